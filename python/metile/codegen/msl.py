"""Metal Shading Language: the spelling table for `CEmitter`.

Produces the (header, body) pair of the `metal_kernel` contract: the body
refers to buffers by their input/output names and to the builtin attributes
(`threadgroup_position_in_grid`, ...) that MLX adds to the signature when the
body mentions them.  Math on half/bfloat is computed in float and rounded
back (Metal's half-precision library functions are less accurate, and
bfloat has none).  Metal has no erf; the header supplies one.
"""

from __future__ import annotations

from ..ir.core import Function, Op
from ..ir.ops import TENSOR_OPS
from . import fp8, msl_tensor_ops
from .c_like import CEmitter
from .debug_ops import MSLDebug

_ERF = """\
// erf for float.  Below |x| = 0.5 its odd Taylor series to x^13 (relative error < 3e-8):
// the 1 - erfc form below cancels every digit near 0 (erf(1e-7) was 0, erf(1e-6) 5% off,
// erf(-0) +0).  Above it, 1 - erfc with erfc's Chebyshev fit (Numerical Recipes' erfcc,
// fractional error < 1.2e-7).
inline float metile_erf(float x) {
  float a = metal::abs(x);
  if (a < 0.5f) {
    float s = x * x;
    return x * (1.1283791671f + s * (-0.3761263890f + s * (0.1128379167f + s * (-0.0268661706f +
           s * (0.0052239776f + s * (-0.0008548327f + s * 0.0001205533f))))));
  }
  float t = 1.0f / (1.0f + 0.5f * a);
  float y = t * metal::exp(-a * a - 1.26551223f + t * (1.00002368f + t * (0.37409196f +
            t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f +
            t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f)))))))));
  return x >= 0.0f ? 1.0f - y : y - 1.0f;
}"""

# pair_fma (ir/ops.py PAIR): a uint word read as two 16-bit floats.  Metal's fma of bfloat
# vectors is not declared on every version: bfloat16 computes in float32, then rounds.
_PAIR_F16 = """\
inline uint metile_pair_fma_f16(uint a, uint b, uint c) {
  return as_type<uint>(metal::fma(as_type<half2>(a), as_type<half2>(b), as_type<half2>(c)));
}"""
_PAIR_BF16 = """\
inline uint metile_pair_fma_bf16(uint a, uint b, uint c) {
  return as_type<uint>(bfloat2(metal::fma(float2(as_type<bfloat2>(a)), float2(as_type<bfloat2>(b)),
                                          float2(as_type<bfloat2>(c)))));
}"""


# 4-wide packed loads (CEmitter.vector_load) from either address space an input may have:
# the CPU runtime's shim spells both as plain pointers (METILE_MSL_CPU_RUNTIME), so one
# definition serves there.
def _vload(vector: str, element: str) -> str:
    def one(space: str) -> str:
        return (f"inline {vector} metile_vload_{vector}(const {space}{element}* p) {{\n"
                f"  return {vector}(*reinterpret_cast<const {space}packed_{vector}*>(p));\n}}")
    return (f"#ifdef METILE_MSL_CPU_RUNTIME\n{one('')}\n#else\n{one('device ')}\n"
            f"{one('constant ')}\n#endif")


_VLOADS = "\n".join(_vload(v, e) for v, e in (("float4", "float"), ("half4", "half"),
                                                ("bfloat4", "bfloat")))


