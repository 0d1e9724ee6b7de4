"""One launch each of the 512x11008x4096 float16 product x @ w.T on the 128x256 warpgroup
tile without and with clusters of two (Schedule(cluster_size=2)), for ncu to profile
(tools/probes/cluster_gemm.py times them):

    ncu -k regex:linear --metrics ... python3 tools/probes/cluster_gemm_once.py [M N K]

Needs the cluster implementation of commit 1694832, reverted by the commit after it (see
benchmarks/results/README.md, twenty-eighth session): on main, Schedule has no cluster_size.
"""
import sys

import mlx.core as mx

sys.path.insert(0, ".")
import metile  # noqa: E402
from metile import ops  # noqa: E402

m, n, k = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (512, 11008, 4096)
x = mx.random.normal((m, k)).astype(mx.float16)
w = (mx.random.normal((n, k)) * k ** -0.5).astype(mx.float16)
mx.eval(x, w)
for cluster in (None, 2):
    block = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_simdgroups=8, TRANSPOSE_B=True)
    if cluster:
        block["SCHEDULE"] = metile.Schedule(cluster_size=cluster)
    print("cluster", cluster, flush=True)
    for _ in range(2):   # the first launch compiles; ncu sees both
        mx.eval(ops._launch_linear(x, w, None, None, None, 0.0, block))
