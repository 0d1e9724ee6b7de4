"""Row normalisations: RMS norm, layer norm and the fused residual add + RMS norm.

    y = x / sqrt(mean(x^2) + eps) * weight                       rms_norm
    y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias        layer_norm
    s = x + residual;  y = rms_norm(s)                            add_rms_norm

All operate on a row-major (rows, columns) matrix along its last axis, one
program per row: the whole row is loaded once into registers (BLOCK, a power of
two >= columns, spread over the program's threads), reduced in float32 (each
thread folds its elements, then SIMD-group shuffles and one step through
threadgroup memory), normalised from the registers and stored once.  Only the
row is held across the reductions (in its own dtype: a float16 row takes half the
registers of a float32 one); weight and bias are read after them, from cache.  So every
kernel reads x (and the residual) once and writes each output once: the memory
traffic of an elementwise op.  `rows` and `columns` are runtime scalars, so one
compiled kernel serves every row count of a given BLOCK, dtype and thread count.

The row index is spelled `program_id(0) * ROWS + arange(0, ROWS)[:, None]` and
the column index `program_id(1) * BLOCK + arange(0, BLOCK)[None, :]` (grid
`(rows, 1)`), masked by both bounds: the 2-D tile store that metile proves
covers the whole output (passes/buffer_usage.py), so the launch needs no
written-mask and no copy of the passed output array.  ROWS stays 1: the statistics
are whole-tile reductions (the shuffle tree above), right for one row only.  (Several
narrow rows a program would take them along axis 1, which the lanes holding a row of
up to 32 runs now combine in place - lower_reductions.rows_reduce; not yet written or
measured here.)

Inputs may be float32, float16 or bfloat16 (one dtype for x, residual, weight
and bias); statistics and the normalisation run in float32, with one rounding to
the output dtype.  add_rms_norm rounds the sum to the dtype first and normalises
the rounded sum, as MLX's `x + residual` followed by `mx.fast.rms_norm` does.
"""

import metile


def grid(rows: int, ROWS: int = 1) -> tuple[int, int]:
    return (metile.cdiv(rows, ROWS), 1)


def block_for(columns: int) -> int:
    """The row tile: the next power of two that holds a whole row."""
    return metile.next_power_of_2(max(int(columns), 1))


@metile.inline
def row_sum(v, ROWS):
    """The sum of each row of the (ROWS, BLOCK) tile v, broadcastable against v: one
    row a program sums the whole tile (lanes, then one step through threadgroup memory);
    several sum along axis 1 - a row held by at most 32 lanes (128 float16 columns on 16
    lanes) combines by shuffles, in registers (lower_reductions.rows_reduce)."""
    if ROWS == 1:
        total = metile.sum(v)
    else:
        total = metile.sum(v, axis=1)[:, None]
    return total


@metile.kernel
def rms_norm(X, W, Y, rows, columns, eps, BLOCK: metile.constexpr,
             HAS_WEIGHT: metile.constexpr = True, ROWS: metile.constexpr = 1):
    """Y = X * rsqrt(mean(X^2) + eps) (* W), per row.  W: `columns` elements (unread
    without HAS_WEIGHT: pass any array)."""
    row = metile.program_id(0) * ROWS + metile.arange(0, ROWS)[:, None]
    col = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (col < columns)
    offs = row * columns + col
    x = metile.load(X + offs, mask=inside, other=0.0).to(metile.float32)
    y = x * metile.rsqrt(row_sum(x * x, ROWS) / columns + eps)
    if HAS_WEIGHT:   # read after the reduction: its registers are not held across it
        y = y * metile.load(W + col, mask=col < columns, other=0.0).to(metile.float32)
    metile.store(Y + offs, y.to(Y.dtype), mask=inside)


@metile.kernel
def layer_norm(X, W, B, Y, rows, columns, eps, BLOCK: metile.constexpr,
               HAS_WEIGHT: metile.constexpr = True, HAS_BIAS: metile.constexpr = True,
               ROWS: metile.constexpr = 1):
    """Y = (X - mean) * rsqrt(var + eps) (* W) (+ B), per row (biased variance, as MLX).
    The variance is the mean of the centred squares, from the registers: no
    E[x^2] - E[x]^2 cancellation."""
    row = metile.program_id(0) * ROWS + metile.arange(0, ROWS)[:, None]
    col = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (col < columns)
    offs = row * columns + col
    x = metile.load(X + offs, mask=inside, other=0.0).to(metile.float32)
    mean = row_sum(x, ROWS) / columns
    # x - mean spelled at each use: recomputed from the held row, not a second row
    square = metile.where(inside, (x - mean) * (x - mean), 0.0)
    y = (x - mean) * metile.rsqrt(row_sum(square, ROWS) / columns + eps)
    if HAS_WEIGHT:   # read after the reductions: their registers are not held across them
        y = y * metile.load(W + col, mask=col < columns, other=0.0).to(metile.float32)
    if HAS_BIAS:
        y = y + metile.load(B + col, mask=col < columns, other=0.0).to(metile.float32)
    metile.store(Y + offs, y.to(Y.dtype), mask=inside)


@metile.kernel
def add_rms_norm(X, R, W, S, Y, rows, columns, eps, BLOCK: metile.constexpr,
                 HAS_WEIGHT: metile.constexpr = True, ROWS: metile.constexpr = 1):
    """S = X + R (rounded to S's dtype) and Y = rms_norm(S) (* W), one read of X and R."""
    row = metile.program_id(0) * ROWS + metile.arange(0, ROWS)[:, None]
    col = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (col < columns)
    offs = row * columns + col
    total = (metile.load(X + offs, mask=inside, other=0.0).to(metile.float32)
             + metile.load(R + offs, mask=inside, other=0.0).to(metile.float32)).to(S.dtype)
    metile.store(S + offs, total, mask=inside)
    s = total.to(metile.float32)
    y = s * metile.rsqrt(row_sum(s * s, ROWS) / columns + eps)
    if HAS_WEIGHT:   # read after the reduction: its registers are not held across it
        y = y * metile.load(W + col, mask=col < columns, other=0.0).to(metile.float32)
    metile.store(Y + offs, y.to(Y.dtype), mask=inside)
