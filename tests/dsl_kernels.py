"""Kernels a Triton user would write, shared by the DSL tests (imported, not collected)."""

import metile


@metile.kernel
def vector_add(X, Y, Z, n, BLOCK: metile.constexpr):
    pid = metile.program_id(0)
    offs = pid * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    x = metile.load(X + offs, mask=mask)
    y = metile.load(Y + offs, mask=mask)
    metile.store(Z + offs, x + y, mask=mask)


@metile.inline
def gelu(x):
    return 0.5 * x * (1.0 + metile.erf(x * 0.7071067811865476))


@metile.kernel
def scale_bias_act(X, B, Y, scale, n, BLOCK: metile.constexpr, ACT: metile.constexpr = "gelu"):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    x = metile.load(X + offs, mask=mask).to(metile.float32)
    b = metile.load(B + offs, mask=mask).to(metile.float32)
    z = x * scale + b
    if ACT == "gelu":
        z = gelu(z)
    elif ACT == "tanh":
        z = metile.tanh(z)
    else:
        z = metile.where(z > 0, z, 0.1 * z)
    metile.store(Y + offs, z.to(Y.dtype), mask=mask)


@metile.kernel
def softmax_rows(X, Y, stride, n_cols, BLOCK: metile.constexpr):
    row = metile.program_id(0)
    cols = metile.arange(0, BLOCK)
    mask = cols < n_cols
    x = metile.load(X + row * stride + cols, mask=mask, other=-float("inf")).to(metile.float32)
    z = x - metile.max(x, axis=0)
    num = metile.exp(z)
    y = num / metile.sum(num, axis=0)
    metile.store(Y + row * stride + cols, y.to(Y.dtype), mask=mask)


@metile.kernel
def layernorm(X, W, B, Y, stride, n_cols, eps, BLOCK: metile.constexpr):
    row = metile.program_id(0)
    cols = metile.arange(0, BLOCK)
    mask = cols < n_cols
    x = metile.load(X + row * stride + cols, mask=mask).to(metile.float32)
    n = metile.cast(n_cols, metile.float32)
    mean = metile.sum(x) / n
    xc = metile.where(mask, x - mean, 0.0)
    var = metile.sum(xc * xc) / n
    rstd = metile.rsqrt(var + eps)
    w = metile.load(W + cols, mask=mask).to(metile.float32)
    b = metile.load(B + cols, mask=mask).to(metile.float32)
    metile.store(Y + row * stride + cols, (xc * rstd * w + b).to(Y.dtype), mask=mask)


@metile.kernel
def transpose(X, Y, M, N, BM: metile.constexpr, BN: metile.constexpr):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tile = metile.load(X + rm[:, None] * N + rn[None, :], mask=mask)
    metile.store(Y + rn[None, :] * M + rm[:, None], tile, mask=mask)


@metile.kernel
def matmul(A, B, C, M, N, K, BM: metile.constexpr, BN: metile.constexpr, BK: metile.constexpr):
    rm = metile.program_id(0) * BM + metile.arange(0, BM)
    rn = metile.program_id(1) * BN + metile.arange(0, BN)
    acc = metile.zeros((BM, BN), dtype=metile.float32)
    for k in metile.tile_range(0, K, BK):
        rk = k + metile.arange(0, BK)
        a = metile.load(A + rm[:, None] * K + rk[None, :],
                        mask=(rm[:, None] < M) & (rk[None, :] < K))
        b = metile.load(B + rk[:, None] * N + rn[None, :],
                        mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = metile.dot(a, b, acc)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    metile.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype), mask=mask)


@metile.kernel
def single_dot(A, B, C, BM: metile.constexpr, BN: metile.constexpr, BK: metile.constexpr):
    """One dot outside a K loop: not a GEMM recurrence, so a general product (on the
    matrix unit where its sizes are whole fragments, passes/lower_dot_fragments.py)."""
    rm, rn, rk = metile.arange(0, BM), metile.arange(0, BN), metile.arange(0, BK)
    a = metile.load(A + rm[:, None] * BK + rk[None, :])
    b = metile.load(B + rk[:, None] * BN + rn[None, :])
    metile.store(C + rm[:, None] * BN + rn[None, :], metile.dot(a, b))


