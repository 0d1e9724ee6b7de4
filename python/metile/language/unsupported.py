"""Names of Triton's `tl` namespace that metile does not build (yet), with the reason.

A kernel that reaches for one (`metile.make_block_ptr`, `metile.math.softmax`) gets a
located CompilationError naming it instead of a bare missing attribute.  A name
leaves this table when it is built; the lookup only runs for missing names.
"""

_NOT_YET = "not built yet"
_NO_FP8 = ("AMD's and the legacy fp8 formats are not built (metile has NVIDIA's/OCP's "
           "float8e4nv and float8e5)")
_SHAPE = ("this shape op is not built yet (metile.reshape, metile.trans/permute, "
          "metile.expand_dims, metile.broadcast_to, join, split, interleave, cat and flip are)")

REASONS = {
    "float64": "metile has no float64 (Metal has none)",
    **{n: _NO_FP8 for n in ("float8e4b15", "float8e4b8", "float8e5b16")},
    "gather": _SHAPE,
    "tensor_descriptor": "the descriptor type cannot be named, and host-side descriptors "
                         "are not kernel arguments; build one in the kernel with "
                         "metile.make_tensor_descriptor",
    **{n: "not built yet (metile has reduce, associative_scan, cumsum, cumprod, argmax and "
          "argmin)" for n in ("histogram", "softmax")},
    "inline_asm_elementwise": "inline assembly cannot be portable across Metal and CUDA",
    "dot_scaled": "scaled (microscaling) dot products are not built",
    "full_like": _NOT_YET,
    "pointer_type": "pointer types cannot be named: MLX exposes no device addresses",
    "extra": "backend libraries (tl.extra.cuda.libdevice) are CUDA-only; metile.math has "
             "the portable functions (e.g. metile.math.asin for libdevice.asin)",
}


def reason(name: str) -> str | None:
    return REASONS.get(name)
