"""Kernel-only durations of metile's row kernels and MLX's own ops at 16384x8192
float16, for ncu: each op is launched 3 times after one warm-up call, so
`ncu --metrics gpu__time_duration.sum` separates the kernels' GPU time from what the
benchmark's per-call latency adds around them (launch gaps, allocation).

    ncu --metrics gpu__time_duration.sum --csv python3 tools/probes/row_kernels_vs_mlx.py
"""
import sys

import mlx.core as mx

sys.path.insert(0, "kernels")
sys.path.insert(0, "tools/probes")
from metile import model_ops  # noqa: E402
from row_kernels_profile import CONFIG, inputs  # noqa: E402

EPS = 1e-5


def main():
    x, w = inputs()
    mx.synchronize()
    rms, soft, layer = ((("num_warps", CONFIG[op]),)
                        for op in ("rms_norm", "softmax", "layer_norm"))
    cases = {
        "rms_norm": (lambda: mx.fast.rms_norm(x, w, EPS),
                     lambda: model_ops._rms_fn(EPS, True, rms)(x, w)),
        "softmax": (lambda: mx.softmax(x, axis=-1),
                    lambda: model_ops._softmax_fn(soft)(x)),
        "layer_norm": (lambda: mx.fast.layer_norm(x, w, w, EPS),
                       lambda: model_ops._layer_fn(EPS, True, True, layer)(x, w, w)),
    }
    for op in sys.argv[1:] or list(cases):
        for who, fn in zip(("mlx", "metile"), cases[op]):
            for _ in range(4):
                mx.eval(fn())
            mx.synchronize()
            print(op, who, "done", flush=True)


if __name__ == "__main__":
    main()
