"""Frontend: a @metile.kernel Python function -> Tile IR (tile form).

`build_tile_ir` specializes the function for one launch signature: each
runtime parameter is a buffer (pointer) or a scalar of a given dtype; each
constexpr is a Python value.  Errors are CompilationErrors with locations.
"""

from __future__ import annotations

import inspect

from ..ir.core import Block, Builder, Function, Param, Value, walk
from ..ir.types import PointerType, ScalarType, TileType
from ..language import dtypes as dt
from ..language.core import TRITON_MAX_TENSOR_NUMEL, constexpr
from ..errors import CompilationError, LaunchError
from .desugar_control import desugar
from .generator import CompileContext, Generator, is_constexpr_annotation
from .source import function_source

__all__ = ["CompilationError", "LaunchError", "build_tile_ir", "constexpr_params"]


def constexpr_params(fn) -> tuple[list[str], set[str], dict]:
    """(parameter names in order, the constexpr ones, their defaults)."""
    sig = inspect.signature(fn)
    names, consts, defaults = [], set(), {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            src = function_source(fn)
            raise CompilationError("kernels cannot take *args or **kwargs", src.loc(src.tree))
        names.append(p.name)
        if is_constexpr_annotation(p.annotation) or (
                p.kind == p.KEYWORD_ONLY and p.default is not p.empty):
            consts.add(p.name)
        if p.default is not p.empty:
            # (`B: tl.constexpr = tl.constexpr(4)`: the value, as Triton reads it)
            defaults[p.name] = p.default.value if isinstance(p.default, constexpr) else p.default
    return names, consts, defaults


def build_tile_ir(fn, specs: dict, constexprs: dict, fragments: bool = False, debug: bool = False
                  ) -> tuple[Function, CompileContext]:
    """`specs[name]` is ("buffer", DType) or ("scalar", DType) for runtime parameters;
    `debug` keeps device_assert checks (frontend/debug_ops.py)."""
    src = function_source(fn)
    names, consts, _ = constexpr_params(fn)
    body = Block()
    builder = Builder(body)
    params, env = [], {}
    for name in names:
        if name in consts or (name not in specs and constexprs.get(name, 0) is None):
            # (a runtime parameter passed None: a constexpr None, as Triton specializes it)
            params.append(Param(name, "constexpr", constant=constexprs[name]))
            env[name] = constexprs[name]
            continue
        kind, dtype = specs[name]
        t = PointerType(dtype, "device", name) if kind == "buffer" else ScalarType(dtype)
        v = Value(t, None, name)
        params.append(Param(name, kind, v))
        env[name] = v
    ctx = CompileContext()
    ctx.fragments = fragments
    ctx.debug = debug
    ctx.relaxed_precision = constexprs.get("RELAXED_PRECISION") is True
    gen = Generator(src, builder, ctx, env)
    gen.visit_body(desugar(src, is_helper=False))
    check_tile_sizes(body)
    out = Function(fn.__name__, params, body)
    if fragments:
        out.meta["fragments"] = True
    return out, ctx


def check_tile_sizes(body: Block) -> None:
    """Every tile the kernel makes holds at most TRITON_MAX_TENSOR_NUMEL elements, Triton's
    bound: a program's tile lives in its threads' registers (or the CPU runtime's stack),
    so a larger one compiled and then failed at run time (a 2**27-element tile overflowed
    the CPU runtime's stack; on a GPU it spills without end)."""
    for op in walk(body):
        for r in op.results:
            if isinstance(r.type, TileType) and r.type.numel > TRITON_MAX_TENSOR_NUMEL:
                raise CompilationError(
                    f"a tile of shape {r.type.shape} has {r.type.numel} elements, more than "
                    f"the {TRITON_MAX_TENSOR_NUMEL} (2**20) a program's tile may hold (as in "
                    f"Triton): use smaller BLOCK sizes and loop over the rest", op.loc)


_ = dt
