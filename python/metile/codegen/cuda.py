"""CUDA C++: the spelling table for `CEmitter`.

Produces the (header, body) pair of MLX's `cuda_kernel` contract (the body
sees buffers by their input/output names; MLX wraps it in a `__global__`
function inside `namespace mlx::core::cu` and compiles it with NVRTC).
Concept map: threadgroup -> block, SIMD-group -> warp (32 lanes on every
NVIDIA GPU, as on Apple GPUs), threadgroup memory -> static `__shared__`,
barrier -> `__syncthreads`, SIMD-group reductions -> `__shfl_xor_sync`
butterflies, half/bfloat -> `__half`/`__nv_bfloat16` with math done in float.
"""

from __future__ import annotations

from ..ir.core import Function, Op
from ..passes.lower_matmul import MatrixUnit
from .c_like import CEmitter

# Butterfly reductions over a full warp.  Every lane ends with the result, as
# Metal's simd_sum/simd_max/simd_min do; the lane geometry always launches
# whole warps, so the full mask is exact.
_WARP = """\
template <typename T> __device__ __forceinline__ T metile_warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T metile_warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) { T w = __shfl_xor_sync(0xffffffffu, v, o); v = w > v ? w : v; }
  return v;
}
template <typename T> __device__ __forceinline__ T metile_warp_min(T v) {
  for (int o = 16; o > 0; o >>= 1) { T w = __shfl_xor_sync(0xffffffffu, v, o); v = w < v ? w : v; }
  return v;
}"""


# WMMA (tensor cores); included before the kernel when a fragment is declared.
_WMMA = """\
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>"""


class CUDAEmitter(CEmitter):
    TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int32": "int32_t",
             "uint32": "uint32_t", "bool": "bool"}
    GEOMETRY = {
        "program_id": "static_cast<int>(blockIdx.{axis})",
        "num_programs": "static_cast<int>(gridDim.{axis})",
        "thread_id": "static_cast<int>(threadIdx.x)",
        "simd_lane": "static_cast<int>(threadIdx.x & 31u)",
        "simd_group": "static_cast<int>(threadIdx.x >> 5)",
    }
    MATH_FUNCS = {"exp": "expf({x})", "exp2": "exp2f({x})", "log": "logf({x})", "sqrt": "sqrtf({x})",
                  "rsqrt": "rsqrtf({x})", "tanh": "tanhf({x})", "abs": "fabsf({x})", "erf": "erff({x})",
                  "sigmoid": "(1.0f / (1.0f + expf(-({x}))))"}
    SIMD_REDUCE = {"sum": "metile_warp_sum", "max": "metile_warp_max", "min": "metile_warp_min"}
    INFINITY = "cuda::std::numeric_limits<float>::infinity()"
    NAN = "cuda::std::numeric_limits<float>::quiet_NaN()"
    BARRIER = "__syncthreads();"
    SHARED_DECL = "__shared__ {type} {name}[{size}];"
    HELPERS = {"warp": _WARP, "wmma": _WMMA}
    # Tensor cores through WMMA.  Strict float32 has no unit (FFMA register tiles);
    # TF32 only under the kernel's RELAXED_PRECISION=True.
    MATRIX_UNITS = (MatrixUnit("wmma 16x16x16", (16, 16, 16), ("float16", "bfloat16")),
                    MatrixUnit("wmma tf32 16x16x8", (16, 16, 8), ("float32",), relaxed_only=True,
                               convert="tf32"))
    FRAGMENT = {
        "decl": "{type} {name}[{size}];",
        "fill": "nvcuda::wmma::fill_fragment({frag}, {value});",
        "load": "nvcuda::wmma::load_matrix_sync({frag}, &{root}[{offset}], {ld});",
        "load_tf32": "nvcuda::wmma::load_matrix_sync({frag}, &{root}[{offset}], {ld});\n"
                     "for (int _t = 0; _t < {frag}.num_elements; ++_t) "
                     "{frag}.x[_t] = nvcuda::wmma::__float_to_tf32({frag}.x[_t]);",
        "store": "nvcuda::wmma::store_matrix_sync(&{root}[{offset}], {frag}, {ld}, "
                 "nvcuda::wmma::mem_row_major);",
        "mma": "nvcuda::wmma::mma_sync({d}, {a}, {b}, {c});",
    }
    SIMD_BARRIER = "__syncwarp();"

    def fragment_type(self, role, dtype, shape) -> str:
        self.helpers_used.add("wmma")
        m, n, k = shape
        if role == "acc":
            return f"nvcuda::wmma::fragment<nvcuda::wmma::accumulator, {m}, {n}, {k}, float>"
        t = "nvcuda::wmma::precision::tf32" if dtype.name == "float32" else self.TYPES[dtype.name]
        use = "matrix_a" if role == "a" else "matrix_b"
        return (f"nvcuda::wmma::fragment<nvcuda::wmma::{use}, {m}, {n}, {k}, {t}, "
                f"nvcuda::wmma::row_major>")

    def shared_decl(self, t: str, name: str, size: int, align: int) -> str:
        # WMMA loads/stores need 256-bit aligned pointers.
        if align:
            return f"__shared__ __align__({align}) {t} {name}[{size}];"
        return super().shared_decl(t, name, size, align)

    def __init__(self, fn: Function, scalars: set[str] = frozenset()):
        super().__init__(fn)
        self.scalars = scalars

    def expr(self, op: Op) -> str:
        # MLX's cuda_kernel passes 0-d inputs (runtime scalars) as pointers.
        if op.name == "param" and op.attrs["name"] in self.scalars:
            return f"{op.attrs['name']}[0]"
        if op.name == "simd_reduce":
            self.helpers_used.add("warp")
        if op.name == "abs" and not op.results[0].type.dtype.is_float:
            return f"abs({self.ref(op.operands[0])})"
        return super().expr(op)

    def math(self, name: str, x: str, rt) -> str:
        # CUDA has erff; the shared printer would request Metal's helper.
        if name == "erf":
            fmt = self.MATH_FUNCS[name]
            if rt.dtype.name == "float32":
                return fmt.format(x=x)
            return f"static_cast<{self.type(rt)}>({fmt.format(x=f'static_cast<float>({x})')})"
        return super().math(name, x, rt)


def emit_cuda(fn: Function, scalars: set[str] = frozenset()) -> tuple[str, str]:
    """(header, body) of a thread-form function; `scalars` names the runtime
    scalar inputs (read through their pointer)."""
    return CUDAEmitter(fn, scalars).render()
