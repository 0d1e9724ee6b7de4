"""RELAXED_PRECISION: the one place a GEMM may use reduced-precision matrix units.

On CUDA, float32 operands then go through TF32 tensor cores (10-bit mantissa
operands, float32 accumulation); on Metal's simdgroup_matrix and in the CPU
runtime float32 stays exact.  The tolerance below is the TF32 precision
policy, not a loosened strict-FP32 check: rounding each operand to 11
significant bits gives a relative error up to 2^-11 per product, so a K-term
dot product of standard-normal values errs by about 2^-11 * sqrt(K) in
absolute terms; we allow 4x that.
"""

import math

import mlx.core as mx
import numpy as np

from metile_kernels.gemm import grid, matmul


def test_relaxed_precision_float32_gemm(rng):
    m, n, k = 100, 70, 129
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b
    d = matmul[grid(m, n)].prepare(mx.array(a), mx.array(b), mx.zeros((m, n)), m, n, k,
                                   RELAXED_PRECISION=True)
    out = np.array(d())
    tf32_atol = 4 * 2.0**-11 * math.sqrt(k)
    np.testing.assert_allclose(out, ref, rtol=2.0**-10, atol=tf32_atol)
    fragment = d.variant.data["lowering"]["matmul"]["fragment"]
    if d.variant.backend == "cuda":
        assert "tf32" in fragment
    else:  # simdgroup_matrix float32 is exact: the strict tolerance still holds
        assert fragment == "simdgroup_matrix 8x8"
        np.testing.assert_allclose(out, ref, rtol=3e-4, atol=3e-5)
