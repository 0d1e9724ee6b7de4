"""GEMM kernels written in metile's tensor-view form.

    output[rows, columns] = epilogue(left[rows, inner] @ right[inner, columns])

All matrices are row-major, except that with TRANSPOSE_B=True `right` is the
(columns, inner) row-major matrix whose transpose is multiplied: an
`mlx.nn.Linear` weight as stored, read through strides (1, inner) so no
transposed copy is made.  The launch grid covers the output tiles:
`grid(rows, columns, BLOCK_M, BLOCK_N)`.  `rows`, `columns` and `inner` are
runtime scalars (any sizes, ragged edges masked), so one compiled kernel serves
every shape of a given dtype and tile.  Operands may be float32, float16 or
bfloat16 (both the same dtype); accumulation is float32 and the epilogue runs in
float32 until the single conversion to the output's dtype.

`gated_mlp` is the dual GEMM of a gated MLP, act(x @ w_gate.T) * (x @ w_up.T).

`batched_matmul_epilogue` adds a batch axis (program_id(2)) with a stride per
operand, 0 for a batch-broadcast operand.

The compiler recognises the `dot` recurrence over K tiles and lowers it to
matrix fragments (see `metile.passes.gemm` / `lower_matmul`); the epilogue of
`matmul_epilogue` is fused into the store.  A user's own kernel written the
same way gets the same lowering.
"""

import metile

EPILOGUES = ("none", "affine", "affine_leaky", "relu", "gelu_tanh", "sigmoid_gated")


def grid(rows: int, columns: int, BLOCK_M: int = 64, BLOCK_N: int = 64) -> tuple[int, int]:
    return (metile.cdiv(rows, BLOCK_M), metile.cdiv(columns, BLOCK_N))


@metile.inline
def right_operand(right, inner, columns, BLOCK_K, BLOCK_N, TRANSPOSE_B):
    """The (inner, columns) right operand: row-major, or with TRANSPOSE_B the transpose
    of a row-major (columns, inner) buffer.  The transposed tile is contiguous along K,
    not N, so CUDA's 16-byte asynchronous copies do not take it (gemm_async falls back
    to ordinary staged loads)."""
    if TRANSPOSE_B:
        view = metile.tensor(right, shape=(inner, columns), strides=(1, inner),
                             block_shape=(BLOCK_K, BLOCK_N), access="read")
    else:
        view = metile.tensor(right, shape=(inner, columns), strides=(columns, 1),
                             block_shape=(BLOCK_K, BLOCK_N), access="read")
    return view


@metile.inline
def output_tile(output, rows, columns, BLOCK_M, BLOCK_N):
    """The row-major (rows, columns) output `output` points at, written in
    (BLOCK_M, BLOCK_N) tiles."""
    return metile.tensor(output, shape=(rows, columns), strides=(columns, 1),
                         block_shape=(BLOCK_M, BLOCK_N), access="write")


@metile.inline
def tile_product(a, b, row_origin, column_origin, k_begin, k_end, BLOCK_M, BLOCK_N, BLOCK_K):
    """The float32 BLOCK_M x BLOCK_N product of views `a` and `b` at the output tile
    (row_origin, column_origin), over K from k_begin to k_end: the dot recurrence the
    GEMM lowering recognises (staged operands, matrix units, fused epilogue)."""
    accumulator = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in metile.tile_range(k_begin, k_end, BLOCK_K):
        accumulator = metile.dot(a.load((row_origin, k)), b.load((k, column_origin)), accumulator)
    return accumulator


@metile.kernel
def matmul(left, right, output, rows, columns, inner,
           BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
           BLOCK_K: metile.constexpr = 16, RELAXED_PRECISION: metile.constexpr = False,
           TRANSPOSE_B: metile.constexpr = False):
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = right_operand(right, inner, columns, BLOCK_K, BLOCK_N, TRANSPOSE_B)
    c = output_tile(output, rows, columns, BLOCK_M, BLOCK_N)
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    accumulator = tile_product(a, b, row_origin, column_origin, 0, inner, BLOCK_M, BLOCK_N,
                               BLOCK_K)
    c.store((row_origin, column_origin), accumulator.to(output.dtype))


@metile.inline
def gelu_tanh(x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + metile.tanh(inner))


