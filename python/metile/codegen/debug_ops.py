"""How each backend spells device_print and device_assert (thread form, see
passes/lower_debug.py for the operands).

MSL: Metal compute kernels have no printf and no trap, so the calls go to the CPU
runtime's shim (runtime/msl_cpu/include/metile_msl/debug.h) under
`#if defined(METILE_MSL_CPU_RUNTIME)`, a macro only the shim defines: the same MSL
compiles on a Mac with the checks gone.  (The compiler refuses device_print for a
Metal GPU outright, compiler/debug_support.py, so nothing printed is lost silently.)

CUDA: printf, and for a failed assertion printf then `__trap()`, which aborts the
kernel and leaves the CUDA context unusable (MLX reports the launch error at its next
synchronisation), as a failed device `assert` does.
"""

from __future__ import annotations

from ..ir.core import Op


def c_string(text: str) -> str:
    """A C string literal holding `text` (UTF-8; anything but printable ASCII as octal
    escapes, which unlike \\x stop after three digits)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\t":
            out.append("\\n" if ch == "\n" else "\\t")
        elif 32 <= byte < 127 and ch != "?":  # '?' escaped: no trigraph can form
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _split(op: Op, refs: list[str]):
    """(condition or None, program ids, index operands, values) of a thread-form op."""
    rank = op.attrs["rank"]
    if op.name == "device_assert":
        return refs[0], refs[1:4], refs[4:4 + rank], []
    return None, refs[:3], refs[3:3 + rank], refs[3 + rank:]


class MSLDebug:
    def emit(self, em, op: Op, refs: list[str], depth: int) -> None:
        cond, pids, index, values = _split(op, refs)
        kind = op.attrs["index"]
        at = (f"metile_rt::debug_thread({index[0]})" if kind == "thread"
              else f"metile_rt::debug_element({', '.join(index)})")
        head = ", ".join([*pids, at])
        if op.name == "device_print":
            hex_ = "true" if op.attrs["hex"] else "false"
            args = ", ".join([head, c_string(op.attrs["prefix"]), hex_, *values])
            call = f"metile_rt::device_print({args});"
        else:
            call = (f"if (!{cond}) metile_rt::device_assert_fail({head}, "
                    f"{c_string(op.attrs['head'])}, {c_string(op.attrs['msg'])});")
        em.emit("#if defined(METILE_MSL_CPU_RUNTIME)", depth)
        em.emit(call, depth)
        em.emit("#endif", depth)


# dtype name -> (printf format, argument over {v}); hex forms print the bits
_CUDA_FORMATS = {
    "float32": ("%.9g", "static_cast<double>({v})"),
    "float16": ("%.5g", "static_cast<double>(__half2float({v}))"),
    "bfloat16": ("%.4g", "static_cast<double>(__bfloat162float({v}))"),
    "int32": ("%d", "static_cast<int>({v})"),
    "uint32": ("%u", "static_cast<unsigned>({v})"),
    "int64": ("%lld", "static_cast<long long>({v})"),
    "uint64": ("%llu", "static_cast<unsigned long long>({v})"),
    **{n: ("%d", "static_cast<int>({v})") for n in ("int8", "int16")},
    **{n: ("%u", "static_cast<unsigned>({v})") for n in ("uint8", "uint16")},
    "bool": ("%s", '({v} ? "True" : "False")'),
}
_CUDA_HEX = {
    "float32": ("0x%08x", "__float_as_uint({v})"),
    "float16": ("0x%04x", "static_cast<unsigned>(__half_as_ushort({v}))"),
    "bfloat16": ("0x%04x", "static_cast<unsigned>(__bfloat16_as_ushort({v}))"),
    "int32": ("0x%08x", "static_cast<unsigned>({v})"),
    "uint32": ("0x%08x", "static_cast<unsigned>({v})"),
    "int64": ("0x%016llx", "static_cast<unsigned long long>({v})"),
    "uint64": ("0x%016llx", "static_cast<unsigned long long>({v})"),
    **{n: ("0x%02x", "static_cast<unsigned>(static_cast<uint8_t>({v}))") for n in ("int8", "uint8")},
    **{n: ("0x%04x", "static_cast<unsigned>(static_cast<uint16_t>({v}))")
       for n in ("int16", "uint16")},
}


def _cuda_where(kind: str, index: list[str], word: str) -> str:
    if kind == "thread":
        return "thread %d"
    return f"{word} (" + ", ".join("%d" for _ in index) + ")"


class CUDADebug:
    def emit(self, em, op: Op, refs: list[str], depth: int) -> None:
        cond, pids, index, values = _split(op, refs)
        kind = op.attrs["index"]
        if op.name == "device_print":
            fmt, args = "pid (%d, %d, %d) " + _cuda_where(kind, index, "idx"), [*pids, *index]
            if op.attrs["prefix"]:
                fmt += " %s"
                args.append(c_string(op.attrs["prefix"]))
            dtypes = [v.type.dtype.name for v in op.operands[3 + op.attrs["rank"]:]]
            parts = []
            for name, ref in zip(dtypes, values):
                table = _CUDA_HEX if op.attrs["hex"] and name in _CUDA_HEX else _CUDA_FORMATS
                f, arg = table[name]
                parts.append(f)
                args.append(arg.format(v=ref))
            if parts:
                fmt += ": " + ", ".join(parts)
            em.emit(f"printf({c_string(fmt + chr(10))}, {', '.join(args)});", depth)
            return
        fmt = "%s in program (%d, %d, %d)"
        if kind != "none":
            fmt += ", " + _cuda_where(kind, index, "element")
        args = [c_string(op.attrs["head"]), *pids, *index]
        if op.attrs["msg"]:
            fmt += ": %s"
            args.append(c_string(op.attrs["msg"]))
        em.emit(f"if (!{cond}) {{ printf({c_string(fmt + chr(10))}, {', '.join(args)}); "
                f"__trap(); }}", depth)
