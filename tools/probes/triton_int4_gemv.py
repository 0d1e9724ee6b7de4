"""Triton 3.6's int4 GEMV on MLX's packing, timed as read_floor times its reads (issue 17's
decode target: 2.5x MLX's `quantized_matmul` at 1x4096x11008, group 64, float16).

read_floor (s154, H200) put the bytes of one product (25.4 MB) at 7.45 us for Triton's best
flat read, the target at 12.3 us and metile's pair GEMV at 14.1.  What a flat read does not
say is what a GEMV written the way Triton users write one reaches: the same weights
(mx.quantize's layout: eight 4-bit values a uint32, the first lowest; a float16 scale and bias
a group of 64 along K), x a row of float16, each program BLOCK_N rows over the whole K in
BLOCK_K steps, the dequantized weights times x summed in float32 (s * sum(q x) + b * sum(x)
a group).  Every (BLOCK_N, BLOCK_K, warps) below is timed, 8 products a CUDA graph over 4
weights cycled (as the MLX chains cycle them), 20 graphs a synchronisation, median of rounds.

Measured (s156, H100, the same card on which metile's pair GEMV took 14.5 us and MLX's op
27.9 in MLX's chain): the 3-D tile form 34.8 us at best (8 rows x 512, 1 warp), the nibbles
form 20.1 (8 x 1024, 1 warp) - Triton as a user writes it reaches ~1.4x of MLX where metile
reaches ~1.9-2.0x (a CUDA graph against MLX's compiled chain, so the ratio is approximate).

    python3 tools/probes/triton_int4_gemv.py [out.json]       # GPU (torch + triton)
    TRITON_INTERPRET=1 python3 tools/probes/triton_int4_gemv.py --check   # CPU interpreter
"""
import json
import os
import sys

sys.path[:0] = ["tools/probes"]
import torch
import triton
import triton.language as tl

from probe_report import cuda_graph_us  # noqa: E402

GROUP = 64
CHAIN, CALLS, ROUNDS = 8, 20, int(os.environ.get("ROUNDS", "7"))