@metile.kernel(num_simdgroups=4)
def block_sum(X, Out, n, BLOCK: metile.constexpr = 128):
    """Thread level: each thread strides over its row, then a shared-memory tree."""
    partial = metile.shared(BLOCK, dtype=metile.float32)
    tid = metile.thread_id()
    row = metile.program_id(0)
    acc = 0.0
    for i in metile.tile_range(tid, n, BLOCK):
        acc += metile.load(X + row * n + i).to(metile.float32)
    metile.store(partial + tid, acc)
    metile.barrier()
    step = BLOCK // 2
    while step > 0:
        if tid < step:
            metile.store(partial + tid, metile.load(partial + tid) + metile.load(partial + tid + step))
        metile.barrier()
        step = step // 2
    if tid == 0:
        metile.store(Out + row, metile.load(partial).to(Out.dtype))


@metile.kernel(num_simdgroups=1)
def view_copy(A, Out, BLOCK: metile.constexpr = 32):
    """Thread level, as in the specification's fragment examples: scalar tensor views."""
    source = metile.tensor(A, shape=(8, 8), access="read")
    output = metile.tensor(Out, shape=(8, 8), access="write")
    for index in metile.tile_range(metile.thread_id(), 64, BLOCK):
        position = (index // 8, index % 8)
        output.store(position, source.load(position) * 2.0)


@metile.kernel
def block_view_copy(X, Y, M, N, BM: metile.constexpr, BN: metile.constexpr):
    """Block level through views with block_shape: loads/stores are masked to the shape."""
    src = metile.tensor(X, shape=(M, N), strides=(N, 1), block_shape=(BM, BN), access="read")
    # Y is (N, M) row-major: element (i, j) of the logical (M, N) view lives at j * M + i.
    dst = metile.tensor(Y, shape=(M, N), strides=(1, M), block_shape=(BM, BN), access="write")
    origin = (metile.program_id(0) * BM, metile.program_id(1) * BN)
    dst.store(origin, src.load(origin) + 1.0)


@metile.kernel
def control_flow(X, Y, n, flag, BLOCK: metile.constexpr):
    """Runtime if/else and while carrying tiles and scalars."""
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    x = metile.load(X + offs, mask=mask)
    if flag > 0:
        acc = x * 2.0
    else:
        acc = x - 1.0
    i = 0
    while i < flag:
        acc = metile.maximum(acc, 0.0) + 1.0
        i += 1
    metile.store(Y + offs, acc, mask=mask)


@metile.kernel
def unary_math(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    x = metile.load(X + offs, mask=mask)
    a = metile.abs(x)
    y = metile.exp2(x * 0.5) + metile.log(a + 1.0) + metile.sqrt(a) + metile.sigmoid(x)
    y = y + metile.minimum(x, 0.25) + metile.rsqrt(a + 1.0) + metile.exp(-a) + metile.tanh(x)
    y = y + metile.erf(x) + metile.where(x > 0.5, metile.full((BLOCK,), 2.0, x.dtype), -x)
    metile.store(Y + offs, y, mask=mask)


@metile.kernel
def block_rows(X, RowSum, ColMax, Soft, M, N, BM: metile.constexpr, BN: metile.constexpr):
    """Axis reductions of a 2-D tile and broadcasting a reduced column back over it."""
    rm = metile.arange(0, BM)
    rn = metile.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = metile.load(X + rm[:, None] * N + rn[None, :], mask=mask)
    metile.store(RowSum + rm, metile.sum(x, axis=1), mask=rm < M)
    xm = metile.where(mask, x, -float("inf"))
    metile.store(ColMax + rn, metile.max(xm, axis=0), mask=rn < N)
    z = metile.exp(xm - metile.max(xm, axis=1)[:, None])
    metile.store(Soft + rm[:, None] * N + rn[None, :], z / metile.sum(z, axis=1)[:, None],
                 mask=mask)
