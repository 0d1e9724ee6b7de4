"""How each `metile.*` builtin becomes Tile IR.

Each entry receives the frontend `Generator`, the evaluated positional and
keyword arguments (runtime Values or compile-time Python values) and returns
the call's value.  Arguments the language requires at compile time (shapes,
axes, dtypes) are checked here with `need_constexpr`.
"""

from __future__ import annotations

import inspect
import math

from ..ir.core import Value
from ..ir.types import PointerType, ScalarType, TileType, dtype_of
from ..language import dtypes as dt
from ..errors import CompilationError
from .semantics import broadcast_shapes, describe, is_const
from .views import TensorView, make_view

IMPLS = {}


def builtin(signature: str, name: str | None = None):
    """Register an implementation; `signature` is the Python parameter list users see."""
    params = []
    for part in filter(None, (p.strip() for p in signature.split(","))):
        pname, eq, default = part.partition("=")
        params.append(inspect.Parameter(
            pname, inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=eval(default) if eq else inspect.Parameter.empty))  # noqa: S307
    sig = inspect.Signature(params)

    def register(fn):
        nonlocal name
        name = name or fn.__name__.rstrip("_")

        def call(gen, args, kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise CompilationError(f"metile.{name}(): {e}") from None
            bound.apply_defaults()
            return fn(gen, **bound.arguments)

        IMPLS[name] = call
        return fn

    return register


def need_constexpr(value, what: str, kind=int):
    if isinstance(value, Value) or not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise CompilationError(f"{what} must be a constexpr {kind.__name__} (known at compile "
                               f"time), got {describe(value)}")
    return value


def need_dtype(value, what: str) -> dt.DType:
    d = dt.to_dtype(value)
    if d is None:
        raise CompilationError(f"{what}: unsupported dtype {value!r}; kernels take "
                               f"{', '.join(d.name for d in dt.ALL)}")
    return d


def _i32(gen, name: str, **attrs) -> Value:
    return gen.b.value(name, [], ScalarType(dt.int32), **attrs)


@builtin("axis=0")
def program_id(gen, axis):
    need_constexpr(axis, "program_id() axis")
    if axis not in (0, 1, 2):
        raise CompilationError(f"program_id() axis must be 0, 1 or 2, got {axis}")
    return _i32(gen, "program_id", axis=axis)


@builtin("axis=0")
def num_programs(gen, axis):
    need_constexpr(axis, "num_programs() axis")
    if axis not in (0, 1, 2):
        raise CompilationError(f"num_programs() axis must be 0, 1 or 2, got {axis}")
    return _i32(gen, "num_programs", axis=axis)


@builtin("")
def thread_id(gen):
    return _i32(gen, "thread_id")


@builtin("")
def num_threads(gen):
    return _i32(gen, "num_threads")


@builtin("start, end")
def arange(gen, start, end):
    need_constexpr(start, "arange() start")
    need_constexpr(end, "arange() end")
    if end <= start:
        raise CompilationError(f"arange({start}, {end}) is empty: end must be greater than start")
    if start < -2**31 or end > 2**31:
        # (its values are int32: a BLOCK of 2**31 compiled and overflowed at run time)
        raise CompilationError(f"arange({start}, {end}): its values are int32, so start and "
                               f"end must lie in [-2**31, 2**31]")
    return gen.b.value("arange", [], TileType((end - start,), ScalarType(dt.int32)),
                       start=start, end=end)


@builtin("pointer, mask=None, other=None, boundary_check=(), padding_option='', "
         "cache_modifier='', eviction_policy='', volatile=False")
def load(gen, pointer, mask, other, boundary_check, padding_option, cache_modifier,
         eviction_policy, volatile):
    _memory_hints("load", cache_modifier, eviction_policy, volatile)
    if hasattr(pointer, "load_block"):  # a block pointer (frontend/block_pointers.py)
        return pointer.load_block(gen, mask, other, boundary_check, padding_option)
    _block_options(boundary_check, padding_option, "load")
    return gen.sem.load(pointer, mask=mask, other=other)


@builtin("pointer, value, mask=None, boundary_check=(), cache_modifier='', "
         "eviction_policy=''")
def store(gen, pointer, value, mask, boundary_check, cache_modifier, eviction_policy):
    _memory_hints("store", cache_modifier, eviction_policy, False)
    if hasattr(pointer, "store_block"):
        return pointer.store_block(gen, value, mask, boundary_check)
    _block_options(boundary_check, "", "store")
    gen.sem.store(pointer, value, mask=mask)


# Triton's cache and eviction hints (the strings its semantic.py accepts).  They are checked
# and otherwise ignored: Metal has no per-access cache control, and metile's CUDA emission
# issues plain loads and stores (what Triton does for the default hints).
_CACHE_MODIFIERS = {"load": ("", ".ca", ".cg", ".cv"), "store": ("", ".wb", ".cg", ".cs", ".wt")}
_EVICTION_POLICIES = ("", "evict_last", "evict_first")


def _memory_hints(verb: str, cache_modifier, eviction_policy, volatile) -> None:
    if cache_modifier is None:
        cache_modifier = ""
    if eviction_policy is None:
        eviction_policy = ""
    allowed = _CACHE_MODIFIERS[verb]
    if cache_modifier not in allowed:
        raise CompilationError(f"{verb}(): cache_modifier={cache_modifier!r} is not one of "
                               f"Triton's {verb} cache modifiers "
                               f"{', '.join(repr(c) for c in allowed[1:])}")
    if eviction_policy not in _EVICTION_POLICIES:
        raise CompilationError(f"{verb}(): eviction_policy={eviction_policy!r} is not one of "
                               f"'evict_last', 'evict_first'")
    if not isinstance(volatile, bool):
        raise CompilationError(f"{verb}(): volatile= must be a constexpr bool, got "
                               f"{describe(volatile)}")


def _block_options(boundary_check, padding_option, verb: str) -> None:
    """Triton refuses block-pointer options on a load/store of a pointer tile."""
    for name, given in (("boundary_check", boundary_check), ("padding_option", padding_option)):
        if given:
            raise CompilationError(f"{verb}(): {name}= is only for block pointers "
                                   f"(metile.make_block_ptr); a pointer tile takes "
                                   f"{'mask=' if name == 'boundary_check' else 'other='}")


def _atomic(kind):
    @builtin("pointer, val, mask=None, sem=None, scope=None", f"atomic_{kind}")
    def impl(gen, pointer, val, mask, sem, scope):
        return gen.sem.atomic(kind, pointer, val, mask=mask, sem=sem, scope=scope)


for _kind in ("add", "max", "min", "xchg", "and", "or", "xor"):
    _atomic(_kind)


@builtin("pointer, cmp, val, sem=None, scope=None")
def atomic_cas(gen, pointer, cmp, val, sem, scope):
    return gen.sem.atomic("cas", pointer, val, compare=cmp, sem=sem, scope=scope)


@builtin("condition, x, y")
def where(gen, condition, x, y):
    return gen.sem.where(condition, x, y)


def _propagate_nan(value, what: str) -> bool:
    """True for PropagateNan.ALL (a NaN operand gives NaN), False for NONE (the NaN loses)."""
    from ..language.core import PropagateNan
    if value is None or value is PropagateNan.NONE:
        return False
    if value is PropagateNan.ALL:
        return True
    raise CompilationError(f"{what} propagate_nan must be metile.PropagateNan.NONE or .ALL, "
                           f"got {describe(value)}")


def _nan_or(gen, r, *xs):
    """`r`, except NaN where an operand of `xs` is NaN (float operands only)."""
    if not isinstance(r, Value):   # (folded: constant operands)
        return math.nan if any(isinstance(x, float) and x != x for x in xs) else r
    if not dtype_of(r.type).is_float:
        return r
    for x in reversed(xs):
        if isinstance(x, Value):
            x = gen.sem.convert(x, dtype_of(r.type))
            r = gen.sem.where(gen.sem.binary("ne", x, x), x, r)
        elif isinstance(x, float) and x != x:
            return gen.sem.binary("add", r, x)
    return r


def _min_max(name):
    @builtin("x, y, propagate_nan=None", name)
    def impl(gen, x, y, propagate_nan):
        r = gen.sem.binary(name, x, y)
        return _nan_or(gen, r, x, y) if _propagate_nan(propagate_nan, f"{name}()") else r


for _name in ("maximum", "minimum"):
    _min_max(_name)


def _unary(name):
    @builtin("x", name)
    def impl(gen, x):
        return gen.sem.unary(name, x)


for _name in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "erf",
              "sin", "cos", "tan", "asin", "acos", "atan", "floor", "ceil"):
    _unary(_name)

