"""The CPU runtime's shim of Metal 4 tensor ops (<metal_tensor>,
<MetalPerformancePrimitives/MetalPerformancePrimitives.h>:
mpp::tensor_ops::matmul2d with tensors and cooperative tensors), run through
metile.metal_kernel on the CPU stream and checked against NumPy.

The kernels take the forms real tensor-ops code uses (written here, not
copied): Apple's header examples (inline tensors over device pointers,
slices per threadgroup, a K loop over static slices with dynamic edges, a
cooperative destination with a bias loaded into the same layout and stored
through a tensor), MLX's NAX kernels (cooperative left/right/destination
tensors filled element by element in MLX's 16 x 16 fragment layout,
multiply_accumulate, execution_simdgroup per SIMD-group), and the sequence
metile's emitter is to use (tensor_ops.h's header): an accumulator reused
across a K loop, then a per-element epilogue by coordinates.  Every test
also passes the strict Metal model (METILE_MSL_STRICT=1 from conftest) and
the bounds check (buffers fenced)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import MslCompileError
from conftest import requires_clang

pytestmark = requires_clang

HEADER = """
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;
"""


@pytest.fixture(autouse=True)
def _cpu_stream():
    with mx.stream(mx.cpu):
        yield


def _run(name, input_names, source, inputs, out_shapes, out_dtypes, grid, threadgroup, header=HEADER,
         output_names=None, **kw):
    names = output_names or [f"out{i}" for i in range(len(out_shapes))]
    kernel = metile.metal_kernel(name, input_names, names, source, header=header)
    outs = kernel(inputs=inputs, output_shapes=out_shapes, output_dtypes=out_dtypes, grid=grid,
                  threadgroup=threadgroup, **kw)
    mx.eval(outs)
    return [np.array(o.astype(mx.float32) if o.dtype == mx.bfloat16 else o) for o in outs]


def _host(x: mx.array) -> np.ndarray:
    """The exact values of x (bfloat16 widened), as float64 or int64."""
    a = np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)
    return a.astype(np.int64) if np.issubdtype(a.dtype, np.integer) else a.astype(np.float64)


def _operand(rng, shape, dtype):
    if dtype in (mx.int8, mx.uint8):
        lo, hi = (-128, 128) if dtype == mx.int8 else (0, 256)
        return mx.array(rng.integers(lo, hi, size=shape).astype(np.int64)).astype(dtype)
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def _close(got, want, dtype, k):
    if dtype == mx.int32:
        np.testing.assert_array_equal(got, want.astype(np.int64).astype(np.int32))
        return
    # float32 accumulation, then one rounding to the destination type.
    rtol = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}[dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.sqrt(k) * 4)


# --- one SIMD-group, device tensors: each supported element-type combination --

SIMPLE = """
  constexpr auto desc = matmul2d_descriptor(BM, BN, static_cast<int>(dynamic_extent));
  matmul2d<desc, execution_simdgroup> op;
  auto tA = tensor<const device TA, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(K, BM));
  auto tB = tensor<const device TB, dextents<int32_t, 2>, tensor_inline>(B, dextents<int32_t, 2>(BN, K));
  auto tC = tensor<device TD, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(BN, BM));
  op.run(tA, tB, tC);
