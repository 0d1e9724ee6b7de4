"""The Triton side of triton_peer.py: the fused GEMM + affine/leaky epilogue kernel,
its torch references, and the timing loop.  Needs torch, Triton and a CUDA GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.compiler.triton_peer import (ALPHA, BETA, CONFIGS, DEFAULT_L2_BYTES, SLOPE, TOLERANCE,
                                             fits_shared_memory, input_sets_for, launches_for, median,
                                             recorded_at, shape_key)


def _prune(configs, named_args, **kwargs):
    # Triton would skip an over-budget config too, but only after compiling it.
    element_bytes = named_args["a_ptr"].element_size()
    kept = [c for c in configs if fits_shared_memory(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"],
                                                     c.kwargs["BLOCK_K"], c.num_stages, element_bytes)]
    return kept or configs


@triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                           num_warps=w, num_stages=s) for bm, bn, bk, w, s in CONFIGS],
    key=["M", "N", "K"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def affine_leaky_gemm(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      alpha, beta, SLOPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    row_tiles = tl.cdiv(M, BLOCK_M)
    col_tiles = tl.cdiv(N, BLOCK_N)
    # Programs sweep a band of GROUP_M tile rows column by column: neighbouring
    # programs reuse the same B columns and the band's A rows while they sit in L2.
    per_band = GROUP_M * col_tiles
    band = pid // per_band
    first_row = band * GROUP_M
    band_rows = tl.minimum(row_tiles - first_row, GROUP_M)
    within = pid - band * per_band
    tile_m = first_row + within % band_rows
    tile_n = within // band_rows

    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    a_tile = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = ks < K - k0
        a = tl.load(a_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_tile, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    scaled = acc * alpha + beta
    out = tl.where(scaled > 0, scaled, scaled * SLOPE)
    c_tile = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_tile, out.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def triton_fused(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    # "ieee" keeps float32 strict (no TF32), like metile's strict path and
    # MLX_ENABLE_TF32=0; for 16-bit inputs the precision setting has no effect.
    precision = "ieee" if a.dtype == torch.float32 else "tf32"

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    affine_leaky_gemm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1), ALPHA, BETA, SLOPE=SLOPE, DOT_PRECISION=precision)


def torch_eager(a, b, c, bias):
    torch.addmm(bias, a, b, alpha=ALPHA, out=c)
    F.leaky_relu_(c, SLOPE)


def reference(a, b):
    z = ALPHA * (a.double() @ b.double()) + BETA
    return torch.where(z > 0, z, SLOPE * z)


def error(got, ref, rtol, atol) -> dict:
    diff = got.double() - ref
    bad = diff.abs() > atol + rtol * ref.abs()
    return {"relative_frobenius": float(torch.linalg.norm(diff) / torch.linalg.norm(ref)),
            "max_absolute": float(diff.abs().max()), "mismatched": int(bad.sum()), "of": bad.numel(),
            "passes": not bool(bad.any())}


def sampler(fn, sets, launches: int, mode: str):
    """A function returning seconds per call over one sample of `launches` calls."""
    def enqueue():
        for i in range(launches):
            fn(*sets[i % len(sets)])

    run, graph = enqueue, None
    if mode == "graph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            enqueue()
        run = graph.replay
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    run()  # warm-up, not recorded
    torch.cuda.synchronize()

    def sample():
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / launches

    sample.graph = graph  # keeps the graph alive as long as the sampler
    return sample


def random_set(shape, dtype, generator):
    M, N, K = shape
    a = torch.randn((M, K), generator=generator, device="cuda", dtype=torch.float32).to(dtype)
    b = torch.randn((K, N), generator=generator, device="cuda", dtype=torch.float32).to(dtype)
    return a, b, torch.empty((M, N), device="cuda", dtype=dtype)


def best_config() -> dict | None:
    cfg = getattr(affine_leaky_gemm, "best_config", None)
    if cfg is None:
        return None
    return {**{k: cfg.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def measure_shape(shape, index: int, args, dtype, l2_bytes: int) -> dict:
    M, N, K = shape
    rtol, atol = TOLERANCE[args.dtype]
    seed = args.seed + index
    generator = torch.Generator(device="cuda").manual_seed(seed)
    first = random_set(shape, dtype, generator)
    bias = torch.full((N,), BETA, device="cuda", dtype=dtype)
    ref = reference(first[0], first[1])
    triton_fused(*first)  # autotunes for this (M, N, K, dtype)
    torch.cuda.synchronize()
    case = {"shape": [M, N, K], "seed": seed, "best_config": best_config(),
            "error": error(first[2], ref, rtol, atol)}
    torch_eager(*first, bias)
    case["torch_error"] = error(first[2], ref, rtol, atol)
    del ref
    failing = [name for name, key in (("triton", "error"), ("torch", "torch_error")) if not case[key]["passes"]]
    for name in failing:
        print(f"{shape_key(shape)} {args.dtype}: {name} fails rtol={rtol}, atol={atol}: "
              f"{case['error' if name == 'triton' else 'torch_error']}")
    if failing and args.time_anyway:
        case["timed_despite_tolerance_failure"] = failing
    untimed = set() if args.time_anyway else set(failing)

    set_bytes = (M * K + K * N + M * N) * first[0].element_size()
    sets = [first] + [random_set(shape, dtype, generator) for _ in range(input_sets_for(set_bytes, l2_bytes) - 1)]
    case["input_sets"] = len(sets)
    probe = sampler(triton_fused, sets, 5, "loop")
    launches = launches_for(min(probe() for _ in range(3)), args.target_ms)
    case["launches_per_sample"] = launches
    variants = {"triton": triton_fused, "torch": lambda a, b, c: torch_eager(a, b, c, bias)}
    samplers = {name: sampler(fn, sets, launches, args.timing) for name, fn in variants.items()
                if name not in untimed}
    times = {name: [] for name in samplers}
    order = list(samplers)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(samplers[name]())
    flops = 2.0 * M * N * K
    if "triton" in times:
        seconds = median(times["triton"])
        case.update(us=seconds * 1e6, tflops=flops / seconds / 1e12,
                    samples_us=[t * 1e6 for t in times["triton"]])
    if "torch" in times:
        seconds = median(times["torch"])
        case.update(torch_us=seconds * 1e6, torch_tflops=flops / seconds / 1e12)
    if "us" in case and "torch_us" in case:
        case["torch_over_triton"] = case["torch_us"] / case["us"]
    del samplers, sets, first
    torch.cuda.empty_cache()
    return case


def measure(shapes, args):
    dtype = getattr(torch, args.dtype)
    # Float32 accumulation everywhere: no TF32, no reduced-precision split-K in cuBLAS.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES
    cases = {}
    for index, shape in enumerate(shapes):
        case = measure_shape(shape, index, args, dtype, l2_bytes)
        cases[shape_key(shape)] = case
        print(f"{shape_key(shape):>18} {args.dtype}: triton {case.get('us', float('nan')):9.1f} us "
              f"({case.get('tflops', float('nan')):6.1f} TFLOP/s, {case['best_config']})  "
              f"torch {case.get('torch_us', float('nan')):9.1f} us", flush=True)
    rtol, atol = TOLERANCE[args.dtype]
    section = {
        **recorded_at(),
        "operation": f"leaky_relu({ALPHA} * (A @ B) + {BETA}, slope {SLOPE}); A MxK, B KxN row-major; "
                     f"output in the input dtype",
        "metric": f"device time per call: CUDA events around a {args.timing} of launches_per_sample calls, "
                  f"triton and torch alternating, median over rounds; warm-up excluded",
        "precision": {
            "triton": "float32 accumulation and epilogue; tl.dot input_precision='ieee' for float32",
            "torch": "eager addmm(bias, A, B, alpha) then in-place leaky_relu (two kernels, epilogue in "
                     "the input dtype); allow_tf32=False, reduced-precision reductions off",
            "reference": "torch float64 matmul and epilogue of the same rounded inputs",
            "rtol": rtol, "atol": atol,
        },
        "configuration": {"dtype": args.dtype, "shapes": [list(s) for s in shapes], "seed": args.seed,
                          "rounds": args.rounds, "target_ms": args.target_ms, "timing": args.timing,
                          "time_anyway": args.time_anyway, "l2_bytes": l2_bytes,
                          "autotune_configs": [dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps",
                                                         "num_stages"), c)) for c in CONFIGS]},
        "cases": cases,
    }
    versions = {"torch": torch.__version__, "triton": triton.__version__, "device": props.name,
                "capability": list(torch.cuda.get_device_capability(0)), "cuda": torch.version.cuda}
    return section, versions
