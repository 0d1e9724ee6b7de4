"""Where a 1024^3 float16 fused GEMM's wall time per mx.compile'd call goes (H200).

The benchmark (benchmarks/compiler/schedule_fusion.py) measured ~46 us per call for
metile's fused leaky GEMM at 1024^3 with either tile, while ncu times its kernel at 13 us
(128x128x64) and a one-thread precompiled kernel costs ~9.5 us per call.  This probe times,
per mx.compile'd call, alternating, many calls per synchronization:

  mlx        mx.compile(leaky(a @ b)) (the benchmark's peer)
  fused      the benchmark's metile call (the default launch: METILE_CUDA_LAUNCH)
  raw        the same cubin and arguments through MLX's precompiled_cuda_kernel
  nop        a kernel that does nothing, launched with the fused launch's grid, block,
             dynamic shared memory, inputs and outputs (the floor of that launch form)
  nop-1out   the same without the tensor maps' scratch output
  tiny       a one-block, one-thread kernel (the floor of any launch)

each at 38 and 200 calls per synchronization, independent (MLX may run them
concurrently) and chained (each call's output is the next one's B operand), with the host time to build the calls
(no evaluation) and the time of the evaluation that follows, per call.  With `--ncu` it
instead evaluates `--calls=N` (3) calls of each, for `ncu --metrics gpu__time_duration.sum`
to list every kernel a call launches (or, with `--graph-profiling graph`, the GPU time of
the CUDA graphs MLX runs them in: back-to-back, as in the timing loop).  `--ways=a,b`
keeps those ways only.

    python3 tools/probes/gemm_call_floor.py [out.json] [--ncu] [--ways=raw,nop] [--calls=20]
"""
import json
import os
import sys
import time

import mlx.core as mx
import numpy as np

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import nvrtc  # noqa: E402

from benchmarks.compiler import schedule_fusion as sf  # noqa: E402
from metile import _ext  # noqa: E402

N = 1024
TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_simdgroups": 8}
NOP = r'''
extern "C" __global__ void nop_gemm_form() {}
extern "C" __global__ void nop_gemm_form_1out() {}
extern "C" __global__ void tiny_form(const float* x, float* y) { y[0] = x[0] + 1.0f; }
'''


def capture(fn, a, b):
    """The arguments of `fn`'s launch through MLX's precompiled_cuda_kernel (the launch is
    taken that way while capturing: METILE_CUDA_LAUNCH=mlx)."""
    seen = []
    real = _ext.launch_precompiled_cuda
    before = os.environ.get("METILE_CUDA_LAUNCH")
    os.environ["METILE_CUDA_LAUNCH"] = "mlx"

    def spy(*args):
        seen.append(args)
        return real(*args)
    _ext.launch_precompiled_cuda = spy
    try:
        mx.eval(fn(a, b))
    finally:
        _ext.launch_precompiled_cuda = real
        if before is None:
            os.environ.pop("METILE_CUDA_LAUNCH")
        else:
            os.environ["METILE_CUDA_LAUNCH"] = before
    return seen[-1]


def split(fn, a, b, launches, chain=False):
    """(build us, eval us, total us) per call, best of 5.  `chain`: each call's output is
    the next call's B operand, so MLX must run the calls one after another."""
    best = (1e9, 1e9, 1e9)
    for _ in range(5):
        mx.synchronize()
        t0 = time.perf_counter()
        if chain:
            outs, x = [], b
            for _ in range(launches):
                x = fn(a, x)
                outs.append(x)
        else:
            outs = [fn(a, b) for _ in range(launches)]
        t1 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        t2 = time.perf_counter()
        row = ((t1 - t0) / launches * 1e6, (t2 - t1) / launches * 1e6, (t2 - t0) / launches * 1e6)
        if row[2] < best[2]:
            best = row
    return [round(x, 2) for x in best]