"""

DTYPES = [
    (mx.float16, mx.float16, mx.float32),
    (mx.float16, mx.float16, mx.float16),
    (mx.bfloat16, mx.bfloat16, mx.float32),
    (mx.bfloat16, mx.bfloat16, mx.bfloat16),
    (mx.float32, mx.float32, mx.float32),
    (mx.int8, mx.int8, mx.int32),
    (mx.uint8, mx.int8, mx.int32),
    (mx.float16, mx.int8, mx.float32),
    (mx.bfloat16, mx.float16, mx.float32),
]


@pytest.mark.parametrize("ta,tb,td", DTYPES, ids=lambda t: str(t).split(".")[-1])
def test_matmul2d_each_dtype(rng, ta, tb, td):
    m, n, k = 32, 48, 40
    a, b = _operand(rng, (m, k), ta), _operand(rng, (k, n), tb)
    (c,) = _run("tops_dtype", ["A", "B", "K"], SIMPLE, [a, b, k], [(m, n)], [td], (32, 1, 1), (32, 1, 1),
                template=[("TA", ta), ("TB", tb), ("TD", td), ("BM", m), ("BN", n)])
    _close(c, _host(a) @ _host(b), td, k)


# --- descriptor transpose flags ---------------------------------------------

TRANSPOSE_HEADER = HEADER + """
// A is M x K, or K x M stored when TL; B is K x N, or N x K stored when TR.
template <bool TL, bool TR>
void transposed_case(const device float* A, const device float* B, device float* C, int M, int N, int K) {
  constexpr auto desc = matmul2d_descriptor(32, 24, static_cast<int>(dynamic_extent), TL, TR, false);
  matmul2d<desc, execution_simdgroup> op;
  auto tA = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(
      A, TL ? dextents<int32_t, 2>(M, K) : dextents<int32_t, 2>(K, M));
  auto tB = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(
      B, TR ? dextents<int32_t, 2>(K, N) : dextents<int32_t, 2>(N, K));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(C, dextents<int32_t, 2>(N, M));
  op.run(tA, tB, tC);
}
"""

TRANSPOSE = """
  switch (flags) {
    case 0: transposed_case<false, false>(A, B, out0, 32, 24, 20); break;
    case 1: transposed_case<true, false>(A, B, out0, 32, 24, 20); break;
    case 2: transposed_case<false, true>(A, B, out0, 32, 24, 20); break;
    default: transposed_case<true, true>(A, B, out0, 32, 24, 20); break;
  }
"""


@pytest.mark.parametrize("tl,tr", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul2d_transpose_flags(rng, tl, tr):
    m, n, k = 32, 24, 20
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a_stored = a.T.copy() if tl else a
    b_stored = b.T.copy() if tr else b
    (c,) = _run("tops_transpose", ["A", "B", "flags"], TRANSPOSE,
                [mx.array(a_stored), mx.array(b_stored), int(tl) + 2 * int(tr)], [(m, n)], [mx.float32],
                (32, 1, 1), (32, 1, 1), header=TRANSPOSE_HEADER)
    _close(c, a.astype(np.float64) @ b, mx.float32, k)


# --- multiply vs multiply_accumulate into a device tensor --------------------

MODE_HEADER = HEADER + """
template <bool ACCUMULATE>
void mode_case(const device half* A, const device half* B, device float* C) {
  constexpr auto desc = matmul2d_descriptor(
      16, 32, 24, false, false, false,
      ACCUMULATE ? matmul2d_descriptor::mode::multiply_accumulate : matmul2d_descriptor::mode::multiply);
  matmul2d<desc, execution_simdgroup> op;
  auto tA = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(24, 16));
  auto tB = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(B, dextents<int32_t, 2>(32, 24));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(C, dextents<int32_t, 2>(32, 16));
  op.run(tA, tB, tC);
}
"""

MODE = """
  for (uint i = thread_index_in_simdgroup; i < 16 * 32; i += 32) out0[i] = C0[i];
  threadgroup_barrier(mem_flags::mem_device);
  if (accumulate) mode_case<true>(A, B, out0); else mode_case<false>(A, B, out0);
"""


@pytest.mark.parametrize("accumulate", [False, True])
def test_multiply_vs_multiply_accumulate(rng, accumulate):
    a, b = _operand(rng, (16, 24), mx.float16), _operand(rng, (24, 32), mx.float16)
    c0 = rng.standard_normal((16, 32)).astype(np.float32)
    (c,) = _run("tops_mode", ["A", "B", "C0", "accumulate"], MODE, [a, b, mx.array(c0), int(accumulate)],
                [(16, 32)], [mx.float32], (32, 1, 1), (32, 1, 1), header=MODE_HEADER)
    want = _host(a) @ _host(b) + (c0 if accumulate else 0)
    _close(c, want, mx.float32, 24)


# --- Apple's form: several SIMD-groups, slices per threadgroup ----------------

APPLE_SLICES = """
  const int M = dims[0], N = dims[1], K = dims[2];
  constexpr auto desc = matmul2d_descriptor(64, 32, static_cast<int>(dynamic_extent));
  matmul2d<desc, execution_simdgroups<4>> op;
  auto tA = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(K, M));
  auto tB = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(B, dextents<int32_t, 2>(N, K));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(N, M));
  auto mA = tA.slice(0, int(threadgroup_position_in_grid.y) * 64);
  auto mB = tB.slice(int(threadgroup_position_in_grid.x) * 32, 0);
  auto mC = tC.slice(int(threadgroup_position_in_grid.x) * 32, int(threadgroup_position_in_grid.y) * 64);
  op.run(mA, mB, mC);