@metile.inline
def activation(x, EPILOGUE, NEGATIVE_SLOPE):
    """matmul_epilogue's pointwise epilogues that take no alpha/beta."""
    result = x
    if EPILOGUE == "affine_leaky":
        result = metile.where(x > 0, x, x * NEGATIVE_SLOPE)
    elif EPILOGUE == "relu":
        # NaN stays NaN, as in MLX's relu (mx.maximum); metile.maximum, Triton's, returns
        # the number where one operand is NaN
        result = metile.where(x < 0, 0.0, x)
    elif EPILOGUE == "gelu_tanh":
        result = gelu_tanh(x)
    elif EPILOGUE == "sigmoid_gated":
        result = x * metile.sigmoid(x)
    return result


@metile.kernel
def matmul_epilogue(left, right, output, rows, columns, inner, alpha, beta,
                    BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
                    BLOCK_K: metile.constexpr = 16, RELAXED_PRECISION: metile.constexpr = False,
                    EPILOGUE: metile.constexpr = "affine_leaky",
                    NEGATIVE_SLOPE: metile.constexpr = 0.1, TRANSPOSE_B: metile.constexpr = False):
    """`matmul` with a fused pointwise epilogue chosen by EPILOGUE (see EPILOGUES).
    alpha and beta are runtime float32 scalars; epilogues that do not use them ignore them."""
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = right_operand(right, inner, columns, BLOCK_K, BLOCK_N, TRANSPOSE_B)
    c = output_tile(output, rows, columns, BLOCK_M, BLOCK_N)
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    accumulator = tile_product(a, b, row_origin, column_origin, 0, inner, BLOCK_M, BLOCK_N,
                               BLOCK_K)
    result = accumulator
    if EPILOGUE == "affine" or EPILOGUE == "affine_leaky":
        result = accumulator * alpha + beta
    if EPILOGUE != "affine":
        result = activation(result, EPILOGUE, NEGATIVE_SLOPE)
    c.store((row_origin, column_origin), result.to(output.dtype))


@metile.kernel
def linear_epilogue(left, right, output, bias, residual, rows, columns, inner,
                    BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
                    BLOCK_K: metile.constexpr = 16, RELAXED_PRECISION: metile.constexpr = False,
                    BIAS: metile.constexpr = "columns", RESIDUAL: metile.constexpr = False,
                    EPILOGUE: metile.constexpr = "none", NEGATIVE_SLOPE: metile.constexpr = 0.1,
                    TRANSPOSE_B: metile.constexpr = False):
    """activation(left @ right + bias) (+ residual), all in one kernel: the bias and the
    residual are read inside the fused epilogue (passes/gemm_epilogue_reads.py).

    BIAS: "columns" (bias has `columns` elements, one per output column: a Linear's bias),
    "rows" (`rows` elements, one per output row) or "none".  RESIDUAL: add `residual`
    (rows x columns, row-major) after the activation.  EPILOGUE: as matmul_epilogue's,
    with alpha = 1 and beta = 0.  Unused buffers are not read (pass any array)."""
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = right_operand(right, inner, columns, BLOCK_K, BLOCK_N, TRANSPOSE_B)
    c = output_tile(output, rows, columns, BLOCK_M, BLOCK_N)
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    accumulator = tile_product(a, b, row_origin, column_origin, 0, inner, BLOCK_M, BLOCK_N,
                               BLOCK_K)
    result = accumulator
    if BIAS == "columns":
        per_column = metile.tensor(bias, shape=(columns,), strides=(1,), block_shape=(BLOCK_N,),
                                   access="read")
        result = result + per_column.load((column_origin,)).to(metile.float32)[None, :]
    elif BIAS == "rows":
        per_row = metile.tensor(bias, shape=(rows,), strides=(1,), block_shape=(BLOCK_M,),
                                access="read")
        result = result + per_row.load((row_origin,)).to(metile.float32)[:, None]
    result = activation(result, EPILOGUE, NEGATIVE_SLOPE)
    if RESIDUAL:
        r = metile.tensor(residual, shape=(rows, columns), strides=(columns, 1),
                          block_shape=(BLOCK_M, BLOCK_N), access="read")
        result = result + r.load((row_origin, column_origin)).to(metile.float32)
    c.store((row_origin, column_origin), result.to(output.dtype))


GATED_ACTIVATIONS = ("silu", "gelu_tanh", "relu")


