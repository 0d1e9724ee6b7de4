"""MSL spelling of the Metal 4 tensor-ops GEMM (thread-form mpp_* ops of
passes/gemm_tensor_ops.py), for `MSLEmitter`.

The call sequence is the one the CPU runtime's shim documents
(runtime/msl_cpu/include/metile_msl/tensor_ops.h): a matmul2d_descriptor in
multiply_accumulate mode, `matmul2d<descriptor, execution_simdgroup>`, float
destination cooperative tensors zero-filled before the K loop, `run` on inline
tensors over device memory each K step, then per element `is_valid_element`,
`get_multidimensional_index` ([0] the column, [1] the row) and `operator[]`.
API facts and their public sources: codegen/README.md, "Metal 4 tensor ops".

MLX binds an input array of fewer than 8 elements as `constant` memory, which a
Metal tensor cannot view.  `metile_mpp_step` is therefore overloaded on the
operands' address space: device operands go through inline tensors and `run`;
any other pair (constant memory) is multiplied per destination element, at the
coordinates the destination names, with the same zero reads outside the extents.
(The CPU runtime erases address spaces and always takes the tensor overload; the
strict Metal check compiles both.)
"""

from __future__ import annotations

HEADER = """\
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
// metile's tensor-ops GEMM step (passes/gemm_tensor_ops.py).  Operand element (x, y) (x the
// unit-stride axis) is at p[off + x + y * ld] and valid for x < cols, y < rows; TL / TR: the
// operand is stored transposed (x runs along M / N instead of K).
template <typename T>
using metile_mpp_tensor = metal::tensor<const device T, metal::dextents<int32_t, 2>, metal::tensor_inline>;
template <bool TL, bool TR, int K, typename Op, typename TA, typename TB, typename Acc>
inline void metile_mpp_step(thread Op& op, const device TA* a, int oa, int ca, int ra, int la,
                            const device TB* b, int ob, int cb, int rb, int lb, thread Acc& acc) {
  metile_mpp_tensor<TA> ta(a + oa, metal::dextents<int32_t, 2>(ca, ra), metal::array<int32_t, 2>({1, la}));
  metile_mpp_tensor<TB> tb(b + ob, metal::dextents<int32_t, 2>(cb, rb), metal::array<int32_t, 2>({1, lb}));
  op.run(ta, tb, acc);
}
// Operands Metal cannot view as tensors (constant memory): the same product per element.
template <bool TL, bool TR, int K, typename Op, typename PA, typename PB, typename Acc>
inline void metile_mpp_step(thread Op&, PA a, int oa, int ca, int ra, int la,
                            PB b, int ob, int cb, int rb, int lb, thread Acc& acc) {
  for (uint16_t i = 0; i < acc.get_capacity(); ++i) {
    if (!acc.is_valid_element(i)) continue;
    const auto idx = acc.get_multidimensional_index(i);
    const int m = int(idx[1]), n = int(idx[0]);
    float sum = acc[i];
    for (int k = 0; k < K; ++k) {
      const int ax = TL ? m : k, ay = TL ? k : m, bx = TR ? k : n, by = TR ? n : k;
      if (ax < ca && ay < ra && bx < cb && by < rb)
        sum += float(a[oa + ax + ay * la]) * float(b[ob + bx + by * lb]);
    }
    acc[i] = sum;
  }
}"""

_MODE = "mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate"


def _bool(x) -> str:
    return "true" if x else "false"


def statement(emitter, op, a: list[str], depth: int) -> None:
    """mpp_setup / mpp_step."""
    at = op.attrs
    emitter.helpers_used.add("tensor_ops")
    if op.name == "mpp_setup":
        name = at["op"]
        left, right = (f"metile_mpp_tensor<{emitter.TYPES[at[s].name]}>" for s in ("left", "right"))
        emitter.emit(f"constexpr auto {name}_desc = mpp::tensor_ops::matmul2d_descriptor("
                     f"{at['m']}, {at['n']}, {at['k']}, {_bool(at['transpose_left'])}, "
                     f"{_bool(at['transpose_right'])}, {_bool(at['relaxed'])}, {_MODE});", depth)
        emitter.emit(f"mpp::tensor_ops::matmul2d<{name}_desc, metal::execution_simdgroup> {name};",
                     depth)
        for acc in at["accs"]:
            emitter.emit(f"auto {acc} = {name}.get_destination_cooperative_tensor<{left}, "
                         f"{right}, float>();", depth)
            emitter.emit(f"for (uint16_t _i = 0; _i < {acc}.get_capacity(); ++_i) "
                         f"{acc}[_i] = 0.0f;", depth)
        return
    oa, ca, ra, la, ob, cb, rb, lb = a
    emitter.emit(f"metile_mpp_step<{_bool(at['transpose_left'])}, {_bool(at['transpose_right'])}, "
                 f"{at['k']}>({at['op']}, {at['a']}, {oa}, {ca}, {ra}, {la}, {at['b']}, {ob}, "
                 f"{cb}, {rb}, {lb}, {at['acc']});", depth)


def expr(emitter, op) -> str:
    """mpp_capacity / mpp_valid / mpp_coord / mpp_get."""
    acc = op.attrs["acc"]
    if op.name == "mpp_capacity":
        return f"static_cast<int>({acc}.get_capacity())"
    i = f"static_cast<uint16_t>({emitter.ref(op.operands[0])})"
    if op.name == "mpp_valid":
        return f"{acc}.is_valid_element({i})"
    if op.name == "mpp_coord":   # [0] the column, [1] the row
        return f"static_cast<int>({acc}.get_multidimensional_index({i})[{1 - op.attrs['axis']}])"
    return f"static_cast<float>({acc}[{i}])"