"""


@pytest.mark.parametrize("m,n,k", [(128, 96, 48), (100, 70, 37)], ids=["aligned", "ragged"])
def test_execution_simdgroups_with_slices(rng, m, n, k):
    a, b = _operand(rng, (m, k), mx.float16), _operand(rng, (k, n), mx.float16)
    tiles = (-(-n // 32), -(-m // 64))
    (c,) = _run("tops_apple_slices", ["A", "B", "dims"], APPLE_SLICES, [a, b, mx.array([m, n, k], dtype=mx.int32)],
                [(m, n)], [mx.float32], (tiles[0] * 128, tiles[1], 1), (128, 1, 1), race_check=True)
    _close(c, _host(a) @ _host(b), mx.float32, k)


APPLE_KLOOP = """
  const int M = dims[0], N = dims[1], K = dims[2];
  constexpr int tilek = 16;
  constexpr auto desc = matmul2d_descriptor(64, 32, tilek, false, false, false,
                                            matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroups<4>> op;
  auto A_ = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(K, M));
  auto B_ = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(B, dextents<int32_t, 2>(N, K));
  auto C_ = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(N, M));
  const int row0 = int(threadgroup_position_in_grid.y) * 64, col0 = int(threadgroup_position_in_grid.x) * 32;
  if (row0 + 64 <= M && col0 + 32 <= N) {
    // Inside tile: static slices, no edge checks.
    auto tC = C_.static_slice<32, 64>(col0, row0);
    int k = 0;
    for (; k + tilek <= K; k += tilek) {
      auto tA = A_.static_slice<tilek, 64>(k, row0);
      auto tB = B_.static_slice<32, tilek>(col0, k);
      op.run(tA, tB, tC);
    }
    if (k < K) {
      auto tA = A_.static_slice<dynamic_extent, 64>(k, row0);
      auto tB = B_.static_slice<32, dynamic_extent>(col0, k);
      op.run(tA, tB, tC);
    }
  } else {
    auto tC = C_.slice(col0, row0);
    for (int k = 0; k < K; k += tilek) {
      auto tA = A_.slice(k, row0);
      auto tB = B_.slice(col0, k);
      op.run(tA, tB, tC);
    }
  }
"""


def test_k_loop_static_slices_inside_dynamic_at_edges(rng):
    m, n, k = 96, 80, 53
    a, b = _operand(rng, (m, k), mx.float16), _operand(rng, (k, n), mx.float16)
    (c,) = _run("tops_apple_kloop", ["A", "B", "dims"], APPLE_KLOOP, [a, b, mx.array([m, n, k], dtype=mx.int32)],
                [(m, n)], [mx.float32], (3 * 128, 2, 1), (128, 1, 1), init_value=0)
    _close(c, _host(a) @ _host(b), mx.float32, k)


# --- inline tensors with strides and offsets into larger buffers --------------

STRIDED = """
  // A: rows 3.. and columns 5.. of a 40 x 30 buffer; B: stored N x K inside a
  // wider buffer; C: columns 8..8+N of a 20 x 40 output.
  constexpr auto desc = matmul2d_descriptor(16, 24, static_cast<int>(dynamic_extent), false, true);
  matmul2d<desc, execution_simdgroup> op;
  tensor<const device float, dextents<int32_t, 2>, tensor_inline> tA(
      Abig + 3 * 30 + 5, dextents<int32_t, 2>(20, 16), array<int32_t, 2>({1, 30}));
  tensor<const device float, dextents<int32_t, 2>, tensor_inline> tB(
      Bbig, dextents<int32_t, 2>(20, 24), array<int32_t, 2>({1, 32}));
  tensor<device float, dextents<int32_t, 2>, tensor_inline> tC(
      out0 + 8, dextents<int32_t, 2>(24, 16), array<int32_t, 2>{1, 40});
  auto sC = tC.slice(0, 2);  // rows 2.. of the view: the op's last rows fall outside and are skipped
  op.run(tA, tB, sC);
