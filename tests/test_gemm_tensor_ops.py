"""metile GEMMs lowered to Metal 4 tensor ops (passes/gemm_tensor_ops.py) on the apple10
target, run by the CPU runtime's tensor-ops shim with race and bounds checks on, every
kernel also compiled against the strict Metal model (conftest), against NumPy float64
products of the same (rounded) inputs.  Tolerances as in test_gemm.py.

Covered: Schedule(backend="tensor_ops" | "nax") and automatic selection; ragged sizes;
float32 / float16 / bfloat16 operands; every matmul_epilogue EPILOGUE and
linear_epilogue's bias / residual reads (right operand row-major and transposed); a
pointer-arithmetic kernel; the fallback to the SIMD-group path, with its reason, when
the operand loads are not tensor views, and the refusal when tensor_ops was required;
the controls the opaque paths refuse; the constant-memory overload of the emitted step."""

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import requires_clang, requires_msl_device
from dsl_kernels import matmul as pointer_matmul
from metile.codegen.msl_tensor_ops import HEADER
from metile.errors import CompilationError
from metile_kernels.gemm import EPILOGUES, grid, linear_epilogue, matmul, matmul_epilogue
from test_epilogue import ALPHA, BETA, reference
from test_gemm import OUTPUT_TOL, check, operands

pytestmark = [requires_msl_device, requires_clang]

TILE = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16)
SHAPES = [(75, 45, 37), (1, 1, 1), (130, 70, 200)]
K_LOOP = [{"induction_variable": "k", "kind": "loop", "lanes": 128, "elements_per_lane": 1,
           "iteration_step": 16}]


@pytest.fixture(autouse=True)
def _checked(monkeypatch):
    monkeypatch.setenv("METILE_RACE_CHECK", "1")
    monkeypatch.delenv("METILE_TARGET", raising=False)
    monkeypatch.delenv("METILE_BACKEND", raising=False)


def tensor_ops_kernel(d, backend="tensor_ops"):
    """The dispatch planned and lowered the tensor-op path: its report and its MSL."""
    plan, report = d.schedule_plan, d.execution_report
    assert (plan.backend, plan.threadgroup_size, plan.simdgroup_grid, plan.staging) == \
        (backend, (128, 1, 1), (2, 2), "device")
    assert "opaque lane ownership" in plan.cooperative_layout
    assert [lp.to_dict() for lp in report.loops] == K_LOOP
    assert report.allocations == () and not report.double_buffered
    src = d.source
    assert "metal::execution_simdgroup>" in src and "threadgroup_barrier" not in src
    desc = "16, 16, 16" if backend == "nax" else "32, 32, 16"
    assert f"matmul2d_descriptor({desc}," in src
    return report


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("schedule", [None, metile.Schedule(backend="tensor_ops")],
                         ids=["auto", "tensor_ops"])
def test_ragged_products(rng, dtype, schedule):
    extra = {} if schedule is None else {"SCHEDULE": schedule}
    for m, n, k in SHAPES:
        a, b, ref = operands(rng, m, n, k, dtype)
        d = matmul[grid(m, n)].prepare(a, b, mx.zeros((m, n)), m, n, k, **TILE, **extra,
                                       target="apple10")
        tensor_ops_kernel(d)
        check(d(), ref)


@pytest.mark.parametrize("kind", EPILOGUES)
def test_every_epilogue(rng, kind):
    # float16 operands and output: the epilogue in float32, one rounding at the store
    m, n, k = 75, 45, 37
    a, b, acc = operands(rng, m, n, k, "float16")
    d = matmul_epilogue[grid(m, n)].prepare(a, b, mx.zeros((m, n), mx.float16), m, n, k, ALPHA,
                                            BETA, EPILOGUE=kind, **TILE, target="apple10")
    report = tensor_ops_kernel(d)
    assert report.epilogue_regions == 1   # at least the float16 conversion
    check(d(), reference(kind, acc), "float16")