# Triton's correctly rounded spellings: metile's division and square root are the
# backend's (Metal's fast math is not correctly rounded; see README "Coming from Triton").
IMPLS["sqrt_rn"] = IMPLS["sqrt"]


def _binary_math(name):
    @builtin("x, y", name)
    def impl(gen, x, y):
        return gen.sem.binary(name, x, y)


for _name in ("pow", "atan2", "umulhi"):
    _binary_math(_name)


@builtin("x, y, ieee_rounding=False")
def fdiv(gen, x, y, ieee_rounding):
    return gen.sem.binary("div", x, y)


@builtin("x, y")
def div_rn(gen, x, y):
    return gen.sem.binary("div", x, y)


@builtin("x, y, z")
def fma(gen, x, y, z):
    # two roundings (multiply, then add): metile has no fused op yet
    return gen.sem.binary("add", gen.sem.binary("mul", x, y), z)


@builtin("a, b, c, dtype=None")
def pair_fma(gen, a, b, c, dtype):
    if dtype is None:
        raise CompilationError("pair_fma() needs dtype= (metile.float16 or metile.bfloat16): "
                               "the type of the two halves of each word")
    return gen.sem.pair_fma(a, b, c, need_dtype(dtype, "pair_fma() dtype="))


@builtin("x, min, max, propagate_nan=None")
def clamp(gen, x, min, max, propagate_nan):
    r = gen.sem.binary("minimum", gen.sem.binary("maximum", x, min), max)
    # Triton's ALL propagates a NaN of x only (a NaN bound leaves the result undefined)
    return _nan_or(gen, r, x) if _propagate_nan(propagate_nan, "clamp()") else r


