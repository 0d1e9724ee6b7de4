"""Thread-block clusters of two for the warpgroup GEMM (Schedule(cluster_size=2);
passes/gemm_wgmma.py `_cluster_exchange`, `_wgmma_tma_steps`).

On this machine: the schedule's checks, what the plan, report and launch record say, the
emitted source (`__cluster_dims__`, the partner exchange, multicast copies, the empty
barriers), NVRTC compiling it for sm_90a without spills, every refusal by name, and a
launch on a grid the clusters do not tile.  On an H200: the numbers against NumPy where the
pair shares the right operand (the library's tile order), the left one (a kernel whose
axis 0 walks columns), neither (each block copies its own tiles), the dual GEMM, and
ragged edges.
"""

import mlx.core as mx
import numpy as np
import pytest

import metile
import nvrtc
from metile import Schedule
from metile.errors import CompilationError
from metile_kernels.gemm import gated_mlp, grid, linear_epilogue, matmul, tile_product
from test_gemm import check, operands
from test_gemm_wgmma import check_products

WG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)
PAIRED = Schedule(cluster_size=2)
on_gpu = pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                            reason="needs MLX's CUDA backend on a GPU")
needs_nvrtc = pytest.mark.skipif(nvrtc.TOOLKIT is None, reason="needs the nvidia-cuda-* wheels")