"""


def test_inline_tensors_with_strides_offsets_and_slices(rng):
    abig = rng.standard_normal((40, 30)).astype(np.float32)
    bbig = rng.standard_normal((24, 32)).astype(np.float32)
    (c,) = _run("tops_strided", ["Abig", "Bbig"], STRIDED, [mx.array(abig), mx.array(bbig)], [(20, 40)],
                [mx.float32], (32, 1, 1), (32, 1, 1), init_value=-7.0)
    a = abig[3:19, 5:25].astype(np.float64)
    b = bbig[:, :20].T.astype(np.float64)
    want = np.full((20, 40), -7.0)
    want[2:16, 8:32] = (a @ b)[:14]
    _close(c, want, mx.float32, 20)


# --- the emitter's sequence: a cooperative accumulator over a K loop, then a
# per-element epilogue by coordinates, ragged sizes --------------------------

EMITTER = """
  const int M = dims[0], N = dims[1], K = dims[2];
  constexpr int BK = 16;
  constexpr auto desc = matmul2d_descriptor(BM, BN, BK, false, false, false,
                                            matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroups<SG>> op;
  tensor<const device half, dextents<int32_t, 2>, tensor_inline> tA(A, dextents<int32_t, 2>(K, M),
                                                                     array<int32_t, 2>({1, K}));
  tensor<const device half, dextents<int32_t, 2>, tensor_inline> tB(B, dextents<int32_t, 2>(N, K),
                                                                     array<int32_t, 2>({1, N}));
  const int row0 = int(threadgroup_position_in_grid.y) * BM, col0 = int(threadgroup_position_in_grid.x) * BN;
  auto mA = tA.slice(0, row0);
  auto mB = tB.slice(col0, 0);
  auto acc = op.template get_destination_cooperative_tensor<decltype(mA), decltype(mB), float>();
  for (uint16_t i = 0; i < acc.get_capacity(); ++i) acc[i] = 0.0f;
  for (int k = 0; k < K; k += BK) {
    auto kA = tA.slice(k, row0);
    auto kB = tB.slice(col0, k);
    op.run(kA, kB, acc);
  }
  for (uint16_t i = 0; i < acc.get_capacity(); ++i) {
    if (!acc.is_valid_element(i)) continue;
    auto idx = acc.get_multidimensional_index(i);
    const int r = row0 + idx[1], c = col0 + idx[0];
    if (r < M && c < N) out0[r * N + c] = half(max(acc[i] * alpha + bias[c], 0.0f));
  }
"""


@pytest.mark.parametrize("bm,bn,sg", [(32, 32, 1), (64, 32, 4), (32, 48, 2)])
def test_cooperative_accumulator_k_loop_and_epilogue(rng, bm, bn, sg):
    m, n, k = 77, 45, 50
    a, b = _operand(rng, (m, k), mx.float16), _operand(rng, (k, n), mx.float16)
    bias = rng.standard_normal(n).astype(np.float32)
    grid = (-(-n // bn) * 32 * sg, -(-m // bm), 1)
    (c,) = _run("tops_emitter", ["A", "B", "bias", "alpha", "dims"], EMITTER,
                [a, b, mx.array(bias), 1.5, mx.array([m, n, k], dtype=mx.int32)], [(m, n)], [mx.float16],
                grid, (32 * sg, 1, 1), template=[("BM", bm), ("BN", bn), ("SG", sg)], race_check=True)
    want = np.maximum((_host(a) @ _host(b)) * 1.5 + bias, 0)
    _close(c, want, mx.float16, k)


# --- Apple's cooperative form: mask-guarded init, a bias loaded into the
# destination's layout, an epilogue by coordinate, store through a tensor -----

APPLE_COOP = """
  const int M = dims[0], N = dims[1], K = dims[2];
  constexpr auto desc = matmul2d_descriptor(64, 32, static_cast<int>(dynamic_extent));
  matmul2d<desc, execution_simdgroups<4>> op;
  auto A_ = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(K, M));
  auto B_ = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(B, dextents<int32_t, 2>(N, K));
  auto bias_ = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(bias, dextents<int32_t, 2>(N, M));
  auto C_ = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(N, M));
  const int row0 = int(threadgroup_position_in_grid.y) * 64, col0 = int(threadgroup_position_in_grid.x) * 32;
  auto mA = A_.slice(0, row0);
  auto mB = B_.slice(col0, 0);
  auto mC = C_.slice(col0, row0);
  auto mBias = bias_.slice(col0, row0);
  auto cT = op.get_destination_cooperative_tensor<decltype(mA), decltype(mB), float>();
  for (uint16_t i = 0; i < cT.get_capacity(); ++i) {
    if (cT.get_mask(i)) cT[i] = 0;
  }
  op.run(mA, mB, cT);
  auto biasT = op.get_destination_cooperative_tensor<decltype(mA), decltype(mB), float>();
  biasT.load(mBias);
  uint16_t i = 0;
  for (auto it = cT.begin(); it != cT.end(); ++it, ++i) {
    if (!cT.get_mask(i)) continue;
    auto ids = it.get_multidimensional_index();
    *it = (*it + biasT[i]) * float(1 + (col0 + ids[0]) % 3);
  }
  cT.store(mC);