@metile.kernel
def gated_mlp(x, w_gate, w_up, output, rows, columns, inner, gate_out=None, up_out=None,
              BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
              BLOCK_K: metile.constexpr = 16, RELAXED_PRECISION: metile.constexpr = False,
              ACTIVATION: metile.constexpr = "silu", TRANSPOSE_B: metile.constexpr = True):
    """activation(x @ w_gate.T) * (x @ w_up.T): a gated MLP's gate and up projections as
    one dual GEMM (passes/gemm.py): each K step stages the x tile once and multiplies it
    by both weight tiles into two float32 accumulators; the gate, the product and the
    conversion are one fused epilogue.  `w_gate` and `w_up` are (columns, inner) as a
    Linear stores them (TRANSPOSE_B, the default; False takes (inner, columns) row-major
    weights).  ACTIVATION: "silu" (x * sigmoid(x)), "gelu_tanh" or "relu".  `gate_out` and
    `up_out` ((rows, columns) each, optional): the two products as well, in their dtype -
    what a backward pass needs - from the same epilogue."""
    a = metile.tensor(x, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    gate = right_operand(w_gate, inner, columns, BLOCK_K, BLOCK_N, TRANSPOSE_B)
    up = right_operand(w_up, inner, columns, BLOCK_K, BLOCK_N, TRANSPOSE_B)
    c = output_tile(output, rows, columns, BLOCK_M, BLOCK_N)
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    gate_acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    up_acc = metile.zeros((BLOCK_M, BLOCK_N), dtype=metile.float32)
    for k in metile.tile_range(0, inner, BLOCK_K):
        x_tile = a.load((row_origin, k))
        gate_acc = metile.dot(x_tile, gate.load((k, column_origin)), gate_acc)
        up_acc = metile.dot(x_tile, up.load((k, column_origin)), up_acc)
    if ACTIVATION == "silu":
        gated = gate_acc * metile.sigmoid(gate_acc)
    elif ACTIVATION == "gelu_tanh":
        gated = gelu_tanh(gate_acc)
    else:
        gated = metile.where(gate_acc < 0, 0.0, gate_acc)     # relu, NaN kept (activation)
    c.store((row_origin, column_origin), (gated * up_acc).to(output.dtype))
    if gate_out is not None:
        output_tile(gate_out, rows, columns, BLOCK_M, BLOCK_N).store(
            (row_origin, column_origin), gate_acc.to(gate_out.dtype))
    if up_out is not None:
        output_tile(up_out, rows, columns, BLOCK_M, BLOCK_N).store(
            (row_origin, column_origin), up_acc.to(up_out.dtype))


def batched_grid(batch: int, rows: int, columns: int, BLOCK_M: int = 64,
                 BLOCK_N: int = 64) -> tuple[int, int, int]:
    return (metile.cdiv(rows, BLOCK_M), metile.cdiv(columns, BLOCK_N), batch)


@metile.kernel
def batched_matmul_epilogue(left, right, output, rows, columns, inner, left_batch_stride,
                            right_batch_stride,
                            BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
                            BLOCK_K: metile.constexpr = 16,
                            RELAXED_PRECISION: metile.constexpr = False,
                            EPILOGUE: metile.constexpr = "none",
                            NEGATIVE_SLOPE: metile.constexpr = 0.1,
                            TRANSPOSE_B: metile.constexpr = False):
    """output[i] = epilogue(left[i] @ right[i]) for each batch index i = program_id(2):
    `left` holds (rows, inner) matrices `left_batch_stride` elements apart, `right`
    (inner, columns) ones (with TRANSPOSE_B, (columns, inner)) `right_batch_stride`
    apart, `output` (rows, columns) ones back to back.  A stride of 0 gives every batch
    index the same matrix (a broadcast batch).  EPILOGUE: "none", "relu",
    "affine_leaky" (alpha 1, beta 0), "gelu_tanh" or "sigmoid_gated".
    Grid: `batched_grid(batch, rows, columns, BLOCK_M, BLOCK_N)`."""
    batch = metile.program_id(2)
    a = metile.tensor(left + batch * left_batch_stride, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = right_operand(right + batch * right_batch_stride, inner, columns, BLOCK_K, BLOCK_N,
                      TRANSPOSE_B)
    c = output_tile(output + batch * rows * columns, rows, columns, BLOCK_M, BLOCK_N)
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    accumulator = tile_product(a, b, row_origin, column_origin, 0, inner, BLOCK_M, BLOCK_N,
                               BLOCK_K)
    result = activation(accumulator, EPILOGUE, NEGATIVE_SLOPE)
    c.store((row_origin, column_origin), result.to(output.dtype))


def split_k_grid(splits: int, rows: int, columns: int, BLOCK_M: int = 64,
                 BLOCK_N: int = 64) -> tuple[int, int, int]:
    return (metile.cdiv(rows, BLOCK_M), metile.cdiv(columns, BLOCK_N), splits)


def split_k_chunk(inner: int, splits: int, BLOCK_K: int) -> int:
    """The K extent each split multiplies: a whole number of K tiles, so no tile of one
    split reads into the next."""
    return metile.cdiv(metile.cdiv(inner, splits), BLOCK_K) * BLOCK_K


@metile.kernel
def matmul_split_k(left, right, partial, rows, columns, inner, chunk,
                   BLOCK_M: metile.constexpr = 64, BLOCK_N: metile.constexpr = 64,
                   BLOCK_K: metile.constexpr = 16, RELAXED_PRECISION: metile.constexpr = False,
                   TRANSPOSE_B: metile.constexpr = False):
    """partial[s] = left[:, s*chunk : (s+1)*chunk] @ right[s*chunk : (s+1)*chunk, :] in
    float32 for the split s = program_id(2) (`chunk` a multiple of BLOCK_K; the last
    split stops at `inner`).  The K loop of a skinny product (few output tiles, long K)
    spread over more programs; `split_k_epilogue` adds the partial products up.
    Grid: `split_k_grid(splits, rows, columns, BLOCK_M, BLOCK_N)`."""
    split = metile.program_id(2)
    a = metile.tensor(left, shape=(rows, inner), strides=(inner, 1),
                      block_shape=(BLOCK_M, BLOCK_K), access="read")
    b = right_operand(right, inner, columns, BLOCK_K, BLOCK_N, TRANSPOSE_B)
    c = output_tile(partial + split * rows * columns, rows, columns, BLOCK_M, BLOCK_N)
    row_origin = metile.program_id(0) * BLOCK_M
    column_origin = metile.program_id(1) * BLOCK_N
    k_begin = split * metile.maximum(chunk, 0)   # (>= 0 provably: its views need no lower-bound mask)
    k_end = metile.minimum(k_begin + chunk, inner)
    accumulator = tile_product(a, b, row_origin, column_origin, k_begin, k_end, BLOCK_M, BLOCK_N,
                               BLOCK_K)
    c.store((row_origin, column_origin), accumulator)


def split_k_epilogue_grid(rows: int, columns: int, BLOCK: int) -> tuple[int, int]:
    return (rows, metile.cdiv(columns, BLOCK))


@metile.kernel
def split_k_epilogue(partial, output, bias, residual, rows, columns, splits,
                     BLOCK: metile.constexpr = 1024, BIAS: metile.constexpr = "none",
                     RESIDUAL: metile.constexpr = False, EPILOGUE: metile.constexpr = "none",
                     NEGATIVE_SLOPE: metile.constexpr = 0.1):
    """output = activation(sum over splits of partial + bias) (+ residual): the epilogue of
    a split-K product, the same as linear_epilogue's (BIAS "columns", "rows" or "none").
    Program (r, j) (grid `split_k_epilogue_grid`) writes columns [j * BLOCK, (j + 1) *
    BLOCK) of row r through the (row, columns) store form the launch proves covers
    `output`.  (A flat index over rows * columns, the form before, was not proven: each
    launch zero-filled the output, wrote a mask of the elements stored and merged the two
    - 38 us of fills and selects beside an 11 us epilogue at 512x2560 on the H200, s96.)"""
    r = metile.program_id(0)
    c = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)
    inside = c < columns
    n = rows * columns
    at = r * columns + c
    total = metile.zeros((BLOCK,), dtype=metile.float32)
    for s in range(0, splits):
        total = total + metile.load(partial + s * n + at, mask=inside, other=0.0)
    if BIAS == "columns":
        total = total + metile.load(bias + c, mask=inside, other=0.0).to(metile.float32)
    elif BIAS == "rows":
        total = total + metile.load(bias + r + c * 0, mask=inside, other=0.0).to(metile.float32)
    result = activation(total, EPILOGUE, NEGATIVE_SLOPE)
    if RESIDUAL:
        result = result + metile.load(residual + at, mask=inside, other=0.0).to(metile.float32)
    one = metile.arange(0, 1)
    metile.store(output + (r + one)[:, None] * columns + c[None, :],
                 result[None, :].to(output.dtype),
                 mask=((r + one)[:, None] < rows) & (c[None, :] < columns))
