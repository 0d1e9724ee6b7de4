"""Every CUDA kernel MLX compiles for metile carries `__launch_bounds__(threads)`.

Without them ptxas may give a thread up to 255 registers; the H200 attention
benchmark (1x32x4096x128 float16, causal; then the 64x64 tile, 1024 threads)
needed 127 registers x 1024 threads = 130048 > 65536 and MLX's graph refused the
launch ("too many resources requested for launch").  Here (NVRTC, no GPU) the
kernels are compiled as MLX's `cuda_kernel` builds them (tests/nvrtc.py,
mlx_translation_unit) and ptxas's register count is checked against the
register file.  MLX compiles a kernel only when its scalars travel as 0-d arrays
(METILE_CUDA_SCALARS=array, the fallback where metile finds no NVRTC), so the tests set
that; by value metile compiles it with the same bounds (cuda_source.translation_unit).
On an H200 the benchmark's kernel runs against MLX's op.
"""

import re

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile import attention_ops
from metile.runtime import cuda_source
from metile_kernels import attention as kernels
from nvrtc import TOOLKIT, compile_named, mlx_translation_unit

# 64K 32-bit registers per block on every architecture since sm_50.
REGISTER_FILE = 65536

needs_nvrtc = pytest.mark.skipif(TOOLKIT is None, reason="needs NVRTC (nvidia-cuda-nvrtc wheel)")
on_gpu = pytest.mark.skipif(not (mx.cuda.is_available() and mx.default_device().type == mx.gpu),
                            reason="runs on MLX's CUDA backend")


@pytest.fixture(autouse=True)
def scalars_as_arrays(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "array")


def registers(dispatch) -> tuple[int, int]:
    """(ptxas registers per thread, threads per block) of the kernel as MLX compiles
    it, for sm_90 (sm_90a for a kernel whose launch names it: warpgroup MMA)."""
    name_expression, source = mlx_translation_unit(dispatch)
    arch = (dispatch.variant.data["lowering"].get("launch") or {}).get("arch") or "sm_90"
    lowered, log = compile_named(source, arch, name_expression, ["--ptxas-options=-v"])
    assert lowered.startswith("_ZN3mlx4core2cu"), lowered
    used = re.findall(r"Used (\d+) registers", log)
    assert len(used) == 1, log
    return int(used[0]), dispatch.call_kwargs["threadgroup"][0]


def forward(d, dtype, tile, length=4096, heads=32, mask="causal"):
    """attention_forward as the op launches it on CUDA (its warps: attention_ops)."""
    dt = getattr(mx, dtype)
    q = mx.zeros((1, heads, length, d), dt)
    m, n = tile
    warps = attention_ops.forward_warps(m, dt.size)
    return kernels.attention_forward[kernels.forward_grid(length, heads, 1, m)].prepare(
        q, q, q, mx.zeros((1,), mx.float32), mx.zeros(q.shape, dt), length, length, 1, 0.125,
        0, 0, 0, 0, 0, 0, HEAD_DIM=d, BLOCK_D=attention_ops._head_block(d), MASK=mask,
        BLOCK_M=m, BLOCK_N=n, backend="cuda", **({"num_warps": warps} if warps else {}))


def h200_tile(d, dtype, monkeypatch, decode=False):
    """The tile attention_ops picks first on a CUDA device (96 KiB of shared memory)."""
    monkeypatch.setattr(attention_ops, "_on_cuda", lambda: True)
    cfg = attention_ops.tiles(d, getattr(mx, dtype).size, decode)[0]
    return cfg["BLOCK_M"], cfg["BLOCK_N"]


@needs_nvrtc
def test_benchmark_attention_kernel_fits_the_register_file(monkeypatch):
    # (the accumulator layout's 128x64 block on 8 warps, two blocks an SM asked for)
    tile = h200_tile(128, "float16", monkeypatch)
    assert tile == (128, 64)
    regs, threads = registers(forward(128, "float16", tile))
    assert threads == 256
    assert 2 * regs * threads <= REGISTER_FILE, (regs, threads)


@needs_nvrtc
@pytest.mark.parametrize("d,dtype", [(64, "bfloat16"), (80, "float16"), (96, "bfloat16"),
                                     (128, "bfloat16"), (128, "float32")])
def test_attention_forward_fits_for_each_head_dim(monkeypatch, d, dtype):
    # 80, 96 and 128 in 16-bit dtypes needed 122-128 registers at 1024 threads
    regs, threads = registers(forward(d, dtype, h200_tile(d, dtype, monkeypatch)))
    assert regs * threads <= REGISTER_FILE, (d, dtype, regs, threads)


@needs_nvrtc
def test_decode_kernels_fit(monkeypatch):
    d, dt = 128, mx.float16
    m, n = h200_tile(d, "float16", monkeypatch, decode=True)
    q, k = mx.zeros((1, 32, 1, d), dt), mx.zeros((1, 8, 4096, d), dt)
    splits = 16
    split = kernels.attention_split[kernels.split_grid(splits, 8, 1)].prepare(
        q, k, k, mx.zeros((1,), mx.float32), mx.zeros((splits, 32, d), mx.float32),
        mx.zeros((splits, 32, 2), mx.float32), 1, 4096, 4, 256, 0.125, 0, 0, 0, 0, 0, 0,
        HEAD_DIM=d, BLOCK_D=d, MASK="none", BLOCK_M=m, BLOCK_N=n, backend="cuda")
    combine = kernels.attention_combine[(4,)].prepare(
        mx.zeros((splits, 32, d), mx.float32), mx.zeros((splits, 32, 2), mx.float32),
        mx.zeros((32, d), dt), 32, splits, HEAD_DIM=d, BLOCK_D=d, BLOCK_R=8, backend="cuda")
    for dispatch in (split, combine):
        regs, threads = registers(dispatch)
        assert regs * threads <= REGISTER_FILE, (dispatch.variant.data["name"], regs, threads)


