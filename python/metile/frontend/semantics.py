"""Typing rules of the language: how operands combine into Tile IR ops.

Rules (each violation is a CompilationError at the offending expression):
  * Mixed dtypes promote as in Triton (`promote`): kinds rank bool < integer <
    float and the higher kind wins; within a kind the wider dtype wins;
    float16 with bfloat16 gives float32; int32 with uint32 gives uint32,
    int32 with int64 gives int64, int64 with uint64 gives uint64 (so int8 with
    int32 gives int32, int8 with uint8 gives uint8, int16 with uint8 gives int16).
    8/16-bit results keep their type: the emitters declare every value with its
    IR type, which narrows C's int-promoted arithmetic back (wrapping, as Triton).
  * A Python number (literal or constexpr) does not take part in promotion
    when its kind is at most the runtime operand's (`x_f16 * 2.0` stays
    float16, `i * 3` stays int32); a number of a higher kind promotes the
    operand to int32 or float32 (`i * 0.5` is float32).  A Python int takes
    Triton's type: int32, else uint32 (below 2**32), int64, uint64 (below 2**64).
  * `/` is true division: integer operands become float32 first.
  * `store`, atomics and `load(other=)` convert the value to the
    pointer's element type, as an explicit cast would.
  * Shapes broadcast as in NumPy; a scalar meets a tile by splatting.
  * Integer `//` and `%` follow C (truncate toward zero), as on the GPU;
    Python semantics apply only to compile-time constants.  A constant zero divisor, or a
    constant shift amount outside [0, bits of the operand type), is an error.
  * Pointers are a root buffer plus an int32 or int64 offset: `ptr + int` and
    `int + ptr` only.  An int64 offset keeps the whole address expression 64-bit.
Compile-time values (Python numbers, constexprs) fold in Python.
"""

from __future__ import annotations

import math
import operator
from dataclasses import replace
from math import prod

import numpy as np

from ..ir.core import Builder, Value
from ..ir.ops import COMPARE, FLOAT_ONLY, INT_ONLY
from ..ir.types import (PointerType, ScalarType, TileType, dtype_of, elem_type, is_pointer,
                        shape_of, with_shape)
from ..passes.shared_hazards import pointer_origin
from ..language import dtypes as dt
from ..errors import CompilationError

_PY_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "idiv": operator.floordiv, "mod": operator.mod, "and": operator.and_, "or": operator.or_,
    "xor": operator.xor, "shl": operator.lshift, "shr": operator.rshift,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
    # as the run-time ops (fmax, fmin): a NaN operand gives the other (Python's max and
    # min gave the NaN when it came first)
    "maximum": lambda a, b: b if a != a else a if b != b else max(a, b),
    "minimum": lambda a, b: b if a != a else a if b != b else min(a, b),
    "pow": lambda a, b: _ieee(np.power, float(a), float(b)),
    "atan2": lambda a, b: math.atan2(a, b),
    "umulhi": lambda a, b: ((a % 2**32) * (b % 2**32)) >> 32,
}

_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "//", "mod": "%",
           "and": "&", "or": "|", "xor": "^", "shl": "<<", "shr": ">>", "lt": "<", "le": "<=",
           "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}



def _ieee(fn, *xs) -> float:
    """fn (a NumPy ufunc on float64) at compile time, with IEEE results where Python's math
    raises (overflow to inf, a domain error to NaN, a pole to inf)."""
    with np.errstate(all="ignore"):
        return float(fn(*(np.float64(x) for x in xs)))


def _article(word) -> str:
    return "an" if str(word)[:1] in "aeiou" else "a"

def is_const(x) -> bool:
    return isinstance(x, (bool, int, float))


def buffer_param_hint(*xs) -> str:
    """A hint when a buffer parameter is used like a scalar (a launch passed an mx.array
    where the kernel wants a number: `o < n` with n = mx.array([8]))."""
    for x in xs:
        if isinstance(x, Value) and x.owner is None and is_pointer(x.type) and x.hint:
            return (f" (parameter {x.hint!r} was passed an mx.array, so it is a buffer here; "
                    f"pass a Python number for a scalar, or read it with metile.load({x.hint}))")
    return ""