"""


def test_cooperative_destination_load_epilogue_store(rng):
    m, n, k = 100, 70, 40
    a, b = _operand(rng, (m, k), mx.float16), _operand(rng, (k, n), mx.float16)
    bias = rng.standard_normal((m, n)).astype(np.float32)
    (c,) = _run("tops_apple_coop", ["A", "B", "bias", "dims"], APPLE_COOP,
                [a, b, mx.array(bias), mx.array([m, n, k], dtype=mx.int32)], [(m, n)], [mx.float32],
                (3 * 128, 2, 1), (128, 1, 1), init_value=-1.0)
    want = (_host(a) @ _host(b) + bias) * (1 + np.arange(n) % 3)
    _close(c, want, mx.float32, k)


# --- ggml's form: tiles staged in threadgroup memory, transpose_right, a
# fresh (zero) destination accumulated over K, stored through a device tensor
# inside the matrix and through threadgroup memory at its edges -------------

GGML = """
  const int M = dims[0], N = dims[1], K = dims[2];
  constexpr int NR0 = 64, NR1 = 32, NK = 32;
  threadgroup half sa[NR0 * NK];
  threadgroup half sb[NR1 * NK];
  threadgroup float sc[NR0 * NR1];
  const int r0 = int(threadgroup_position_in_grid.y) * NR0;  // weight rows: columns of out
  const int r1 = int(threadgroup_position_in_grid.x) * NR1;  // tokens: rows of out
  const uint tid = thread_index_in_threadgroup;
  auto tA = tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(sa, dextents<int32_t, 2>(NK, NR0));
  auto tB = tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(sb, dextents<int32_t, 2>(NK, NR1));
  mpp::tensor_ops::matmul2d<
      mpp::tensor_ops::matmul2d_descriptor(NR1, NR0, NK, false, true, false,
                                           mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate),
      execution_simdgroups<4>> mm;
  auto cT = mm.get_destination_cooperative_tensor<decltype(tB), decltype(tA), float>();
  for (int k0 = 0; k0 < K; k0 += NK) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = tid; i < NR0 * NK; i += 128) {
      const int n = r0 + int(i) / NK, k = k0 + int(i) % NK;
      sa[i] = n < N && k < K ? W[n * K + k] : half(0);
    }
    for (uint i = tid; i < NR1 * NK; i += 128) {
      const int m = r1 + int(i) / NK, k = k0 + int(i) % NK;
      sb[i] = m < M && k < K ? half(X[m * K + k]) : half(0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    mm.run(tB, tA, cT);
  }
  if (r0 + NR0 <= N && r1 + NR1 <= M) {
    auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0 + r1 * N + r0, dextents<int32_t, 2>(N, NR1));
    cT.store(tC);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    auto tC = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(sc, dextents<int32_t, 2>(NR0, NR1));
    cT.store(tC);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = tid; i < NR0 * NR1; i += 128) {
      const int m = r1 + int(i) / NR0, n = r0 + int(i) % NR0;
      if (m < M && n < N) out0[m * N + n] = sc[i];
    }
  }
