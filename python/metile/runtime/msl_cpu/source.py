"""Build the full kernel source the way MLX's metal_kernel does, plus the C++
entry point that lets the MSL CPU runtime call it.

MLX generates a kernel signature from the input/output names, their dtypes and
the builtin attributes the body mentions; user bodies are written against that
signature, so the CPU runtime must reproduce it exactly (same parameter
spelling, same `constant`/`device` choice, same `_shape/_strides/_ndim`
extras).  The Metal path sends the user's pieces to MLX unchanged; only the
CPU path uses this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx

# MLX passes an input as `constant` memory when it has fewer elements than this.
MAX_CONSTANT_ARRAY_SIZE = 8

_TYPE_NAMES = {
    mx.bool_: "bool",
    mx.uint8: "uint8_t",
    mx.uint16: "uint16_t",
    mx.uint32: "uint32_t",
    mx.uint64: "uint64_t",
    mx.int8: "int8_t",
    mx.int16: "int16_t",
    mx.int32: "int32_t",
    mx.int64: "int64_t",
    mx.float16: "float16_t",
    mx.bfloat16: "bfloat16_t",
    mx.float32: "float",
    mx.float64: "double",
}

# (attribute, MSL type, C++ expression over `lane` giving its value)
_ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint", "(_d3(lane->dispatch_threads_per_threadgroup) + 3) / 4"),
    ("dispatch_simdgroups_per_threadgroup", "uint", "(_d3(lane->dispatch_threads_per_threadgroup) + 31) / 32"),
    ("dispatch_threads_per_threadgroup", "uint3", "_u3(lane->dispatch_threads_per_threadgroup)"),
    ("grid_origin", "uint3", "uint3{0u, 0u, 0u}"),
    ("grid_size", "uint3", "_u3(lane->threads_per_grid)"),
    ("quadgroup_index_in_threadgroup", "uint", "lane->thread_index_in_threadgroup / 4"),
    ("quadgroups_per_threadgroup", "uint", "(_d3(lane->threads_per_threadgroup) + 3) / 4"),
    ("simdgroup_index_in_threadgroup", "uint", "lane->simdgroup_index_in_threadgroup"),
    ("simdgroups_per_threadgroup", "uint", "lane->simdgroups_per_threadgroup"),
    ("thread_execution_width", "uint", "32u"),
    ("thread_index_in_quadgroup", "uint", "lane->thread_index_in_threadgroup % 4"),
    ("thread_index_in_simdgroup", "uint", "lane->thread_index_in_simdgroup"),
    ("thread_index_in_threadgroup", "uint", "lane->thread_index_in_threadgroup"),
    ("thread_position_in_grid", "uint3", "_u3(lane->thread_position_in_grid)"),
    ("thread_position_in_threadgroup", "uint3", "_u3(lane->thread_position_in_threadgroup)"),
    ("threadgroup_position_in_grid", "uint3", "_u3(lane->threadgroup_position_in_grid)"),
    ("threadgroups_per_grid", "uint3", "_u3(lane->threadgroups_per_grid)"),
    ("threads_per_grid", "uint3", "_u3(lane->threads_per_grid)"),
    ("threads_per_simdgroup", "uint", "32u"),
    ("threads_per_threadgroup", "uint3", "_u3(lane->threads_per_threadgroup)"),
]


def type_name(dtype: mx.Dtype) -> str:
    try:
        return _TYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"[metal_kernel] dtype {dtype} is not supported by metile's MSL CPU runtime") from None


def shape_infos(source: str, input_names: list[str]) -> list[tuple[bool, bool, bool]]:
    """Which of `{name}_shape/_strides/_ndim` the body refers to (MLX's rule: a substring test)."""
    return [(f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source) for n in input_names]


def used_attributes(source: str) -> list[tuple[str, str, str]]:
    return [a for a in _ATTRIBUTES if a[0] in source]


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: mx.Dtype
    ndim: int
    size: int


def template_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, mx.Dtype):
        if value == mx.float64:
            # (it compiled here as `double`, even under the strict check)
            raise TypeError("[metal_kernel] template argument float64: Metal has no double "
                            "(a Metal GPU refuses the kernel); use float32")
        return type_name(value)
    raise TypeError(f"[metal_kernel] template argument {value!r} must be an int, bool or mx.Dtype")


# `threadgroup T name[A][B];` in a kernel body must name storage shared by the
# whole group, which a C++ local cannot be; it becomes a reference to a slot of the
# group's arena.  Several names in one declaration (`threadgroup float a[32], b[32];`) take
# a slot each; `alignas(N)` before the type or `__attribute__((aligned(N)))` after the
# names align every slot to N (slots are 16-byte aligned anyway).  The type is named
# through `ident<...>`: written `float4 (&tile)[32]` it expanded as the float4(...)
# constructor macro (vector_ctors.h), an "undeclared identifier 'tile'".  Pointers and
# references do not match; an initialised declaration is checked below.
_DECLARATOR = r"[A-Za-z_]\w*\s*(?:\[[^\]\[;]+\]\s*)*"
_THREADGROUP_DECL = re.compile(
    r"\bthreadgroup\s+(?:alignas\s*\(\s*(?P<a1>\d+)\s*\)\s*)?"
    r"(?P<type>[A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?)\s+"
    rf"(?P<decls>{_DECLARATOR}(?:,\s*{_DECLARATOR})*)"
    r"(?:__attribute__\s*\(\(\s*aligned\s*\(\s*(?P<a2>\d+)\s*\)\s*\)\)\s*)?;"
)
# What is left of a threadgroup object declaration once the body's are rewritten: one
# with an initializer, or one in a helper function of the header (Metal takes neither;
# here each silently became a per-thread local).
_LEFT_THREADGROUP_OBJECT = re.compile(
    r"\bthreadgroup\s+(?:const\s+)?(?:alignas\s*\([^)]*\)\s*)?"
    r"[A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?\s+[A-Za-z_]\w*\s*(?:\[|=|,|;|__attribute__)"
)


