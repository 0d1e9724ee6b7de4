"""Host time of an eager launch on any machine, without a GPU (the numbers behind README's
"What a launch costs on the host"):

  cpu runtime   kernel[grid](...) of a one-element kernel on the CPU runtime, its raw
                binding call (_ext.CpuLaunch) with the same arguments, metile.ops.matmul (a
                repeated call: its replay, metile/op_replay.py; backend="mlx" too), MLX's
                `x + 1` and `a @ a`, scaled_dot_product_attention's decode (auto: MLX's
                op on the CPU; backend="metile": two kernels) against MLX's op
  stand-in CUDA the same kernel[grid], metile.ops.matmul(16x16 float16,
                backend="metile") and the decode attention as on an H200, with the bindings replaced by stand-ins
                that only make the output arrays (MLX's device checks answered as on a
                GPU): what metile's Python costs per launch there

Each is the best of five loops of many launches, no evaluation.  Run it twice to compare
a change; CPU load from other work moves the numbers.

    python tools/probes/eager_host_cost.py
"""
import time

import mlx.core as mx

import metile
from metile import _ext


@metile.kernel
def plus_one(X, Y):
    metile.store(Y, metile.load(X) + 1.0)


@metile.kernel
def add_one(X, Y, n, BLOCK: metile.constexpr):
    # the usual form (masked block store): its coverage is proven, so no written-mask
    # output and no merge; plus_one's one-element store is not, and pays for both
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) + 1.0, mask=mask)


def cycling(fn, items):
    """fn of the next item at each call: a new shape every call where the items have more
    distinct shapes than a kernel's launch cache keeps (256), as an eager decoding loop
    over a growing cache meets them."""
    at = [0]

    def call():
        item = items[at[0] % len(items)]
        at[0] += 1
        return fn(item)
    return call


def _new_shapes():
    """600 vectors of 200..799 elements, 600 float16 caches of 256..855 keys (8 heads, 64)."""
    longer = [mx.ones((n,)) for n in range(200, 800)]
    caches = [mx.zeros((1, 8, n, 64), mx.float16) for n in range(256, 856)]
    mx.eval(*longer, *caches)
    return longer, caches


