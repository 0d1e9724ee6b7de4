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
    # add_rms_norm (issue 17: >= 1.5x against MLX's add followed by its rms_norm): MLX's
    # two kernels, then each configuration `auto` measures; with the copy's time
    # (tools/probes/hbm_ceiling.py) these bound what fusing the add can give
    r = mx.random.normal(x.shape).astype(x.dtype)
    mx.eval(r)

    def mlx_pair():
        h = x + r
        return h, mx.fast.rms_norm(h, w, EPS)

    cases["add_rms_norm"] = (mlx_pair,) + tuple(
        (lambda c: lambda: model_ops._add_rms_fn(EPS, True, model_ops._frozen(c))(x, r, w))(c)
        for c in model_ops.configs("add_rms_norm", x.shape[-1]))
    for op in sys.argv[1:] or list(cases):
        names = ["mlx"] + ["metile"] + [f"metile-config{i}" for i in range(1, len(cases[op]) - 1)]
        for who, fn in zip(names, cases[op]):
            for _ in range(4):
                mx.eval(fn())
            mx.synchronize()
            print(op, who, "done", flush=True)


if __name__ == "__main__":
    main()
