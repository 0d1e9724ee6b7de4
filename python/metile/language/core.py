"""The functions a kernel may call.

These are markers, not implementations: the frontend recognises each by its
`__metile_builtin__` name and builds Tile IR for the call.  Calling one from
ordinary Python (outside a kernel) raises, so a kernel accidentally run as
Python fails loudly instead of computing something else.
"""

from __future__ import annotations

import enum


class constexpr:
    """Annotation for a compile-time parameter (`BLOCK: metile.constexpr`).

    Each distinct value specializes the kernel.  Keyword-only parameters with
    a default are constexpr too.
    """

    def __init__(self, value=None):
        self.value = value

    def __repr__(self) -> str:
        return f"constexpr({self.value!r})"


def _builtin(name: str, doc: str):
    def stub(*args, **kwargs):
        raise RuntimeError(f"metile.{name} can only be called inside a @metile.kernel function")

    stub.__name__ = name
    stub.__qualname__ = name
    stub.__doc__ = doc
    stub.__metile_builtin__ = name
    return stub


_DOCS = {
    # block level
    "program_id": "program_id(axis) -> int32: index of this program (threadgroup) along a grid axis.",
    "num_programs": "num_programs(axis) -> int32: number of programs along a grid axis.",
    "arange": "arange(start, end) -> int32 tile [start, end); both bounds constexpr.",
    "load": "load(pointer, mask=None, other=None, boundary_check=(), padding_option='', "
            "cache_modifier='', eviction_policy='', volatile=False): scalar or tile load; "
            "masked-off lanes read `other` (0); a block pointer takes boundary_check=. The "
            "cache/eviction/volatile hints are checked and have no effect.",
    "store": "store(pointer, value, mask=None, boundary_check=(), cache_modifier='', "
             "eviction_policy=''): scalar or tile store; masked-off lanes write nothing; a block "
             "pointer takes boundary_check=. The hints are checked and have no effect.",
    "atomic_add": "atomic_add(pointer, val, mask=None, sem=None, scope=None): adds val to device "
                  "memory atomically (float32, int32 or uint32 buffers); returns the old value.",
    "atomic_max": "atomic_max(pointer, val, mask=None, sem=None, scope=None): stores the larger; "
                  "returns the old value (float32, int32, uint32).",
    "atomic_min": "atomic_min(pointer, val, mask=None, sem=None, scope=None): stores the smaller; "
                  "returns the old value (float32, int32, uint32).",
    "atomic_xchg": "atomic_xchg(pointer, val, mask=None, sem=None, scope=None): stores val; "
                   "returns the old value.",
    "atomic_cas": "atomic_cas(pointer, cmp, val, sem=None, scope=None): stores val where the old "
                  "value equals cmp (bitwise); returns the old value.",
    "atomic_and": "atomic_and(pointer, val, mask=None, sem=None, scope=None): int32/uint32; "
                  "returns the old value.",
    "atomic_or": "atomic_or(pointer, val, mask=None, sem=None, scope=None): int32/uint32; "
                 "returns the old value.",
    "atomic_xor": "atomic_xor(pointer, val, mask=None, sem=None, scope=None): int32/uint32; "
                  "returns the old value.",
    "where": "where(condition, a, b): elementwise selection.",
    "maximum": "maximum(a, b, propagate_nan=PropagateNan.NONE): elementwise maximum; NONE: a "
               "NaN operand loses to the other, ALL: a NaN operand gives NaN.",
    "minimum": "minimum(a, b, propagate_nan=PropagateNan.NONE): elementwise minimum (as "
               "maximum).",
    "exp": "exp(x)", "exp2": "exp2(x)", "log": "log(x)", "sqrt": "sqrt(x)", "rsqrt": "rsqrt(x)",
    "abs": "abs(x)", "tanh": "tanh(x)", "sigmoid": "sigmoid(x) = 1 / (1 + exp(-x))", "erf": "erf(x)",
    "log2": "log2(x)", "sin": "sin(x)", "cos": "cos(x)", "tan": "tan(x)", "asin": "asin(x)",
    "acos": "acos(x)", "atan": "atan(x)", "floor": "floor(x)", "ceil": "ceil(x)",
    "pow": "pow(x, y): x ** y in float (x < 0 follows the target's pow).",
    "atan2": "atan2(y, x)",
    "umulhi": "umulhi(x, y): the high 32 bits of the 64-bit product of int32/uint32 operands, "
              "both read as unsigned (Triton's tl.umulhi).",
    "sqrt_rn": "sqrt_rn(x): sqrt(x) (the backend's square root)",
    "fdiv": "fdiv(x, y, ieee_rounding=False): x / y", "div_rn": "div_rn(x, y): x / y",
    "fma": "fma(x, y, z) = x * y + z, rounded after the multiply and after the add.",
    "pair_fma": "pair_fma(a, b, c, dtype): uint32 words each holding two 16-bit floats of "
                "dtype (float16 or bfloat16, low half first): both halves a * b + c, each "
                "rounded once (CUDA's HFMA2, Metal's half2 fma); packed arithmetic for "
                "kernels bound by instruction count (quantized_matvec_pairs).",
    "clamp": "clamp(x, min, max, propagate_nan=PropagateNan.NONE) = minimum(maximum(x, min), "
             "max); ALL: a NaN x gives NaN.",
    "cast": "cast(x, dtype, fp_downcast_rounding=None, bitcast=False): explicit conversion "
            "(mixed operands also promote as in Triton); bitcast=True reads the bits as another "
            "type of the same width (fp8 bytes from and to uint8 buffers, float32 bit "
            "tricks through (u)int32).",
    "sum": "sum(x, axis=None, keep_dims=False, dtype=None): reduction; None reduces every axis "
           "to a scalar; dtype= casts the input first (floats accumulate in float32).",
    "xor_sum": "xor_sum(x, axis=None, keep_dims=False): bitwise xor of integer (or bool) "
               "elements.",
    "reduce_or": "reduce_or(x, axis, keep_dims=False): bitwise or of integer (or bool) elements.",
    "reduce": "reduce(input, axis, combine_fn, keep_dims=False): a reduction of a tile (or a "
              "tuple of tiles of one shape) with an @metile.inline combine_fn(a..., b...) -> "
              "one value per input, applied in order along the axis (axis=None: all elements, "
              "row-major).",
    "max": "max(x, axis=None, return_indices=False, return_indices_tie_break_left=True, "
           "keep_dims=False): reduction; with return_indices, (values, argmax indices).",
    "min": "min(x, axis=None, return_indices=False, return_indices_tie_break_left=True, "
           "keep_dims=False): reduction; with return_indices, (values, argmin indices).",
    "argmax": "argmax(x, axis, tie_break_left=True, keep_dims=False) -> int32: index of the "
              "largest element (ties: the smallest index; tie_break_left=False: the largest). "
              "axis=None indexes the row-major flattened tile.",
    "argmin": "argmin(x, axis, tie_break_left=True, keep_dims=False) -> int32: as argmax, "
              "for the smallest element.",
    "cumsum": "cumsum(x, axis=0, reverse=False, dtype=None): inclusive prefix sum along axis "
              "(floats accumulate in float32; bool scans as int32).",
    "cumprod": "cumprod(x, axis=0, reverse=False, dtype=None): inclusive prefix product.",
    "associative_scan": "associative_scan(input, axis, combine_fn, reverse=False): inclusive "
                        "scan of a tile (or a tuple of tiles of one shape) with an "
                        "@metile.inline combine_fn(a..., b...) -> one value per input.",
    "sort": "sort(x, dim=None, descending=False): sorted along the last axis (a power of two, "
            "at most 4096 elements; NaN sorts as the largest value).",
    "join": "join(a, b): a new last axis of extent 2 holding a and b.",
    "split": "split(x): (x[..., 0], x[..., 1]) of a tile whose last axis has extent 2.",
    "interleave": "interleave(a, b): the elements of a and b alternating along the last axis.",
    "trans": "trans(x, *dims): permute a tile's axes (no dims: swap the two axes of a 2-D "
             "tile); also x.T and x.trans().",
    "permute": "permute(x, *dims): result axis i is axis dims[i] of x.",
    "reshape": "reshape(x, *shape, can_reorder=False): the same elements in the same row-major "
               "order under a new shape (one extent may be -1).",
    "view": "view(x, *shape): reshape (the row-major order is kept).",
    "zeros": "zeros(shape, dtype=float32): constant tile.",
    "zeros_like": "zeros_like(x): zeros of x's shape and dtype.",
    "flip": "flip(x, dim=None): x reversed along dim (None: the last axis).",
    "ravel": "ravel(x, can_reorder=False): x as a 1-D tile in row-major order.",
    "squeeze": "squeeze(x, dim): x without axis dim, which must have extent 1.",
    "unsqueeze": "unsqueeze(x, dim): expand_dims(x, dim).",
    "cat": "cat(a, b, can_reorder=False): a then b along axis 0 (the other extents equal).",
    "broadcast": "broadcast(a, b): (a, b) broadcast to their common shape (dtypes kept).",
    "swizzle2d": "swizzle2d(i, j, size_i, size_j, size_g): Triton's grouped (row-major within "
                 "groups of size_g rows, column-major across them) renumbering of (i, j).",
    "expand_dims": "expand_dims(x, axis): a new axis of extent 1 (axis may be a tuple).",
    "broadcast_to": "broadcast_to(x, shape): NumPy broadcasting to `shape`.",
    "full": "full(shape, value, dtype=float32): constant tile.",
    "cdiv": "cdiv(a, b) = (a + b - 1) // b.",
    "dot": "dot(a, b, acc=None, input_precision=None, allow_tf32=None, "
           "max_num_imprecise_acc=None, out_dtype=float32): tile matrix product a[M,K] @ b[K,N] "
           "(+ acc), accumulated in float32.",
    # thread level
    "thread_id": "thread_id() -> int32: this thread's index within its program.",
    "num_threads": "num_threads() -> int32: threads per program (the lane geometry's size).",
    "tile_range": "tile_range(start, end, step=1): loop range, written `for i in metile.tile_range(...)`.",
    "shared": "shared(size, dtype=float32): threadgroup (shared) memory; returns a pointer.",
    "barrier": "barrier(): threadgroup barrier; must be reached by every thread of the program.",
    "debug_barrier": "debug_barrier(): Triton's name for barrier().",
    # hints and compile-time helpers (Triton's names)
    "multiple_of": "multiple_of(x, values): hint, returns x (metile proves alignment itself).",
    "max_contiguous": "max_contiguous(x, values): hint, returns x.",
    "max_constancy": "max_constancy(x, values): hint, returns x.",
    "assume": "assume(cond): hint; a compile-time False is an error, a runtime one is not used.",
    "static_assert": "static_assert(cond, msg=''): compile-time assertion.",
    "static_print": "static_print(*values): prints at compile time (values' types for runtime ones).",
    "static_range": "static_range(start, end=None, step=1): a for loop unrolled at compile time.",
    "device_print": "device_print(prefix, *values, hex=False): prints at run time, one line per "
                    "element: `pid (x, y, z) idx (i, j) prefix: v0, v1` (a uniform scalar once "
                    "per program); the CPU runtime and CUDA (not a Metal GPU).",
    "device_assert": "device_assert(cond, msg='', mask=None): in debug builds (debug=True or "
                     "METILE_DEBUG=asserts) stops the launch where cond is false; mx.eval "
                     "raises naming the kernel, the line, the program and the element. "
                     "Otherwise compiled out, arguments unevaluated.",
    "range": "range(start, end=None, step=1, num_stages=None, ...): a runtime for loop "
             "(Triton's tl.range; num_stages and warp_specialize warn: not honoured here).",
    "tensor": "tensor(buffer, shape=, strides=None, block_shape=None, access='readwrite'): indexed view.",
    "loop_state": "loop_state(value): marks a loop-carried value (identity; any reassigned variable is carried).",
    # block pointers and tensor descriptors (Triton's names; frontend/block_pointers.py)
    "make_block_ptr": "make_block_ptr(base, shape, strides, offsets, block_shape, order): a block "
                      "pointer; load/store it with boundary_check=, move it with advance().",
    "advance": "advance(block_ptr, offsets): the block pointer moved by offsets (one per dim).",
    "make_tensor_descriptor": "make_tensor_descriptor(base, shape, strides, block_shape, "
                              "padding_option='zero'): desc.load(offsets) / desc.store(offsets, "
                              "value), every dimension bounds-checked.",
    "load_tensor_descriptor": "load_tensor_descriptor(desc, offsets): desc.load(offsets).",
    "store_tensor_descriptor": "store_tensor_descriptor(desc, offsets, value): "
                               "desc.store(offsets, value).",
}

