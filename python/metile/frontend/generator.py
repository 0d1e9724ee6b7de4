"""Python AST -> Tile IR.

The kernel body is walked once, statement by statement; nothing is traced or
unrolled.  A name is bound either to a runtime Value (SSA) or to a
compile-time Python value (constexprs, numbers, dtypes, views, tuples), and
expressions over compile-time values fold in Python.  Control flow on runtime
conditions becomes structured IR: variables reassigned inside a loop or a
branch become loop-carried values / branch results.  Anything outside the
supported subset is a CompilationError at the offending node.
"""

from __future__ import annotations

import ast
import builtins as py_builtins
import types

from ..ir.core import Builder, Value
from ..ir.types import TileType, dtype_of, elem_type, shape_of
from ..language import dtypes as dt
from ..language import unsupported
from ..language.core import constexpr
from .builtins import IMPLS, view_method
from . import debug_ops, join_split, reduce_ops, scans, shape_ops  # noqa: F401  (register their builtins into IMPLS)
from .block_pointers import BlockPointer, TensorDescriptor
from ..errors import CompilationError
from .tuples import KernelTuple
from .semantics import Semantics, describe, is_const
from .control import UNSET, ControlFlow, Undefined, _const_dtype
from .desugar_control import desugar
from .source import FunctionSource, function_source
from .views import TensorView

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div",
           ast.FloorDiv: "idiv", ast.Mod: "mod", ast.BitAnd: "and", ast.BitOr: "or",
           ast.BitXor: "xor", ast.LShift: "shl", ast.RShift: "shr"}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}

_UNSUPPORTED_NAMES = {
    ast.Try: "try statement", ast.With: "with statement", ast.Raise: "raise statement",
    ast.Global: "global statement", ast.Nonlocal: "nonlocal statement",
    ast.Delete: "del statement", ast.ClassDef: "class definition",
    ast.FunctionDef: "nested function definition", ast.Import: "import statement",
    ast.ImportFrom: "import statement", ast.ListComp: "list comprehension",
    ast.DictComp: "dict comprehension", ast.SetComp: "set comprehension",
    ast.GeneratorExp: "generator expression", ast.Lambda: "lambda",
    ast.JoinedStr: "f-string", ast.Dict: "dict literal", ast.Set: "set literal",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Starred: "starred expression",
    ast.NamedExpr: "assignment expression", ast.AsyncFor: "async for",
    ast.AsyncWith: "async with",
}
if hasattr(ast, "TryStar"):
    _UNSUPPORTED_NAMES[ast.TryStar] = "try statement"
if hasattr(ast, "Match"):
    _UNSUPPORTED_NAMES[ast.Match] = "match statement"

_PY_FUNCS = {"min", "max", "abs", "int", "float", "bool", "len", "range"}


def _check_constexpr_argument(fn, name: str, value) -> None:
    """A called helper's constexpr parameter given a runtime scalar is refused at the
    caller's line (rather than deep inside the helper): the usual slip is a BLOCK passed
    as a runtime int.  A tile is taken as the runtime value it is, as Triton takes it (its
    fused-attention tutorial annotates `offs_m: tl.constexpr` and passes an arange)."""
    if isinstance(value, Value) and not isinstance(value.type, TileType):
        raise CompilationError(f"{fn.__qualname__}(): constexpr parameter {name!r} needs a "
                               f"compile-time value, got {describe(value)}")