# Atomics (codegen/c_like.py `atomic`).  Metal has relaxed device atomics on 32-bit words
# only: float max/min order the bits as signed ints when the value's sign bit is clear and as
# unsigned ints when it is set (IEEE order for non-NaN floats, -0.0 below +0.0); xchg and cas
# act on the bits (cas compares bit patterns, as on CUDA); the weak compare-exchange retries
# spurious failures.  metile_atomic_init copies element i in from the passed contents before
# its first atomic: a byte of the written-mask goes 0 -> 2 (copying) -> 1 (ready) through a
# compare-exchange on its aligned 32-bit word; the copying thread finishes inside the loop
# iteration that won, so SIMD lockstep cannot starve it.
_ATOMICS = """#define METILE_RELAXED metal::memory_order_relaxed
#if !defined(__METAL_VERSION__) || __METAL_VERSION__ >= 320
#define METILE_FENCE() metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_device)
#else
#define METILE_FENCE()
#endif
inline float metile_atomic_fmax(device float* p, float v) {
  return as_type<int>(v) >= 0
      ? as_type<float>(metal::atomic_fetch_max_explicit((device metal::atomic_int*)p, as_type<int>(v), METILE_RELAXED))
      : as_type<float>(metal::atomic_fetch_min_explicit((device metal::atomic_uint*)p, as_type<uint>(v), METILE_RELAXED));
}
inline float metile_atomic_fmin(device float* p, float v) {
  return as_type<int>(v) >= 0
      ? as_type<float>(metal::atomic_fetch_min_explicit((device metal::atomic_int*)p, as_type<int>(v), METILE_RELAXED))
      : as_type<float>(metal::atomic_fetch_max_explicit((device metal::atomic_uint*)p, as_type<uint>(v), METILE_RELAXED));
}
template <typename T>
inline T metile_atomic_xchg(device T* p, T v) {
  return as_type<T>(metal::atomic_exchange_explicit((device metal::atomic_uint*)p, as_type<uint>(v), METILE_RELAXED));
}
template <typename T>
inline T metile_atomic_cas(device T* p, T c, T v) {
  const uint want = as_type<uint>(c);
  uint seen = want;
  while (!metal::atomic_compare_exchange_weak_explicit((device metal::atomic_uint*)p, &seen, as_type<uint>(v),
                                                       METILE_RELAXED, METILE_RELAXED)) {
    if (seen != want) return as_type<T>(seen);
    seen = want;
  }
  return c;
}
template <typename T>
inline T metile_atomic_read(device T* p) {
  return as_type<T>(metal::atomic_load_explicit((device metal::atomic_uint*)p, METILE_RELAXED));
}
template <typename T, typename In>  // In: MLX passes small inputs in the constant space
inline void metile_atomic_init(device bool* state, device T* out, In in, int i) {
  device metal::atomic_uint* w = (device metal::atomic_uint*)((device uchar*)state + (i & ~3));
  const uint shift = uint(i & 3) * 8u;
  uint cur = metal::atomic_load_explicit(w, METILE_RELAXED);
  while (((cur >> shift) & 0xffu) != 1u) {
    if (((cur >> shift) & 0xffu) == 0u) {
      if (metal::atomic_compare_exchange_weak_explicit(w, &cur, cur | (2u << shift), METILE_RELAXED, METILE_RELAXED)) {
        metal::atomic_exchange_explicit((device metal::atomic_uint*)&out[i], as_type<uint>(static_cast<T>(in[i])), METILE_RELAXED);
        metal::atomic_fetch_xor_explicit(w, 3u << shift, METILE_RELAXED);
        return;
      }
    } else {
      cur = metal::atomic_load_explicit(w, METILE_RELAXED);
    }
  }
}"""


# Combining within aligned groups of L lanes (a row of a tile on L lanes), as Metal has
# no segmented simd_sum: a butterfly of simd_shuffle_xor, every lane taking part.
_LANES = """\
// One butterfly step with the lane l ^ m (the lanes holding one row of an accumulator
// fragment, passes/lower_mma_layout.py).
template <typename T> inline T metile_xor_sum(T v, ushort m) { return v + metal::simd_shuffle_xor(v, m); }
template <typename T> inline T metile_xor_max(T v, ushort m) { return metal::max(v, metal::simd_shuffle_xor(v, m)); }
template <typename T> inline T metile_xor_min(T v, ushort m) { return metal::min(v, metal::simd_shuffle_xor(v, m)); }
template <ushort L, typename T> inline T metile_lanes_sum(T v) {
  for (ushort o = L / 2; o > 0; o >>= 1) v += metal::simd_shuffle_xor(v, o);
  return v;
}
template <ushort L, typename T> inline T metile_lanes_max(T v) {
  for (ushort o = L / 2; o > 0; o >>= 1) v = metal::max(v, metal::simd_shuffle_xor(v, o));
  return v;
}
template <ushort L, typename T> inline T metile_lanes_min(T v) {
  for (ushort o = L / 2; o > 0; o >>= 1) v = metal::min(v, metal::simd_shuffle_xor(v, o));
  return v;
}"""