@triton.jit
def int4_gemv(x, w, s, b, out, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[n] = sum_k x[k] * (s[n, k // 64] * q[n, k] + b[n, k // 64]), q the 4-bit values of
    w's rows (K // 8 words a row).  N a multiple of BLOCK_N is not assumed; K of BLOCK_K is."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    live = rows < N
    rows = tl.where(live, rows, 0)
    words = K // 8
    groups = K // 64
    shifts = (tl.arange(0, 8) * 4).to(tl.uint32)
    acc = tl.zeros([BLOCK_N, BLOCK_K // 64], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(w + rows[:, None] * words + wi[None, :])          # (N, BK/8) uint32
        q = (packed[:, :, None] >> shifts[None, None, :]) & 0xF             # (N, BK/8, 8)
        q = tl.reshape(q.to(tl.float16), (BLOCK_N, BLOCK_K // 64, 64))
        xv = tl.load(x + k0 + tl.arange(0, BLOCK_K)).to(tl.float16)
        xg = tl.reshape(xv, (BLOCK_K // 64, 64))
        gi = k0 // 64 + tl.arange(0, BLOCK_K // 64)
        sv = tl.load(s + rows[:, None] * groups + gi[None, :]).to(tl.float32)
        bv = tl.load(b + rows[:, None] * groups + gi[None, :]).to(tl.float32)
        qx = tl.sum((q * xg[None, :, :]).to(tl.float32), axis=2)             # (N, BK/64)
        xs = tl.sum(xg.to(tl.float32), axis=1)                               # (BK/64,)
        acc += sv * qx + bv * xs[None, :]
    tl.store(out + rows, tl.sum(acc, axis=1).to(out.dtype.element_ty), mask=live)


@triton.jit
def int4_gemv_nibbles(x, w, s, b, out, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """int4_gemv with no 3-D tile: nibble j of each word times x[8 w + j] (a strided read
    of x), eight 2-D products a step, the scale and bias applied a word (each word lies in
    one group)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    live = rows < N
    rows = tl.where(live, rows, 0)
    words = K // 8
    groups = K // 64
    acc = tl.zeros([BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(w + rows[:, None] * words + wi[None, :])
        gi = wi // 8
        sv = tl.load(s + rows[:, None] * groups + gi[None, :]).to(tl.float32)
        bv = tl.load(b + rows[:, None] * groups + gi[None, :]).to(tl.float32)
        part = tl.zeros([BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
        xs = tl.zeros([BLOCK_K // 8], dtype=tl.float32)
        for j in tl.static_range(8):
            xj = tl.load(x + wi * 8 + j).to(tl.float32)
            q = ((packed >> (4 * j)) & 0xF).to(tl.float32)
            part += q * xj[None, :]
            xs += xj
        acc += sv * part + bv * xs[None, :]
    tl.store(out + rows, tl.sum(acc, axis=1).to(out.dtype.element_ty), mask=live)


KERNELS = {"tiles": int4_gemv, "nibbles": int4_gemv_nibbles}


def gemv(x, w, s, b, out, block_n, block_k, warps, form="tiles"):
    n, k = s.shape[0], x.shape[-1]
    KERNELS[form][(triton.cdiv(n, block_n),)](x, w, s, b, out, n, k, BLOCK_N=block_n,
                                              BLOCK_K=block_k, num_warps=warps)
    return out


def operands(n, k, count, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    qs = []
    for _ in range(count):
        w = torch.randint(-2**31, 2**31 - 1, (n, k // 8), generator=g, dtype=torch.int32)
        s = (torch.rand((n, k // GROUP), generator=g) / 64).to(torch.float16)
        b = (torch.rand((n, k // GROUP), generator=g) / -128).to(torch.float16)
        qs.append((w.to(device), s.to(device), b.to(device)))
    x = torch.randn((k,), generator=g).to(torch.float16).to(device)
    return x, qs


def reference(x, w, s, b):
    """float64 from the packed words (uint32 nibbles, the first lowest)."""
    words = w.to(torch.int64) & 0xFFFFFFFF
    q = torch.stack([(words >> (4 * j)) & 0xF for j in range(8)], dim=-1).reshape(w.shape[0], -1)
    deq = q.double() * s.double().repeat_interleave(GROUP, 1) + \
        b.double().repeat_interleave(GROUP, 1)
    return deq @ x.double()


def check():
    device = "cpu"
    for n, k, bn, bk in ((37, 512, 16, 256), (64, 1024, 32, 512)):
        x, qs = operands(n, k, 1, device)
        out = torch.empty(n, dtype=torch.float16, device=device)
        for form in KERNELS:
            got = gemv(x, *qs[0], out, bn, bk, 4, form).double()
            want = reference(x, *qs[0])
            err = (got - want).abs().max().item() / want.abs().max().item()
            print(form, n, k, bn, bk, f"relative max error {err:.2e}",
                  "ok" if err < 1e-2 else "WRONG")


def timed(fns) -> float:
    return cuda_graph_us(fns, ROUNDS, CALLS)[0]


def main():
    if "--check" in sys.argv:
        check()
        return
    n, k = 11008, 4096
    x, qs = operands(n, k, 4, "cuda")
    outs = [torch.empty(n, dtype=torch.float16, device="cuda") for _ in range(CHAIN)]
    want = reference(x, *qs[0]).float()
    us, errors = {}, {}
    forms = os.environ.get("FORMS", "tiles,nibbles").split(",")
    configs = [(f, bn, bk, wp) for f in forms for bn in (4, 8, 16, 32, 64)
               for bk in (256, 512, 1024) for wp in (1, 2, 4, 8) if bn * bk // 8 >= 32 * wp]
    for form, bn, bk, wp in configs:
        name = f"{form} {bn}x{bk}/{wp}w"
        try:
            got = gemv(x, *qs[0], outs[0], bn, bk, wp, form).float()
            errors[name] = round((got - want).abs().max().item() / want.abs().max().item(), 5)
            us[name] = timed([lambda q=qs[i % 4], o=outs[i]: gemv(x, *q, o, bn, bk, wp, form)
                              for i in range(CHAIN)])
        except Exception as e:  # a configuration Triton cannot compile (registers, shared)
            us[name] = f"{type(e).__name__}: {str(e)[:120]}"
    timed_ok = {c: t for c, t in us.items() if isinstance(t, float)}
    best = min(timed_ok, key=timed_ok.get)
    report = {"machine": {"card": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "triton": triton.__version__},
              "metric": f"us a product, {CHAIN} a CUDA graph over 4 int4 weights cycled "
                        f"(1x{k}x{n}, group 64, float16), {CALLS} graphs a sync, median of "
                        f"{ROUNDS} rounds",
              "best": best, "best_us": timed_ok[best], "best_error": errors[best],
              "us": us, "relative_max_error": errors}
    print(json.dumps({k_: v for k_, v in report.items() if k_ not in ("us",
                                                                     "relative_max_error")}))
    top = sorted(timed_ok, key=timed_ok.get)[:8]
    print("fastest:", ", ".join(f"{c} {timed_ok[c]}" for c in top))
    path = sys.argv[1] if len(sys.argv) > 1 else None
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
