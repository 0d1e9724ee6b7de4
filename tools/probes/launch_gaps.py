"""The GPU timeline of back-to-back compiled calls: metile's softmax / rms_norm against
MLX's op, as the model_ops benchmark enqueues them (N calls, one eval, one sync), for
nsys: the gap between consecutive kernels is what the benchmark's per-call latency adds
to the kernel's own time.

    nsys profile -t cuda -o gaps python3 tools/probes/launch_gaps.py [rows: 256 columns]
    nsys stats -r cuda_gpu_trace -f csv gaps.nsys-rep
"""
import sys

import mlx.core as mx

sys.path.insert(0, "kernels")
from metile import model_ops  # noqa: E402

EPS = 1e-5


def main():
    rows, columns = (16384, 8192) if len(sys.argv) < 2 else (int(sys.argv[1]), 256)
    x = mx.random.normal((rows, columns)).astype(mx.float16)
    w = mx.random.normal((columns,)).astype(mx.float16)
    mx.eval(x, w)
    fns = {
        "mlx_softmax": mx.compile(lambda x, w: mx.softmax(x, axis=-1)),
        "metile_softmax": mx.compile(lambda x, w: model_ops._softmax_fn((("num_warps", 4),))(x)),
        "mlx_rms_norm": mx.compile(lambda x, w: mx.fast.rms_norm(x, w, EPS)),
        "metile_rms_norm": mx.compile(
            lambda x, w: model_ops._rms_fn(EPS, True, (("num_warps", 16),))(x, w)),
    }
    for name, fn in fns.items():
        for _ in range(2):          # warm-up, then the traced batch
            mx.eval([fn(x, w) for _ in range(30)])
            mx.synchronize()
        print(name, "done", flush=True)


if __name__ == "__main__":
    main()
