"""metile.cuda_kernel: CUDA C++ bodies through metile's C++ layer (H200 device machine)."""

import mlx.core as mx
import numpy as np
import pytest

import metile

pytestmark = pytest.mark.skipif(
    not (mx.cuda.is_available() and mx.default_device().type == mx.gpu), reason="needs MLX's CUDA backend"
)


def test_elementwise_exp(rng):
    kernel = metile.cuda_kernel(
        "cu_exp", ["inp"], ["out"],
        "auto i = blockIdx.x * blockDim.x + threadIdx.x; if (i < inp_shape[0]) out[i] = exp(inp[i]);",
    )
    x = rng.standard_normal(1000).astype(np.float32)
    (out,) = kernel(inputs=[mx.array(x)], grid=(1000, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[(1000,)], output_dtypes=[mx.float32])
    np.testing.assert_allclose(np.array(out), np.exp(x.astype(np.float64)), rtol=3e-4, atol=3e-5)


def test_shared_memory_block_sum_inside_compile(rng):
    source = """
        __shared__ float partial[256];
        int t = threadIdx.x;
        int i = blockIdx.x * blockDim.x + t;
        partial[t] = i < n[0] ? x[i] : 0.0f;  // MLX passes 0-d CUDA inputs as pointers
        __syncthreads();
        for (int s = 128; s > 0; s /= 2) {
            if (t < s) partial[t] += partial[t + s];
            __syncthreads();
        }
        if (t == 0) out[blockIdx.x] = partial[0];
    """
    kernel = metile.cuda_kernel("cu_block_sum", ["x", "n"], ["out"], source)
    x = rng.standard_normal(1000).astype(np.float32)

    @mx.compile
    def f(v):
        (out,) = kernel(inputs=[v * 2.0, 1000], grid=(1024, 1, 1), threadgroup=(256, 1, 1),
                        output_shapes=[(4,)], output_dtypes=[mx.float32])
        return out.sum()

    np.testing.assert_allclose(float(f(mx.array(x))), 2 * x.astype(np.float64).sum(), rtol=3e-4, atol=1e-3)


def test_same_name_different_source_runs_each_source():
    # MLX caches CUDA modules by name; metile's names carry a content hash.
    x = mx.arange(8).astype(mx.float32)
    outs = []
    for op in ("+", "*"):
        kernel = metile.cuda_kernel("same_name", ["x"], ["out"],
                                    f"int i = threadIdx.x; out[i] = x[i] {op} 2.0f;")
        outs.append(kernel(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1),
                           output_shapes=[(8,)], output_dtypes=[mx.float32])[0])
    np.testing.assert_array_equal(np.array(outs[0]), np.arange(8) + 2)
    np.testing.assert_array_equal(np.array(outs[1]), np.arange(8) * 2)