@pytest.mark.parametrize("bias", ["columns", "rows"])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_linear_epilogue_reads_bias_and_residual(rng, bias, transpose_b):
    m, n, k = 70, 90, 45
    a, b, acc = operands(rng, m, n, k, "float32")
    right = mx.array(np.array(b).T.copy()) if transpose_b else b
    vec = rng.standard_normal(n if bias == "columns" else m).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    d = linear_epilogue[grid(m, n)].prepare(
        a, right, mx.zeros((m, n)), mx.array(vec), mx.array(res), m, n, k, BIAS=bias,
        RESIDUAL=True, EPILOGUE="gelu_tanh", TRANSPOSE_B=transpose_b, **TILE, target="apple10",
        SCHEDULE=metile.Schedule(backend="tensor_ops"))
    tensor_ops_kernel(d)
    assert ("right stored transposed" in d.schedule_plan.reasons[-1]) == transpose_b
    z = acc + (vec[None, :] if bias == "columns" else vec[:, None])
    check(d(), reference("gelu_tanh", z) + res)


def test_pointer_arithmetic_kernel(rng):
    # Triton-style addresses (A + rm[:, None] * K + rk[None, :]) with row and K masks.
    for m, n, k in [(75, 45, 37), (3, 130, 20)]:
        a, b, ref = operands(rng, m, n, k, "float32")
        d = pointer_matmul[grid(m, n)].prepare(a, b, mx.zeros((m, n)), m, n, k, BM=64, BN=64,
                                               BK=16, target="apple10")
        tensor_ops_kernel(d)
        check(d(), ref)


@pytest.mark.parametrize("dtype,relaxed", [("float16", False), ("bfloat16", False),
                                           ("float32", True)])
def test_nax_fragments(rng, dtype, relaxed):
    m, n, k = 75, 45, 37
    a, b, acc = operands(rng, m, n, k, dtype)
    d = matmul_epilogue[grid(m, n)].prepare(
        a, b, mx.zeros((m, n)), m, n, k, ALPHA, BETA, EPILOGUE="affine_leaky", **TILE,
        RELAXED_PRECISION=relaxed, SCHEDULE=metile.Schedule(backend="nax"), target="apple10")
    report = tensor_ops_kernel(d, "nax")
    assert "decompose_nax_fragments" in report.passes
    # 2x2 NAX fragment products per SIMD-group: four destinations, four runs per K step
    assert d.source.count("get_destination_cooperative_tensor") == 4
    assert d.source.count("metile_mpp_step<") == 4
    relax = "true" if relaxed else "false"
    assert f"matmul2d_descriptor(16, 16, 16, false, false, {relax}," in d.source
    check(d(), reference("affine_leaky", acc))


@pytest.mark.parametrize("simdgroups,grid_,desc", [(1, (1, 1), "64, 64, 16"),
                                                   (2, (2, 1), "32, 64, 16")])
def test_other_simdgroup_grids(rng, simdgroups, grid_, desc):
    m, n, k = 75, 45, 37
    a, b, ref = operands(rng, m, n, k, "float32")
    d = matmul[grid(m, n)].prepare(a, b, mx.zeros((m, n)), m, n, k, **TILE, target="apple10",
                                   SCHEDULE=metile.Schedule(backend="tensor_ops",
                                                            num_simdgroups=simdgroups))
    plan = d.schedule_plan
    assert (plan.threadgroup_size, plan.simdgroup_grid) == ((32 * simdgroups, 1, 1), grid_)
    assert f"matmul2d_descriptor({desc}," in d.source
    check(d(), ref)


# -- operands that are not tensor views -----------------------------------------------------

