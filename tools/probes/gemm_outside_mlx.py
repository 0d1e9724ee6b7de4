"""metile's 1024^3 float16 fused GEMM kernel launched outside MLX (CuPy), back to back,
timed with CUDA events: the GPU time per launch in a stream, without MLX's graphs or
allocator (H200).

Under mx.compile a call costs 29-36 us while ncu times the kernel alone at 13.3 us and a
no-op kernel of the same launch form costs 7-12 us (gemm_call_floor.py).  This runs the
same cubin with the same arguments (captured from metile's launch) 200 times per pair of
events:
  same-out    one output and scratch buffer, reused by every launch
  fresh-out   200 distinct device buffers (cudaMalloc), as MLX hands out new outputs
  managed     200 distinct cudaMallocManaged buffers (MLX's allocator uses managed memory),
              touched by a first round on the GPU
  managed-in  managed outputs and managed A and B written by the host first (as
              mx.array(numpy) makes them), then read by the GPU
  advised-in  the same after cudaMemAdvise(preferred location: the GPU) and a prefetch
  graph       fresh-out's 200 launches captured into one CUDA graph (as MLX runs them)
  nop-graph   the same with a kernel that does nothing (same grid, block, shared memory)
  cublas      CuPy's a @ b (cuBLAS), same shapes, no epilogue
and checks the result against MLX's.

    python3 tools/probes/gemm_outside_mlx.py [out.json]
"""
import ctypes
import json
import sys
import tempfile
from pathlib import Path

import cupy as cp
import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]
from benchmarks.compiler import schedule_fusion as sf  # noqa: E402
from gemm_call_floor import capture  # noqa: E402  (this folder: the same launch's arguments)

N = 1024
TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_simdgroups": 8}
LAUNCHES = 200


def timed(launch, rounds=5):
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    stream = getattr(launch, "stream", None)
    launch(0)
    best = 1e9
    for _ in range(rounds):
        start.record(stream)
        for i in range(LAUNCHES):
            launch(i)
        stop.record(stream)
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) * 1e3 / LAUNCHES)
    return round(best, 2)


def graph_of(launch):
    """One CUDA graph of LAUNCHES calls of `launch`, and a function timing one replay."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for i in range(LAUNCHES):
            launch(i)
        graph = stream.end_capture()

    def replay(i):
        if i == 0:
            graph.launch(stream)
    replay.stream = stream
    return replay


def main():
    rng = np.random.default_rng(0)
    an = rng.standard_normal((N, N)).astype(np.float16)
    bn = rng.standard_normal((N, N)).astype(np.float16)
    a, b = mx.array(an), mx.array(bn)
    fns = sf.variants((N, N, N), mx.float16, TILE)
    args, want = capture(fns["fused"], a, b)
    name, cubin, inputs, oshapes, odtypes, grid, tg, smem, init, erc, stream, scalars = args
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    kernel = cp.RawModule(path=f.name).get_function(name)
    kernel.max_dynamic_shared_size_bytes = smem
    blocks = (grid[0] // tg[0], grid[1] // tg[1], grid[2] // tg[2])
    ac, bc = cp.asarray(an), cp.asarray(bn)
    rest = [cp.asarray(np.array(x)) for x in inputs[2:]]
    values = [np.int32(v) if isinstance(v, int) else np.float32(v) for v in scalars]
    nbytes = [int(np.prod(s)) * (2 if d == mx.float16 else 1) for s, d in zip(oshapes, odtypes)]

    def buffers(alloc):
        return [[alloc(n) for n in nbytes] for _ in range(LAUNCHES)]

    def launcher(outs):
        def launch(i):
            kernel(blocks, tg, (ac, bc, *rest, *[o[i % len(o)] for o in outs], *values),
                   shared_mem=smem)
        return launch

    device = buffers(lambda n: cp.empty(n, cp.uint8))
    managed = buffers(lambda n: cp.ndarray((n,), cp.uint8, cp.cuda.malloc_managed(n)))
    def host_written(x: np.ndarray, advise: bool):
        mem = cp.cuda.malloc_managed(x.nbytes)
        ctypes.memmove(mem.ptr, x.ctypes.data, x.nbytes)
        if advise:
            try:
                cp.cuda.runtime.memAdvise(mem.ptr, x.nbytes, 3, 0)  # SetPreferredLocation
                cp.cuda.runtime.memPrefetchAsync(mem.ptr, x.nbytes, 0, 0)
            except Exception as e:   # CUDA 13 changed these calls' location argument
                print(f"advise/prefetch not applied: {type(e).__name__}: {e}")
        return cp.ndarray(x.shape, x.dtype, mem)

    def launcher_in(a_, b_, outs):
        def launch(i):
            kernel(blocks, tg, (a_, b_, *rest, *[o[i % len(o)] for o in outs], *values),
                   shared_mem=smem)
        return launch

    managed_outs = [[row[j] for row in managed] for j in range(len(nbytes))]
    ways = {
        "managed-in": launcher_in(host_written(an, False), host_written(bn, False), managed_outs),
        "advised-in": launcher_in(host_written(an, True), host_written(bn, True), managed_outs),
        "same-out": launcher([[device[0][j]] for j in range(len(nbytes))]),
        "fresh-out": launcher([[row[j] for row in device] for j in range(len(nbytes))]),
        "managed": launcher([[row[j] for row in managed] for j in range(len(nbytes))]),
        "cublas": lambda i: ac @ bc,
    }
    nop = cp.RawModule(code='extern "C" __global__ void nop_form() {}').get_function("nop_form")
    nop.max_dynamic_shared_size_bytes = smem
    fresh = [[row[j] for row in device] for j in range(len(nbytes))]
    ways["graph"] = graph_of(launcher(fresh))
    ways["nop-graph"] = graph_of(lambda i: nop(blocks, tg, (), shared_mem=smem))
    ways["fresh-out"](0)
    cp.cuda.runtime.deviceSynchronize()
    got = device[0][0].view(cp.float16).reshape(N, N).get()
    assert np.array_equal(got, want), "the kernel outside MLX differs from metile's result"
    rows = {}
    for r in range(2):
        for key in (list(ways) if r == 0 else list(ways)[::-1]):
            rows[key] = min(rows.get(key, 1e9), timed(ways[key]))
    print(f"{name}: {blocks} blocks x {tg}, {smem} B shared; us per launch, {LAUNCHES} back to back")
    for k, v in rows.items():
        print(f"  {k:10s} {v:8.2f}")
    if len(sys.argv) > 1:
        json.dump({"machine": mx.device_info().get("device_name", str(mx.default_device())), "cupy": cp.__version__, "mlx": mx.__version__,
                   "kernel": name, "blocks": blocks, "threads": tg, "shared_memory": smem,
                   "metric": f"CUDA events around {LAUNCHES} back-to-back launches, best of 5x2",
                   "us_per_launch": rows}, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
