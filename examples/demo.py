"""metile demo: a fused GEMM epilogue inside an MLX graph, on the default device.

    python examples/demo.py

out = leaky_relu(alpha * (x @ w) + beta) runs as ONE metile kernel (the
epilogue is fused into the GEMM's store) between ordinary MLX ops, all traced
by mx.compile.  On a Mac it runs on the Metal GPU, on an NVIDIA machine with
MLX's CUDA backend as CUDA, elsewhere in metile's MSL CPU runtime.  The result
is checked against NumPy and the kernel's execution report is printed.
"""

import mlx.core as mx
import numpy as np

from metile_kernels.gemm import grid, matmul_epilogue

ALPHA, BETA = 1.5, -0.25
M, N, K = 96, 80, 72  # ragged: not multiples of the 64x64x16 tile


def fused_layer(x, w):
    out = mx.zeros((M, N), x.dtype)
    return matmul_epilogue[grid(M, N)](x, w, out, M, N, K, ALPHA, BETA, EPILOGUE="affine_leaky")


@mx.compile
def model(x, w):
    h = mx.tanh(x)                 # MLX op
    y = fused_layer(h, w)          # metile kernel: GEMM + fused epilogue
    return y.sum(axis=1)           # MLX op


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    out = model(mx.array(x), mx.array(w))
    mx.eval(out)

    z = ALPHA * (np.tanh(x.astype(np.float64)) @ w) + BETA
    ref = np.where(z > 0, z, 0.1 * z).sum(axis=1)
    err = np.abs(np.array(out) - ref).max()
    print(f"device: {mx.default_device()}  output {out.shape}  max |error| vs NumPy: {err:.2e}")
    np.testing.assert_allclose(np.array(out), ref, rtol=3e-4, atol=1e-3)

    # the report of the launch that ran inside the compiled graph (the kernel's last one)
    print(matmul_epilogue.explain())
    print("OK")


if __name__ == "__main__":
    main()
