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
    HELPERS = {"warp": _WARP}

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