@pytest.fixture(autouse=True)
def tma_variant(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_WGMMA", "tma")


def prepare(m, n, k, kernel=matmul, tile=WG, schedule=PAIRED, **kw):
    z = mx.zeros
    return kernel[grid(m, n, tile["BLOCK_M"], tile["BLOCK_N"])].prepare(
        z((m, k), dtype=mx.float16), z((k, n), dtype=mx.float16), z((m, n)), m, n, k, **tile,
        SCHEDULE=schedule, backend="cuda", **kw)


@metile.kernel
def matmul_columns_first(left, right, output, rows, columns, inner,
                         BLOCK_M: metile.constexpr = 128, BLOCK_N: metile.constexpr = 256,
                         BLOCK_K: metile.constexpr = 64):
    """`matmul` with grid axis 0 over column tiles: a cluster's pair shares the left tile."""
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = metile.tensor(right, shape=(inner, columns), strides=(columns, 1),
                      block_shape=(BLOCK_K, BLOCK_N), access="read")
    c = metile.tensor(output, shape=(rows, columns), strides=(columns, 1),
                      block_shape=(BLOCK_M, BLOCK_N), access="write")
    row_origin = metile.program_id(1) * BLOCK_M
    column_origin = metile.program_id(0) * BLOCK_N
    acc = tile_product(a, b, row_origin, column_origin, 0, inner, BLOCK_M, BLOCK_N, BLOCK_K)
    c.store((row_origin, column_origin), acc.to(output.dtype))


@metile.kernel
def matmul_diagonal(left, right, output, rows, columns, inner, column_tiles,
                    BLOCK_M: metile.constexpr = 128, BLOCK_N: metile.constexpr = 256,
                    BLOCK_K: metile.constexpr = 64):
    """Axis 0 over row tiles, each program's column tile shifted by its row tile: the two
    blocks of a pair read different tiles of both operands, so neither is shared."""
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = metile.tensor(right, shape=(inner, columns), strides=(columns, 1),
                      block_shape=(BLOCK_K, BLOCK_N), access="read")
    c = metile.tensor(output, shape=(rows, columns), strides=(columns, 1),
                      block_shape=(BLOCK_M, BLOCK_N), access="write")
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = ((metile.program_id(0) + metile.program_id(1)) % column_tiles) * BLOCK_N
    acc = tile_product(a, b, row_origin, column_origin, 0, inner, BLOCK_M, BLOCK_N, BLOCK_K)
    c.store((row_origin, column_origin), acc.to(output.dtype))


@metile.kernel
def matmul_in_a_branch(left, right, output, rows, columns, inner,
                       BLOCK_M: metile.constexpr = 128, BLOCK_N: metile.constexpr = 256,
                       BLOCK_K: metile.constexpr = 64):
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = metile.tensor(right, shape=(inner, columns), strides=(columns, 1),
                      block_shape=(BLOCK_K, BLOCK_N), access="read")
    c = metile.tensor(output, shape=(rows, columns), strides=(columns, 1),
                      block_shape=(BLOCK_M, BLOCK_N), access="write")
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    if row_origin < rows:
        acc = tile_product(a, b, row_origin, column_origin, 0, inner, BLOCK_M, BLOCK_N, BLOCK_K)
        c.store((row_origin, column_origin), acc.to(output.dtype))


# -- the schedule field -------------------------------------------------------------------

def test_cluster_size_values_are_checked():
    with pytest.raises(ValueError, match="cluster_size must be None, 1 or 2, got 4"):
        Schedule(cluster_size=4)
    for bad in ("2", True, 2.0):
        with pytest.raises(TypeError, match="cluster_size must be None, 1 or 2"):
            Schedule(cluster_size=bad)
    # a field added after the recorded format: in keys and reprs only when set
    assert "cluster_size" not in Schedule().key() and "cluster_size" not in repr(Schedule())
    assert "cluster_size=2" in PAIRED.key() and "cluster_size=2" in repr(PAIRED)
    assert Schedule(cluster_size=1).key() != PAIRED.key()


# -- what the compiler produces -----------------------------------------------------------

def test_plan_report_and_launch_name_the_cluster():
    d = prepare(512, 1024, 4096)
    report = d.execution_report
    assert report.plan.cluster_size == 2 and report.plan.to_dict()["cluster_size"] == 2
    assert any("Clusters of 2 blocks" in r for r in report.plan.reasons)
    assert "cluster_multicast" in report.passes and "bulk_tensor_copies" in report.passes
    launch = d.variant.data["lowering"]["launch"]
    assert launch["cluster"] == 2
    # every box half its tile along the outer axis: A 128 -> 64 rows, B's 64 K rows -> 32
    assert launch["tensor_maps"] == [{"dtype": "float16", "box": [64, 64]},
                                     {"dtype": "float16", "box": [64, 32]}]
    assert prepare(512, 1024, 4096, schedule=None).execution_report.plan.cluster_size == 1
    assert "cluster" not in prepare(512, 1024, 4096, schedule=None).variant.data["lowering"]["launch"]


def test_source_exchanges_with_the_partner_and_multicasts():
    d = prepare(512, 1024, 4096)
    body = d.variant.data["body"]
    # one exchange of both maps' parameters (+ the proof and the trip count): 2 + 2 x 6
    assert body.count("metile_cluster_put(") == 14
    assert "metile_tma_load2d_multicast(" in body and "metile_mbar_arrive_pair(" in body
    # each stage's empty barrier: one arrival per warp (8) of each block
    assert "metile_mbar_init_count(" in body and ", 16);" in body
    tu = nvrtc.translation_unit(d)
    assert "__cluster_dims__(2, 1, 1) __launch_bounds__(256)" in tu
    plain = nvrtc.translation_unit(prepare(512, 1024, 4096, schedule=None))
    assert "__cluster_dims__" not in plain and "multicast" not in plain


@needs_nvrtc
@pytest.mark.parametrize("case", ["matmul", "linear 128x128", "gated"])
def test_compiles_for_sm90a_without_spills(case):
    if case == "matmul":
        d = prepare(512, 1024, 4096)
    else:
        m, n, k = 512, 1024, 4096
        z = mx.zeros
        x, w = z((m, k), dtype=mx.float16), z((n, k), dtype=mx.float16)
        tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
        if case == "gated":
            d = gated_mlp[grid(m, n, 128, 128)].prepare(
                x, w, w, z((m, n), dtype=mx.float16), m, n, k, **tile, SCHEDULE=PAIRED,
                backend="cuda")
        else:
            d = linear_epilogue[grid(m, n, 128, 128)].prepare(
                x, w, z((m, n), dtype=mx.float16), z((n,), dtype=mx.float16), x, m, n, k,
                **tile, TRANSPOSE_B=True, SCHEDULE=PAIRED, backend="cuda")
    assert d.variant.data["lowering"]["launch"]["cluster"] == 2
    _, log = nvrtc.cubin(nvrtc.translation_unit(d), "sm_90a", ["-Xptxas=-v"])
    assert "0 bytes spill stores" in log and "serialized" not in log, log[-2000:]


# -- refusals -------------------------------------------------------------------------------

def test_refused_where_there_are_no_clusters(monkeypatch):
    for variant, what in (("1", "cp.async"), ("ws", "warp-specialized")):
        monkeypatch.setenv("METILE_CUDA_WGMMA", variant)
        with pytest.raises(CompilationError, match="cannot honour cluster_size=2.*no thread-block clusters"):
            prepare(512, 1024, 4096)
    monkeypatch.setenv("METILE_CUDA_WGMMA", "tma")
    a = mx.zeros((256, 256))
    with pytest.raises(CompilationError, match="cannot honour cluster_size=2.*no thread-block clusters"):
        matmul[grid(256, 256, 64, 64)].prepare(a, a, mx.zeros((256, 256)), 256, 256, 256,
                                               BLOCK_M=64, BLOCK_N=64, BLOCK_K=16,
                                               SCHEDULE=PAIRED, backend="msl")


def test_refused_for_kernels_that_are_not_gemms():
    @metile.kernel
    def double(x, out, n, BLOCK: metile.constexpr = 256):
        i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        metile.store(out + i, metile.load(x + i, mask=i < n) * 2, mask=i < n)

    x = mx.zeros((1000,))
    with pytest.raises(CompilationError, match="cannot honour cluster_size=2.*not a GEMM"):
        double[(4,)](x, mx.zeros((1000,)), 1000, SCHEDULE=PAIRED)


def test_a_k_loop_some_block_might_not_reach_is_never_lowered():
    # the pair meets at cluster barriers in the K loop; the GEMM lowering takes only a
    # top-level K loop, which every block reaches, so no block waits for a partner that
    # branched around it
    with pytest.raises(CompilationError, match="the K loop is nested inside control flow"):
        prepare(512, 1024, 4096, kernel=matmul_in_a_branch, tile={
            "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64})


def test_a_grid_the_clusters_do_not_tile_is_refused():
    k = metile.cuda_kernel("paired", ["x"], ["y"], "y[0] = x[0];", arch="sm_90a", cluster=2)
    x = mx.zeros((4,))
    with pytest.raises(ValueError, match="clusters of 2 blocks along grid axis 0, so that axis "
                                         "needs a multiple of 2 blocks; this launch has 3"):
        k(inputs=[x], output_shapes=[(4,)], output_dtypes=[mx.float32], grid=(3 * 128, 1, 1),
          threadgroup=(128, 1, 1))
    with pytest.raises(ValueError, match="cluster must be an int from 1 to 8"):
        metile.cuda_kernel("paired", ["x"], ["y"], "y[0] = x[0];", cluster=2)
    with pytest.raises(ValueError, match="cluster must be an int from 1 to 8"):
        metile.cuda_kernel("paired", ["x"], ["y"], "y[0] = x[0];", arch="sm_90a", cluster=9)


# -- on the H200 ----------------------------------------------------------------------------

@on_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(512, 1000, 1000), (256, 257, 4100), (1024, 512, 64)])
def test_pairs_sharing_the_right_operand_on_the_gpu(rng, dtype, shape):
    m, n, k = shape
    a, b, ref = operands(rng, m, n, k, dtype)
    d = matmul[grid(m, n, 128, 256)].prepare(a, b, mx.zeros((m, n)), m, n, k, **WG,
                                             SCHEDULE=PAIRED)
    assert d.variant.data["lowering"]["launch"]["cluster"] == 2
    check_products(d(), a, b, ref)


@on_gpu
def test_pairs_sharing_the_left_operand_on_the_gpu(rng):
    m, n, k = 300, 1000, 700
    a, b, ref = operands(rng, m, n, k, "float16")
    out = matmul_columns_first[(4, 3)](a, b, mx.zeros((m, n)), m, n, k, SCHEDULE=PAIRED)
    check_products(out, a, b, ref)


@on_gpu
def test_pairs_sharing_nothing_copy_alone_on_the_gpu(rng):
    m, n, k = 512, 1024, 300
    a, b, ref = operands(rng, m, n, k, "float16")
    out = matmul_diagonal[(4, 4)](a, b, mx.zeros((m, n)), m, n, k, 4, SCHEDULE=PAIRED)
    check_products(out, a, b, ref)


@on_gpu
def test_weight_layout_and_dual_gemm_on_the_gpu(rng):
    m, n, k = 256, 520, 1000
    f = mx.float16
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(f)
    wg = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(f)
    wu = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(f)
    bias = mx.array(rng.standard_normal((n,)).astype(np.float32)).astype(f)
    tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
    X, G, U, B = (np.array(t.astype(mx.float32)).astype(np.float64) for t in (x, wg, wu, bias))
    out = linear_epilogue[grid(m, n, 128, 128)](x, wg, mx.zeros((m, n)), bias, x, m, n, k,
                                                **tile, TRANSPOSE_B=True, BIAS="columns",
                                                EPILOGUE="relu", SCHEDULE=PAIRED)
    check(out, np.maximum(X @ G.T + B, 0))
    out = gated_mlp[grid(m, n, 128, 128)](x, wg, wu, mx.zeros((m, n), dtype=f), m, n, k, **tile,
                                          SCHEDULE=PAIRED)
    gate = X @ G.T
    check(out, gate / (1 + np.exp(-gate)) * (X @ U.T), "float16")


@on_gpu
def test_an_odd_number_of_row_tiles_is_refused_on_the_gpu(rng):
    a, b, _ = operands(rng, 300, 256, 64, "float16")
    with pytest.raises(ValueError, match="needs a multiple of 2 blocks; this launch has 3"):
        matmul[grid(300, 256, 128, 256)](a, b, mx.zeros((300, 256)), 300, 256, 64, **WG,
                                         SCHEDULE=PAIRED)
