"""The warpgroup GEMM's bulk-tensor loop with its refills ordered by a block barrier a K
step (METILE_WGMMA_REFILL=barrier) or by per-stage "empty" mbarriers (=empty, the default:
no block barrier in the loop; thread 0 waits for the stage's release after issuing the
step's products), against MLX's product in one run.  The step's barrier was the top stall
of the 512x11008x4096 float16 product (ncu, H200, s107).

Each variant is traced (mx.compile) with its setting in the environment, checked against
MLX's result, then all are timed alternating, many calls a sync (mlp_gemm_tiles.measure).

    python3 tools/probes/refill_order.py [out.json] [--rounds 5] [--only 512]
"""
import argparse
import json
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "tools/probes")
from mlp_gemm_tiles import measure  # noqa: E402

CASES = [("linear", 512, 11008, 4096, (128, 256)), ("linear", 512, 4096, 11008, (128, 256)),
         ("linear", 512, 4096, 11008, (128, 128)), ("gated", 512, 11008, 4096, (128, 128)),
         ("linear", 2048, 11008, 4096, (128, 256)), ("linear", 2048, 4096, 11008, (128, 256)),
         ("gated", 2048, 11008, 4096, (128, 128)), ("linear", 4096, 4096, 4096, (128, 256))]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", type=int)
    args = p.parse_args()
    cases = []
    for kind, m, n, k, (bm, bn) in CASES:
        if args.only and m != args.only:
            continue
        block = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_simdgroups=8, TRANSPOSE_B=True)
        cases.append((kind, m, n, k, {
            f"{bm}x{bn} {refill}": (block, {"METILE_WGMMA_REFILL": refill}) for refill in ("barrier", "empty")}))
    report = measure(cases, args.rounds, "tools/probes/refill_order.py")
    if args.output:
        json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
