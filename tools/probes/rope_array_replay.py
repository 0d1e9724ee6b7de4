"""Which offset rope's kernel applied when it takes the offset as a one-element array,
launched again and again with new offsets (the replay form that rotated wrongly on CUDA
in the thirty-second session's GPU tests, s115).

    python tools/probes/rope_array_replay.py

For each form and offset it prints which offset the output matches (MLX's op at the
call's offset, at the form's first offset, at 0) or its largest error."""
import dataclasses

import mlx.core as mx
import numpy as np

import metile
from metile import model_ops

OFFSETS = [0, 1, 2, 37, 300, 5]


def which(out, x, offsets_tried, **kw):
    for o in offsets_tried:
        want = mx.fast.rope(x, 16, traditional=False, base=10000.0, scale=0.5, offset=o, **kw)
        if np.allclose(np.array(out, np.float64), np.array(want, np.float64), rtol=1e-4, atol=1e-4):
            return f"matches offset {o}"
    want = mx.fast.rope(x, 16, traditional=False, base=10000.0, scale=0.5, offset=offsets_tried[0])
    return f"max error {float(mx.abs(out - want).max()):.3g} (none of {offsets_tried})"


def main():
    print("device", mx.default_device())
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((2, 3, 1, 20)).astype(np.float32))
    spec = model_ops._Rope(16, False, 10000.0, 0.5, None, "array", 1, 3)
    shared = model_ops._rope_fn(spec, True, False, (("ROWS", 1),))
    for form in ("custom_function", "evaluated_offset", "kernel_direct", "full_path_array"):
        for o in OFFSETS:
            off = mx.array([o], mx.int32)
            if form == "evaluated_offset":
                mx.eval(off)
            if form in ("custom_function", "evaluated_offset"):
                out = shared(model_ops._rows(x), off).reshape(x.shape)
            elif form == "kernel_direct":
                out = model_ops._launch_rope(model_ops._rows(x), spec, off, None, {"ROWS": 1}).reshape(x.shape)
            else:
                out = metile.ops.rope(x, 16, traditional=False, base=10000.0, scale=0.5,
                                      offset=mx.array(o, mx.int32), backend="metile")
            mx.eval(out)
            print(f"{form:18s} offset {o:4d}: {which(out, x, [o, OFFSETS[0], 0])}", flush=True)
    try:
        from metile_kernels import rope as kernels
        d = kernels.rope.last_dispatch
        print("by value:", d.variant.compiled.lowering.get("launch", {}).get("scalars_by_value"))
        print("input roles:", d.variant.compiled.input_roles)
    except Exception as e:  # (a report only)
        print("no dispatch report:", e)


if __name__ == "__main__":
    main()