@builtin("x, dtype, fp_downcast_rounding=None, bitcast=False")
def cast(gen, x, dtype, fp_downcast_rounding, bitcast):
    if fp_downcast_rounding not in (None, "rtne"):
        raise CompilationError(f"cast() fp_downcast_rounding={fp_downcast_rounding!r} is not "
                               f"supported; conversions round to nearest even")
    if not isinstance(bitcast, bool):
        raise CompilationError(f"cast() bitcast= must be a constexpr bool, got {describe(bitcast)}")
    return gen.sem.cast(x, need_dtype(dtype, "cast()"), bitcast=bitcast)


def _keep_dims(gen, x, r, axis, keep_dims):
    """The reduced axis (every axis for axis=None) kept with extent 1, as Triton's keep_dims."""
    if not keep_dims:
        return r
    rank = len(x.type.shape)
    if axis is None or rank == 1:
        return gen.sem.broadcast_to(r, (1,) * rank)
    return gen.sem.expand_dims(r, axis % rank)


def _small_int(x) -> bool:
    d = dtype_of(x.type) if isinstance(x, Value) else None
    return d is not None and d.is_int and d.bits < 32


def _widened_sum_input(gen, x):
    """Triton sums 8/16-bit integers in 32 bits of the same signedness (its `_pick_sum_dtype`)."""
    if not _small_int(x):
        return x
    return gen.sem.cast(x, dt.int32 if dtype_of(x.type).kind == "i" else dt.uint32)


def _reduction(kind):
    @builtin("input, axis=None, return_indices=False, return_indices_tie_break_left=True, "
             "keep_dims=False", kind)
    def impl(gen, input, axis, return_indices, return_indices_tie_break_left, keep_dims):
        if not return_indices and _small_int(input):  # Triton: 8/16-bit max/min give int32
            input = gen.sem.cast(input, dt.int32)
        r = _keep_dims(gen, input, gen.sem.reduce(kind, input, axis), axis, keep_dims)
        if not return_indices:
            return r
        i = gen.sem.reduce("arg" + kind, input, axis, return_indices_tie_break_left)
        return r, _keep_dims(gen, input, i, axis, keep_dims)


for _name in ("max", "min"):
    _reduction(_name)


