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
   types reinterpret bits, Metal's convert element-wise.  So does a C-style
   cast of an unparenthesised operand, ``(float4)iv``, ``(int2)-v.xy``,
   ``(half4)a[i]`` (the operand is read as C reads a cast's: unary operators,
   then a name, number or parenthesised group, then member, index and call
   suffixes); one whose operand cannot be read so is an error (it summed to
   1.4e-44 for ``(float4)int4(1, 2, 3, 4)``).
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
# (not a cast of a cast, `(float2)(int2)u`: the operand there is `(int2)u`, _bare_c_casts')
_C_CAST = re.compile(rf"\(\s*({_VECTOR_TYPE})\s*\)\s*\((?!\s*{_VECTOR_TYPE}\s*\))")
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


_BARE_C_CAST = re.compile(rf"\(\s*({_VECTOR_TYPE})\s*\)(?!\s*\((?!\s*{_VECTOR_TYPE}\s*\)))")
_CLOSING = {"(": ")", "[": "]"}


def _group_end(text: str, i: int) -> int:
    """The index after the bracket group opening at text[i] ('(' or '['), or -1."""
    stack = []
    for j in range(i, len(text)):
        c = text[j]
        if c in _CLOSING:
            stack.append(_CLOSING[c])
        elif c in ")]":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return j + 1
    return -1


def _operand_end(text: str, i: int) -> int:
    """The end of the cast operand starting at text[i] (a C unary expression), or -1."""
    while i < len(text) and text[i].isspace():
        i += 1
    if text.startswith(("++", "--"), i):
        return _operand_end(text, i + 2)
    if i < len(text) and text[i] in "-+!~*&":
        return _operand_end(text, i + 1)
    m = _BARE_C_CAST.match(text, i)
    if m:   # a cast of a cast
        return _operand_end(text, m.end())
    if i < len(text) and text[i] == "(":
        j = _group_end(text, i)
    else:
        m = re.compile(r"(?:::)?[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*|"
                       r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[A-Za-z]*").match(text, i)
        j = m.end() if m else -1
        if m and m.group().startswith("::metile_rt::"):
            # this module's own template calls (convert<int2>(u) of a cast of a cast); a
            # user's `a < b` is never read as template arguments
            t = re.compile(r"\s*<[^<>()]*>").match(text, j)
            j = t.end() if t else j
    while j > 0:   # member, index, call and increment suffixes
        m = re.compile(r"\s*(?:\.|->)\s*[A-Za-z_]\w*|\s*(?:\+\+|--)").match(text, j)
        if m:
            j = m.end()
            continue
        k = j
        while k < len(text) and text[k].isspace():
            k += 1
        if k < len(text) and text[k] in "([":
            j = _group_end(text, k)
            continue
        break
    return j


def _bare_c_casts(text: str) -> str:
    """``(V)operand`` -> ``::metile_rt::convert<V>(operand)`` for vector types V."""
    out, pos = [], 0
    for m in _BARE_C_CAST.finditer(text):
        if m.start() < pos:
            continue
        before = text[:m.start()].rstrip()
        word = re.search(r"[A-Za-z_]\w*$", before)
        if (before.endswith((")", "]")) or (word and word.group() not in ("return", "case"))) \
                or before.endswith(("<", ",")) and _in_template_args(before):
            continue   # sizeof(float4), a call's parenthesised argument, a template argument
        end = _operand_end(text, m.end())
        if end < 0:
            line = text.count("\n", 0, m.start()) + 1
            raise ValueError(f"line {line}: the C-style vector cast {m.group().strip()} - "
                             f"its operand could not be read; write {_strip_metal(m.group(1))}(...)"
                             f" (clang's cast between vector types reinterprets bits, Metal's "
                             f"converts each element)")
        out.append(text[pos:m.start()])
        out.append(f"::metile_rt::convert<{_strip_metal(m.group(1))}>("
                   f"{_bare_c_casts(text[m.end():end])})")
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _in_template_args(before: str) -> bool:
    return before.count("<") > before.count(">")


def rewrite_msl(source: str) -> str:
    """Returns ``source`` with the rewrites listed in this module's docstring
    applied.  Idempotent: rewriting twice gives the same text."""
    out = _INSTANTIATION_ATTRS.sub("template ", source)
    out = _STATIC_CAST.sub(lambda m: f"::metile_rt::convert<{_strip_metal(m.group(1))}>(", out)
    out = _C_CAST.sub(lambda m: f"::metile_rt::convert<{_strip_metal(m.group(1))}>(", out)
    out = _VEC_CTOR.sub(_make_vec, out)
    out = _bare_c_casts(out)   # (after make_vec: `(float4)vec<int, 4>(...)` reads whole)
    out = _BF_LITERAL.sub(_bf_literal, out)
    return out
