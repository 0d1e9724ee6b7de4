"""SASS of the pair-dequantizing fused GEMM (quantized_ops.WGMMA_PAIRS / WGMMA_PAIRS_TALL)
on a machine without a GPU (NVRTC and nvdisasm from their pip wheels): registers, spills and
the instruction mix of its K loop, to weigh a change to the staging before device time.

    python tools/probes/pair_gemm_sass.py WGMMA_PAIRS_TALL [--m 512 --n 11008 --k 4096]
"""

import argparse
import re
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, "tests")
sys.path.insert(0, ".")
sys.path.insert(0, "tools/probes")


def sass(tile: str, m: int, n: int, k: int, dtype: str = "float16", dump=None):
    import mlx.core as mx
    import nvrtc as tools
    from metile import quantized_ops
    from metile_kernels import quantized as kernels
    from metile_kernels.quantized_pairs import unpack_constants

    config = getattr(quantized_ops, tile)
    dt = getattr(mx, dtype)
    meta = {key: v for key, v in config.items() if key != "kernel"}
    # (a config's BULK_X as the op passes it, for CUDA on any machine)
    backend = quantized_ops._bulk_x_backend("cuda") if meta.pop("BULK_X", False) else "cuda"
    wq, s, b = mx.quantize(mx.zeros((n, k), dt), group_size=64, bits=4)
    x = mx.zeros((m, k), dt)
    d = kernels.quantized_matmul[kernels.matmul_grid(m, n, meta["BLOCK_M"], meta["BLOCK_N"])].prepare(
        x, wq, s, b, mx.zeros((m, n), dt), m, n, k, BITS=4, GROUP=64, TRANSPOSE=True,
        GROUP_SHIFT=6, backend=backend, **meta,
        **{key.lower() if key == "MAGIC" else key: v for key, v in unpack_constants(dtype).items()})
    if dump:
        open(dump + ".cu", "w").write(d.source)
    data, log = tools.cubin(tools.translation_unit(d), "sm_90a", ("-Xptxas", "-v"))
    text = tools.disassemble(data)
    if dump:
        open(dump + ".sass", "w").write(text)
    return d, log, text


if __name__ == "__main__":
    from pairs_sass import loops, mix
    parser = argparse.ArgumentParser()
    parser.add_argument("tile", nargs="?", default="WGMMA_PAIRS_TALL")
    parser.add_argument("--m", type=int, default=512)
    parser.add_argument("--n", type=int, default=11008)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--dump")
    args = parser.parse_args()
    d, log, text = sass(args.tile, args.m, args.n, args.k, args.dtype, args.dump)
    print(" ".join(re.findall(r"Used \d+ registers|\d+ bytes spill \w+", log)) or log[-400:])
    print("passes:", " ".join(d.execution_report.passes))
    whole, loop = mix(text)
    print("kernel", sum(whole.values()), "instructions; largest loop", sum(loop.values()))
    # each K loop (a loop issuing products), by how x arrives: TMA boxes or cp.async groups
    for body in loops(text)[1]:
        if any(op.startswith("HGMMA") for op in body):
            how = "bulk tensor (UTMALDG)" if any(op.startswith("UTMALDG") for op in body) else \
                "cp.async (LDGSTS)" if any(op.startswith("LDGSTS") for op in body) else "other"
            print(f"  K loop of {sum(body.values())} instructions, x by {how}")
    print("  " + ", ".join(f"{op} {c}" for op, c in loop.most_common(30)))