def param_hint(*xs) -> str:
    """A hint when a scalar kernel parameter is used like a buffer (a launch passed a scalar),
    found through the arithmetic that made `xs` (`Y + offs` with a scalar Y)."""
    seen, todo = set(), [x for x in xs if isinstance(x, Value)]
    while todo and len(seen) < 64:
        x = todo.pop()
        if x.id in seen:
            continue
        seen.add(x.id)
        if x.owner is None and isinstance(x.type, ScalarType) and x.hint:
            # (a 0-d mx.array is a scalar too: "pass an mx.array" read as wrong advice then)
            return (f" (parameter {x.hint!r} was passed a scalar - a number, or a 0-d mx.array, "
                    f"which a launch takes as a scalar value; pass an mx.array of one or more "
                    f"dimensions if it is a buffer, e.g. x.reshape(1))")
        owner = getattr(x, "owner", None)
        if owner is not None and hasattr(owner, "operands") and owner.name != "load":
            todo.extend(owner.operands)
    return ""


def describe(x) -> str:
    if isinstance(x, Value):
        kind = "tile" if isinstance(x.type, TileType) else "scalar"
        return f"a {x.type} {kind}" if kind == "tile" else f"a runtime {x.type} value"
    if isinstance(x, tuple):   # frontend/tuples.py's KernelTuple too
        # (each element by what it is: a Value's repr is its IR name, `%6:tile<4, float32>`)
        return "tuple (" + ", ".join(str(v.type) if isinstance(v, Value) else describe(v)
                                     for v in x) + ("," if len(x) == 1 else "") + ")"
    return f"{type(x).__name__} {x!r}"


def broadcast_shapes(a: tuple, b: tuple) -> tuple:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise CompilationError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


_KIND_RANK = {"b": 0, "i": 1, "u": 1, "f": 2}


def promote(a: dt.DType, b: dt.DType) -> dt.DType:
    """The common dtype of two runtime operands (Triton's rules, see the module doc)."""
    if a == b:
        return a
    ka, kb = _KIND_RANK[a.kind], _KIND_RANK[b.kind]
    if ka != kb:
        return a if ka > kb else b
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    if a.is_float:  # float16 and bfloat16: neither holds the other's values
        return dt.float32
    return a if a.kind == "u" else b


def no_fp8(what: str, *dtypes) -> None:
    """fp8 values are storage: converted to and from, never computed in (Triton refuses most
    fp8 arithmetic too), so an operation on one is an error naming the way out."""
    d = next((d for d in dtypes if d is not None and d.is_fp8), None)
    if d is not None:
        raise CompilationError(f"{what} on {d} values: fp8 is a storage type; convert to "
                               f"float16/float32 first (x.to(metile.float32))")


def number_dtype(x) -> dt.DType:
    """The dtype a Python number takes on its own."""
    if isinstance(x, bool):
        return dt.bool_
    if isinstance(x, int):
        for d in (dt.int32, dt.uint32, dt.int64, dt.uint64):
            if int_range(d)[0] <= x <= int_range(d)[1]:
                return d
        raise CompilationError(f"integer constant {x} does not fit in 64 bits")
    return dt.float32


def int_range(d: dt.DType) -> tuple[int, int]:
    """The values an integer dtype holds."""
    return (0, 2**d.bits - 1) if d.kind == "u" else (-2**(d.bits - 1), 2**(d.bits - 1) - 1)


# Pointer offsets metile lowers; any other integer is cast by the user, as the error says.
OFFSET_DTYPES = (dt.int32, dt.int64)


def with_number(d: dt.DType, x) -> dt.DType:
    """The dtype of a runtime `d` operand combined with the Python number `x`."""
    n = number_dtype(x)
    return d if _KIND_RANK[n.kind] <= _KIND_RANK[d.kind] else n


# Device atomics metile emits on every backend (Metal atomic_float/int/uint, CUDA atomic*):
# the buffer dtypes each kind takes.
ATOMIC_DTYPES = ("float32", "int32", "uint32")
ATOMIC_KIND_DTYPES = {**{k: ATOMIC_DTYPES for k in ("add", "max", "min", "xchg", "cas")},
                      **{k: ("int32", "uint32") for k in ("and", "or", "xor")}}
# Triton's memory semantics, its default (None) acq_rel: the emitters order the atomic's
# thread's other memory accesses around it with fences (README "Coming from Triton").
ATOMIC_SEMS = (None, "relaxed", "acquire", "release", "acq_rel")
ATOMIC_SCOPES = (None, "gpu", "cta", "sys")


