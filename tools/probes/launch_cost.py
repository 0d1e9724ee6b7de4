"""What one launch costs on the host, MLX's own op against MLX's custom-kernel entry points
and metile's launch, for a kernel that does almost nothing (one element), eager, many
launches per synchronization (the time per launch is then the host's, not the GPU's):

  mlx op         `x + 1.0` on a 1-element array
  cuda_kernel    mx.fast.cuda_kernel (source compiled by MLX) doing the same
  precompiled    mx.fast.precompiled_cuda_kernel of the same kernel, NVRTC-compiled here
  metile         metile's `kernel[grid](...)` of the same computation
  metile op      metile.ops.matmul of a 16x16x16 float16 product (the op layer's cost;
                 a repeated call replays its launch, metile/op_replay.py)
  mlx matmul     the same product through MLX
  ... of lazy    both products of a lazy matmul's output (built each call)
  metile/mlx linear, rms_norm, softmax: metile.ops (backend="metile") against MLX's op or
                 composite on a 16x64 float16 row block (linear: a 64x64 weight and a bias)
  metile/mlx attention: decode (one query of 8 heads over 256 keys, float16), the op with
                 backend="metile" (two kernels) and "mlx" against MLX's op

    python3 tools/probes/launch_cost.py [out.json]
"""
import json
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, "tests")
import nvrtc  # noqa: E402

import metile  # noqa: E402
from eager_host_cost import cycling  # noqa: E402  (this folder: sys.path[0] when run)

PAIRS = ("linear", "rms_norm", "softmax")
SOURCE = 'extern "C" __global__ void plus_one(const float* x, float* y) { y[0] = x[0] + 1.0f; }'


@metile.kernel
def plus_one(X, Y):
    metile.store(Y, metile.load(X) + 1.0)


@metile.kernel
def add_one(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + offs, metile.load(X + offs, mask=offs < n) + 1.0, mask=offs < n)


def main():
    x = mx.array([1.0], dtype=mx.float32)
    a = mx.array(np.ones((16, 16), np.float16))
    rng = np.random.default_rng(0)
    rows, w, bias = (mx.array(rng.standard_normal(s).astype(np.float16)) for s in
                     ((16, 64), (64, 64), (64,)))
    q, kv = (mx.array(rng.standard_normal(s).astype(np.float16)) for s in
             ((1, 8, 1, 64), (1, 8, 256, 64)))
    mx.eval(x, a, rows, w, bias, q, kv)
    # new shapes: 600 lengths, and 600 key/value caches of 256..855 keys
    longer = [mx.array(np.ones(n, np.float32)) for n in range(200, 800)]
    caches = [mx.array(rng.standard_normal((1, 8, n, 64)).astype(np.float16))
              for n in range(256, 856)]
    mx.eval(*longer, *caches)
    jit = mx.fast.cuda_kernel(name="plus_one_jit", input_names=["x"], output_names=["y"],
                              source="y[0] = x[0] + 1.0f;")
    cubin, _ = nvrtc.cubin(SOURCE, "sm_90a")
    common = dict(output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1),
                  threadgroup=(1, 1, 1))
    out = mx.zeros((1,), dtype=mx.float32)
    ways = {
        "mlx op": lambda: x + 1.0,
        "cuda_kernel": lambda: jit(inputs=[x], **common)[0],
        "precompiled": lambda: mx.fast.precompiled_cuda_kernel(
            name="plus_one", compiled_source=cubin, inputs=[x], scalars=[], **common)[0],
        "metile": lambda: plus_one[(1,)](x, out),
        "metile op": lambda: metile.ops.matmul(a, a, backend="metile"),
        "mlx matmul": lambda: a @ a,
        # the same product of a lazy matmul output (an eager model's launches take lazy
        # arrays): both sides also build that MLX matmul
        "metile op of lazy": lambda: metile.ops.matmul(a @ a, a, backend="metile"),
        "mlx matmul of lazy": lambda: (a @ a) @ a,
        "metile linear": lambda: metile.ops.linear(rows, w, bias, backend="metile"),
        "mlx linear": lambda: mx.addmm(bias, rows, w.T),
        "metile rms_norm": lambda: metile.ops.rms_norm(rows, bias, 1e-5, backend="metile"),
        "mlx rms_norm": lambda: mx.fast.rms_norm(rows, bias, 1e-5),
        "metile softmax": lambda: metile.ops.softmax(rows, backend="metile"),
        "mlx softmax": lambda: mx.softmax(rows, axis=-1),
        # decode attention (one query of 8 heads over 256 keys): two kernels a call
        "metile attention": lambda: metile.ops.scaled_dot_product_attention(
            q, kv, kv, scale=0.125, backend="metile"),
        "mlx attention": lambda: mx.fast.scaled_dot_product_attention(q, kv, kv, scale=0.125),
        "metile attention mlx": lambda: metile.ops.scaled_dot_product_attention(
            q, kv, kv, scale=0.125, backend="mlx"),
        # a new shape every call: kernel[grid] of a masked block against x + 1.0, and
        # decode attention over a cache one key longer each call
        "metile new shape": cycling(lambda v: add_one[(-(-v.shape[0] // 256),)](
            v, mx.zeros(v.shape, v.dtype), v.shape[0], BLOCK=256), longer),
        "mlx new shape": cycling(lambda v: v + 1.0, longer),
        "metile attention new shape": cycling(lambda c: metile.ops.scaled_dot_product_attention(
            q, c, c, scale=0.125, backend="metile"), caches),
        "mlx attention new shape": cycling(lambda c: mx.fast.scaled_dot_product_attention(
            q, c, c, scale=0.125), caches),
    }
    for key, fn in ways.items():
        got = np.array(fn().astype(mx.float32))
        if key.endswith("new shape"):
            if key.startswith("metile"):   # (each cycle's first item on both sides)
                want = np.array(ways[key.replace("metile", "mlx")]().astype(mx.float32))
                assert np.allclose(got, want, rtol=1e-2, atol=1e-2), key
            continue
        if key in ("metile op", "mlx matmul"):
            assert np.allclose(got, 16.0), key
        elif key.endswith("of lazy"):
            assert np.allclose(got, 256.0), key
        elif key.startswith(("metile ", "mlx ")) and key.split()[1] in PAIRS + ("attention",):
            want = np.array(ways["mlx " + key.split()[1]]().astype(mx.float32))
            assert np.allclose(got, want, rtol=1e-2, atol=1e-2), key
        else:
            assert got.ravel()[0] == 2.0, (key, got)
    launches = 2000
    times = {k: [] for k in ways}
    for r in range(4):
        for key in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            fn = ways[key]
            mx.eval(fn())
            mx.synchronize()
            t = time.perf_counter()
            outs = [fn() for _ in range(launches)]
            queued = time.perf_counter() - t
            mx.eval(outs)
            mx.synchronize()
            total = time.perf_counter() - t
            times[key].append((queued / launches * 1e6, total / launches * 1e6))
    results = {k: {"build_us": round(min(q for q, _ in v), 2),
                   "per_launch_us": round(min(t for _, t in v), 2)} for k, v in times.items()}
    for k, v in results.items():
        print(f"{k:12s} {v}", flush=True)
    if len(sys.argv) > 1:
        json.dump({"machine": mx.device_info().get("device_name", str(mx.default_device())), "mlx": mx.__version__,
                   "metric": "eager, 2000 launches per synchronization, best of 4 "
                             "alternating: build_us = host time to build the lazy op, "
                             "per_launch_us = build + evaluation + GPU, per launch",
                   "results": results}, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