"""


def test_ggml_form_threadgroup_tiles_fresh_destination(rng):
    m, n, k = 45, 100, 70
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = _operand(rng, (n, k), mx.float16)
    (c,) = _run("tops_ggml", ["X", "W", "dims"], GGML, [mx.array(x), w, mx.array([m, n, k], dtype=mx.int32)],
                [(m, n)], [mx.float32], (2 * 128, 2, 1), (128, 1, 1), race_check=True)
    want = x.astype(np.float16).astype(np.float64) @ _host(w).T
    _close(c, want, mx.float32, k)


# --- MLX's NAX form: cooperative left, right and destination tensors filled
# element by element in the 16 x 16 fragment layout -------------------------

NAX_HEADER = HEADER + """
// (row, column) of element e (0..7) of lane `lane` in a 16 x 16 fragment as
// stored: the layout MLX's NAX fragments use (tensor_ops.h documents it).
inline int2 frag_rc(uint lane, int e) {
  const int q = int(lane >> 2);
  return int2(((q & 4) | int((lane >> 1) & 3)) + (e >> 2) * 8, ((q & 2) | int(lane & 1)) * 4 + (e & 3));
}

// One 16 x 32 tile of C per SIMD-group, K in steps of 16.  A is M x K (K x M
// stored when TA), B is K x N (N x K stored when TB), all row-major.
template <bool TA, bool TB>
void nax_tile(const device half* A, const device half* B, device float* C, device float* C2,
              int M, int N, int K, uint sg, uint lane) {
  constexpr auto desc = matmul2d_descriptor(16, 32, 16, TA, TB, true,
                                            matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroup> op;
  auto ct_a = op.template get_left_input_cooperative_tensor<half, half, float>();
  auto ct_b = op.template get_right_input_cooperative_tensor<half, half, float>();
  auto ct_c = op.template get_destination_cooperative_tensor<decltype(ct_a), decltype(ct_b), float>();
  for (short i = 0; i < ct_c.get_capacity(); i++) ct_c[i] = 0.0f;
  const int m0 = int(sg / 2) * 16, n0 = int(sg % 2) * 32;
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int e = 0; e < 8; e++) {
      const int2 rc = frag_rc(lane, e);
      ct_a[e] = TA ? A[(k0 + rc.x) * M + m0 + rc.y] : A[(m0 + rc.x) * K + k0 + rc.y];
      for (int nn = 0; nn < 2; nn++)
        ct_b[nn * 8 + e] = TB ? B[(n0 + nn * 16 + rc.x) * K + k0 + rc.y] : B[(k0 + rc.x) * N + n0 + nn * 16 + rc.y];
    }
    op.run(ct_a, ct_b, ct_c);
  }
  for (int nn = 0; nn < 2; nn++)
    for (int e = 0; e < 8; e++) {
      const int2 rc = frag_rc(lane, e);
      C[(m0 + rc.x) * N + n0 + nn * 16 + rc.y] = ct_c[nn * 8 + e];
    }
  for (uint16_t i = 0; i < ct_c.get_capacity(); i++) {
    if (!ct_c.is_valid_element(i)) continue;
    auto idx = ct_c.get_multidimensional_index(i);
    C2[(m0 + idx[1]) * N + n0 + idx[0]] = ct_c[i];
  }
}
"""

NAX = """
  if (transposed) nax_tile<true, true>(A, B, out0, out1, 32, 64, 48, simdgroup_index_in_threadgroup, thread_index_in_simdgroup);
  else nax_tile<false, false>(A, B, out0, out1, 32, 64, 48, simdgroup_index_in_threadgroup, thread_index_in_simdgroup);
