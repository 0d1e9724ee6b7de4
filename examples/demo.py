"""metile demo: an MSL kernel as a lazy node of an MLX graph, on the default device.

    python examples/demo.py

A matmul by MLX feeds a hand-written MSL epilogue (scale, bias, leaky ReLU)
run by metile: on a Mac it runs on the Metal GPU, elsewhere in metile's MSL
CPU runtime.  The whole graph goes through mx.compile and is checked against
NumPy.  (The fused-GEMM DSL demo with explain() replaces this once the
kernel library lands.)
"""

import mlx.core as mx
import numpy as np

import metile

EPILOGUE = """
    uint i = thread_position_in_grid.x;
    if (i < n) {
        float v = x[i] * alpha + bias[i % columns];
        out[i] = v > 0.0f ? v : v * 0.1f;
    }
"""

epilogue = metile.metal_kernel(
    name="affine_leaky", input_names=["x", "bias", "alpha", "n", "columns"], output_names=["out"], source=EPILOGUE
)


@mx.compile
def layer(a, b, bias):
    y = a @ b
    n = y.size
    (out,) = epilogue(
        inputs=[y, bias, 0.5, n, y.shape[1]],
        grid=(n, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[y.shape],
        output_dtypes=[mx.float32],
    )
    return out


def main():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((96, 64), np.float32), rng.standard_normal((64, 80), np.float32)
    bias = rng.standard_normal(80, np.float32)
    out = layer(mx.array(a), mx.array(b), mx.array(bias))
    mx.eval(out)
    ref = a.astype(np.float64) @ b * 0.5 + bias
    ref = np.where(ref > 0, ref, ref * 0.1)
    err = np.abs(np.array(out) - ref).max()
    print(f"device: {mx.default_device()}  output {out.shape} {out.dtype}  max |error| vs NumPy: {err:.2e}")
    assert np.allclose(np.array(out), ref, rtol=3e-4, atol=1e-4), "mismatch against NumPy"
    print("OK")


if __name__ == "__main__":
    main()