# Metal's simd_sum/max/min take 32-bit integers only (MLX's own reductions shuffle 64-bit
# values too): long/ulong combine in a butterfly that moves each value as two 32-bit halves.
_SIMD64 = """\
template <typename T>
inline T metile_simd_xor64(T v, ushort mask) {
  return as_type<T>(metal::simd_shuffle_xor(as_type<uint2>(v), mask));
}
template <typename T> inline T metile_simd_sum64(T v) {
  for (ushort o = 16; o > 0; o >>= 1) v += metile_simd_xor64(v, o);
  return v;
}
template <typename T> inline T metile_simd_max64(T v) {
  for (ushort o = 16; o > 0; o >>= 1) { const T w = metile_simd_xor64(v, o); v = w > v ? w : v; }
  return v;
}
template <typename T> inline T metile_simd_min64(T v) {
  for (ushort o = 16; o > 0; o >>= 1) { const T w = metile_simd_xor64(v, o); v = w < v ? w : v; }
  return v;
}
template <typename T> inline T metile_simd_or64(T v) {
  for (ushort o = 16; o > 0; o >>= 1) v |= metile_simd_xor64(v, o);
  return v;
}
template <typename T> inline T metile_simd_xor64(T v) {
  for (ushort o = 16; o > 0; o >>= 1) v ^= metile_simd_xor64(v, o);
  return v;
}"""


def _fetch(op: str, atomic_type: str) -> str:
    return (f"metal::atomic_fetch_{op}_explicit((device metal::{atomic_type}*){{p}}, {{v}}, "
            f"METILE_RELAXED)")