"""


@pytest.mark.parametrize("transposed", [False, True])
def test_mlx_nax_form_cooperative_inputs(rng, transposed):
    m, n, k = 32, 64, 48
    a, b = _operand(rng, (m, k), mx.float16), _operand(rng, (k, n), mx.float16)
    a_st = a.T if transposed else a
    b_st = b.T if transposed else b
    c, c2 = _run("tops_nax", ["A", "B", "transposed"], NAX, [a_st, b_st, int(transposed)], [(m, n), (m, n)],
                 [mx.float32, mx.float32], (128, 1, 1), (128, 1, 1), header=NAX_HEADER, race_check=True)
    _close(c, _host(a) @ _host(b), mx.float32, k)
    # get_multidimensional_index names the same places as MLX's fragment map.
    np.testing.assert_array_equal(c2, c)


# --- layout invariants: padding, validity and coordinates ---------------------

LAYOUT = """
  constexpr auto desc = matmul2d_descriptor(24, 40, 16);
  matmul2d<desc, execution_simdgroups<3>> op;
  auto t = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(x, dextents<int32_t, 2>(4, 4));
  auto ct = op.get_destination_cooperative_tensor<decltype(t), decltype(t), float>();
  const uint tid = thread_index_in_threadgroup;
  int valid = 0, mismatches = 0;
  for (uint16_t i = 0; i < ct.get_capacity(); ++i) {
    if (ct.get_mask(i) != ct.is_valid_element(i)) mismatches++;
    if (!ct.is_valid_element(i)) continue;
    valid++;
    auto idx = ct.get_multidimensional_index(i);
    owner[idx[1] * 40 + idx[0]] += float(tid + 1);
  }
  uint16_t e = 0;
  for (auto it = ct.begin(); it != ct.end(); ++it, ++e) {
    auto a = it.get_multidimensional_index(), b = ct.get_multidimensional_index(e);
    if (a[0] != b[0] || a[1] != b[1]) mismatches++;
  }
  counts[tid] = valid;
  counts[96 + tid] = mismatches + (e == ct.get_capacity() ? 0 : 1000);
  counts[192 + tid] = ct.get_capacity();