globals().update({name: _builtin(name, doc) for name, doc in _DOCS.items()})


def cdiv(a, b):
    """cdiv(a, b) = (a + b - 1) // b; usable on the host (grid sizes) and in kernels."""
    return -(-a // b)


cdiv.__metile_builtin__ = "cdiv"


def next_power_of_2(n):
    """The smallest power of two >= n (1 for n <= 1); usable on the host and in kernels."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"next_power_of_2() needs an int, got {type(n).__name__}")
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


next_power_of_2.__metile_builtin__ = "next_power_of_2"
_DOCS["next_power_of_2"] = next_power_of_2.__doc__

BUILTINS = tuple(_DOCS)


class PropagateNan(enum.Enum):
    """Triton's NaN rule for maximum/minimum/clamp: NONE, a NaN operand loses to the other
    (fmax); ALL, a NaN operand gives NaN."""
    NONE = 0x0000
    ALL = 0xFFFF


# Triton's bound on a tensor's element count.  metile enforces none of its own: register tiles
# may be larger, and tiles held in threadgroup memory are bounded by its size at compile time.
TRITON_MAX_TENSOR_NUMEL = 1048576

__all__ = ["constexpr", "PropagateNan", "TRITON_MAX_TENSOR_NUMEL", *BUILTINS]
