"""Source rewrites that MSL needs before it compiles as C++ against metile's
Metal shim (include/metal_stdlib).

Most of MSL compiles unchanged against the shim: vector constructors such as
``float4(a.xy, 1, 2)`` are handled there by function-like macros (a
function-like macro expands only when followed by ``(``, so ``float4 x``,
``device float4*`` and ``as_type<float4>(y)`` keep naming the type).  What a
header cannot handle is rewritten here, on the user's source only (never on
the shim):

1. ``vec<T, N>(args)`` (optionally ``metal::vec``) becomes
   ``::metile_rt::make_vec<T, N>(args)``: Metal vector construction
   (splat, element-wise conversion, concatenation).  ``vec<T, N>`` not
   followed by ``(`` is left alone.
2. ``static_cast<V>(x)`` and the parenthesised C-style cast ``(V)(x)``, where
   V is a vector type name (``float4``, ``bool2``, ``vec<T, N>``, ...),
   become ``::metile_rt::convert<V>(x)``: clang's own casts between vector
   types reinterpret bits, Metal's convert element-wise.  A C-style cast
   without parentheses around the operand, ``(float4)x``, is not rewritten
   (it splats a scalar correctly but reinterprets a vector).
3. bfloat literals ``1.5bf`` / ``2bf`` become ``((bfloat)1.5f)`` /
   ``((bfloat)2)``: clang cannot define a ``bf`` literal suffix.
4. Attribute lists after ``template`` in explicit instantiations
   (``template [[host_name("k")]] [[kernel]] decltype(f<float>) f<float>;``)
   are dropped: clang rejects attributes there.

Everything else, in particular ``threadgroup`` declarations in kernel bodies
and the ``metile_lane_main`` wrapper, is the source generator's job.
"""

from __future__ import annotations

import re

__all__ = ["rewrite_msl", "VECTOR_TYPE_NAMES"]

_SCALARS = ("bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "float", "bfloat")
VECTOR_TYPE_NAMES = tuple(f"{s}{n}" for s in _SCALARS for n in (2, 3, 4))

_VEC_NAME = r"(?:" + "|".join(VECTOR_TYPE_NAMES) + r")"
# vec<...> with at most one level of nested <...> in its arguments.
_VEC_TEMPLATE = r"(?:metal\s*::\s*)?vec\s*<(?:[^<>]|<[^<>]*>)*>"
_VECTOR_TYPE = rf"(?:(?:metal\s*::\s*)?\b{_VEC_NAME}\b|{_VEC_TEMPLATE})"

_VEC_CTOR = re.compile(rf"(?<![\w:.])({_VEC_TEMPLATE})\s*\(")
_STATIC_CAST = re.compile(rf"\bstatic_cast\s*<\s*({_VECTOR_TYPE})\s*>\s*\(")
_C_CAST = re.compile(rf"\(\s*({_VECTOR_TYPE})\s*\)\s*\(")
_BF_LITERAL = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)bf\b")
_INSTANTIATION_ATTRS = re.compile(r"\btemplate\s*((?:\[\[(?:[^\]]|\](?!\]))*\]\]\s*)+)(?=[^\s<])")


def _strip_metal(type_text: str) -> str:
    return re.sub(r"^metal\s*::\s*", "", type_text)


def _make_vec(m: re.Match) -> str:
    args = re.match(r"(?:metal\s*::\s*)?vec\s*<(.*)>$", m.group(1), re.S).group(1)
    return f"::metile_rt::make_vec<{args}>("


def _bf_literal(m: re.Match) -> str:
    num = m.group(1)
    if re.fullmatch(r"\d+", num):
        return f"((bfloat){num})"
    return f"((bfloat){num}f)"


def rewrite_msl(source: str) -> str:
    """Returns ``source`` with the rewrites listed in this module's docstring
    applied.  Idempotent: rewriting twice gives the same text."""
    out = _INSTANTIATION_ATTRS.sub("template ", source)
    out = _STATIC_CAST.sub(lambda m: f"::metile_rt::convert<{_strip_metal(m.group(1))}>(", out)
    out = _C_CAST.sub(lambda m: f"::metile_rt::convert<{_strip_metal(m.group(1))}>(", out)
    out = _VEC_CTOR.sub(_make_vec, out)
    out = _BF_LITERAL.sub(_bf_literal, out)
    return out
