"""Text form of Tile IR (`METILE_DEBUG=tile_ir`), MLIR-like and stable for tests."""

from __future__ import annotations

from .core import Block, Function, Op, Value


class _Names:
    def __init__(self):
        self.names: dict[int, str] = {}

    def __call__(self, v: Value) -> str:
        if v.id not in self.names:
            base = v.hint if v.hint and v.hint.isidentifier() else ""
            self.names[v.id] = f"%{base}{len(self.names)}" if base else f"%{len(self.names)}"
        return self.names[v.id]


def _attrs(op: Op) -> str:
    if not op.attrs:
        return ""
    return " {" + ", ".join(f"{k}={v!r}" for k, v in op.attrs.items()) + "}"


def _block(block: Block, names: _Names, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for op in block.ops:
        lhs = ", ".join(names(r) for r in op.results)
        lhs = f"{lhs} = " if lhs else ""
        args = ", ".join(names(o) for o in op.operands)
        types = ", ".join(str(r.type) for r in op.results)
        types = f" : {types}" if types else ""
        loc = f"  // line {op.loc.line}" if op.loc else ""
        out.append(f"{pad}{lhs}{op.name}({args}){_attrs(op)}{types}{loc}")
        for i, region in enumerate(op.regions):
            bargs = ", ".join(f"{names(a)}: {a.type}" for a in region.args)
            out.append(f"{pad}  ^region{i}({bargs}):")
            _block(region, names, indent + 2, out)


def format_function(fn: Function) -> str:
    names = _Names()
    params = []
    for p in fn.params:
        if p.kind == "constexpr":
            params.append(f"{p.name}: constexpr = {p.constant!r}")
        else:
            params.append(f"{names(p.value)}: {p.value.type}")
    out = [f"func @{fn.name}({', '.join(params)}) [{fn.form} form] {{"]
    _block(fn.body, names, 1, out)
    out.append("}")
    return "\n".join(out)