@metile.kernel
def wrapped_rows(A, B, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr,
                 BK: metile.constexpr):
    # Triton's tutorial addressing: rows past M wrap around (% M), a gather-like address.
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        rk = k + metile.arange(0, BK)
        a = metile.load(A + (rm % M)[:, None] * K + rk[None, :], mask=rk[None, :] < K, other=0.0)
        b = metile.load(B + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = metile.dot(a, b, acc)
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@metile.kernel
def converted_operands(A, B, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr,
                       BK: metile.constexpr):
    # Operands converted after loading: the dot's operands are casts, not loads.
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        rk = k + metile.arange(0, BK)
        a = metile.load(A + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K))
        b = metile.load(B + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = metile.dot(a.to(metile.float16), b.to(metile.float16), acc)
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@metile.kernel
def lower_bounded(A, B, C, M, N, K, start, BM: metile.constexpr, BN: metile.constexpr,
                  BK: metile.constexpr):
    # A mask with a lower bound (rows >= start): not a rectangle from the tile's origin.
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        rk = k + metile.arange(0, BK)
        a = metile.load(A + rm[:, None] * K + rk[None, :],
                        mask=(rm[:, None] >= start) & (rm[:, None] < M) & (rk[None, :] < K))
        b = metile.load(B + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = metile.dot(a, b, acc)
    metile.store(C + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


NOT_VIEWS = [
    (wrapped_rows, (), "the left operand's address is not affine in the tile coordinates"),
    (converted_operands, (), "the left operand is computed (cast), not exactly one load"),
    (lower_bounded, (10,), "a mask conjunct of the left operand (ge) is not of the form "
                           "`index < bound`"),
]


@pytest.mark.parametrize("kernel,extra,why", NOT_VIEWS, ids=lambda x: getattr(x, "__name__", ""))
def test_operands_that_are_not_tensor_views(rng, kernel, extra, why):
    m, n, k = 75, 45, 37
    a, b, ref = operands(rng, m, n, k, "float32")
    if kernel is lower_bounded:
        ref[:10] = 0.0
    if kernel is converted_operands:   # the products of the float16-rounded operands
        ref = np.array(a.astype(mx.float16).astype(mx.float32)).astype(np.float64) @ \
            np.array(b.astype(mx.float16).astype(mx.float32)).astype(np.float64)
    args = (a, b, mx.zeros((m, n)), m, n, k, *extra)
    tile = dict(BM=64, BN=64, BK=16)
    # Automatic selection keeps the SIMD-group lowering and says why first.
    d = kernel[grid(m, n)].prepare(*args, **tile, target="apple10")
    assert d.schedule_plan.backend == "simdgroup"
    assert d.schedule_plan.reasons[0].startswith(f"tensor_ops not selected: {why}")
    check(d(), ref)
    # Requiring tensor_ops is refused with the same reason.
    with pytest.raises(CompilationError) as info:
        kernel[grid(m, n)].prepare(*args, **tile, target="apple10",
                                   SCHEDULE=metile.Schedule(backend="tensor_ops"))
    assert f"cannot honour backend='tensor_ops': {why}" in str(info.value)
    assert "reads each operand tile as a Metal tensor straight from device memory" \
        in str(info.value)


# -- controls the opaque paths cannot honour (the specification's reasons) -----------------

@pytest.mark.parametrize("schedule,message", [
    (dict(backend="tensor_ops", vector_width=4),
     "cannot honour backend='tensor_ops' with vector_width=4: tensor_ops accesses are opaque and "
     "cannot satisfy an explicit vector width"),
    (dict(backend="nax", vector_width=4),
     "cannot honour backend='nax' with vector_width=4: nax accesses are opaque"),
    (dict(backend="nax", double_buffer=True),
     "cannot honour backend='nax' with double_buffer=True: nax loads device memory directly into "
     "cooperative tensors; no software double buffer can materialize"),
    (dict(backend="nax", staging="threadgroup"),
     "cannot honour backend='nax' with staging='threadgroup': nax supports only device staging"),
    (dict(backend="tensor_ops", num_stages=3),
     "cannot honour backend='tensor_ops' with num_stages=3: tensor_ops loads device memory "
     "directly into cooperative tensors; there are no operand stages"),
    (dict(backend="tensor_ops", num_simdgroups=3),
     "cannot honour num_simdgroups=3: no SIMD-group grid WM x WN = 3 divides the 64x64 tile "
     "into whole 16x16 fragments"),
])
def test_refused_controls(rng, schedule, message):
    a, b, _ = operands(rng, 64, 64, 64, "float16")
    with pytest.raises(CompilationError) as info:
        matmul[grid(64, 64)].prepare(a, b, mx.zeros((64, 64)), 64, 64, 64, **TILE,
                                     target="apple10", SCHEDULE=metile.Schedule(**schedule))
    assert message in str(info.value)


def test_auto_with_double_buffering_takes_the_controllable_path(rng):
    m, n, k = 75, 45, 37
    a, b, ref = operands(rng, m, n, k, "float32")
    d = matmul[grid(m, n)].prepare(a, b, mx.zeros((m, n)), m, n, k, **TILE, target="apple10",
                                   SCHEDULE=metile.Schedule(double_buffer=True))
    assert d.schedule_plan.backend == "simdgroup" and d.execution_report.double_buffered
    check(d(), ref)


# -- the emitted step's overload for operands in constant memory ----------------------------

# MLX binds arrays of fewer than 8 elements as `constant` memory, which no Metal tensor
# views; the CPU runtime erases address spaces and always takes the tensor overload, so
# this kernel reaches the per-element overload explicitly, through views that are not
# device pointers, and checks it against the tensor overload and NumPy.
VIEW_HEADER = HEADER + """
struct test_view {
  const device float* p;
  float operator[](int i) const { return p[i]; }
};
"""

VIEW_BODY = """
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(32, 32, 16, TL, TR, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, metal::execution_simdgroup> op;
  auto acc = op.get_destination_cooperative_tensor<metile_mpp_tensor<float>, metile_mpp_tensor<float>, float>();
  for (uint16_t i = 0; i < acc.get_capacity(); ++i) acc[i] = 0.0f;
  const int M = dims[0], N = dims[1], K = dims[2];
  for (int k = 0; k < K; k += 16) {
    // A: M x K (TL: K x M stored), B: K x N (TR: N x K stored), row-major
    const int oa = TL ? k * M : k, ob = TR ? k : k * N;
    const int ca = TL ? M : metal::min(16, K - k), ra = TL ? metal::min(16, K - k) : M;
    const int cb = TR ? metal::min(16, K - k) : N, rb = TR ? N : metal::min(16, K - k);
    if (VIEWS) {
      test_view va = {A}, vb = {B};
      metile_mpp_step<TL, TR, 16>(op, va, oa, ca, ra, TL ? M : K, vb, ob, cb, rb, TR ? K : N, acc);
    } else {
      metile_mpp_step<TL, TR, 16>(op, A, oa, ca, ra, TL ? M : K, B, ob, cb, rb, TR ? K : N, acc);
    }
  }
  for (uint16_t i = 0; i < acc.get_capacity(); ++i) {
    if (!acc.is_valid_element(i)) continue;
    const auto idx = acc.get_multidimensional_index(i);
    if (int(idx[1]) < M && int(idx[0]) < N) out0[int(idx[1]) * N + int(idx[0])] = acc[i];
  }
"""


@pytest.mark.parametrize("tl,tr", [(False, False), (True, True)])
def test_constant_memory_overload_matches_the_tensor_overload(rng, tl, tr):
    m, n, k = 27, 30, 37
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    stored_a, stored_b = (a.T.copy() if tl else a), (b.T.copy() if tr else b)
    outs = []
    for views in (True, False):
        body = VIEW_BODY.replace("TL", str(tl).lower()).replace("TR", str(tr).lower()) \
            .replace("VIEWS", str(views).lower())
        kern = metile.metal_kernel("mpp_step_views", ["A", "B", "dims"], ["out0"], body,
                                   header=VIEW_HEADER)
        with mx.stream(mx.cpu):
            (c,) = kern(inputs=[mx.array(stored_a), mx.array(stored_b),
                                mx.array([m, n, k], dtype=mx.int32)],
                        output_shapes=[(m, n)], output_dtypes=[mx.float32], grid=(32, 1, 1),
                        threadgroup=(32, 1, 1), init_value=0.0)
            outs.append(np.array(c))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for out in outs:
        np.testing.assert_allclose(out, ref, **OUTPUT_TOL["float32"])