def rewrite_threadgroup_declarations(body: str) -> str:
    slot = 0

    def replace(match: re.Match) -> str:
        nonlocal slot
        t = match["type"]
        align = max(16, int(match["a1"] or 0), int(match["a2"] or 0))
        out = []
        for decl in match["decls"].split(","):
            name, dims = re.match(r"\s*([A-Za-z_]\w*)\s*(.*)", decl, re.S).groups()
            dims = re.sub(r"\s+", "", dims)
            slot += 1
            out.append(f"threadgroup ::metile_rt::ident<{t}{dims}>& {name} = "
                       f"::metile_rt::tg_storage<{t}{dims}, {align}>({slot - 1});")
        return " ".join(out)

    return _THREADGROUP_DECL.sub(replace, body)


def check_threadgroup_objects(text: str, where: str, label: str) -> None:
    """Refuse a threadgroup object declaration the rewrite did not place in shared
    storage, naming its line (`where`: "source" or "header")."""
    m = _LEFT_THREADGROUP_OBJECT.search(text)
    if m is None:
        return
    from .compiler import MslCompileError
    line = text.count("\n", 0, m.start()) + 1
    snippet = text[m.start():text.find(";", m.start()) + 1 or None].strip()
    raise MslCompileError(
        f"[metal_kernel] kernel '{label}' ({where}, line {line}): `{snippet}` - a "
        f"threadgroup variable is shared by the group only when it is declared in the kernel "
        f"body without an initializer (`threadgroup T name[N];`, several names, alignas); "
        f"Metal takes threadgroup variables in kernel scope only, uninitialized, and here "
        f"this one would be a per-thread local")


def build(
    *,
    name: str,
    inputs: list[InputSpec],
    output_names: list[str],
    output_dtypes: list[mx.Dtype],
    source: str,
    header: str,
    template: list[tuple[str, object]],
    atomic_outputs: bool,
    rewrite,
) -> str:
    """The C++ translation unit for one specialization of a kernel."""
    infos = shape_infos(source, [i.name for i in inputs])
    func = "custom_kernel_" + name
    params: list[str] = []
    args: list[str] = []
    index = 0
    for spec, (has_shape, has_strides, has_ndim) in zip(inputs, infos):
        t = type_name(spec.dtype)
        space = "constant" if spec.size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if spec.ndim == 0 else "*"
        params.append(f"  const {space} {t}{ref} {spec.name} [[buffer({index})]]")
        cast = f"(const {space} {t}*)lane->buffers[{index}]"
        args.append(f"*{cast}" if spec.ndim == 0 else cast)
        index += 1
        if spec.ndim == 0:
            continue
        for present, decl, ctype, deref in (
            (has_shape, f"const constant int* {spec.name}_shape", "const constant int*", False),
            (has_strides, f"const constant int64_t* {spec.name}_strides", "const constant int64_t*", False),
            (has_ndim, f"const constant int& {spec.name}_ndim", "const constant int*", True),
        ):
            if present:
                params.append(f"  {decl} [[buffer({index})]]")
                cast = f"({ctype})lane->buffers[{index}]"
                args.append(f"*{cast}" if deref else cast)
                index += 1
    for out_name, dtype in zip(output_names, output_dtypes):
        t = type_name(dtype)
        t = f"atomic<{t}>" if atomic_outputs else t
        params.append(f"  device {t}* {out_name} [[buffer({index})]]")
        args.append(f"(device {t}*)lane->buffers[{index}]")
        index += 1
    for attr, msl_type, value in used_attributes(source):
        params.append(f"  {msl_type} {attr} [[{attr}]]")
        args.append(value)

    template_decl = template_args = ""
    if template:
        kinds = []
        for tname, value in template:
            kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "typename"
            kinds.append(f"{kind} {tname}")
        template_decl = "template <" + ", ".join(kinds) + ">\n"
        template_args = "<" + ", ".join(template_value(v) for _, v in template) + ">"

    label = name.replace('"', "")
    body = rewrite_threadgroup_declarations(source)
    check_threadgroup_objects(body, "source", label)
    check_threadgroup_objects(header, "header", label)
    # #line directives make compiler diagnostics point into the user's header
    # and body rather than into this generated file.
    return "\n".join(
        [
            "#include <metal_stdlib>",
            "#include <metile_msl/mlx_utils.h>",
            "using namespace metal;",
            f'#line 1 "{label} (header)"',
            rewrite(header),
            '#line 1 "metile generated signature"',
            template_decl + f"[[kernel]] void {func}(",
            ",\n".join(params) + ") {",
            f'#line 1 "{label} (source)"',
            rewrite(body),
            "}",
            '#line 1 "metile generated entry"',
            "static inline uint3 _u3(const uint32_t* v) { return uint3{v[0], v[1], v[2]}; }",
            "static inline uint _d3(const uint32_t* v) { return v[0] * v[1] * v[2]; }",
            'extern "C" __attribute__((visibility("default"))) int metile_abi_version() { return METILE_MSL_ABI_VERSION; }',
            'extern "C" __attribute__((visibility("default"))) void metile_lane_main(metile_rt::Lane* lane) {',
            "  ::metile_rt::current_lane = lane;",
            f"  {func}{template_args}(" + ", ".join(args) + ");",
            "}",
            "",
        ]
    )