@needs_nvrtc
def test_bounds_follow_the_launch_block():
    # A body whose 200 live floats want ~240 registers: ptxas fits it to the block
    # the header names (spilling at 1024 threads), and the lowered symbol is the one
    # MLX looks up.
    body = """
      float acc[200];
      for (int i = 0; i < 200; ++i) acc[i] = x[threadIdx.x * 200 + i];
      #pragma unroll
      for (int r = 0; r < 50; ++r)
      #pragma unroll
      for (int i = 0; i < 200; ++i) acc[i] = acc[i] * acc[(i * 7 + r) % 200] + 1.0f;
      for (int i = 0; i < 200; ++i) out[threadIdx.x * 200 + i] = acc[i];
    """
    kernel = metile.cuda_kernel("heavy", ["x"], ["out"], body)

    def used(header, symbol):
        source = (cuda_source.PRELUDE + header + "namespace mlx::core::cu {\n__global__ void "
                  + symbol + "(\n    const float* x,\n    float* out) {\n" + body + "\n}\n}\n")
        lowered, log = compile_named(source, "sm_90", f"mlx::core::cu::{symbol}",
                                     ["--ptxas-options=-v"])
        assert symbol in lowered
        return int(re.search(r"Used (\d+) registers", log).group(1))

    assert used("", "custom_kernel_heavy") * 1024 > REGISTER_FILE   # MLX's source as is
    for threads in (1024, 512, 256):
        name, header = kernel.mlx_source([mx.float32], [mx.float32], [], (threads, 1, 1))
        assert used(header, f"custom_kernel_{name}") * threads <= REGISTER_FILE, threads


def test_block_size_is_part_of_the_kernel_name():
    kernel = metile.cuda_kernel("k", ["x"], ["out"], "out[0] = x[0];")
    a = kernel.mlx_source([mx.float32], [mx.float32], [], (256, 1, 1))
    b = kernel.mlx_source([mx.float32], [mx.float32], [], (128, 2, 1))
    c = kernel.mlx_source([mx.float32], [mx.float32], [], (1024, 1, 1))
    assert a[0] == b[0] and a[1] == b[1]        # 256 threads either way
    assert a[0] != c[0]
    assert a[1].endswith(f"#define custom_kernel_{a[0]}(...) __launch_bounds__(256) "
                         f"custom_kernel_{a[0]}(__VA_ARGS__)\n")
    assert "__launch_bounds__(1024)" in c[1]


def test_launch_hands_mlx_the_bounded_header(monkeypatch, stand_in_gpu):
    # No GPU here: stand in for the device check and record what the binding gets.
    from metile import _ext
    seen = []
    monkeypatch.setattr(_ext, "launch_cuda", lambda *args: seen.append(args))
    kernel = metile.cuda_kernel("tmpl", ["x"], ["out"], "out[threadIdx.x] = x[threadIdx.x] * N;",
                                header="// user header\n")
    for block in ((128, 1, 1), (32, 2, 1)):
        kernel(inputs=[mx.zeros(128)], output_shapes=[(128,)], output_dtypes=[mx.float32],
               grid=(128, 1, 1), threadgroup=block, template=[("N", 3), ("T", mx.float16)])
    (name, *_, header), (other, *_, other_header) = ((a[0], a[4]) for a in seen)
    symbol = f"custom_kernel_{name}_3_float16_t"
    assert header == (f"// user header\n\n#define {symbol}(...) __launch_bounds__(128) "
                      f"{symbol}(__VA_ARGS__)\n")
    assert name != other and "__launch_bounds__(64)" in other_header


def test_symbol_spells_template_arguments_as_mlx():
    # mlx/backend/cuda/custom_kernel.cpp: "custom_kernel_" + name, then "_<int>",
    # "_t"/"_f", "_" + get_type_string(dtype) per template argument
    template = [("T", mx.float16), ("N", 4), ("B", True), ("U", mx.bfloat16), ("F", False),
                ("V", mx.float32), ("M", -3)]
    assert cuda_source.mlx_kernel_symbol("k_abc", template) == \
        "custom_kernel_k_abc_float16_t_4_t_bfloat16_t_f_float_-3"
    assert cuda_source.mlx_kernel_symbol("k_abc") == "custom_kernel_k_abc"
    with pytest.raises(TypeError, match="template argument 'S' is 1.5; MLX takes an int"):
        cuda_source.mlx_kernel_symbol("k", [("S", 1.5)])


@on_gpu
def test_benchmark_attention_case_runs_on_the_gpu():
    # The benchmark's tile and block (they depend on D and the dtype, not on the head
    # count): MLX refused this launch before the bounds.  4 heads keep NumPy quick.
    b, h, n, d = 1, 4, 4096, 128
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float16) for _ in range(3))
    scale = d ** -0.5
    ours = metile.ops.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v),
                                                   scale=scale, mask="causal", backend="metile")
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float32), k.astype(np.float32)) * scale
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    expected = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v.astype(np.float32))
    np.testing.assert_allclose(np.array(ours.astype(mx.float32)), expected, rtol=1e-2, atol=5e-3)