def _plain_scalar(value):
    """A NumPy scalar (`np.float32(1e-5)`, `np.int64(3)`, `np.bool_`) read from Python as
    the Python number it holds, which the kernel language takes as a constant (in a tuple
    too); anything
    else as it is; a `metile.constexpr(v)` object (Triton's module-level `NAME =
    tl.constexpr(v)`) as v (the object is always truthy: `if NAME:` took the true branch)."""
    if isinstance(value, constexpr):
        return _plain_scalar(value.value)
    if type(value) is tuple:   # (a shape of NumPy ints: zeros() refused it as not ints)
        return tuple(_plain_scalar(v) for v in value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and \
            hasattr(value, "item") and not hasattr(value, "__len__"):
        item = value.item()
        if isinstance(item, (bool, int, float)):
            return item
    return value


def is_constexpr_annotation(ann) -> bool:
    if ann is constexpr or isinstance(ann, constexpr):
        return True
    if isinstance(ann, str):  # `from __future__ import annotations`
        return ann.split(".")[-1] == "constexpr"
    return False


class CompileContext:
    """State shared by a kernel and the helpers inlined into it."""

    def __init__(self):
        self.shared_count = 0
        self.globals_used: dict[str, object] = {}
        self.helpers: list[object] = []
        self.depth = 0
        self.fragments = False  # simdgroup_inline: 8x8 block views are matrix fragments
        self.debug = False  # device_assert and runtime `assert` are checked (debug_ops.py)
        self.relaxed_precision = False  # the kernel's RELAXED_PRECISION=True (dot())


class _Return(Exception):
    def __init__(self, value):
        self.value = value


class Generator(ControlFlow):
    def __init__(self, src: FunctionSource, builder: Builder, ctx: CompileContext, env: dict,
                 is_helper: bool = False):
        self.src = src
        self.b = builder
        self.sem = Semantics(builder)
        self.ctx = ctx
        self.env = env
        self.is_helper = is_helper
        self._closure = src.closure()

    def next_shared(self) -> int:
        self.ctx.shared_count += 1
        return self.ctx.shared_count - 1

    # -- dispatch ------------------------------------------------------------------
    def visit(self, node: ast.AST):
        saved = self.b.loc
        self.b.loc = self.src.loc(node)
        try:
            kind = _UNSUPPORTED_NAMES.get(type(node))
            if kind is not None:
                raise CompilationError(f"unsupported Python in a kernel: {kind}")
            method = getattr(self, "visit_" + type(node).__name__, None)
            if method is None:
                raise CompilationError(f"unsupported Python in a kernel: {type(node).__name__}")
            return method(node)
        except CompilationError as e:
            if e.loc is None:
                e.loc = self.src.loc(node)
            raise
        finally:
            self.b.loc = saved

    def visit_body(self, stmts) -> None:
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, ast.Return):
                if i != len(stmts) - 1:
                    raise CompilationError("code after return", self.src.loc(stmts[i + 1]))
            self.visit(stmt)

    # -- statements -----------------------------------------------------------------
    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        self.visit(node.value)

    def visit_Pass(self, node):
        pass

    def visit_Assign(self, node):
        value = self.visit(node.value)
        if value is None and isinstance(node.value, ast.Call):
            # store(), barrier(): statements, not values
            name = ast.unparse(node.value.func)
            raise CompilationError(f"{name}() returns no value; call it as a statement")
        for target in node.targets:
            self.assign(target, value)

    def visit_AnnAssign(self, node):
        if node.value is None:
            raise CompilationError("annotation without a value")
        self.assign(node.target, self.visit(node.value))

    def visit_AugAssign(self, node):
        if not isinstance(node.target, ast.Name):
            raise CompilationError("augmented assignment only to a plain name; use metile.store")
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise CompilationError(f"unsupported operator {type(node.op).__name__}")
        current = self.lookup(node.target.id)
        value = self.visit(node.value)
        if isinstance(current, tuple) and op in ("add", "mul"):
            # a tuple grows (t += (x,)) or repeats as in Python, at compile time
            self.env[node.target.id] = current + value if op == "add" else current * value
            return
        self.env[node.target.id] = self.sem.binary(op, current, value)

    def assign(self, target, value) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            starred = [i for i, t in enumerate(target.elts) if isinstance(t, ast.Starred)]
            fixed = len(target.elts) - len(starred)
            # (Python refuses two starred names before the kernel is parsed)
            if not isinstance(value, tuple) or (len(value) < fixed if starred else
                                                len(value) != fixed):
                want = f"at least {fixed}" if starred else f"{fixed}"
                raise CompilationError(f"cannot unpack {describe(value)} into {want} names")
            if starred:
                # `first, *rest = t`: rest takes the middle as a tuple (Python gives a list;
                # a tuple keeps it a kernel tuple, carried and indexed the same way)
                i, tail = starred[0], fixed - starred[0]
                value = (*value[:i], KernelTuple(value[i:len(value) - tail]),
                         *value[len(value) - tail:])
                target_elts = [t.value if isinstance(t, ast.Starred) else t
                               for t in target.elts]
            else:
                target_elts = target.elts
            for t, v in zip(target_elts, value):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            raise CompilationError("item assignment is not supported; use metile.store or a "
                                   "tensor view's .store()")
        else:
            raise CompilationError(f"unsupported assignment target {type(target).__name__}")

    def visit_Return(self, node):
        # desugar_control leaves at most a final return; a kernel's has no value.
        if not self.is_helper:
            return
        value = None if node.value is None else self.visit(node.value)
        raise _Return(None if value is UNSET else value)

    def visit_Assert(self, node):
        block, count = self.b.block, len(self.b.block.ops)
        test = self.visit(node.test)
        if isinstance(test, Value):  # a device_assert, as in Triton (frontend/debug_ops.py)
            msg = "" if node.msg is None else self.visit(node.msg)
            if self.ctx.debug:
                debug_ops.emit_assert(self, test, debug_ops._text(msg, "assert message"))
            elif self.b.block is block:
                del block.ops[count:]  # compiled out: drop what computed the condition
            return
        if not test:
            msg = self.visit(node.msg) if node.msg is not None else "assertion failed"
            raise CompilationError(f"static assertion failed: {msg}")

    # -- expressions ------------------------------------------------------------------
    def visit_Constant(self, node):
        if node.value is Ellipsis:
            raise CompilationError("... is not supported")
        return node.value

    def lookup(self, name: str):
        if name in self.env:
            v = self.env[name]
            if isinstance(v, Undefined):
                raise CompilationError(f"name {name!r} is not defined here: {v.reason}")
            return v
        for scope in (self._closure, self.src.globals):
            if name in scope:
                value = scope[name]
                self._record_global(name, value)
                return _plain_scalar(value)
        if name in _PY_FUNCS:
            return getattr(py_builtins, name)
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        if hasattr(py_builtins, name):
            allowed = ", ".join(sorted(_PY_FUNCS))
            raise CompilationError(f"Python's built-in {name!r} is not available inside a kernel "
                                   f"(kernels can call metile functions, @metile.inline helpers "
                                   f"and {allowed})")
        raise CompilationError(f"name {name!r} is not defined")

    def _record_global(self, name, value):
        key = f"{self.src.fn.__module__}.{self.src.fn.__qualname__}:{name}"
        self.ctx.globals_used[key] = value
        if getattr(value, "__metile_inline__", False) and value not in self.ctx.helpers:
            self.ctx.helpers.append(value)

    def visit_Name(self, node):
        return self.lookup(node.id)

    def visit_Tuple(self, node):
        return KernelTuple(self.visit(e) for e in node.elts)

    visit_List = visit_Tuple

    def visit_BinOp(self, node):
        a, b = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.MatMult):
            return self.sem.dot(a, b)
        if isinstance(node.op, ast.Pow):
            if is_const(a) and is_const(b):
                return a ** b
            raise CompilationError("** is only supported on compile-time constants")
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise CompilationError(f"unsupported operator {type(node.op).__name__}")
        if not (is_const(a) or isinstance(a, Value)) or not (is_const(b) or isinstance(b, Value)):
            if not isinstance(a, Value) and not isinstance(b, Value):
                return _fold_py(op, a, b)
            raise CompilationError(f"unsupported operand: {describe(a)} and {describe(b)}")
        return self.sem.binary(op, a, b)

    def visit_UnaryOp(self, node):
        x = self.visit(node.operand)
        if isinstance(node.op, ast.UAdd):
            return x
        if isinstance(node.op, ast.USub):
            return self.sem.unary("neg", x)
        if isinstance(node.op, ast.Not):
            if isinstance(x, Value):
                if isinstance(x.type, TileType) and dtype_of(x.type) != dt.bool_:
                    # a bool tile negates elementwise (Triton's `not x.to(tl.int1)`); on a
                    # number tile the meaning is unclear, and `~` is bitwise there (~1 is -2)
                    raise CompilationError(
                        f"'not' needs a bool scalar or tile, got {describe(x)}; write "
                        f"x == 0 (or ~ for the bitwise complement)")
                if dtype_of(x.type) != dt.bool_:
                    # Python's truthiness, as `if n:` tests n != 0 (and Triton's logical_not):
                    # `not n` on a runtime int or float was refused with a hint about tiles
                    return self.sem.binary("eq", x, 0)
                return self.sem.unary("not", x)
            return not x
        if isinstance(node.op, ast.Invert):
            if is_const(x):
                return ~x
            return self.sem.unary("not", x)
        raise CompilationError(f"unsupported unary operator {type(node.op).__name__}")

    def visit_BoolOp(self, node):
        op = "and" if isinstance(node.op, ast.And) else "or"
        result = self.visit(node.values[0])
        for v_node in node.values[1:]:
            if not isinstance(result, Value):
                if (op == "and" and not result) or (op == "or" and result):
                    return result
                result = self.visit(v_node)
                continue
            other = self.visit(v_node)
            for v in (result, other):
                if isinstance(v, Value) and dtype_of(v.type) != dt.bool_:
                    # Python's `n and m` is an operand, not a bool, so no conversion keeps its
                    # meaning everywhere: ask for the comparison meant
                    raise CompilationError(f"'{op}' needs bool scalars, got {describe(v)}; "
                                           f"compare it, e.g. (n != 0) {op} ...")
            # bool tiles combine elementwise (Triton's logical_and / logical_or): both sides
            # are computed, as they are for scalars
            result = self.sem.binary(op, result, other)
        return result

    def visit_Compare(self, node):
        if len(node.ops) != 1:
            # Python's `a < b < c`: (a < b) and (b < c), b evaluated once; elementwise on
            # tiles (bool `and`), folded where a link is a compile-time False
            result, left = True, self.visit(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.visit(right_node)
                link = self._compare(op, left, right)
                left = right
                if not isinstance(link, Value):
                    if not link:
                        return link
                    continue
                result = link if result is True else self.sem.binary("and", result, link)
            return result
        return self._compare(node.ops[0], self.visit(node.left), self.visit(node.comparators[0]))

    def _compare(self, op, a, b):
        if isinstance(op, (ast.Is, ast.IsNot)) and (a is None or b is None):
            # `B is not None` on a runtime value (a buffer or scalar is never None): known at
            # compile time, as in Triton, where a None argument is a constexpr
            return (a is b) if isinstance(op, ast.Is) else (a is not b)
        if isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
            if isinstance(a, Value) or isinstance(b, Value):
                raise CompilationError("is / in are only supported on compile-time values")
            return {ast.Is: lambda: a is b, ast.IsNot: lambda: a is not b,
                    ast.In: lambda: a in b, ast.NotIn: lambda: a not in b}[type(op)]()
        if not isinstance(a, Value) and not isinstance(b, Value):
            return _fold_py(_CMPOPS[type(op)], a, b)
        return self.sem.binary(_CMPOPS[type(op)], a, b)

    def visit_IfExp(self, node):
        cond = self.visit(node.test)
        if not isinstance(cond, Value):
            return self.visit(node.body if cond else node.orelse)
        if isinstance(cond.type, TileType):    # elementwise: both sides, as metile.where
            return self.sem.where(cond, self.visit(node.body), self.visit(node.orelse))
        if _plain_operands(node):   # both sides cost a select and cannot act or fault
            a, b = self.visit(node.body), self.visit(node.orelse)
            if all(is_const(v) and not isinstance(v, bool) for v in (a, b)):
                # two numbers take the type an if statement's branches give them (2**31 with
                # -1 is int64); where's promotion would type -1 as 2**31's uint32 and refuse it
                t = _const_dtype(a, b)
                a, b = self.sem.const(a, t), self.sem.const(b, t)
            if all(isinstance(v, Value) or is_const(v) for v in (a, b)):
                return self.sem.where(cond, a, b)
        return self.conditional_expression(cond, node)   # (control.py: one side runs)

    def visit_Attribute(self, node):
        obj = self.visit(node.value)
        attr = node.attr
        if isinstance(obj, Value):
            if attr == "dtype":
                e = elem_type(obj.type)
                return e.dtype
            if attr == "shape":
                return shape_of(obj.type)
            if attr == "type":
                # Triton's `Out.type.element_ty` / `x.type.scalar` (its tutorials' spelling
                # of a buffer's element type): the dtype, as `.dtype` gives it
                d = elem_type(obj.type).dtype
                return types.SimpleNamespace(element_ty=d, scalar=d, shape=shape_of(obj.type))
            if attr == "to":
                return _Method(lambda gen, args, kw: gen.sem.cast(obj, _dtype_arg(args, kw),
                                                                  bitcast=bool(kw.get("bitcast"))))
            if attr == "T":
                if len(shape_of(obj.type)) != 2:
                    raise CompilationError(f".T needs a 2-D tile, got {describe(obj)}; use "
                                           f"metile.permute for other ranks")
                return self.sem.permute(obj, (1, 0), "trans")
            if attr in _TILE_METHODS:
                return _Method(lambda gen, args, kw: IMPLS[attr](gen, [obj, *args], kw))
            raise CompilationError(f"a runtime value has no attribute {attr!r}")
        if isinstance(obj, TensorView):
            m = view_method(obj, attr)
            return _Method(m) if callable(m) else m
        if isinstance(obj, (BlockPointer, TensorDescriptor)):
            m = obj.attribute(attr)
            return _Method(m) if callable(m) else m
        if isinstance(obj, types.ModuleType) or not isinstance(obj, (int, float)):
            try:
                return _plain_scalar(getattr(obj, attr))
            except AttributeError:
                name = getattr(obj, "__name__", "")
                why = unsupported.reason(attr) if name in ("metile", "metile.language.math") \
                    else None
                if why is not None:
                    prefix = "metile.math" if name.endswith("math") else "metile"
                    raise CompilationError(f"{prefix}.{attr} (Triton's tl.{attr}) is not "
                                           f"supported: {why}") from None
                raise CompilationError(f"{describe(obj)} has no attribute {attr!r}") from None
        raise CompilationError(f"{describe(obj)} has no attribute {attr!r}")

    def visit_Subscript(self, node):
        obj = self.visit(node.value)
        idx = node.slice
        items = idx.elts if isinstance(idx, ast.Tuple) else [idx]
        if isinstance(obj, Value):
            if not isinstance(obj.type, TileType):
                raise CompilationError("only tiles can be indexed (with None and :)")
            out, axis = obj, 0
            full = [isinstance(item, ast.Slice) and item.lower is item.upper is item.step is None
                    for item in items]
            dots = [isinstance(item, ast.Constant) and item.value is Ellipsis for item in items]
            if sum(dots) > 1:
                raise CompilationError("an index can only have a single ellipsis ('...')")
            for item, is_full, is_dots in zip(items, full, dots):
                if is_full:
                    axis += 1
                elif is_dots:   # NumPy's: the ':' the other items leave (x[..., None])
                    axis += max(0, len(obj.type.shape) - sum(full))
                elif isinstance(item, ast.Constant) and item.value is None:
                    out = self.sem.expand_dims(out, axis)
                    axis += 1
                else:
                    what = "slicing part of an axis" if isinstance(item, ast.Slice) \
                        else "element access"
                    raise CompilationError(f"tiles can only be indexed with None, ':' and '...' "
                                           f"(e.g. x[:, None]); {what} is not supported")
            if axis - (len(out.type.shape) - len(obj.type.shape)) > len(obj.type.shape):
                raise CompilationError("too many ':' for the tile's rank")
            return out
        key = self.visit(idx)
        try:
            return _plain_scalar(obj[key])
        except Exception as e:  # noqa: BLE001
            raise CompilationError(f"cannot index {describe(obj)}: {e}") from None

    def visit_Slice(self, node):
        # a compile-time slice (of a tuple; tiles take only ':' and None, visit_Subscript)
        parts = [None if p is None else self.visit(p) for p in (node.lower, node.upper, node.step)]
        if any(isinstance(p, Value) for p in parts):
            raise CompilationError("slice bounds must be compile-time ints (tuples are sliced at "
                                   "compile time)")
        return slice(*parts)

    def visit_Call(self, node):
        func = self.visit(node.func)
        if getattr(func, "__metile_builtin__", None) == "device_assert" and not self.ctx.debug:
            return None  # compiled out, arguments unevaluated (frontend/debug_ops.py)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise CompilationError("unsupported Python in a kernel: starred argument")
            args.append(self.visit(a))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                raise CompilationError("unsupported Python in a kernel: **kwargs")
            kwargs[k.arg] = self.visit(k.value)
        if isinstance(func, _Method):
            return func.fn(self, args, kwargs)
        if func is constexpr:
            # `tl.constexpr(v)` inside a kernel: v, which must be known at compile time
            if kwargs or len(args) != 1 or not is_const(args[0]):
                raise CompilationError("metile.constexpr(value) takes one compile-time "
                                       f"constant, got {', '.join(map(describe, args)) or 'none'}")
            return args[0]
        name = getattr(func, "__metile_builtin__", None)
        if name is not None:
            return IMPLS[name](self, args, kwargs)
        if getattr(func, "__metile_inline__", False):
            return self.inline_call(func, args, kwargs)
        if func in (py_builtins.min, py_builtins.max):
            if kwargs or len(args) < 2:
                raise CompilationError(f"{func.__name__}() needs at least two arguments")
            if any(isinstance(a, Value) for a in args):
                out = args[0]
                for a in args[1:]:
                    out = self.sem.binary("minimum" if func is min else "maximum", out, a)
                return out
            return func(*args)
        if func is py_builtins.abs:
            return self.sem.unary("abs", *args)
        if func is py_builtins.len and len(args) == 1 and not kwargs and \
                isinstance(args[0], Value):
            # a tile's length is static, as a NumPy array's: its first dimension
            shape = shape_of(args[0].type)
            if not shape:
                raise CompilationError(f"len() of a scalar ({describe(args[0])}): only a tile "
                                       f"has a length")
            return shape[0]
        if func in (py_builtins.int, py_builtins.float, py_builtins.bool, py_builtins.len):
            if any(isinstance(a, Value) for a in args):
                raise CompilationError(f"{func.__name__}() of a runtime value; use metile.cast")
            return func(*args, **kwargs)
        if func is py_builtins.range:
            raise CompilationError("range() can only be used as the iterable of a for loop")
        if getattr(func, "__metile_kernel__", False):
            return self.kernel_call(func, args, kwargs)
        label = getattr(func, "__qualname__", repr(func))
        raise CompilationError(f"call to {label}, which is neither a metile builtin nor a "
                               f"@metile.inline helper")

    def kernel_call(self, kernel, args, kwargs):
        """A @metile.kernel called from a kernel is a device function (as Triton's @jit
        functions call each other): its body is inlined like an @metile.inline helper's.
        Its constexpr parameters take the call's compile-time values; its stores write the
        caller's buffers; launch options (grid, num_simdgroups) belong to the caller."""
        fn = kernel.fn
        bound = self._bind_call(fn, args, kwargs)
        for name in kernel.constexpr_names:
            _check_constexpr_argument(fn, name, bound[name])
        return self._inline_body(fn, bound)

    def inline_call(self, helper, args, kwargs):
        fn = helper.__wrapped__ if hasattr(helper, "__wrapped__") else helper
        bound = self._bind_call(fn, args, kwargs)
        import inspect
        for p in inspect.signature(fn).parameters.values():
            if is_constexpr_annotation(p.annotation):
                _check_constexpr_argument(fn, p.name, bound[p.name])
        return self._inline_body(fn, bound)

    @staticmethod
    def _bind_call(fn, args, kwargs) -> dict:
        import inspect
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
        except TypeError as e:
            raise CompilationError(f"{fn.__qualname__}(): {e}") from None
        bound.apply_defaults()
        # (a default written `B: tl.constexpr = tl.constexpr(4)` is the value, as the
        # launch's defaults and module globals are: _plain_scalar)
        return {k: _plain_scalar(v) if isinstance(v, constexpr) else v
                for k, v in bound.arguments.items()}

    def _inline_body(self, fn, env: dict):
        if self.ctx.depth > 32:
            raise CompilationError("@metile.inline helpers and kernels called from kernels nest "
                                   "more than 32 deep (recursion?)")
        src = function_source(fn)
        sub = Generator(src, self.b, self.ctx, env, is_helper=True)
        self.ctx.depth += 1
        try:
            sub.visit_body(desugar(src, is_helper=True))
        except _Return as r:
            return r.value
        finally:
            self.ctx.depth -= 1
        return None


# Triton's tensor methods that are metile builtins taking the tile first (`x.reshape(4, 8)`)
_TILE_METHODS = frozenset({"trans", "permute", "reshape", "view", "expand_dims", "broadcast_to",
                           "sum", "max", "min", "argmax", "argmin", "cumsum", "cumprod",
                           "associative_scan", "sort", "split"})


class _Method:
    def __init__(self, fn):
        self.fn = fn


_FAULTING = (ast.FloorDiv, ast.Mod)


def _plain_operands(node: ast.IfExp) -> bool:
    """Whether both sides of `a if c else b` are arithmetic on names and numbers that can
    neither fault nor act (no call, no // or %, no subscript: a view's is a load), so
    computing both and selecting is the same as computing one."""
    for side in (node.body, node.orelse):
        for n in ast.walk(side):
            if isinstance(n, (ast.Call, ast.Subscript, ast.Tuple, ast.List, ast.Dict, ast.Set,
                              ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
                return False
            if isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, _FAULTING):
                return False
    return True


def _dtype_arg(args, kwargs):
    from .builtins import need_dtype
    extra = set(kwargs) - {"dtype", "fp_downcast_rounding", "bitcast"}
    if extra or len(args) > 1:
        raise CompilationError(f".to() takes a dtype (and Triton's fp_downcast_rounding=, "
                               f"bitcast=), got {', '.join(sorted(extra)) or 'extra arguments'}")
    if not isinstance(kwargs.get("bitcast", False), bool):
        raise CompilationError(f".to() bitcast= must be a constexpr bool, got "
                               f"{describe(kwargs['bitcast'])}")
    if kwargs.get("fp_downcast_rounding") not in (None, "rtne"):
        raise CompilationError(f".to() fp_downcast_rounding={kwargs['fp_downcast_rounding']!r} "
                               f"is not supported; conversions round to nearest even")
    value = args[0] if args else kwargs.get("dtype")
    return need_dtype(value, ".to()")


def _fold_py(op, a, b):
    from .semantics import _PY_BINARY
    try:
        return _PY_BINARY[op](a, b)
    except Exception as e:  # noqa: BLE001
        raise CompilationError(f"cannot evaluate {a!r} {op} {b!r} at compile time: {e}") from None