class Semantics:
    def __init__(self, builder: Builder):
        self.b = builder

    # -- constants and shapes ------------------------------------------------
    def const(self, value, dtype: dt.DType) -> Value:
        if dtype.is_fp8:
            raise CompilationError(f"a {dtype} constant ({value!r}): fp8 is a storage type; make "
                                   f"the value in float32 and convert it (.to({dtype!r}))")
        if dtype.is_bool:
            value = bool(value)
        elif dtype.is_int:
            if isinstance(value, float):
                raise CompilationError(f"float constant {value!r} used as {dtype}; cast explicitly")
            value = int(value)
            lo, hi = int_range(dtype)
            if not lo <= value <= hi:
                raise CompilationError(f"constant {value} does not fit in {dtype}")
        else:
            value = float(value)
        return self.b.value("const", [], ScalarType(dtype), value=value)

    def literal(self, x, like: dt.DType) -> Value:
        """A Python number typed to meet a value of dtype `like`."""
        if isinstance(x, bool) and not like.is_bool:
            raise CompilationError(f"bool constant {x!r} combined with {like}; cast explicitly")
        if isinstance(x, float) and not like.is_float:
            raise CompilationError(
                f"float constant {x!r} combined with {_article(like)} {like} value; cast explicitly "
                f"(metile.cast(x, metile.float32)) or use an int constant")
        if like.is_bool and not isinstance(x, bool):
            raise CompilationError(f"number {x!r} combined with a bool value")
        return self.const(x, like)

    def to_value(self, x, dtype: dt.DType | None = None) -> Value:
        if isinstance(x, Value):
            return x
        if not is_const(x):
            raise CompilationError(f"expected a number or a runtime value, got {describe(x)}")
        return self.literal(x, number_dtype(x) if dtype is None else dtype)

    def broadcast_to(self, v: Value, shape: tuple) -> Value:
        have = shape_of(v.type)
        if have == tuple(shape):
            return v
        if not have:
            return self.b.value("splat", [v], TileType(tuple(shape), v.type), shape=tuple(shape))
        while len(have) < len(shape):
            v = self.expand_dims(v, 0)
            have = shape_of(v.type)
        if have == tuple(shape):
            return v
        broadcast_shapes(have, tuple(shape))
        return self.b.value("broadcast", [v], TileType(tuple(shape), elem_type(v.type)),
                            shape=tuple(shape))

    def expand_dims(self, v: Value, axis: int) -> Value:
        shape = list(shape_of(v.type))
        if not shape:
            raise CompilationError("indexing with None needs a tile, got a scalar")
        shape.insert(axis, 1)
        return self.b.value("expand_dims", [v], TileType(tuple(shape), elem_type(v.type)), axis=axis)

    def common(self, *xs) -> tuple[list[Value], tuple]:
        """Runtime values for `xs`, broadcast to one shape (constants typed by the first value)."""
        like = next((dtype_of(x.type) for x in xs if isinstance(x, Value) and dtype_of(x.type)), None)
        vals = [x if isinstance(x, Value) else self.to_value(x, like) for x in xs]
        shape: tuple = ()
        for v in vals:
            shape = broadcast_shapes(shape, shape_of(v.type))
        return [self.broadcast_to(v, shape) for v in vals], shape

    # -- elementwise ------------------------------------------------------------
    def binary(self, name: str, a, b):
        if is_const(a) and is_const(b):
            try:
                return _PY_BINARY[name](a, b)
            except (ArithmeticError, ValueError) as e:
                raise CompilationError(f"cannot evaluate {a!r} {_SYMBOL.get(name, name)} {b!r} at "
                                       f"compile time: {e}") from None
        pointers = [isinstance(x, Value) and is_pointer(x.type) for x in (a, b)]
        if any(pointers):
            if name in ("add", "sub"):
                return self._pointer_arith(name, a, b)
            raise CompilationError(f"'{_SYMBOL.get(name, name)}' is not defined on pointers: "
                                   f"a pointer only takes + or - an int32 or int64 offset (load "
                                   f"or store through it to get values){buffer_param_hint(a, b)}")
        no_fp8(f"'{_SYMBOL.get(name, name)}'", *(dtype_of(x.type) for x in (a, b)
                                                  if isinstance(x, Value)))
        if isinstance(a, Value) and isinstance(b, Value):
            da, db = dtype_of(a.type), dtype_of(b.type)
            if name in ("idiv", "mod") and da.is_int and db.is_int and \
                    (da.kind == "u") != (db.kind == "u"):
                # as Triton refuses it: promoted to unsigned, -7 // 2u is 2147483644
                raise CompilationError(
                    f"'{_SYMBOL[name]}' of {da} and {db}: operands of different signedness "
                    f"would divide as unsigned; cast one (x.to(metile.{da.name}) or "
                    f"y.to(metile.{db.name}))")
            d = promote(da, db)
        else:
            v, x = (a, b) if isinstance(a, Value) else (b, a)
            if not is_const(x):
                raise CompilationError(f"expected a number or a runtime value, got {describe(x)}")
            d = with_number(dtype_of(v.type), x)
        if name == "div" and (not d.is_float or d.bits == 16):
            # `/` is true division, also between integers; and as Triton computes it (PTX
            # has no 16-bit division), in float32 for float16/bfloat16 operands, a float32
            # result (int32 100000 / float16 4 gave inf, 1/3 three digits)
            d = dt.float32
        (va, vb), shape = self.common(self.convert(a, d), self.convert(b, d))
        self._check_dtype(name, d)
        self._check_constant_operand(name, vb, d)
        rtype = dt.bool_ if name in COMPARE else d
        return self.b.value(name, [va, vb], with_shape(ScalarType(rtype), shape))

    def _check_dtype(self, name: str, d: dt.DType) -> None:
        if name in FLOAT_ONLY and not d.is_float:
            hint = " (use // for integer division)" if name == "div" else ""
            raise CompilationError(f"'{name}' needs a floating-point operand, got {d}{hint}")
        if name in INT_ONLY and not d.is_int:
            raise CompilationError(f"'{_SYMBOL.get(name, name)}' needs integer operands, got {d}")
        if name == "umulhi" and d.bits == 64:
            raise CompilationError(f"umulhi() of {d} operands (the high 64 bits of a 128-bit "
                                   f"product) is not built; it takes int32/uint32")
        if name == "umulhi" and d.is_int and d.bits < 32:  # Triton takes 32/64-bit only
            raise CompilationError(f"umulhi() needs int32/uint32 operands, got {d}; cast them")
        if name in ("and", "or", "xor") and d.is_float:
            raise CompilationError(f"'{_SYMBOL[name]}' needs bool or integer operands, got {d}")
        if d.is_bool and name not in ("and", "or", "xor", "eq", "ne", "not"):
            raise CompilationError(f"'{_SYMBOL.get(name, name)}' is not defined on bool values")

    @staticmethod
    def _check_constant_operand(name: str, b: Value, d: dt.DType) -> None:
        """A constant divisor of zero or shift amount outside the type's width has no value on
        any backend (Triton's is poison; C++'s is undefined, and clang folds it to garbage
        where a runtime zero divisor would be reported), so it is refused here."""
        while getattr(b.owner, "name", None) in ("splat", "broadcast", "expand_dims"):
            b = b.owner.operands[0]
        if getattr(b.owner, "name", None) != "const" or not d.is_int:
            return
        value = b.owner.attrs["value"]
        if name in ("idiv", "mod") and value == 0:
            raise CompilationError(f"integer '{_SYMBOL[name]}' by the constant 0: the result "
                                   f"is undefined")
        if name in ("shl", "shr") and not 0 <= value < d.bits:
            raise CompilationError(f"'{_SYMBOL[name]}' by {value} on {d}: a shift amount must "
                                   f"be in [0, {d.bits}) (larger or negative amounts are "
                                   f"undefined)")

    def _pointer_arith(self, name: str, a, b):
        if isinstance(b, Value) and is_pointer(b.type):
            if name == "sub" or (isinstance(a, Value) and is_pointer(a.type)):
                raise CompilationError("only pointer + integer offset is supported")
            a, b = b, a
        if isinstance(b, Value) and dtype_of(b.type) not in OFFSET_DTYPES:
            raise CompilationError(f"pointer offsets must be int32 or int64, got "
                                   f"{dtype_of(b.type)}; cast them")
        if isinstance(b, (float, bool)):
            raise CompilationError(f"pointer offset must be an integer, got {b!r}")
        if name == "sub":
            b = self.unary("neg", b) if isinstance(b, Value) else -b
        if isinstance(b, int):
            b = self.const(b, dt.int32 if int_range(dt.int32)[0] <= b <= int_range(dt.int32)[1]
                           else dt.int64)
        shape = broadcast_shapes(shape_of(a.type), shape_of(b.type))
        pa, pb = self.broadcast_to(a, shape), self.broadcast_to(b, shape)
        pt = elem_type(a.type)
        if dtype_of(b.type) == dt.int64:  # the offset, and every one added later, is 64-bit
            pt = replace(pt, index=dt.int64)
        return self.b.value("ptr_add", [pa, pb], with_shape(pt, shape))

    def unary(self, name: str, x):
        if is_const(x):
            # float math as the run-time functions compute it, IEEE special values included
            # (exp(1000.) is inf, log(0.) -inf, sqrt(-1.) NaN: compile errors before), floor
            # and ceil of a float a float (Python's gave an int: `i * floor(2.5)` was int32)
            fold = {"neg": operator.neg, "not": operator.not_, "abs": abs,
                    "exp2": lambda v: _ieee(np.exp2, float(v)),
                    "rsqrt": lambda v: _ieee(lambda u: 1 / np.sqrt(u), float(v)),
                    "sigmoid": lambda v: _ieee(lambda u: 1 / (1 + np.exp(-u)), float(v)),
                    "floor": lambda v: float(math.floor(v)) if isinstance(v, float) else
                    math.floor(v),
                    "ceil": lambda v: float(math.ceil(v)) if isinstance(v, float) else
                    math.ceil(v)}
            ieee = getattr(np, {"asin": "arcsin", "acos": "arccos", "atan": "arctan"}.get(
                name, name), None)
            fn = fold.get(name) or (
                (lambda v, f=ieee: _ieee(f, float(v))) if isinstance(ieee, np.ufunc)
                else getattr(math, name))
            try:
                return fn(x)
            except (ArithmeticError, ValueError) as e:
                raise CompilationError(f"cannot evaluate {name}({x!r}) at compile time: {e}") \
                    from None
        if is_pointer(x.type):
            raise CompilationError(f"'{name}' is not defined on pointers{buffer_param_hint(x)}")
        d = dtype_of(x.type)
        no_fp8(f"'{_SYMBOL.get(name, name)}'", d)
        if name == "not" and d.is_float:
            raise CompilationError(f"'~'/'not' needs a bool or integer operand, got {d}")
        if name == "neg" and d.is_bool:
            raise CompilationError("unary '-' is not defined on bool values")
        if name not in ("not", "neg", "abs"):
            self._check_dtype(name, d)
        return self.b.value(name, [x], x.type)

    def convert(self, x, dtype: dt.DType) -> Value:
        """`x` as a `dtype` value: implicit conversion (promotion, stores), folded for numbers."""
        if isinstance(x, Value):
            return x if is_pointer(x.type) else self.cast(x, dtype)
        if not is_const(x):
            raise CompilationError(f"expected a number or a runtime value, got {describe(x)}")
        if dtype.is_bool:
            return self.const(bool(x), dtype)
        if dtype.is_float or not isinstance(x, float):
            return self.const(x, dtype)
        return self.cast(self.const(x, dt.float32), dtype)  # C's conversion: toward zero

    def cast(self, x, dtype: dt.DType, bitcast: bool = False):
        """A value conversion (fp8 rounds to nearest even and saturates, codegen/fp8.py), or
        with `bitcast` the same bits read as `dtype`."""
        if isinstance(x, Value) and is_pointer(x.type):
            raise CompilationError("pointers cannot be cast")
        if not isinstance(x, Value):
            x = self.to_value(x)
        src = dtype_of(x.type)
        if bitcast:
            # the same bits read as another type of the same width (Triton's bitcast):
            # fp8 bytes in and out of uint8 buffers, float32 <-> (u)int32 bit tricks
            if src.bits != dtype.bits or src.is_bool or dtype.is_bool:
                raise CompilationError(f"bitcast=True from {src} to {dtype}: a reinterpreting "
                                       f"cast needs two non-bool types of one width ({src} has "
                                       f"{src.bits} bits, {dtype} {dtype.bits})")
        if src == dtype:
            return x
        attrs = {"bitcast": True} if bitcast else {}
        return self.b.value("cast", [x], with_shape(ScalarType(dtype), shape_of(x.type)),
                            to=dtype, **attrs)

    def where(self, cond, a, b):
        if isinstance(cond, bool) or (is_const(cond) and not isinstance(cond, Value)):
            return a if cond else b
        if not isinstance(cond, Value) or is_pointer(cond.type):
            raise CompilationError(f"where() condition must be a bool or integer value, got "
                                   f"{describe(cond)}")
        if dtype_of(cond.type) != dt.bool_:  # Triton's rule: nonzero selects `a`
            cond = self.binary("ne", cond, 0)
        roots = {elem_type(x.type).root for x in (a, b)
                 if isinstance(x, Value) and is_pointer(x.type)}
        if len(roots) > 1:
            # a pointer names its buffer in its type (loads and stores bind one buffer):
            # choosing between two buffers element by element would read and write only one
            raise CompilationError(f"where() between pointers into different buffers "
                                   f"({', '.join(sorted(roots))}) is not supported: load from "
                                   f"each and choose between the values (or store to each "
                                   f"under complementary masks)")
        picks = [dtype_of(x.type) for x in (a, b) if isinstance(x, Value)]
        if len(picks) != 2 or picks[0] != picks[1]:  # choosing between two fp8 tiles is a copy
            no_fp8("where() mixing types", *picks)
        if isinstance(a, Value) and isinstance(b, Value):
            d = promote(dtype_of(a.type), dtype_of(b.type))
        elif isinstance(a, Value) or isinstance(b, Value):
            v, x = (a, b) if isinstance(a, Value) else (b, a)
            d = with_number(dtype_of(v.type), x)
        else:
            # two numbers type as an `if` statement's two assignments do (0 or 2**31: uint32)
            d = promote(number_dtype(a), number_dtype(b))
        (c, va, vb), shape = self.common(cond, self.convert(a, d), self.convert(b, d))
        return self.b.value("where", [c, va, vb], va.type)

    def pair_fma(self, a, b, c, pair: dt.DType):
        """Both 16-bit halves of uint32 words a * b + c in `pair` (ir/ops.py PAIR)."""
        if pair not in (dt.float16, dt.bfloat16):
            raise CompilationError(f"pair_fma() dtype= must be float16 or bfloat16 (the halves "
                                   f"of each 32-bit word), got {pair}")
        words = []
        for name, x in zip("abc", (a, b, c)):
            if isinstance(x, Value) and not is_pointer(x.type) and dtype_of(x.type) == dt.int32:
                # the same 32 bits (a word constant merged from two branches is an int32
                # value where it fits: frontend/control.py)
                x = self.cast(x, dt.uint32, bitcast=True)
            if isinstance(x, Value):
                if is_pointer(x.type) or dtype_of(x.type) != dt.uint32:
                    got = "a pointer" if is_pointer(x.type) else dtype_of(x.type)
                    raise CompilationError(
                        f"pair_fma() operand {name} must be uint32 (or int32) words holding two "
                        f"{pair} values, got {got} (reinterpret 32-bit words with "
                        f".to(metile.uint32, bitcast=True))")
                words.append(x)
            elif isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2 ** 32:
                words.append(self.const(x, dt.uint32))
            else:
                raise CompilationError(f"pair_fma() operand {name} must be a uint32 value or a "
                                       f"32-bit word constant, got {describe(x)}")
        ops, shape = self.common(*words)
        return self.b.value("pair_fma", ops, with_shape(ScalarType(dt.uint32), shape),
                            pair=pair.name)

    # -- memory -------------------------------------------------------------------
    def load(self, ptr, mask=None, other=None):
        if not (isinstance(ptr, Value) and is_pointer(ptr.type)):
            raise CompilationError(f"load() needs a pointer, got {describe(ptr)}{param_hint(ptr)}")
        if mask is None:
            _check_shared_index(ptr, "load()")
        pt: PointerType = elem_type(ptr.type)
        ops = [ptr]
        if mask is not None:
            mask = self._mask(mask)
            if other is None:  # masked-off lanes read zero (False in a bool buffer)
                other = False if pt.dtype.is_bool else 0
            other = self.convert(other, pt.dtype)
            ops, shape = self.common(ptr, mask, other)
        shape = shape_of(ops[0].type)
        return self.b.value("load", ops, with_shape(ScalarType(pt.dtype), shape))

    def store(self, ptr, value, mask=None) -> None:
        what = "store()"
        if not (isinstance(ptr, Value) and is_pointer(ptr.type)):
            raise CompilationError(f"{what} needs a pointer, got {describe(ptr)}{param_hint(ptr)}")
        if mask is None:
            _check_shared_index(ptr, what)
        pt: PointerType = elem_type(ptr.type)
        if isinstance(value, Value) and is_pointer(value.type):
            raise CompilationError(f"{what} of a pointer: MLX exposes no device addresses, so "
                                   f"pointers cannot be stored")
        if isinstance(value, Value) and dtype_of(value.type).is_fp8 and not pt.dtype.is_float:
            raise CompilationError(f"{what} of {dtype_of(value.type)} values into a {pt.dtype} "
                                   f"buffer would convert the numbers; store the bytes with "
                                   f".to(metile.uint8, bitcast=True)")
        value = self.convert(value, pt.dtype)
        items = [ptr, value] + ([self._mask(mask)] if mask is not None else [])
        ops, shape = self.common(*items)
        if len(shape) < len(shape_of(ptr.type)) or shape_of(ptr.type) != shape:
            if shape_of(ptr.type) != shape:
                raise CompilationError(f"{what} value/mask of shape {shape} does not fit the "
                                       f"pointer tile of shape {shape_of(ptr.type)}")
        self.b.op("store", ops, [])

    def atomic(self, kind: str, ptr, value, mask=None, compare=None, sem=None, scope=None):
        """atomic_<kind>: a `store` op with attrs {atomic: kind} whose result is the old value
        (operands ptr, value, [mask]; cas: ptr, value, compare)."""
        what = f"atomic_{kind}()"
        if not (isinstance(ptr, Value) and is_pointer(ptr.type)):
            raise CompilationError(f"{what} needs a pointer, got {describe(ptr)}{param_hint(ptr)}")
        if sem not in ATOMIC_SEMS:
            raise CompilationError(f"{what} sem={sem!r}: expected one of "
                                   f"{', '.join(map(repr, ATOMIC_SEMS[1:]))}")
        if scope not in ATOMIC_SCOPES:
            raise CompilationError(f"{what} scope={scope!r}: expected one of "
                                   f"{', '.join(map(repr, ATOMIC_SCOPES[1:]))}")
        pt: PointerType = elem_type(ptr.type)
        if pt.space != "device":
            raise CompilationError(f"{what} on threadgroup memory is not supported; "
                                   "it updates device buffers")
        allowed = ATOMIC_KIND_DTYPES[kind]
        if pt.dtype.name not in allowed:
            raise CompilationError(f"{what} on a {pt.dtype} buffer is not supported; "
                                   f"it takes {', '.join(allowed)} buffers")
        if isinstance(value, Value) and is_pointer(value.type):
            raise CompilationError(f"{what} of a pointer: MLX exposes no device addresses, so "
                                   f"pointers cannot be stored")
        items = [ptr, self.convert(value, pt.dtype)]
        if compare is not None:
            items.append(self.convert(compare, pt.dtype))
        if mask is not None:
            items.append(self._mask(mask))
        ops, shape = self.common(*items)
        if shape_of(ptr.type) != shape:
            raise CompilationError(f"{what} value/mask of shape {shape} does not fit the "
                                   f"pointer tile of shape {shape_of(ptr.type)}")
        op = self.b.op("store", ops, [with_shape(ScalarType(pt.dtype), shape)],
                       {"atomic": kind, "sem": sem or "acq_rel", "scope": scope or "gpu"})
        return op.results[0]

    def _mask(self, mask):
        if isinstance(mask, bool):
            return self.const(mask, dt.bool_)
        if not isinstance(mask, Value) or dtype_of(mask.type) != dt.bool_:
            raise CompilationError(f"mask must be a bool value, got {describe(mask)}")
        return mask

    # -- tiles ---------------------------------------------------------------------
    def reduce(self, kind: str, x, axis, tie_break_left: bool = True):
        if not isinstance(x, Value) or not isinstance(x.type, TileType):
            raise CompilationError(f"{kind}() needs a tile, got {describe(x)}")
        d = dtype_of(x.type)
        if d is not None and d.is_bool and kind == "sum":
            # (Triton's: the count of true elements, in int32, as small ints accumulate)
            x, d = self.cast(x, dt.int32), dt.int32
        if d is None or d.is_bool:
            raise CompilationError(f"{kind}() is not defined on {x.type}")
        no_fp8(f"{kind}()", d)
        shape = x.type.shape
        if axis is not None:
            if not isinstance(axis, int):
                raise CompilationError("reduction axis must be a constexpr int")
            if not -len(shape) <= axis < len(shape):
                raise CompilationError(f"axis {axis} out of range for a rank-{len(shape)} tile")
            axis %= len(shape)
            if len(shape) == 1:
                axis = None
        rshape = () if axis is None else shape[:axis] + shape[axis + 1:]
        attrs = {"kind": kind, "axis": axis}
        if kind in ("argmax", "argmin"):
            d = dt.int32
            if not tie_break_left:
                attrs["tie_break_left"] = False
        return self.b.value("reduce", [x], with_shape(ScalarType(d), rshape), **attrs)

    def scan(self, kind: str, x, axis, reverse: bool = False):
        what = {"sum": "cumsum", "prod": "cumprod"}[kind]
        if not isinstance(x, Value) or not isinstance(x.type, TileType):
            raise CompilationError(f"{what}() needs a tile, got {describe(x)}")
        shape = x.type.shape
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise CompilationError(f"{what}() axis must be a constexpr int, got {describe(axis)}")
        if not -len(shape) <= axis < len(shape):
            raise CompilationError(f"{what}() axis {axis} is out of range for a rank-{len(shape)} "
                                   f"tile")
        no_fp8(f"{what}()", dtype_of(x.type))
        if dtype_of(x.type).is_bool:  # Triton scans bool as int32
            x = self.cast(x, dt.int32)
        attrs = {"kind": kind, "axis": axis % len(shape)}
        if reverse:
            attrs["reverse"] = True
        return self.b.value("scan", [x], x.type, **attrs)

    def permute(self, x, dims: tuple, what: str = "permute"):
        if not isinstance(x, Value) or not isinstance(x.type, TileType):
            raise CompilationError(f"{what}() needs a tile, got {describe(x)}")
        shape = x.type.shape
        if sorted(d for d in dims if isinstance(d, int)) != list(range(len(shape))) \
                or any(isinstance(d, bool) for d in dims):
            raise CompilationError(f"{what}() dims {dims} are not a permutation of the "
                                   f"{len(shape)} axes of a {x.type}")
        if tuple(dims) == tuple(range(len(shape))):
            return x
        rshape = tuple(shape[d] for d in dims)
        return self.b.value("permute", [x], TileType(rshape, elem_type(x.type)), dims=tuple(dims))

    def reshape(self, x, shape: tuple, what: str = "reshape"):
        if not isinstance(x, Value) or not isinstance(x.type, TileType):
            raise CompilationError(f"{what}() needs a tile, got {describe(x)}")
        have = x.type.shape
        if not all(isinstance(s, int) and not isinstance(s, bool) and (s > 0 or s == -1)
                   for s in shape) or not shape or list(shape).count(-1) > 1:
            raise CompilationError(f"{what}() shape must be positive constexpr ints (one may be "
                                   f"-1), got {shape!r}")
        known = prod(s for s in shape if s != -1)
        if -1 in shape and x.type.numel % known == 0:
            shape = tuple(x.type.numel // known if s == -1 else s for s in shape)
        if prod(shape) != x.type.numel:
            raise CompilationError(f"{what}(): a tile of shape {have} ({x.type.numel} elements) "
                                   f"cannot take the shape {shape}")
        if tuple(shape) == have:
            return x
        return self.b.value("reshape", [x], TileType(tuple(shape), elem_type(x.type)),
                            shape=tuple(shape))

    def dot(self, a, b, acc=None):
        for name, v in (("a", a), ("b", b)):
            if not isinstance(v, Value) or not isinstance(v.type, TileType) or len(v.type.shape) != 2:
                raise CompilationError(f"dot() operand {name} must be a 2-D tile, got {describe(v)}")
        (m, k), (k2, n) = a.type.shape, b.type.shape
        if k != k2:
            raise CompilationError(f"dot() inner dimensions differ: {a.type.shape} @ {b.type.shape}")
        da, db = dtype_of(a.type), dtype_of(b.type)
        no_fp8("dot()", da, db)
        if da != db or not da.is_float:
            raise CompilationError(f"dot() needs two floating tiles of one dtype, got {da} and {db}")
        rtype = TileType((m, n), ScalarType(dt.float32))
        if acc is None:
            acc = self.broadcast_to(self.const(0.0, dt.float32), (m, n))
        elif not isinstance(acc, Value) or acc.type != rtype:
            raise CompilationError(f"dot() accumulator must be a {rtype}, got {describe(acc)}")
        return self.b.value("dot", [a, b, acc], rtype)


def _check_shared_index(ptr: Value, what: str) -> None:
    """Refuses a scalar access at a constant element outside its shared array: it read or
    wrote the neighbouring allocation, which no bounds check fences (device buffers are)."""
    if isinstance(ptr.type, TileType):
        return
    alloc, offset = pointer_origin(ptr)
    if alloc is None or offset is None:
        return
    size = alloc.attrs.get("size")
    if isinstance(size, int) and not 0 <= offset < size:
        raise CompilationError(f"{what} of element {offset} of a shared array of {size} "
                               f"elements: outside it (threadgroup memory is not fenced, so "
                               f"it would {'read' if what.startswith('load') else 'write'} "
                               f"the neighbouring array)")
