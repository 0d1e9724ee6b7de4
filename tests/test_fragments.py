"""simdgroup_inline kernels: opaque 8x8 matrix fragments, shared-memory
exchanges and device tiles with masked tails (passes/lower_fragments.py),
checked against NumPy in float64 on the default device: the MSL CPU runtime
here, the CUDA warp-level helpers (codegen/cuda.py metile_frag8) on an NVIDIA
GPU.  Source-text checks follow the backend that ran.

Strict FP32 tolerances: rtol=3e-4, atol=3e-5.  The two specification
examples are copied as written.
"""

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import default_is_cpu, requires_msl_device

MSL = default_is_cpu() or mx.metal.is_available()  # else the default device is CUDA

RTOL, ATOL = 3e-4, 3e-5
INLINE = metile.Schedule(backend="simdgroup_inline")


@metile.kernel
def two_products(A, B, Output, *, BLOCK: metile.constexpr = 32):
    left_memory = metile.shared(64, dtype="f32")
    right_memory = metile.shared(64, dtype="f32")
    result_memory = metile.shared(64, dtype="f32")
    left = metile.tensor(A, shape=(8, 8), access="read")
    right = metile.tensor(B, shape=(8, 8), access="read")
    output = metile.tensor(Output, shape=(8, 8), access="write")
    left_values = metile.tensor(left_memory, shape=(8, 8))
    right_values = metile.tensor(right_memory, shape=(8, 8))
    result_values = metile.tensor(result_memory, shape=(8, 8))
    left_matrix = metile.tensor(left_memory, shape=(8, 8), block_shape=(8, 8))
    right_matrix = metile.tensor(right_memory, shape=(8, 8), block_shape=(8, 8))
    result_matrix = metile.tensor(result_memory, shape=(8, 8), block_shape=(8, 8))
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        position = (index // 8, index % 8)
        left_values.store(position, left.load(position))
        right_values.store(position, right.load(position))
    metile.barrier()
    left_fragment = left_matrix.load((0, 0))
    right_fragment = right_matrix.load((0, 0))
    first = metile.dot(left_fragment, right_fragment, metile.zeros((8, 8)))
    second = metile.dot(metile.maximum(first, 0.0), right_fragment, metile.zeros((8, 8)))
    result_matrix.store((0, 0), second)
    metile.barrier()
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        position = (index // 8, index % 8)
        output.store(position, result_values.load(position))


@metile.kernel
def masked_tiles(Source, Control, Output, *, BLOCK: metile.constexpr = 32):
    scratch = metile.tensor(
        metile.shared(BLOCK * 2, dtype="f32"),
        shape=(BLOCK // 4, 8),
    )
    control = metile.tensor(Control, shape=(1,), access="read")
    rows = control.load((0,))
    source = metile.tensor(
        Source, shape=(rows, 8), strides=(8, 1),
        block_shape=(8, 8), access="read",
    )
    output = metile.tensor(
        Output, shape=(rows, 8), strides=(8, 1),
        block_shape=(8, 8), access="write",
    )
    for row in metile.tile_range(0, rows, 8):
        fragment = source.load((row, 0), scratch=scratch)
        output.store((row, 0), fragment + 1.0, scratch=scratch)


@metile.kernel
def attention_block(Q, K, V, Output, *, BLOCK: metile.constexpr = 32,
                    SCALE: metile.constexpr = 0.5):
    """softmax(Q @ K^T * SCALE) @ V for one 8x8 block: two fragment products with
    the row softmax computed by scalar code through a shared-memory bridge."""
    score_memory = metile.shared(64, dtype="f32")
    queries = metile.tensor(Q, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    keys_t = metile.tensor(K, shape=(8, 8), strides=(1, 8), block_shape=(8, 8), access="read")
    values = metile.tensor(V, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    score_matrix = metile.tensor(score_memory, shape=(8, 8), block_shape=(8, 8))
    scores = metile.tensor(score_memory, shape=(8, 8))
    logits = metile.dot(queries.load((0, 0)), keys_t.load((0, 0)), metile.zeros((8, 8)))
    score_matrix.store((0, 0), logits * SCALE)
    metile.barrier()
    for row in metile.tile_range(metile.thread_id(), 8, BLOCK):
        largest = scores.load((row, 0))
        for column in metile.tile_range(1, 8):
            largest = metile.maximum(largest, scores.load((row, column)))
        total = 0.0
        for column in metile.tile_range(0, 8):
            p = metile.exp(scores.load((row, column)) - largest)
            scores.store((row, column), p)
            total = total + p
        for column in metile.tile_range(0, 8):
            scores.store((row, column), scores.load((row, column)) / total)
    metile.barrier()
    probabilities = score_matrix.load((0, 0))
    output.store((0, 0), metile.dot(probabilities, values.load((0, 0)), metile.zeros((8, 8))))


@metile.kernel
def attention_tiles(Q, K, V, Output, *, N: metile.constexpr = 16, BLOCK: metile.constexpr = 32,
                    SCALE: metile.constexpr = 0.25):
    """softmax(Q @ K^T * SCALE) @ V for one N x N block (head dimension N) from 8x8
    fragments: K-loops keep the accumulator in metile.loop_state; the row softmax
    runs as scalar code on the scores in shared memory."""
    score_memory = metile.shared(N * N, dtype="f32")
    queries = metile.tensor(Q, shape=(N, N), strides=(N, 1), block_shape=(8, 8), access="read")
    keys_t = metile.tensor(K, shape=(N, N), strides=(1, N), block_shape=(8, 8), access="read")
    values = metile.tensor(V, shape=(N, N), strides=(N, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Output, shape=(N, N), strides=(N, 1), block_shape=(8, 8),
                           access="write")
    score_matrix = metile.tensor(score_memory, shape=(N, N), block_shape=(8, 8))
    scores = metile.tensor(score_memory, shape=(N, N))
    for i in metile.tile_range(0, N, 8):
        for j in metile.tile_range(0, N, 8):
            acc = metile.loop_state(metile.zeros((8, 8)))
            for k in metile.tile_range(0, N, 8):
                acc = metile.dot(queries.load((i, k)), keys_t.load((k, j)), acc)
            score_matrix.store((i, j), acc * SCALE)
    metile.barrier()
    for row in metile.tile_range(metile.thread_id(), N, BLOCK):
        largest = scores.load((row, 0))
        for column in metile.tile_range(1, N):
            largest = metile.maximum(largest, scores.load((row, column)))
        total = 0.0
        for column in metile.tile_range(0, N):
            p = metile.exp(scores.load((row, column)) - largest)
            scores.store((row, column), p)
            total = total + p
        for column in metile.tile_range(0, N):
            scores.store((row, column), scores.load((row, column)) / total)
    metile.barrier()
    for i in metile.tile_range(0, N, 8):
        for j in metile.tile_range(0, N, 8):
            acc = metile.loop_state(metile.zeros((8, 8)))
            for k in metile.tile_range(0, N, 8):
                acc = metile.dot(score_matrix.load((i, k)), values.load((k, j)), acc)
            output.store((i, j), acc)


@metile.kernel
def folded_rows(Source, Control, Output, *, BLOCK: metile.constexpr = 32):
    """Output[i, j] = sum over t of Source[8 t + i, j] for the valid rows: a fragment
    in loop_state across the split loop (complete tiles, then the masked remainder)."""
    scratch = metile.tensor(metile.shared(BLOCK * 2, dtype="f32"), shape=(BLOCK // 4, 8))
    rows = metile.load(Control)
    source = metile.tensor(Source, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    total = metile.loop_state(metile.zeros((8, 8)))
    for row in metile.tile_range(0, rows, 8):
        total = total + source.load((row, 0), scratch=scratch)
    output.store((0, 0), total)


@metile.kernel
def half_products(A, B, Output, Rounded, *, BLOCK: metile.constexpr = 32):
    """float16 operands, float32 accumulation; storing the product to float16 shared
    memory is an explicit storage conversion."""
    half_memory = metile.shared(64, dtype="f16")
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    right = metile.tensor(B, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    half_matrix = metile.tensor(half_memory, shape=(8, 8), block_shape=(8, 8))
    half_values = metile.tensor(half_memory, shape=(8, 8))
    product = metile.dot(left.load((0, 0)), right.load((0, 0)), metile.zeros((8, 8)))
    output.store((0, 0), product)
    half_matrix.store((0, 0), product)
    metile.barrier()
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        metile.store(Rounded + index, half_values.load((index // 8, index % 8)))


@metile.kernel
def per_group_tiles(Source, Output, *, BLOCK: metile.constexpr = 64):
    """Each SIMD-group scales its own 8-row tile: SIMD-uniform origins from thread_id() // 32."""
    scratch = metile.tensor(metile.shared(BLOCK * 2, dtype="f32"), shape=(BLOCK // 4, 8))
    source = metile.tensor(Source, shape=(BLOCK // 4, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(BLOCK // 4, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    row = metile.thread_id() // 32 * 8
    output.store((row, 0), source.load((row, 0), scratch=scratch) * 2.0, scratch=scratch)


@metile.kernel
def transpose_tiles(Source, Control, Output, *, BLOCK: metile.constexpr = 32,
                    PITCH: metile.constexpr = 16):
    """Output (8, n) = Source (n, 8) transposed, through a column-major device view;
    a ragged n exercises transposed masked tails."""
    scratch = metile.tensor(metile.shared(BLOCK * 2, dtype="f32"), shape=(BLOCK // 4, 8))
    n = metile.load(Control)
    source = metile.tensor(Source, shape=(8, n), strides=(1, 8), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(8, n), strides=(PITCH, 1), block_shape=(8, 8),
                           access="write")
    for column in metile.tile_range(0, n, 8):
        output.store((0, column), source.load((0, column), scratch=scratch), scratch=scratch)


@metile.kernel
def padded_gram(A, Output, *, BLOCK: metile.constexpr = 32):
    """A @ A^T through a padded row-major shared view and its transposed view."""
    memory = metile.shared(96, dtype="f32")
    values = metile.tensor(memory, shape=(8, 8), strides=(12, 1))
    rows = metile.tensor(memory, shape=(8, 8), strides=(12, 1), block_shape=(8, 8))
    columns = metile.tensor(memory, shape=(8, 8), strides=(1, 12), block_shape=(8, 8))
    output = metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        values.store((index // 8, index % 8), metile.load(A + index))
    metile.barrier()
    output.store((0, 0), metile.dot(rows.load((0, 0)), columns.load((0, 0)), metile.zeros((8, 8))))


def _f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_two_products(rng):
    left_buffer = mx.array(_f32(rng, (8, 8)))
    right_buffer = mx.array(_f32(rng, (8, 8)))
    output_buffer = mx.zeros((8, 8))
    out = two_products[(1,)](
        left_buffer, right_buffer, output_buffer,
        STRICT_MATH=True,
        SCHEDULE=metile.Schedule(backend="simdgroup_inline"),
    )
    a = np.array(left_buffer, np.float64)
    b = np.array(right_buffer, np.float64)
    np.testing.assert_allclose(np.array(out), np.maximum(a @ b, 0) @ b, rtol=RTOL, atol=ATOL)
    src = two_products.last_dispatch.source
    if MSL:
        assert "simdgroup_multiply_accumulate" in src and "simdgroup_load" in src
    else:
        assert "metile_frag_mma(" in src and "metile_frag_load(" in src
    assert two_products.schedule_plan.backend == "simdgroup_inline"
    report = two_products.execution_report
    assert "shared_hazards" in report.passes and "lower_fragments" in report.passes
    assert "simdgroup_inline" in two_products.explain()


@pytest.mark.parametrize("rows", [0, 1, 8, 9, 17])
def test_masked_tiles(rng, rows):
    capacity = 24
    # Rows after the valid ones are NaN in the source and -7 in the output: no later
    # row may be read into a stored value or written.
    source = np.full((capacity, 8), np.nan, np.float32)
    source[:rows] = _f32(rng, (rows, 8))
    before = np.full((capacity, 8), -7.0, np.float32)
    source_buffer, control_buffer = mx.array(source), mx.array([rows], mx.int32)
    output_buffer = mx.array(before)
    out = masked_tiles[(1,)](
        source_buffer, control_buffer, output_buffer,
        STRICT_MATH=True,
        SCHEDULE=metile.Schedule(backend="simdgroup_inline"),
    )
    expect = before.copy()
    expect[:rows] = source[:rows] + 1.0
    np.testing.assert_array_equal(np.array(out), expect)


def test_masked_tiles_source_paths():
    d = masked_tiles[(1,)].prepare(mx.zeros((9, 8)), mx.array([9], mx.int32), mx.zeros((9, 8)),
                                   STRICT_MATH=True, SCHEDULE=INLINE, backend="msl")
    src = d.source
    # complete tiles: matrix load/store; tails: SIMD-group barriers around scratch copies
    assert "simdgroup_load(_fr" in src and "&Source[" in src and "&Output[" in src
    assert "simdgroup_barrier" in src and "thread_elements" in src


def test_attention_block(rng):
    q, k, v = (_f32(rng, (8, 8)) for _ in range(3))
    out = attention_block[(1,)](mx.array(q), mx.array(k), mx.array(v), mx.zeros((8, 8)),
                                STRICT_MATH=True, SCHEDULE=INLINE)
    s = q.astype(np.float64) @ k.T.astype(np.float64) * 0.5
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.array(out), p @ v, rtol=RTOL, atol=ATOL)


def test_strict_math_contradiction():
    with pytest.raises(metile.LaunchError if hasattr(metile, "LaunchError") else Exception,
                       match="STRICT_MATH"):
        two_products[(1,)](mx.zeros((8, 8)), mx.zeros((8, 8)), mx.zeros((8, 8)),
                           STRICT_MATH=1, SCHEDULE=INLINE)


def test_cuda_text():
    # 8x8 fragments on CUDA: a warp-level FFMA/shuffle emulation with private lane
    # ownership (codegen/cuda.py metile_frag8); run on the device machine for numbers.
    d = masked_tiles[(1,)].prepare(mx.zeros((9, 8)), mx.array([9], mx.int32), mx.zeros((9, 8)),
                                   STRICT_MATH=True, SCHEDULE=INLINE, backend="cuda")
    src = d.source
    assert "metile_frag8<float>" in src and "__syncwarp();" in src
    assert "metile_frag_load(_fr" in src and "metile_frag_store(&Output[" in src
    assert "thread_elements" not in src and "metal::" not in src
    d = attention_block[(1,)].prepare(*(mx.zeros((8, 8)) for _ in range(4)), STRICT_MATH=True,
                                      SCHEDULE=INLINE, backend="cuda")
    src = d.source
    assert "metile_frag_mma(" in src and "__shfl_sync" in src and "metile_frag_load_t(" in src
    assert d.variant.data["passes"][-1] == "emit_cuda"


@pytest.mark.parametrize("n", [16, 32])
def test_attention_tiles(rng, n):
    q, k, v = (_f32(rng, (n, n)) for _ in range(3))
    out = attention_tiles[(1,)](mx.array(q), mx.array(k), mx.array(v), mx.zeros((n, n)), N=n,
                                STRICT_MATH=True, SCHEDULE=INLINE)
    s = q.astype(np.float64) @ k.T.astype(np.float64) * 0.25
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.array(out), p @ v, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("rows", [0, 5, 16, 21])
def test_loop_state_across_split_loop(rng, rows):
    source = np.full((24, 8), np.nan, np.float32)
    source[:rows] = _f32(rng, (rows, 8))
    out = folded_rows[(1,)](mx.array(source), mx.array([rows], mx.int32), mx.zeros((8, 8)),
                            STRICT_MATH=True, SCHEDULE=INLINE)
    padded = np.zeros((24, 8))
    padded[:rows] = source[:rows]
    np.testing.assert_allclose(np.array(out), padded.reshape(3, 8, 8).sum(axis=0),
                               rtol=RTOL, atol=ATOL)
    src = folded_rows.last_dispatch.source
    # complete iterations first (no guard), then the guarded remainder
    assert src.count("for (int") >= 2
    assert ("simdgroup_barrier" if MSL else "__syncwarp();") in src


def test_float16_operands(rng):
    a = mx.array(_f32(rng, (8, 8))).astype(mx.float16)
    b = mx.array(_f32(rng, (8, 8))).astype(mx.float16)
    out, rounded = half_products[(1,)](a, b, mx.zeros((8, 8)), mx.zeros((64,), mx.float16),
                                       STRICT_MATH=True, SCHEDULE=INLINE)
    ref = np.array(a.astype(mx.float32), np.float64) @ np.array(b.astype(mx.float32), np.float64)
    np.testing.assert_allclose(np.array(out), ref, rtol=RTOL, atol=ATOL)  # fp32 accumulation
    # float16 storage rounds the product: two units in the last place of float16
    np.testing.assert_allclose(np.array(rounded.astype(mx.float32)).reshape(8, 8), ref,
                               rtol=2e-3, atol=2e-3)
    assert ("simdgroup_matrix<half, 8, 8>" if MSL else "metile_frag8<__half>") in \
        half_products.last_dispatch.source


@pytest.mark.parametrize("block", [64, 128])
def test_work_assigned_to_simdgroups(rng, block):
    source = _f32(rng, (block // 4, 8))
    out = per_group_tiles[(1,)](mx.array(source), mx.zeros((block // 4, 8)), BLOCK=block,
                                STRICT_MATH=True, SCHEDULE=INLINE)
    np.testing.assert_allclose(np.array(out), source * 2.0, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n", [3, 8, 13])
def test_column_major_device_view(rng, n):
    source = _f32(rng, (n, 8))
    before = np.full((8, 16), -3.0, np.float32)
    out = transpose_tiles[(1,)](mx.array(source), mx.array([n], mx.int32), mx.array(before),
                                STRICT_MATH=True, SCHEDULE=INLINE)
    expect = before.copy()
    expect[:, :n] = source.T
    np.testing.assert_array_equal(np.array(out), expect)


@requires_msl_device  # lane orders are the CPU runtime's; compute-sanitizer's racecheck on CUDA
def test_no_races_under_any_lane_order(rng, monkeypatch):
    # The CPU runtime runs every lane order and requires equal outputs: a missing
    # barrier in the lowering (scratch reuse, shared bridge) would show up here.
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    source = _f32(rng, (24, 8))
    out = masked_tiles[(1,)](mx.array(source), mx.array([17], mx.int32), mx.zeros((24, 8)),
                             STRICT_MATH=True, SCHEDULE=INLINE)
    np.testing.assert_array_equal(np.array(out)[:17], source[:17] + 1.0)
    q, k, v = (_f32(rng, (16, 16)) for _ in range(3))
    out = attention_tiles[(1,)](mx.array(q), mx.array(k), mx.array(v), mx.zeros((16, 16)),
                                N=16, STRICT_MATH=True, SCHEDULE=INLINE)
    mx.eval(out)
    out = per_group_tiles[(1,)](mx.array(source[:32 // 2]), mx.zeros((16, 8)), BLOCK=64,
                                STRICT_MATH=True, SCHEDULE=INLINE)
    np.testing.assert_allclose(np.array(out), source[:16] * 2.0, rtol=RTOL, atol=ATOL)


@metile.kernel
def shifted_tile(Source, Control, Output, *, BLOCK: metile.constexpr = 32):
    """A tile whose origin starts above the view: rows before 0 read as zero."""
    scratch = metile.tensor(metile.shared(BLOCK * 2, dtype="f32"), shape=(BLOCK // 4, 8))
    shift = metile.load(Control)
    source = metile.tensor(Source, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    output.store((0, 0), source.load((0 - shift, 0), scratch=scratch), scratch=scratch)


def test_negative_origin_reads_zero(rng):
    source = _f32(rng, (8, 8))
    out = shifted_tile[(1,)](mx.array(source), mx.array([3], mx.int32), mx.zeros((8, 8)),
                             STRICT_MATH=True, SCHEDULE=INLINE)
    expect = np.zeros((8, 8), np.float32)
    expect[3:] = source[:5]
    np.testing.assert_array_equal(np.array(out), expect)



_REPLAY_WARP = r"""
#include <cmath>
#include <cstdio>
#include <vector>
#define __device__
#define __forceinline__ inline
struct D3 { unsigned x, y, z; };
D3 threadIdx;
// SIMT by replay: pass 0 records each lane's shuffle inputs, pass 1 answers from
// them (valid because no shuffle input depends on an earlier shuffle's result).
int pass_no = 0, call_no = 0;
std::vector<std::vector<float>> recorded(32);
float __shfl_sync(unsigned, float v, int src) {
  if (pass_no == 0) { recorded[threadIdx.x & 31].push_back(v); ++call_no; return 0.0f; }
  return recorded[src][call_no++];
}
"""

_REPLAY_MAIN = r"""
int main() {
  float A[64], B[64], C[64], D[64], T[64];
  for (int i = 0; i < 64; ++i) { A[i] = std::sin(i * 0.7f); B[i] = std::cos(i * 1.3f); C[i] = i * 0.01f; }
  metile_frag8<float> a[32], b[32], c[32], d[32], t[32];
  for (int l = 0; l < 32; ++l) {
    threadIdx.x = l;
    metile_frag_load(a[l], A, 8); metile_frag_load(b[l], B, 8); metile_frag_load(c[l], C, 8);
    metile_frag_load_t(t[l], A, 8);
  }
  for (pass_no = 0; pass_no < 2; ++pass_no)
    for (int l = 0; l < 32; ++l) { threadIdx.x = l; call_no = 0; metile_frag_mma(d[l], a[l], b[l], c[l]); }
  for (int l = 0; l < 32; ++l) { threadIdx.x = l; metile_frag_store(D, d[l], 8); metile_frag_store_t(T, t[l], 8); }
  double err = 0, moved = 0;
  for (int r = 0; r < 8; ++r) for (int j = 0; j < 8; ++j) {
    double s = C[r * 8 + j];
    for (int k = 0; k < 8; ++k) s += (double)A[r * 8 + k] * B[k * 8 + j];
    err = std::fmax(err, std::fabs(s - D[r * 8 + j]));
    moved = std::fmax(moved, std::fabs(T[r * 8 + j] - A[r * 8 + j]));  // load_t then store_t
  }
  std::printf("%g %g\n", err, moved);
  return !(err < 1e-5 && moved == 0);
}
"""


@pytest.mark.skipif(not MSL, reason="needs the CPU runtime's clang++; on a GPU the helpers run for real")
def test_cuda_fragment_helpers_on_a_replayed_warp(tmp_path):
    # The CUDA 8x8 helpers (codegen/cuda.py _FRAG8) executed on the CPU: 32 lanes
    # replayed in two passes stand in for the warp's shuffles.
    import subprocess

    from metile.codegen.cuda import _FRAG8
    from metile.runtime.msl_cpu.compiler import find_compiler

    cxx = find_compiler()[0]
    src = tmp_path / "frag8.cpp"
    src.write_text(_REPLAY_WARP + _FRAG8 + _REPLAY_MAIN)
    exe = tmp_path / "frag8"
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wno-unknown-pragmas", str(src), "-o", str(exe)],
                   check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_padded_and_transposed_shared_views(rng):
    a = _f32(rng, (8, 8))
    out = padded_gram[(1,)](mx.array(a), mx.zeros((8, 8)), STRICT_MATH=True, SCHEDULE=INLINE)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(np.array(out), a64 @ a64.T, rtol=RTOL, atol=ATOL)
    # transposed matrix load
    assert ("ulong2(0, 0), true)" if MSL else "metile_frag_load_t(") in \
        padded_gram.last_dispatch.source


@metile.kernel
def group_products(A, B, Output, *, BLOCK: metile.constexpr = 64):
    """relu(A_g @ B_g) for each SIMD-group g = thread_id() // 32: rows [24 g, 24 g + 24)
    of one shared allocation belong to group g (its A tile, B tile, then the product).
    No barrier between a group's matrix reads and its product store: the in-bounds
    proof and the hazard analysis cover every SIMD-group's own tiles."""
    memory = metile.shared(BLOCK * 6, dtype="f32")
    values = metile.tensor(memory, shape=(BLOCK * 3 // 4, 8))
    matrix = metile.tensor(memory, shape=(BLOCK * 3 // 4, 8), block_shape=(8, 8))
    for index in metile.tile_range(metile.thread_id(), BLOCK * 2, BLOCK):
        row = index // 64 * 24 + index % 64 // 8
        values.store((row, index % 8), metile.load(A + index))
        values.store((row + 8, index % 8), metile.load(B + index))
    metile.barrier()
    base = metile.thread_id() // 32 * 24
    product = metile.dot(matrix.load((base, 0)), matrix.load((base + 8, 0)),
                         metile.zeros((8, 8)))
    matrix.store((base + 16, 0), metile.maximum(product, 0.0))
    metile.barrier()
    for index in metile.tile_range(metile.thread_id(), BLOCK * 2, BLOCK):
        row = index // 64 * 24 + 16 + index % 64 // 8
        metile.store(Output + index, values.load((row, index % 8)))


@pytest.mark.parametrize("block", [64, 128])
def test_per_simdgroup_shared_tiles(rng, block, monkeypatch):
    # every lane order must give the same result (METILE_RACE_CHECK): the groups'
    # tiles really are disjoint
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    groups = block // 32
    a, b = _f32(rng, (groups, 8, 8)), _f32(rng, (groups, 8, 8))
    out = group_products[(1,)](mx.array(a), mx.array(b), mx.zeros((groups, 8, 8)), BLOCK=block,
                               STRICT_MATH=True, SCHEDULE=INLINE)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0.0)
    np.testing.assert_allclose(np.array(out), ref, rtol=RTOL, atol=ATOL)


@metile.kernel
def group_rounds(Source, Output, *, BLOCK: metile.constexpr = 64):
    """SIMD-group g doubles its tile g + 1 times: a while loop whose condition is
    uniform within each SIMD-group (and differs between them)."""
    source = metile.tensor(Source, shape=(BLOCK // 4, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(BLOCK // 4, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    group = metile.thread_id() // 32
    fragment = metile.loop_state(source.load((group * 8, 0)))
    step = 0
    while step <= group:
        fragment = fragment * 2.0
        step = step + 1
    output.store((group * 8, 0), fragment)


def test_simd_uniform_while_condition(rng):
    source = _f32(rng, (4, 8, 8))
    out = group_rounds[(1,)](mx.array(source), mx.zeros((4, 8, 8)), BLOCK=128,
                             STRICT_MATH=True, SCHEDULE=INLINE)
    expect = source * (2.0 ** np.arange(1, 5, dtype=np.float32))[:, None, None]
    np.testing.assert_array_equal(np.array(out), expect)


@metile.kernel(differentiable=True)
def relu_epilogue(Source, Control, Output, *, BLOCK: metile.constexpr = 32):
    """A pointwise fragment epilogue over device tiles with a masked tail."""
    scratch = metile.tensor(metile.shared(BLOCK * 2, dtype="f32"), shape=(BLOCK // 4, 8))
    rows = metile.load(Control)
    source = metile.tensor(Source, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(rows, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    for row in metile.tile_range(0, rows, 8):
        o = (row, 0)
        output.store(o, metile.maximum(source.load(o, scratch=scratch) * 2.0, 0.0),
                     scratch=scratch)


@metile.kernel(differentiable=True)
def product_epilogue(A, B, Output, *, BLOCK: metile.constexpr = 32):
    left = metile.tensor(A, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    right = metile.tensor(B, shape=(8, 8), strides=(8, 1), block_shape=(8, 8), access="read")
    output = metile.tensor(Output, shape=(8, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    product = metile.dot(left.load((0, 0)), right.load((0, 0)), metile.zeros((8, 8)))  # MARK
    output.store((0, 0), metile.maximum(product, 0.0))


def test_fragment_epilogue_vjp(rng):
    rows, capacity = 9, 16
    source = _f32(rng, (capacity, 8))
    weights = _f32(rng, (capacity, 8))
    control = mx.array([rows], mx.int32)

    def loss(s):
        out = relu_epilogue[(1,)](s, control, mx.full((capacity, 8), -7.0),
                                  STRICT_MATH=True, SCHEDULE=INLINE)
        return (out * mx.array(weights)).sum(), out

    (value, out), grad = mx.value_and_grad(loss)(mx.array(source))
    expect = np.full((capacity, 8), -7.0, np.float32)
    expect[:rows] = np.maximum(source[:rows] * 2.0, 0.0)
    np.testing.assert_array_equal(np.array(out), expect)
    # rows past the row count are never read: their gradient is zero
    ref = np.zeros((capacity, 8), np.float32)
    ref[:rows] = weights[:rows] * 2.0 * (source[:rows] > 0)
    np.testing.assert_allclose(np.array(grad), ref, rtol=RTOL, atol=ATOL)


def test_matrix_products_are_not_differentiated():
    import inspect
    with pytest.raises(metile.CompilationError, match="does not differentiate matrix products"
                       ) as info:
        product_epilogue[(1,)](mx.zeros((8, 8)), mx.zeros((8, 8)), mx.zeros((8, 8)),
                               STRICT_MATH=True, SCHEDULE=INLINE)
    lines, first = inspect.getsourcelines(product_epilogue.fn)
    line = first + next(i for i, t in enumerate(lines) if "# MARK" in t)
    assert f"test_fragments.py:{line}:" in str(info.value)


@metile.kernel(differentiable=True)
def shifted_epilogue(Source, Output, *, BLOCK: metile.constexpr = 32):
    source = metile.tensor(Source, shape=(16, 8), strides=(8, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output, shape=(16, 8), strides=(8, 1), block_shape=(8, 8),
                           access="write")
    output.store((8, 0), source.load((0, 0)) * 2.0)


def test_position_changing_epilogue_is_not_pointwise():
    with pytest.raises(metile.CompilationError, match="every matrix view access needs the same "
                       "origin, extents and strides"):
        shifted_epilogue[(1,)](mx.zeros((16, 8)), mx.zeros((16, 8)), STRICT_MATH=True,
                               SCHEDULE=INLINE)
