"""Triton's causal attention forward on the same machine, as a peer for issue 17's target.

    python3 tools/probes/triton_attention.py OUT.json [--lengths 1024 4096 8192]

Runs with the device's own python3 (torch + Triton 3.6), in its own process (no MLX).
The kernel is the Triton tutorial's forward (online softmax in base 2, off-diagonal key
blocks unmasked, the diagonal masked), written here with plain pointers, for
1x32xLx128 float16, causal; each configuration (BLOCK_M, BLOCK_N, warps, stages, and
Triton's warp specialization of the key loop where this Triton has it) is checked against
torch's scaled_dot_product_attention (max abs error < 2e-2) before it is timed.  torch's
SDPA (flash/cuDNN backend) is timed beside it.  A sample replays a CUDA graph of 20 calls
between two events; variants alternate within a round; the figure is the median over
rounds.
Each (length, configuration) runs in a child process (one configuration faulted with an
illegal address at 4096 in s59 and took the process down)."""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _block(acc, l_i, m_i, q, K, V, base, offs_m, offs_n, offs_d, lo, hi, qk_scale,
           HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr,
           WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = tl.load(K + base + (start_n + offs_n)[None, :] * HEAD_DIM + offs_d[:, None])
        qk = tl.dot(q, k)
        if DIAGONAL:
            keep = offs_m[:, None] >= (start_n + offs_n[None, :])
            qk = qk * qk_scale + tl.where(keep, 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(V + base + (start_n + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def attention_fwd(Q, K, V, Out, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, WS: tl.constexpr):
    start_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.44269504
    acc, l_i, m_i = _block(acc, l_i, m_i, q, K, V, base, offs_m, offs_n, offs_d, 0,
                           start_m * BLOCK_M, qk_scale, HEAD_DIM, BLOCK_N, False, WS)
    acc, l_i, m_i = _block(acc, l_i, m_i, q, K, V, base, offs_m, offs_n, offs_d,
                           start_m * BLOCK_M, (start_m + 1) * BLOCK_M, qk_scale, HEAD_DIM,
                           BLOCK_N, True, False)
    acc = acc / l_i[:, None]
    tl.store(Out + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(Out.dtype.element_ty))


CONFIGS = [(128, 64, 8, 3, False), (128, 128, 8, 3, False), (128, 64, 4, 3, False),
           (128, 128, 8, 2, False), (128, 64, 8, 3, True), (128, 128, 8, 3, True)]


def run(cfg, q, k, v, out):
    bm, bn, warps, stages, ws = cfg
    n = q.shape[2]
    attention_fwd[(n // bm, q.shape[0] * q.shape[1])](
        q, k, v, out, q.shape[-1] ** -0.5, n, HEAD_DIM=q.shape[-1], BLOCK_M=bm, BLOCK_N=bn,
        WS=ws, num_warps=warps, num_stages=stages)


def sampler(fn, launches=20):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def sample():
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / launches
    return sample


def measure(n, index):
    """torch's SDPA and CONFIGS[index] at length n, alternating, in this process."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 32, n, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    cfg = CONFIGS[index]
    name = "triton %dx%d w%d s%d%s" % (cfg[:4] + (" ws" if cfg[4] else "",))
    out = torch.empty_like(q)
    run(cfg, q, k, v, out)
    err = (out.float() - ref.float()).abs().max().item()
    samplers = {"torch_sdpa": sampler(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))}
    if err < 2e-2:
        samplers[name] = sampler(lambda: run(cfg, q, k, v, out))
    times = {key: [] for key in samplers}
    for r in range(7):
        for key in (samplers if r % 2 == 0 else list(reversed(samplers))):
            times[key].append(samplers[key]())
    return {"name": name, "error": err,
            "us": {key: statistics.median(ts[1:]) for key, ts in times.items()}}


def main():
    if sys.argv[1] == "--one":   # a child: one length and configuration, JSON on stdout
        print(json.dumps(measure(int(sys.argv[2]), int(sys.argv[3]))))
        return
    import subprocess
    path = sys.argv[1]
    lengths = [int(x) for x in sys.argv[sys.argv.index("--lengths") + 1:]] \
        if "--lengths" in sys.argv else [1024, 4096, 8192]
    result = {"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "shape": [1, 32, "L", 128], "dtype": "float16",
              "mask": "causal", "note": "each configuration in its own process beside torch's "
              "SDPA (alternating); us per call from CUDA-graph replays of 20 calls",
              "cases": [], "failures": []}
    for n in lengths:
        for index in range(len(CONFIGS)):
            # a child process each: a configuration that faults cannot take the others down
            child = subprocess.run([sys.executable, __file__, "--one", str(n), str(index)],
                                   capture_output=True, text=True, timeout=120)
            if child.returncode != 0:
                result["failures"].append({"length": n, "config": CONFIGS[index],
                                           "stderr": child.stderr[-600:]})
                print(n, CONFIGS[index], "failed:", child.stderr.strip().splitlines()[-1:], flush=True)
                continue
            case = json.loads(child.stdout.strip().splitlines()[-1])
            case["length"] = n
            result["cases"].append(case)
            flops = 4 * 32 * n * n * 128 / 2
            line = " ".join(f"{key} {us:.1f} us ({flops / us / 1e6:.0f} TF)" for key, us in case["us"].items())
            print(f"{n:5d} err {case['error']:.1e} {line}", flush=True)
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