def _new_block(v):
    return add_one[(-(-v.shape[0] // 256),)](v, mx.zeros(v.shape, v.dtype), v.shape[0], BLOCK=256)


def per_call(fn, n=4000):
    fn()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return round(best, 2)


def cpu_runtime() -> dict:
    x, out = mx.array([1.0]), mx.zeros((1,))
    seen = {}
    real = _ext.CpuLaunch

    class Spy:   # the first launch's binding, and the arrays it is called with
        def __init__(self, *args):
            seen["bound"] = self.bound = real(*args)

        def __call__(self, arrays, stream=None):
            seen["arrays"] = arrays
            return self.bound(arrays, stream)
    _ext.CpuLaunch = Spy
    try:
        mx.eval(plus_one[(1,)](x, out), plus_one[(1,)](x, out))   # (bound by the second)
    finally:
        _ext.CpuLaunch = real
        plus_one._launches.clear()   # (its launch holds the spy)
    mx.eval(plus_one[(1,)](x, out))
    xs, ys = mx.ones((256,)), mx.zeros((256,))
    mx.eval(add_one[(1,)](xs, ys, 256, BLOCK=256))
    a = mx.zeros((16, 16))
    mx.eval(metile.ops.matmul(a, a, backend="metile"))
    q, k = _decode_operands()
    sdpa = metile.ops.scaled_dot_product_attention
    longer, caches = _new_shapes()
    return {"kernel[grid]": per_call(lambda: plus_one[(1,)](x, out)),
            "kernel[grid] masked block": per_call(lambda: add_one[(1,)](xs, ys, 256, BLOCK=256)),
            "raw binding call": per_call(lambda: seen["bound"](seen["arrays"], None)),
            "ops.matmul 16x16x16": per_call(lambda: metile.ops.matmul(a, a, backend="metile")),
            "ops.matmul backend=mlx": per_call(lambda: metile.ops.matmul(a, a, backend="mlx")),
            "mlx x + 1": per_call(lambda: x + 1),
            "mlx a @ a": per_call(lambda: a @ a),
            "ops.sdpa decode auto": per_call(lambda: sdpa(q, k, k, scale=0.125)),
            "ops.sdpa decode metile": per_call(lambda: sdpa(q, k, k, scale=0.125,
                                                            backend="metile"), 2000),
            "mlx sdpa decode": per_call(
                lambda: mx.fast.scaled_dot_product_attention(q, k, k, scale=0.125)),
            # a new shape every call (Dispatch._resized)
            "kernel[grid] new shape": per_call(cycling(_new_block, longer), 1000),
            "mlx x + 1 new shape": per_call(cycling(lambda v: v + 1, longer), 1000),
            "ops.sdpa metile new shape": per_call(cycling(
                lambda c: sdpa(q, c, c, scale=0.125, backend="metile"), caches), 600),
            "mlx sdpa new shape": per_call(cycling(
                lambda c: mx.fast.scaled_dot_product_attention(q, c, c, scale=0.125), caches),
                600)}


def _decode_operands():
    """One query of 8 heads over 256 keys, float16 (attention's decode path)."""
    q = mx.zeros((1, 8, 1, 64), mx.float16)
    k = mx.zeros((1, 8, 256, 64), mx.float16)
    mx.eval(q, k)
    return q, k


def stand_in_cuda() -> dict:
    """Answer MLX's device checks as an sm_90 GPU would; bindings only make outputs."""
    from metile.compiler import backend
    from metile.runtime import cuda_kernel, tensor_maps

    class Stream:
        class device:
            type = mx.gpu

    def outputs(shapes, dtypes):
        return [mx.zeros(tuple(s), d) for s, d in zip(shapes, dtypes)]

    class Function:
        def __init__(self, name, image, shared_memory):
            self.name = name

    mx.cuda.is_available = lambda: True
    mx.default_stream = lambda device: Stream
    backend._device_target = lambda: ("cuda", backend.target_for("cuda", "sm_90"), "Device(gpu, 0)")
    cuda_kernel.resolve_stream = lambda stream, op: Stream
    cuda_kernel._OWN_LAUNCH = True
    tensor_maps.templates = lambda maps, encoded=True: mx.zeros((128 * len(maps),), mx.uint8)
    _ext.CudaFunction = Function
    _ext.launch_cuda_function = lambda fn, inputs, shapes, dtypes, *rest: outputs(shapes, dtypes)

    class CudaLaunch:   # launch_cuda_function bound once (CudaKernel.bind), as on the H200
        def __init__(self, fn, kept, shapes, dtypes, *rest):
            self.shapes, self.dtypes = shapes, dtypes

        def __call__(self, arrays, stream=None):
            return outputs(self.shapes, self.dtypes)
    _ext.CudaLaunch = CudaLaunch
    # MLX's cuda_kernel bound once: the shapes and dtypes are its 8th and 9th arguments
    _ext.CudaSourceLaunch = lambda *a: CudaLaunch(None, None, a[7], a[8])
    _ext.launch_precompiled_cuda = lambda name, cubin, inputs, shapes, dtypes, *rest: outputs(shapes, dtypes)
    _ext.launch_cuda = lambda *a: outputs(a[8], a[9])
    plus_one._launches.clear()   # resolved for the CPU runtime above (the device is still the CPU)
    add_one._launches.clear()
    from metile_kernels import attention   # (its launches of the new shapes above, too)
    for k in (attention.attention_decode, attention.attention_combine_splits):
        k._launches.clear()
    x, out = mx.array([1.0]), mx.zeros((1,))
    xs, ys = mx.ones((256,)), mx.zeros((256,))
    a = mx.zeros((16, 16), mx.float16)
    mx.eval(a)
    q, k = _decode_operands()
    longer, caches = _new_shapes()
    token, weight, bias = (mx.zeros(s, mx.float16) for s in ((1, 4096), (4096, 4096), (4096,)))
    mx.eval(token, weight, bias)
    return {"kernel[grid]": per_call(lambda: plus_one[(1,)](x, out)),
            "kernel[grid] masked block": per_call(lambda: add_one[(1,)](xs, ys, 256, BLOCK=256)),
            "ops.matmul 16x16x16": per_call(lambda: metile.ops.matmul(a, a, backend="metile"), 2000),
            "ops.sdpa decode metile": per_call(lambda: metile.ops.scaled_dot_product_attention(
                q, k, k, scale=0.125, backend="metile"), 2000),
            "ops.linear decode split-K": _split_linear(token, weight, bias),
            "kernel[grid] new shape": per_call(cycling(_new_block, longer), 1000),
            "ops.sdpa metile new shape": per_call(cycling(
                lambda c: metile.ops.scaled_dot_product_attention(
                    q, c, c, scale=0.125, backend="metile"), caches), 600)}


def _split_linear(token, weight, bias) -> float:
    """One token through a 4096x4096 Linear with a bias, as the H200 runs it: the small
    CUDA tile, K split in `split_k_count` parts (a product, then the merge with the bias)."""
    from metile import ops
    real = ops._block
    splits = ops.split_k_count(1, 4096, 4096, ops.CUDA_SMALL_BLOCK)
    ops._block = lambda *a, **kw: {**real(*a, **kw), "SPLIT_K": splits}
    try:
        return per_call(lambda: metile.ops.linear(token, weight, bias, backend="metile"), 2000)
    finally:
        ops._block = real


def main():
    rows = {"cpu runtime": cpu_runtime()}
    rows["stand-in CUDA (needs NVRTC)"] = stand_in_cuda()
    for part, values in rows.items():
        print(part)
        for k, v in values.items():
            print(f"  {k:24s} {v:8.2f} us")


if __name__ == "__main__":
    main()