@builtin("input, axis=None, keep_dims=False, dtype=None, return_indices=False")
def sum_(gen, input, axis, keep_dims, dtype, return_indices):
    if return_indices:
        raise CompilationError("sum() has no return_indices (max() and min() do)")
    if dtype is not None:  # Triton casts the input, then sums in that dtype
        input = gen.sem.cast(input, need_dtype(dtype, "sum() dtype"))
    else:
        input = _widened_sum_input(gen, input)
    return _keep_dims(gen, input, gen.sem.reduce("sum", input, axis), axis, keep_dims)


def _arg_reduction(kind):
    @builtin("input, axis, tie_break_left=True, keep_dims=False", kind)
    def impl(gen, input, axis, tie_break_left, keep_dims):
        if not isinstance(tie_break_left, bool):
            raise CompilationError(f"{kind}() tie_break_left must be a constexpr bool")
        r = gen.sem.reduce(kind, input, axis, tie_break_left)
        return _keep_dims(gen, input, r, axis, keep_dims)


for _name in ("argmax", "argmin"):
    _arg_reduction(_name)


def _scan(name, kind):
    @builtin("input, axis=0, reverse=False, dtype=None", name)
    def impl(gen, input, axis, reverse, dtype):
        if not isinstance(reverse, bool):
            raise CompilationError(f"{name}() reverse must be a constexpr bool")
        if dtype is not None:
            input = gen.sem.cast(input, need_dtype(dtype, f"{name}() dtype"))
        elif kind == "sum":
            input = _widened_sum_input(gen, input)
        return gen.sem.scan(kind, input, axis, reverse)


_scan("cumsum", "sum")
_scan("cumprod", "prod")


