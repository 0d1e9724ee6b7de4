"""SASS of quantized_matvec_pairs for a configuration, on a machine without a GPU (NVRTC and
nvdisasm from their pip wheels): the instruction mix of the kernel and of its K loop, so a
change to the GEMV's code can be weighed before device time is spent on it.

    python tools/probes/pairs_sass.py ROWS=8 SPAN=4 num_warps=1 [--dump FILE]
"""

import argparse
import collections
import math
import re
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, "tests")
sys.path.insert(0, ".")


def sass(config: dict, n=11008, k=4096, bits=4, dtype="float16") -> str:
    import mlx.core as mx
    import nvrtc as tools
    from metile_kernels import quantized_pairs as kernels

    dt = getattr(mx, dtype)
    x = mx.zeros((1, k), dt)
    w = mx.zeros((n, k * bits // 32), mx.uint32)
    s = mx.zeros((n, k // 64), dt)
    params = {key: v for key, v in config.items() if key != "kernel"}
    meta = dict(BITS=bits, GROUP=64, **params)
    meta.update(kernels.pair_constants(dtype, bits), DTYPE=getattr(__import__("metile"), dtype),
                EVEN=(k * bits // 32) % (params.get("LANES", 32) * params["SPAN"]) == 0)
    grid = (math.ceil(n / params["ROWS"]), 1)
    d = kernels.quantized_matvec_pairs[grid].prepare(
        x if params.get("X_HALVES") else x.view(mx.uint64),
        w.view(mx.uint64) if params.get("W64") else w, s, s, mx.zeros((1, n), dt), 1, n,
        k, meta["MAGIC"], backend="cuda",
        **meta)
    data, log = tools.cubin(tools.translation_unit(d), "sm_90", ("-Xptxas", "-v"))
    print(" ".join(re.findall(r"Used \d+ registers|\d+ bytes spill \w+", log)))
    return tools.disassemble(data)


def mix(text: str) -> tuple[collections.Counter, collections.Counter]:
    """(opcode counts of the whole kernel, of its largest backward-branch loop body)."""
    whole, bodies = loops(text)
    return whole, max(bodies, key=lambda c: sum(c.values()), default=collections.Counter())


def loops(text: str) -> tuple[collections.Counter, list[collections.Counter]]:
    """(opcode counts of the whole kernel, of each backward-branch loop body)."""
    lines = [l for l in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
    ops = []
    for l in lines:
        body = l.split("*/", 1)[1].strip()
        body = re.sub(r"^@!?U?P\w+\s+", "", body)
        ops.append((int(l.split("*/")[0].strip()[2:], 16), body.split()[0].rstrip(";")
                    if body else "", body))
    whole = collections.Counter(o for _, o, _ in ops)
    bodies = []
    for at, op, body in ops:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", body)
        target = re.search(r"\.L_x_(\d+)", body)
        if op == "BRA" and target:
            label = f".L_x_{target.group(1)}:"
            starts = [i for i, l in enumerate(text.splitlines()) if l.strip() == label]
            if not starts:
                continue
            start_line = text.splitlines()[starts[0] + 1]
            start = int(start_line.split("*/")[0].strip()[2:], 16) if "/*" in start_line else None
            if start is not None and start < at:
                bodies.append(collections.Counter(o for a, o, _ in ops if start <= a <= at))
    return whole, bodies


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("settings", nargs="*", help="KEY=VALUE of the configuration")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--dump")
    args = parser.parse_args()
    config = {"kernel": "matvec_pairs", "ROWS": 8, "SPAN": 4, "num_warps": 1}
    for item in args.settings:
        key, value = item.split("=")
        config[key] = int(value) if value.lstrip("-").isdigit() else value
    text = sass(config, bits=args.bits, dtype=args.dtype)
    if args.dump:
        open(args.dump, "w").write(text)
    whole, loop = mix(text)
    rows, span, lanes = config["ROWS"], config["SPAN"], config.get("LANES", 32)
    weights = rows * span * (32 // args.bits) * lanes / 32 * config.get("num_warps", 1) / (lanes // 32)
    print(config, f"kernel {sum(whole.values())} instructions, loop {sum(loop.values())}"
          f" ({sum(loop.values()) / (rows * span * (32 // args.bits)):.2f} a weight a lane)")
    print("  loop:", ", ".join(f"{o} {c}" for o, c in loop.most_common()))
