"""Does decode attention's split kernel wait on HBM latency that an L2 prefetch hides?

s97's ncu put `attention_decode` at 3.07 TB/s (64% of the H200's DRAM) at 4096 keys, 25%
theoretical occupancy, half its issue slots waiting on L1TEX; more loads in flight through
registers (AHEAD=2, 16-key blocks) did not help (s116).  A bulk prefetch into L2
(`cp.async.bulk.prefetch.L2.global`, sm_90: one instruction for a contiguous range, no
registers held) asks the HBM for key blocks ahead of the loads, which then hit L2.  This
probe patches the kernel's generated CUDA (this process only; the cubin cache is keyed by
the patched text) and measures the op as benchmarks.attention does (8 attentions a
compiled call, each over its own cache, alternating with MLX's op, output checked against
MLX's first):

    python3 tools/probes/decode_prefetch.py --variant none|iter2|iter4|iter8|whole|lines4
    python3 tools/probes/decode_prefetch.py --all --output $OUT/decode-prefetch.json
    python3 tools/probes/decode_prefetch.py --target gemv --all --variants none whole none

The same for the int4 decode GEMV (`--target gemv`: quantized_matvec_pairs, 1x4096x11008
group 64 float16 as `benchmarks.quantized --chain 8 --weights 4` runs it, ROWS 8): s99's
ncu put it at 38-41% of DRAM with half its stalls on global loads; `whole` prefetches each
program's rows of packed words, scales and biases (16 KB + 2 KB, contiguous) at its start.

iterN: thread 0 prefetches the K and V block N blocks ahead at each loop step; whole:
the split's whole K and V ranges at the start; linesN: a lane a 128-byte line of the block
N ahead (`prefetch.global.L2`).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

sys.path.insert(0, "kernels")
sys.path.insert(0, ".")

LOOP = re.compile(r"for \(int64_t (_k\d+)_w = (_v\d+); \1_w < (_v\d+); \1_w \+= 8\) \{\n"
                  r"  const int \1 = \(int\)\1_w;\n")
# the split's K/V offset, from the kernel's own parameters (attention_decode's kv_offset)
OFFSET = ("const int _pf_row = static_cast<int>(blockIdx.x) % rows_total;\n"
          "const int _pf_head = (_pf_row / q_len) % q_heads;\n"
          "const int _pf_batch = _pf_row / (q_len * q_heads);\n"
          "const long long _pf_off = ((long long)(_pf_batch * (q_heads / group) + _pf_head / group)"
          " * (kv_len + kv_pad) + kv_start) * 128;\n")
BULK = ('asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"({ptr}), "r"({n}) '
        ': "memory");\n')


def patch(source: str, variant: str) -> str:
    if variant == "none":
        return source
    m = LOOP.search(source)
    if m is None:      # (another block size: left as it is, reported as not patched)
        return source
    k, lo, hi = m.group(1), m.group(2), m.group(3)
    if variant.startswith("iter"):
        n = int(variant[4:])
        code = (f"if (threadIdx.x == 0 && {k} + {8 * n} + 8 <= {hi}) {{\n" + OFFSET +
                BULK.format(ptr=f"&K[_pf_off + (long long)({k} + {8 * n}) * 128]", n=2048) +
                BULK.format(ptr=f"&V[_pf_off + (long long)({k} + {8 * n}) * 128]", n=2048) + "}\n")
        return source[:m.end()] + code + source[m.end():]
    if variant.startswith("lines"):
        n = int(variant[5:])
        code = (f"if (threadIdx.x < 32 && {k} + {8 * n} + 8 <= {hi}) {{\n" + OFFSET +
                f"const __half* _pf_b = (threadIdx.x < 16 ? (const __half*)&K[0] : (const __half*)&V[0]);\n"
                f"const char* _pf_p = (const char*)(_pf_b + _pf_off + (long long)({k} + {8 * n}) * 128)"
                f" + (threadIdx.x % 16) * 128;\n"
                'asm volatile("prefetch.global.L2 [%0];" :: "l"(_pf_p));\n}\n')
        return source[:m.end()] + code + source[m.end():]
    if variant == "whole":
        code = (f"if (threadIdx.x == 0 && {hi} > {lo}) {{\n" + OFFSET +
                BULK.format(ptr=f"&K[_pf_off + (long long){lo} * 128]", n=f"({hi} - {lo}) * 256") +
                BULK.format(ptr=f"&V[_pf_off + (long long){lo} * 128]", n=f"({hi} - {lo}) * 256") +
                "}\n")
        return source[:m.start()] + code + source[m.start():]
    raise SystemExit(f"unknown variant {variant!r}")


GEMV_ROWS = 8
GEMV_LOOP = re.compile(r"for \(int64_t (_k\d+)_w = ")


def patch_gemv(source: str, variant: str) -> str:
    """quantized_matvec_pairs (4-bit, group 64, ROWS 8) with its program's packed words,
    scales and biases prefetched into L2 before its loop."""
    if variant == "none":
        return source
    m = GEMV_LOOP.search(source)
    if m is None or variant != "whole":
        return source
    code = ("if (threadIdx.x == 0) {\n"
            f"const int _pf_first = static_cast<int>(blockIdx.x) * {GEMV_ROWS};\n"
            f"const int _pf_rows = min({GEMV_ROWS}, N - _pf_first);\n"
            "if (_pf_rows > 0) {\n"
            "const long long _pf_words = K / 8, _pf_groups = K / 64;\n" +
            BULK.format(ptr="&w[_pf_first * _pf_words]",
                        n="(unsigned)((_pf_rows * _pf_words * 4) & ~15LL)") +
            BULK.format(ptr="&scales[_pf_first * _pf_groups]",
                        n="(unsigned)((_pf_rows * _pf_groups * 2) & ~15LL)") +
            BULK.format(ptr="&biases[_pf_first * _pf_groups]",
                        n="(unsigned)((_pf_rows * _pf_groups * 2) & ~15LL)") +
            "}\n}\n")
    return source[:m.start()] + code + source[m.start():]


def patch_compiles(kernel: str, edit) -> list:
    """NVRTC's compiles of `kernel` (its label holds the name) take `edit(source)`; the list
    returned records, a compile each, whether the edit changed the source."""
    from metile.runtime import nvrtc

    original = nvrtc.compile
    patched = []

    def compile(source, arch, label="kernel"):
        if kernel in label:
            changed = edit(source)
            patched.append(changed != source)
            source = changed
        return original(source, arch, label)

    nvrtc.compile = compile
    return patched


def run_gemv(variant: str, launches, rounds) -> None:
    from benchmarks import quantized as bench

    patched = patch_compiles("quantized_matvec_pairs", lambda src: patch_gemv(src, variant))
    sys.argv = ["quantized", "--dtype", "float16", "--bits", "4", "--group-size", "64",
                "--weights", "4", "--chain", "8", "--prefill-off", "--launches", str(launches),
                "--rounds", str(rounds)]
    print(f"gemv variant {variant}", flush=True)
    bench.main()
    print(f"gemv variant {variant} patched={patched}", flush=True)


def run(variant: str, lengths, launches, rounds, replace=None) -> list[dict]:
    import mlx.core as mx
    from benchmarks import attention as bench
    if replace:        # another attention_decode (FILE:NAME), which the op then launches
        import importlib.util
        from metile_kernels import attention as library
        path, name = replace.split(":")
        spec = importlib.util.spec_from_file_location("decode_variant", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        library.attention_decode = getattr(module, name)
        variant = "none"
    patched = patch_compiles("attention_decode", lambda src: patch(src, variant))
    results = []
    for lk in lengths:
        case = dict(name="decode", b=1, hq=32, hkv=32, lq=1, lk=lk, d=128, mask=None)
        r = bench.measure(case, mx.float16, launches, rounds, chain=8)
        r["variant"] = replace or variant
        r["patched"] = list(patched)
        print(f"{replace or variant:8s} {lk:6d} keys: metile {r['us_per_call']['metile']:.1f} us, mlx "
              f"{r['us_per_call']['mlx']:.1f} ({r['mlx_over_metile']:.3f}x), "
              f"{r['tb_per_s']['metile']:.2f} TB/s, patched={patched}", flush=True)
        results.append(r)
    return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="none")
    p.add_argument("--all", action="store_true")
    p.add_argument("--variants", nargs="+",
                   default=["none", "iter2", "iter4", "iter8", "whole", "lines4", "none"])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--launches", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--output")
    p.add_argument("--target", default="attention", choices=["attention", "gemv"])
    p.add_argument("--replace", help="FILE:NAME of an attention_decode variant to run instead")
    a = p.parse_args()
    if a.target == "gemv" and not a.all:
        run_gemv(a.variant, a.launches, a.rounds)
        return
    if not a.all:
        out = run(a.variant, a.lengths, a.launches, a.rounds, a.replace)
        print("JSON " + json.dumps(out, default=str))
        return
    from benchmarks.common import machine
    everything = []
    for v in a.variants:   # a process each: the kernel compiles once per process
        extra = ["--replace", v[len("replace="):]] if v.startswith("replace=") else ["--variant", v]
        r = subprocess.run([sys.executable, __file__, "--target", a.target, *extra, "--lengths",
                            *map(str, a.lengths), "--launches", str(a.launches),
                            "--rounds", str(a.rounds)], capture_output=True, text=True)
        sys.stdout.write("".join(l + "\n" for l in r.stdout.splitlines()
                                 if not l.startswith("JSON ")))
        if r.returncode:
            print(f"{v}: failed\n{r.stderr[-3000:]}", flush=True)
            continue
        for line in r.stdout.splitlines():
            if line.startswith("JSON "):
                everything += json.loads(line[5:])
    if a.output:
        with open(a.output, "w") as f:
            json.dump({"machine": machine(), "probe": "decode_prefetch", "cases": everything},
                      f, indent=1, default=str)


if __name__ == "__main__":
    main()