def _dims(args, what):
    """Triton's `f(x, 1, 0)` and `f(x, (1, 0))` spellings of a dims/shape argument."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    for a in args:
        if isinstance(a, Value) or isinstance(a, bool) or not isinstance(a, int):
            raise CompilationError(f"{what} must be constexpr ints, got {describe(a)}")
    return tuple(args)


def _permute_call(name):
    def impl(gen, args, kwargs):
        if not args:
            raise CompilationError(f"metile.{name}() needs a tile")
        x, rest = args[0], args[1:]
        extra = set(kwargs) - {"dims"}
        if extra:
            raise CompilationError(f"metile.{name}() got an unexpected keyword argument "
                                   f"{sorted(extra)[0]!r}")
        if "dims" in kwargs:
            rest = (kwargs["dims"],)
        dims = _dims(rest, f"{name}() dims")
        if not dims and name == "trans":
            rank = len(x.type.shape) if isinstance(x, Value) and isinstance(x.type, TileType) else 0
            if rank != 2:
                raise CompilationError(f"trans() without dims needs a 2-D tile, got "
                                       f"{describe(x)}; pass the axis order")
            dims = (1, 0)
        return gen.sem.permute(x, dims, name)
    return impl


def _reshape_call(name):
    def impl(gen, args, kwargs):
        if not args:
            raise CompilationError(f"metile.{name}() needs a tile")
        x, rest = args[0], args[1:]
        extra = set(kwargs) - {"shape", "can_reorder"}
        if extra:
            raise CompilationError(f"metile.{name}() got an unexpected keyword argument "
                                   f"{sorted(extra)[0]!r}")
        if "shape" in kwargs:
            rest = (kwargs["shape"],)
        # can_reorder=True lets Triton pick any order; keeping row-major order is one of them
        return gen.sem.reshape(x, _dims(rest, f"{name}() shape"), name)
    return impl


for _name in ("trans", "permute"):
    IMPLS[_name] = _permute_call(_name)
for _name in ("reshape", "view"):
    IMPLS[_name] = _reshape_call(_name)


def _shape(shape, what):
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, tuple) or not all(isinstance(s, int) and s > 0 for s in shape):
        raise CompilationError(f"{what} shape must be a tuple of positive constexpr ints, "
                               f"got {describe(shape) if isinstance(shape, Value) else shape!r}")
    return shape


@builtin("input, axis")
def expand_dims(gen, input, axis):
    if not isinstance(input, Value) or not isinstance(input.type, TileType):
        raise CompilationError(f"expand_dims() needs a tile, got {describe(input)}")
    axes = axis if isinstance(axis, tuple) else (axis,)
    out = input
    for a in axes:
        need_constexpr(a, "expand_dims() axis")
        rank = len(out.type.shape) + 1
        if not -rank <= a < rank:
            raise CompilationError(f"expand_dims() axis {a} is out of range for a rank-{rank} "
                                   f"result")
        out = gen.sem.expand_dims(out, a % rank)
    return out


@builtin("input, shape")
def broadcast_to(gen, input, shape):
    shape = _shape(shape, "broadcast_to()")
    v = gen.sem.to_value(input)
    have = v.type.shape if isinstance(v.type, TileType) else ()
    try:
        fits = len(shape) >= len(have) and broadcast_shapes(have, shape) == shape
    except CompilationError:
        fits = False
    if not fits:
        raise CompilationError(f"broadcast_to(): a tile of shape {have} does not broadcast to "
                               f"{shape}")
    return gen.sem.broadcast_to(v, shape)


@builtin("shape, dtype='float32'")
def zeros(gen, shape, dtype):
    d = need_dtype(dtype, "zeros()")
    return gen.sem.broadcast_to(gen.sem.const(0, d), _shape(shape, "zeros()"))


@builtin("shape, value, dtype='float32'")
def full(gen, shape, value, dtype):
    d = need_dtype(dtype, "full()")
    if isinstance(value, float) and not d.is_float:
        raise CompilationError(f"full() value {value!r} is a float and dtype {d} is not; pass "
                               f"an int (e.g. int({value!r})) or a float dtype")
    v = gen.sem.to_value(value, d)
    if v.type != ScalarType(d):
        raise CompilationError(f"full() value has type {v.type}, expected a {d} scalar")
    return gen.sem.broadcast_to(v, _shape(shape, "full()"))


@builtin("a, b")
def cdiv(gen, a, b):
    if is_const(a) and is_const(b):
        return -(-a // b)
    sem = gen.sem
    return sem.binary("idiv", sem.binary("sub", sem.binary("add", a, b), 1), b)


# Triton's input_precision values.  Only float32 operands read them; metile's float32
# products are IEEE unless the kernel takes RELAXED_PRECISION=True (a per-kernel policy), so
# "tf32"-family values permit reduced precision without requiring it, as Triton on a device
# without TF32 units, and "ieee" contradicts RELAXED_PRECISION=True.
_INPUT_PRECISIONS = ("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6")


@builtin("a, b, acc=None, input_precision=None, allow_tf32=None, max_num_imprecise_acc=None, "
         "out_dtype='float32'")
def dot(gen, a, b, acc, input_precision, allow_tf32, max_num_imprecise_acc, out_dtype):
    if input_precision is not None and allow_tf32 is not None:
        raise CompilationError("dot(): only one of input_precision= and allow_tf32= can be given")
    if allow_tf32 is not None:
        if not isinstance(allow_tf32, bool):
            raise CompilationError(f"dot(): allow_tf32= must be a constexpr bool, got "
                                   f"{describe(allow_tf32)}")
        input_precision = "tf32" if allow_tf32 else "ieee"
    if input_precision is not None and input_precision not in _INPUT_PRECISIONS:
        raise CompilationError(f"dot(): input_precision={input_precision!r} is not one of "
                               f"{', '.join(map(repr, _INPUT_PRECISIONS))}")
    if input_precision == "ieee" and gen.ctx.relaxed_precision:
        raise CompilationError("dot(): input_precision='ieee' (or allow_tf32=False) contradicts "
                               "the kernel's RELAXED_PRECISION=True")
    # fp8 operands only (Triton ignores it otherwise); metile has no fp8 types
    if max_num_imprecise_acc is not None and (
            isinstance(max_num_imprecise_acc, (bool, Value))
            or not isinstance(max_num_imprecise_acc, int) or max_num_imprecise_acc < 0):
        raise CompilationError(f"dot(): max_num_imprecise_acc= must be a constexpr int >= 0, got "
                               f"{describe(max_num_imprecise_acc)}")
    if need_dtype(out_dtype, "dot() out_dtype") != dt.float32:
        raise CompilationError(f"dot(): out_dtype={dt.to_dtype(out_dtype)} is not built: metile "
                               f"accumulates in float32 (cast the result)")
    return gen.sem.dot(a, b, acc)


@builtin("size, dtype='float32'")
def shared(gen, size, dtype):
    need_constexpr(size, "shared() size")
    if size <= 0:
        raise CompilationError(f"shared() size must be positive, got {size}")
    d = need_dtype(dtype, "shared()")
    root = f"shared{gen.next_shared()}"
    return gen.b.value("shared_alloc", [], PointerType(d, "threadgroup", root), size=size,
                       root=root)


@builtin("")
def barrier(gen):
    # A kernel's barrier() orders its device-memory writes before the group's reads too, as
    # CUDA's __syncthreads does: Metal's threadgroup_barrier(mem_threadgroup) alone does not
    # make one thread's device store visible to another (a store to Y, then a read of
    # another thread's Y element, passed on the CPU runtime and was unordered on an Apple GPU)
    gen.b.op("barrier", [], [], {"device": True})


IMPLS["debug_barrier"] = IMPLS["barrier"]


# -- hints and compile-time helpers ---------------------------------------------------
# Triton's compiler reads multiple_of / max_contiguous / max_constancy / assume to prove
# alignment; metile's passes prove alignment and bounds from the index arithmetic itself,
# so the hints are checked for form and otherwise do not change the program.

def _hint(name):
    @builtin("input, values", name)
    def impl(gen, input, values):
        vals = values if isinstance(values, tuple) else (values,)
        if not vals or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                for v in vals):
            raise CompilationError(f"{name}() values must be positive constexpr ints, "
                                   f"got {describe(values)}")
        if not isinstance(input, Value) and not is_const(input):
            raise CompilationError(f"{name}() needs a value, got {describe(input)}")
        return input


for _name in ("multiple_of", "max_contiguous", "max_constancy"):
    _hint(_name)


@builtin("cond")
def assume(gen, cond):
    if not isinstance(cond, Value):
        if not cond:
            raise CompilationError("assume() of a condition that is false at compile time")
        return None
    if cond.type != ScalarType(dt.bool_):
        raise CompilationError(f"assume() needs a bool scalar condition, got {describe(cond)}")
    return None


@builtin("cond, msg=''")
def static_assert(gen, cond, msg):
    if isinstance(cond, Value):
        raise CompilationError("static_assert() needs a compile-time condition, got "
                               f"{describe(cond)}")
    if not cond:
        raise CompilationError(f"static_assert failed{': ' + str(msg) if msg else ''}")


def _static_print(gen, args, kwargs):
    loc = gen.b.loc
    shown = [str(a.type) if isinstance(a, Value) else repr(a) if not isinstance(a, str) else a
             for a in args]
    print(f"{loc.file}:{loc.line}: static_print:", *shown, **{k: v for k, v in kwargs.items()
                                                               if k in ("sep", "end")})


IMPLS["static_print"] = _static_print


@builtin("n")
def next_power_of_2(gen, n):
    need_constexpr(n, "next_power_of_2() argument")
    from ..language.core import next_power_of_2 as host
    return host(n)


def _loop_only(name):
    def impl(gen, args, kwargs):
        raise CompilationError(f"{name}() can only be used as the iterable of a for loop")
    return impl


for _name in ("static_range", "range"):
    IMPLS[_name] = _loop_only(_name)


@builtin("buffer, shape=None, strides=None, block_shape=None, access='readwrite'")
def tensor(gen, buffer, shape, strides, block_shape, access):
    return make_view(gen.sem, buffer, shape, strides, block_shape, access)


@builtin("value")
def loop_state(gen, value):
    return value


@builtin("start, end=None, step=1")
def tile_range(gen, start, end, step):
    raise CompilationError("tile_range() can only be used as the iterable of a for loop")


def view_method(view: TensorView, name: str):
    """`view.load(position)` / `view.store(position, value)` as callables for the frontend."""
    from . import fragments
    if name == "load":
        return lambda gen, args, kwargs: (
            fragments.load(gen, view, *args, **kwargs) if fragments.applies(gen, view)
            else view.load(gen.sem, *args, **kwargs))
    if name == "store":
        return lambda gen, args, kwargs: (
            fragments.store(gen, view, *args, **kwargs) if fragments.applies(gen, view)
            else view.store(gen.sem, *args, **kwargs))
    if name in ("shape", "strides", "block_shape", "access", "dtype"):
        return getattr(view, name)
    raise CompilationError(f"tensor views have no attribute {name!r}")
