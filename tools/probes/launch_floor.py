"""What a launch costs beyond its kernel, piece by piece (H200, MLX's CUDA backend).

A. Host time to build one eager op (no evaluation), many per loop: metile.ops.matmul at
   16x16x16 and 1024^3 float16, then the binding call alone (`_ext.launch_*`) with the
   arguments that op passed (captured once), then `mx.cuda.is_available()`.  The
   difference says whether the time is metile's Python or the launch underneath.
B. Wall time per mx.compile'd call, 200 calls per synchronization, of kernels that do
   almost nothing (one block, one thread):
     mlx          x + 1
     pre          a precompiled kernel, no dynamic shared memory
     pre+smem     the same launched with 200 KB of dynamic shared memory
     pre+smem+out the same with a second (uint8, 16 KB) output
     scalar-arr   reads an int32 0-d input array (MLX's small managed pool)
     scalar-val   takes that int32 by value
   Each is the floor a real kernel of that kind pays per call on top of its GPU time.

    python3 tools/probes/launch_floor.py [out.json]
"""
import json
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, "tests")
import nvrtc  # noqa: E402

import metile  # noqa: E402
from metile import _ext  # noqa: E402

TINY = r'''
extern "C" __global__ void tiny(const float* x, float* y) { y[0] = x[0] + 1.0f; }
extern "C" __global__ void tiny_smem(const float* x, float* y) { y[0] = x[0] + 1.0f; }
extern "C" __global__ void tiny2(const float* x, float* y, unsigned char* z) { y[0] = x[0] + 1.0f; z[0] = 1; }
extern "C" __global__ void tiny_arr(const float* x, const int* n, float* y) { y[0] = x[0] + n[0]; }
extern "C" __global__ void tiny_val(const float* x, float* y, int n) { y[0] = x[0] + n; }
'''


def per_call(fn, launches=2000, rounds=3):
    best = 1e9
    for _ in range(rounds):
        t = time.perf_counter()
        outs = [fn() for _ in range(launches)]
        best = min(best, (time.perf_counter() - t) / launches * 1e6)
        mx.eval(outs)
        mx.synchronize()
    return round(best, 2)


def wall(fn, launches=200, rounds=5):
    best = 1e9
    mx.eval(fn())
    for _ in range(rounds):
        mx.synchronize()
        t = time.perf_counter()
        mx.eval([fn() for _ in range(launches)])
        mx.synchronize()
        best = min(best, (time.perf_counter() - t) / launches * 1e6)
    return round(best, 2)


def part_a() -> dict:
    seen = {}
    real = {"launch_precompiled_cuda": _ext.launch_precompiled_cuda, "launch_cuda": _ext.launch_cuda}
    if getattr(_ext, "has_cuda_launch", False):
        real["launch_cuda_function"] = _ext.launch_cuda_function

    def spy(name):
        def call(*args):
            seen[name] = args
            return real[name](*args)
        return call

    out = {}
    for n in (16, 1024):
        a = mx.array(np.ones((n, n), np.float16))
        mx.eval(a)
        seen.clear()
        for name in real:
            setattr(_ext, name, spy(name))
        mx.eval(metile.ops.matmul(a, a, backend="metile"))
        for name, fn in real.items():
            setattr(_ext, name, fn)
        (which, args), = seen.items()
        out[f"ops.matmul {n}"] = per_call(lambda: metile.ops.matmul(a, a, backend="metile"), 500)
        out[f"  {n}: {which} alone"] = per_call(lambda: real[which](*args), 500)
        if which == "launch_precompiled_cuda":
            out[f"  {n}: cubin bytes"] = len(args[1])
        elif which == "launch_cuda_function":
            out[f"  {n}: cubin bytes"] = args[0].image_bytes
        else:
            out[f"  {n}: source+header chars"] = len(args[3]) + len(args[4])
        arrays = {"launch_precompiled_cuda": args[2], "launch_cuda_function": args[1]}.get(which, args[7] if len(args) > 7 else [])
        out[f"  {n}: inputs"] = [list(x.shape) for x in arrays]
    out["mx.cuda.is_available"] = per_call(mx.cuda.is_available, 5000)
    out["mx.array(3) (a 0-d int32 array)"] = per_call(lambda: mx.array(3, dtype=mx.int32), 2000)
    out["mx.array([3, 0, 0, 0])"] = per_call(lambda: mx.array([3, 0, 0, 0], dtype=mx.int32), 2000)
    return out


def part_b() -> dict:
    cubin, _ = nvrtc.cubin(TINY, "sm_90a")
    x = mx.array([1.0], dtype=mx.float32)
    n0 = mx.array(3, dtype=mx.int32)
    mx.eval(x, n0)
    common = dict(grid=(1, 1, 1), threadgroup=(1, 1, 1))
    one = dict(output_shapes=[(1,)], output_dtypes=[mx.float32])

    def pre(name, inputs, smem=0, extra=False, scalars=()):
        shapes = one["output_shapes"] + ([(16384,)] if extra else [])
        dtypes = one["output_dtypes"] + ([mx.uint8] if extra else [])
        return mx.fast.precompiled_cuda_kernel(
            name=name, compiled_source=cubin, inputs=inputs, output_shapes=shapes,
            output_dtypes=dtypes, scalars=list(scalars), shared_memory=smem, **common)[0]

    ways = {
        "mlx": lambda x: x + 1.0,
        "pre": lambda x: pre("tiny", [x]),
        # (MLX sets a kernel's shared-memory limit once per name: a name per size)
        "pre+smem": lambda x: pre("tiny_smem", [x], smem=200 * 1024),
        "pre+smem+out": lambda x: pre("tiny2", [x], smem=200 * 1024, extra=True),
        "scalar-arr": lambda x: pre("tiny_arr", [x, n0]),
        "scalar-val": lambda x: pre("tiny_val", [x], scalars=[3]),
    }
    out = {}
    for key, fn in ways.items():
        got = float(np.array(fn(x))[0])
        assert got in (2.0, 4.0), (key, got)
    compiled = {k: mx.compile(f) for k, f in ways.items()}
    for r in range(2):
        for key in (list(ways) if r == 0 else list(ways)[::-1]):
            out.setdefault(f"{key} eager", []).append(wall(lambda: ways[key](x)))
            out.setdefault(f"{key} compiled", []).append(wall(lambda: compiled[key](x)))
    return {k: min(v) for k, v in out.items()}


def main():
    results = {"A: host us to build one op (no evaluation)": part_a(),
               "B: wall us per call, 200 calls per synchronization": part_b()}
    for part, rows in results.items():
        print(part)
        for k, v in rows.items():
            print(f"  {k:36s} {v}")
    if len(sys.argv) > 1:
        json.dump({"machine": mx.device_info().get("device_name", str(mx.default_device())), "mlx": mx.__version__, "results": results},
                  open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