class MSLEmitter(CEmitter):
    TYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16_t", "int32": "int",
             "uint32": "uint", "int64": "long", "uint64": "ulong", "int8": "char", "uint8": "uchar",
             "int16": "short", "uint16": "ushort", "float8e4nv": "uchar", "float8e5": "uchar",
             "bool": "bool"}
    # MLX declares outputs `device T*`; updates go through the layout-compatible atomic type
    ATOMIC = {
        **{(k, d): _fetch(k, a) for k in ("add", "max", "min", "and", "or", "xor")
           for d, a in (("int32", "atomic_int"), ("uint32", "atomic_uint"))},
        ("add", "float32"): _fetch("add", "atomic_float"),
        ("max", "float32"): "metile_atomic_fmax({p}, {v})",
        ("min", "float32"): "metile_atomic_fmin({p}, {v})",
        "xchg": "metile_atomic_xchg({p}, {v})",
        "cas": "metile_atomic_cas({p}, {c}, {v})",
        "read": "metile_atomic_read({p})",
    }
    ATOMIC_INIT = "metile_atomic_init({state}, {out}, {init}, {index});"
    # Metal 3.2 (macOS 15) has device fences; before it, atomics stay relaxed (README)
    ATOMIC_FENCE = {s: "METILE_FENCE();" for s in ("gpu", "cta", "sys")}
    GEOMETRY = {
        "program_id": "static_cast<int>(threadgroup_position_in_grid.{axis})",
        "num_programs": "static_cast<int>(threadgroups_per_grid.{axis})",
        "thread_id": "static_cast<int>(thread_position_in_threadgroup.x)",
        "simd_lane": "static_cast<int>(thread_index_in_simdgroup)",
        "simd_group": "static_cast<int>(simdgroup_index_in_threadgroup)",
    }
    MATH_FUNCS = {"exp": "metal::exp({x})", "exp2": "metal::exp2({x})", "log": "metal::log({x})",
                  "sqrt": "metal::sqrt({x})", "rsqrt": "metal::rsqrt({x})",
                  "tanh": "metal::tanh({x})", "abs": "metal::abs({x})",
                  "erf": "metile_erf({x})", "sigmoid": "(1.0f / (1.0f + metal::exp(-({x}))))",
                  "log2": "metal::log2({x})", "sin": "metal::sin({x})", "cos": "metal::cos({x})",
                  "tan": "metal::tan({x})", "asin": "metal::asin({x})", "acos": "metal::acos({x})",
                  "atan": "metal::atan({x})", "floor": "metal::floor({x})",
                  "ceil": "metal::ceil({x})", "pow": "metal::pow({x}, {y})",
                  "atan2": "metal::atan2({x}, {y})"}
    UMULHI = "metal::mulhi({x}, {y})"
    SIMD_REDUCE = {"sum": "metal::simd_sum", "max": "metal::simd_max", "min": "metal::simd_min",
                   "or": "metal::simd_or", "xor": "metal::simd_xor"}
    INFINITY = "metal::numeric_limits<float>::infinity()"
    NAN = "metal::numeric_limits<float>::quiet_NaN()"
    BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    # (a device-memory write by one thread ordered before the group's reads of it)
    DEVICE_BARRIER = "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);"
    SHARED_DECL = "threadgroup {type} {name}[{size}];"
    PAIR_FMA = {"float16": "metile_pair_fma_f16({a}, {b}, {c})",
                "bfloat16": "metile_pair_fma_bf16({a}, {b}, {c})"}
    HELPERS = {"erf": _ERF, "atomics": _ATOMICS, "pair_float16": _PAIR_F16, "vload": _VLOADS,
               "pair_bfloat16": _PAIR_BF16, "simd64": _SIMD64, "lanes": _LANES,
               "fp8": fp8.helpers("inline", "uchar", "uint", "as_type<uint>", "as_type<float>"),
               "tensor_ops": msl_tensor_ops.HEADER}
    FRAGMENT = {
        "decl": "{type} {name}[{size}];",
        "fill": "{frag} = metal::make_filled_simdgroup_matrix<float, 8, 8>({value});",
        "load": "metal::simdgroup_load({frag}, &{root}[{offset}], {ld});",
        "store": "metal::simdgroup_store({frag}, &{root}[{offset}], {ld});",
        "mma": "metal::simdgroup_multiply_accumulate({d}, {a}, {b}, {c});",
        # simdgroup_inline kernels: transposed views and per-lane pointwise access.
        "load_t": "metal::simdgroup_load({frag}, &{root}[{offset}], {ld}, ulong2(0, 0), true);",
        "store_t": "metal::simdgroup_store({frag}, &{root}[{offset}], {ld}, ulong2(0, 0), true);",
        "get": "{frag}.thread_elements()[{e}]",
        "set": "{frag}.thread_elements()[{e}] = {value};",
        # a left operand from registers (passes/lower_mma_layout.py): elements 2i, 2i + 1
        "set_pair": ("{frag}.thread_elements()[2 * {i}] = {lo}; "
                     "{frag}.thread_elements()[2 * {i} + 1] = {hi};"),
    }
    SIMD_BARRIER = "metal::simdgroup_barrier(mem_flags::mem_threadgroup);"
    DEBUG_OPS = MSLDebug()
    # A 4-wide load read through Metal's packed vector (element alignment) into the
    # aligned vector type: the pass proved 4-element alignment relative to the buffer,
    # and packed types keep it well-defined where a buffer's base is only element-aligned
    # (the CPU runtime's allocations).  Through `metile_vload_<vector>`, overloaded on the
    # address space: MLX passes an input of fewer than 8 elements as `constant` memory,
    # which a cast to a `device` pointer may not read (Metal refused a 3-element bias read
    # 4 a thread), and one body serves both.
    VECTOR_TYPES = {"float32": ("float4", "{v}.{c}"), "float16": ("half4", "{v}.{c}"),
                    "bfloat16": ("bfloat4", "{v}.{c}")}
    VECTOR_LOAD = "const {vtype} {name} = metile_vload_{vtype}(&{root}[{index}]);"
    VECTOR_LOAD_HELPER = "vload"
    # Stores through the packed vector too (element alignment only).
    VECTOR_STORES = {(d, 4): (f"*reinterpret_cast<device packed_{v}*>(&{{root}}[{{index}}]) = "
                              f"{v}({{values}});", 4, "{x}")
                     for d, v in (("float32", "float4"), ("float16", "half4"),
                                  ("bfloat16", "bfloat4"))}
    SHARED_VECTOR_LOAD = ("const {vtype} {name} = *reinterpret_cast<const threadgroup {vtype}*>"
                          "(&{root}[{index}]);")

    def statement(self, op: Op, depth: int) -> None:
        if op.name in ("mpp_setup", "mpp_step"):   # Metal 4 tensor ops (msl_tensor_ops.py)
            return msl_tensor_ops.statement(self, op, [self.ref(v) for v in op.operands], depth)
        super().statement(op, depth)

    def expr(self, op: Op) -> str:
        if op.name in TENSOR_OPS:
            return msl_tensor_ops.expr(self, op)
        if op.name == "acc_coord":
            # Element e (0, 1) of an 8x8 float accumulator's thread_elements(): lane l holds
            # row (l/4 & 4) + (l/2) % 4, columns (l/4 & 2) * 2 + (l % 2) * 2 and + 1 (the
            # layout the CPU runtime's simdgroup_matrix and MLX's steel kernels use).
            lane = "static_cast<int>(thread_index_in_simdgroup)"
            if op.attrs["axis"] == 0:
                return f"((({lane} >> 2) & 4) + (({lane} >> 1) & 3))"
            return f"((({lane} >> 2) & 2) * 2 + ({lane} & 1) * 2 + {op.attrs['e']})"
        if op.name == "simd_reduce" and op.attrs.get("xor"):
            self.helpers_used.add("lanes")
            value = self.ref(op.operands[0])
            for m in op.attrs["xor"]:
                value = f"metile_xor_{op.attrs['kind']}({value}, {m})"
            return value
        if op.name == "simd_reduce" and op.attrs.get("lanes"):
            self.helpers_used.add("lanes")
            return f"metile_lanes_{op.attrs['kind']}<{op.attrs['lanes']}>({self.ref(op.operands[0])})"
        if op.name == "simd_reduce" and op.results[0].type.dtype.bits == 64:
            self.helpers_used.add("simd64")
            return f"metile_simd_{op.attrs['kind']}64({self.ref(op.operands[0])})"
        return super().expr(op)

    def fragment_type(self, role, dtype, shape) -> str:
        rows, cols, depth = shape
        r, c = {"a": (rows, depth), "b": (depth, cols), "acc": (rows, cols)}[role]
        # simdgroup_matrix<T, Cols, Rows>; every unit here is square (8x8).
        return f"metal::simdgroup_matrix<{self.TYPES[dtype.name]}, {c}, {r}>"

    def minmax(self, name, a, rt) -> str:
        if rt.dtype.name in ("float32", "float16", "int32", "uint32"):
            return f"metal::{'max' if name == 'maximum' else 'min'}({a[0]}, {a[1]})"
        return super().minmax(name, a, rt)


def emit_msl(fn: Function) -> tuple[str, str]:
    """(header, body) of a thread-form function."""
    return MSLEmitter(fn).render()
