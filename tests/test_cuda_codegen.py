"""The CUDA emitter, read as text (runs anywhere; the kernels themselves run
in tests/test_dsl_kernels.py on the H200)."""

import mlx.core as mx

import metile
from dsl_kernels import block_sum, softmax_rows, vector_add


def test_geometry_scalars_and_masks(monkeypatch):
    monkeypatch.setenv("METILE_CUDA_SCALARS", "array")
    d = vector_add[(4,)].prepare(mx.zeros((1000,)), mx.zeros((1000,)), mx.zeros((1000,)), 1000, BLOCK=256,
                                  backend="cuda")
    src = d.source
    assert "blockIdx.x" in src and "threadIdx.x" in src
    assert "n[0]" in src  # MLX's cuda_kernel passes runtime scalars as pointers
    monkeypatch.setenv("METILE_CUDA_SCALARS", "value")
    d = vector_add[(4,)].prepare(mx.zeros((1000,)), mx.zeros((1000,)), mx.zeros((1000,)), 1000,
                                 BLOCK=256, backend="cuda")
    assert "n[0]" not in d.source and d.call_kwargs["scalars"] == [1000]
    assert "metal::" not in src and "threadgroup" not in src
    assert d.variant.backend == "cuda" and d.variant.data["passes"][-1] == "emit_cuda"


def test_block_reduction_uses_warp_shuffles_and_shared_memory():
    src = softmax_rows[(2,)].prepare(mx.zeros((2, 8)), mx.zeros((2, 8)), 8, 8, BLOCK=256,
                                       backend="cuda").source
    assert "__shfl_xor_sync" in src and "metile_warp_max(" in src and "metile_warp_sum(" in src
    assert "__shared__ float" in src and "__syncthreads();" in src
    assert "cuda::std::numeric_limits<float>::infinity()" in src


def test_half_types_and_math_in_float():
    x, y, z = (mx.zeros((8,), mx.float16) for _ in range(3))
    src = vector_add[(1,)].prepare(x, y, z, 8, BLOCK=32, backend="cuda").source
    assert "__half" in src
    src = block_sum[(1,)].prepare(mx.zeros((1, 8)), mx.zeros((1,)), 8, backend="cuda").source
    assert "__syncthreads();" in src and "while (true)" in src


def test_backend_is_part_of_the_cache_key():
    args = (mx.zeros((8,)), mx.zeros((8,)), mx.zeros((8,)), 8)
    cuda = vector_add[(1,)].prepare(*args, BLOCK=32, backend="cuda")
    msl = vector_add[(1,)].prepare(*args, BLOCK=32, backend="msl")
    assert cuda.spec.key != msl.spec.key and cuda.source != msl.source


def test_cuda_kernel_names_carry_the_content():
    # MLX caches CUDA modules by name: the name must change with source, header and
    # argument signature, and stay the same (without rehashing) for a repeated launch.
    f32, f16 = [mx.zeros((4,))], [mx.zeros((4,), mx.float16)]
    k = metile.cuda_kernel("k", ["x"], ["y"], "y[0] = x[0];")
    first = k.unique_name(f32, [mx.float32], None)
    assert first.startswith("k_") and k.unique_name(f32, [mx.float32], None) == first
    assert k.unique_name(f16, [mx.float32], None) != first
    assert k.unique_name(f32, [mx.float16], None) != first
    other = metile.cuda_kernel("k", ["x"], ["y"], "y[0] = 2 * x[0];")
    assert other.unique_name(f32, [mx.float32], None) != first
    header = metile.cuda_kernel("k", ["x"], ["y"], "y[0] = x[0];", header="// v2")
    assert header.unique_name(f32, [mx.float32], None) != first