def main():
    ncu = "--ncu" in sys.argv
    only = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--ways=")), None)
    calls = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--calls=")), 3)
    paths = [p for p in sys.argv[1:] if not p.startswith("--")]
    rng = np.random.default_rng(0)
    a = mx.array(rng.standard_normal((N, N)).astype(np.float16))
    b = mx.array(rng.standard_normal((N, N)).astype(np.float16))
    mx.eval(a, b)
    name, cubin, inputs, oshapes, odtypes, grid, tg, smem, init, erc, stream, scalars = \
        capture(sf.variants((N, N, N), mx.float16, TILE)["fused"], a, b)
    fns = sf.variants((N, N, N), mx.float16, TILE)   # traced with the default launch
    rest = list(inputs[2:])
    nop, _ = nvrtc.cubin(NOP, "sm_90a")
    x = mx.array([1.0], dtype=mx.float32)
    mx.eval(x)

    def raw(a, b):
        return _ext.launch_precompiled_cuda(name, cubin, [a, b, *rest], oshapes, odtypes, grid,
                                            tg, smem, init, erc, stream, scalars)[0]

    def nop_form(a, b):
        return _ext.launch_precompiled_cuda("nop_gemm_form", nop, [a, b, *rest], oshapes, odtypes,
                                            grid, tg, smem, init, erc, stream, scalars)[0]

    def nop_1out(a, b):
        return _ext.launch_precompiled_cuda("nop_gemm_form_1out", nop, [a, b, *rest], oshapes[:1],
                                            odtypes[:1], grid, tg, smem, init, erc, stream,
                                            scalars)[0]

    def tiny(a, b):
        return mx.fast.precompiled_cuda_kernel(
            name="tiny_form", compiled_source=nop, inputs=[x], output_shapes=[(1,)],
            output_dtypes=[mx.float32], scalars=[], grid=(1, 1, 1), threadgroup=(1, 1, 1))[0]

    ways = {"mlx": fns["mlx_compile"], "fused": fns["fused"], "raw": mx.compile(raw),
            "nop": mx.compile(nop_form), "nop-1out": mx.compile(nop_1out), "tiny": mx.compile(tiny)}
    ref = np.array(fns["fused"](a, b)).astype(np.float32)
    got = np.array(ways["raw"](a, b)).astype(np.float32)
    assert np.array_equal(ref, got), "the raw launch differs from the fused call"
    if only:
        ways = {k: ways[k] for k in only}
    if ncu:
        for key, fn in ways.items():
            mx.eval([fn(a, b) for _ in range(calls)])
            mx.synchronize()
        return
    rows = {}
    for launches in (38, 200):
        for r in range(2):
            for key in (list(ways) if r == 0 else list(ways)[::-1]):
                for chain in (False, True):
                    if chain and key in ("tiny", "nop-1out"):
                        continue
                    got = split(ways[key], a, b, launches, chain)
                    k = f"{key}{' chained' if chain else ''} x{launches}"
                    if k not in rows or got[2] < rows[k][2]:
                        rows[k] = got
    print(f"launch: {name} grid {grid} block {tg} smem {smem} outputs {oshapes} "
          f"cubin {len(cubin)} B")
    print(f"{'':24s} {'build':>8s} {'eval':>8s} {'total':>8s}  (us per call)")
    for k, v in rows.items():
        print(f"{k:24s} {v[0]:8.2f} {v[1]:8.2f} {v[2]:8.2f}")
    if paths:
        json.dump({"machine": mx.device_info().get("device_name", str(mx.default_device())), "mlx": mx.__version__, "shape": [N, N, N], "tile": TILE,
                   "launch": {"grid": grid, "block": tg, "shared_memory": smem,
                              "outputs": [list(s) for s in oshapes], "cubin_bytes": len(cubin)},
                   "columns": ["build us", "eval us", "total us"], "rows": rows},
                  open(paths[0], "w"), indent=1)


if __name__ == "__main__":
    main()