"""


def test_cooperative_layout_covers_the_tile_once():
    # 24 x 40 is not a whole number of 16 x 16 fragments, and 6 fragments over
    # 3 SIMD-groups: padding inside fragments.
    owner, counts = _run("tops_layout", ["x"], LAYOUT, [mx.zeros((16,))], [(24, 40), (288,)],
                         [mx.float32, mx.int32], (96, 1, 1), (96, 1, 1), output_names=["owner", "counts"],
                         init_value=0)
    assert counts[:96].sum() == 24 * 40
    assert (counts[96:192] == 0).all()
    assert (counts[192:] == 16).all()
    # Each element has exactly one owner (a second one would add to it).
    tid_of = owner.astype(np.int64) - 1
    assert tid_of.min() >= 0 and tid_of.max() < 96
    per_thread = np.bincount(tid_of.ravel(), minlength=96)
    np.testing.assert_array_equal(per_thread, counts[:96])


# --- run is a collective: divergence and a wrong scope are errors, not hangs --

DIVERGENT_HEADER = HEADER + """
inline void tile(const device float* A, device float* C) {
  constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto tA = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(C, dextents<int32_t, 2>(16, 16));
  op.run(tA, tA, tC);
}
"""

DIVERGENT = {
    "thread_returns": (
        "if (thread_index_in_simdgroup >= 8) return;\n  tile(A, out0);",
        DIVERGENT_HEADER, 32,
        r"matmul2d::run: 8 of the 32 threads of SIMD-group 0 reached this run, the others returned"),
    "two_call_sites": (
        """constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto tA = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  if (thread_index_in_simdgroup < 16) { op.run(tA, tA, tC); } else { op.run(tA, tA, tC); }""",
        HEADER, 32, r"divergent SIMD-group operation .* lanes wait at different collectives"),
    "scope_larger_than_threadgroup": (
        """constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroups<4>> op;
  auto tA = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  op.run(tA, tA, tC);""",
        HEADER, 64, r"scope is execution_simdgroups<4> but the threadgroup has 2 SIMD-groups"),
    "simdgroup_skips_run": (
        """constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroups<2>> op;
  auto tA = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  if (simdgroup_index_in_threadgroup == 1) return;
  op.run(tA, tA, tC);""",
        HEADER, 64, r"threads returned without reaching the threadgroup_barrier"),
    "operands_differ_between_threads": (
        """constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto tA = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto tC = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  auto mA = tA.slice(0, int(thread_index_in_simdgroup % 2));
  op.run(mA, tA, tC);""",
        HEADER, 32, r"passed different left tensors \(thread 0 and thread 1 "),
    "partial_simdgroup": (
        "tile(A, out0);", DIVERGENT_HEADER, 24,
        r"24 of the 32 threads of SIMD-group 0 exist \(the threadgroup size is not a multiple of 32\)"),
}


@pytest.mark.parametrize("case", sorted(DIVERGENT))
def test_divergent_run_is_an_error(case):
    source, header, threads, message = DIVERGENT[case]
    kernel = metile.metal_kernel("tops_divergent_" + case, ["A"], ["out0"], source, header=header)
    (out,) = kernel(inputs=[mx.zeros((256,))], output_shapes=[(256,)], output_dtypes=[mx.float32],
                    grid=(threads, 1, 1), threadgroup=(threads, 1, 1))
    with pytest.raises(RuntimeError, match=message):
        mx.eval(out)


# --- what Metal rejects, both models reject at compile time ------------------

REJECTED = {
    "int32_destination_of_half": (
        """constexpr auto desc = matmul2d_descriptor(16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto t = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto c = tensor<device int, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  op.run(t, t, c);""", mx.float16, mx.int32, "unsupported \\(left, right, destination\\) element types"),
    "scope_not_a_scope": (
        """constexpr auto desc = matmul2d_descriptor(16, 16);
  matmul2d<desc, int> op;""", mx.float16, mx.float32, "the scope is metal::execution_simdgroup"),
    "const_destination": (
        """constexpr auto desc = matmul2d_descriptor(16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto t = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto c = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  op.run(t, t, c);""", mx.float16, mx.float32, "the destination tensor has const elements"),
    "cooperative_input_dynamic_k": (
        """constexpr auto desc = matmul2d_descriptor(16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto a = op.get_left_input_cooperative_tensor<half, half, float>();""",
        mx.float16, mx.float32, "input cooperative tensors need a static k"),
    "destination_passed_as_left": (
        """constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto t = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto c = op.get_destination_cooperative_tensor<decltype(t), decltype(t), float>();
  auto h = op.get_destination_cooperative_tensor<decltype(t), decltype(t), half>();
  op.run(h, t, c);""", mx.float16, mx.float32, "a cooperative left operand must come from"),
    "destination_made_for_swapped_input_types": (
        """constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto tA = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto tB = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  auto cT = op.get_destination_cooperative_tensor<decltype(tB), decltype(tA), float>();
  op.run(tA, tB, cT);""", mx.float16, mx.float32, "input types must match cooperative tensor types"),
    "tensor_over_pointer_of_other_type": (
        """auto t = tensor<const device float, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));""",
        mx.float16, mx.float32, "no matching constructor|cannot initialize|no viable conversion"),
    "temporary_operand": (
        """constexpr auto desc = matmul2d_descriptor(16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto t = tensor<const device half, dextents<int32_t, 2>, tensor_inline>(A, dextents<int32_t, 2>(16, 16));
  auto c = tensor<device float, dextents<int32_t, 2>, tensor_inline>(out0, dextents<int32_t, 2>(16, 16));
  op.run(t.slice(0, 0), t, c);""", mx.float16, mx.float32, "no matching member function for call to 'run'"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_rejected_in_both_models(case, monkeypatch):
    source, in_dtype, out_dtype, message = REJECTED[case]
    kernel = metile.metal_kernel("tops_rejected_" + case, ["A"], ["out0"], source, header=HEADER)
    a = mx.zeros((256,), dtype=in_dtype)
    with pytest.raises(MslCompileError, match=message):
        kernel.check(inputs=[a], output_dtypes=[out_dtype])
    monkeypatch.setenv("METILE_MSL_STRICT", "0")
    with pytest.raises(MslCompileError, match=message):
        kernel(inputs=[a], output_shapes=[(256,)], output_dtypes=[out_dtype], grid=(32, 1, 1),
               threadgroup=(32, 1, 1))
