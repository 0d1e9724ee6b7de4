"""Softmax along the last axis of a row-major (rows, columns) matrix.

    y = exp(x - max(x)) / sum(exp(x - max(x)))         per row

One program per row, the row held in registers (BLOCK, a power of two >=
columns, spread over the program's threads): one read of x, the maximum and the
sum as float32 block reductions (SIMD-group shuffles, then one step through
threadgroup memory), one write of y.  Between the sum and the output the
program holds either the exponentials in y's dtype (HOLD) or the row, from which
it computes them again.  Columns past the row are read as -inf, so they add exp(-inf) = 0.  A row
that is -inf everywhere gives NaN, as MLX's softmax does; +inf gives NaN too.

float16/bfloat16 rows are computed in float32.  Without HOLD each output is
rounded once (MLX's `precise=True` numbers); with HOLD the exponential is rounded
to y's dtype before it is scaled, one rounding more (within 1.5 units in the last
place; MLX's `precise=False` computes in the row's own dtype).  HOLD halves the
exponentials, which bound the kernel: on the H200 at 16384x8192 float16 it ran at
81% of the SM's issue rate and 76% of HBM (139 us, s10 ncu), where rms_norm, moving
the same bytes with fewer instructions, took 129.  For float32 rows both forms
give the same numbers.  The row and column indices use the
2-D tile spelling of norms.py, which metile proves covers the whole output (no
written-mask); grid `norms.grid(rows, ROWS)`: ROWS rows a program.
"""

import metile

from metile_kernels.norms import grid, row_sum  # noqa: F401 (grid: the launch's, as norms')

# exp(v) = exp2(v * log2(e)).  exp2 is one hardware instruction on both GPUs (CUDA's expf
# is eight: a range reduction around it).  v = x - max(x) is formed first (scaling x and
# the maximum apart would round 1e4 * log2(e) and lose the difference, or overflow near
# 3e38); rounding v * log2(e) moves the result by at most |v| * 4e-8 relative: below
# float32's own rounding for |v| < 3, and 4e-6 at |v| = 100, where exp(v) < 4e-44.
LOG2E = 1.4426950408889634


@metile.inline
def row_max(v, ROWS):
    """The maximum of each row, as norms.row_sum sums it."""
    if ROWS == 1:
        top = metile.max(v)
    else:
        top = metile.max(v, axis=1)[:, None]
    return top


@metile.kernel
def softmax(X, Y, rows, columns, BLOCK: metile.constexpr, ROWS: metile.constexpr = 1,
            HOLD: metile.constexpr = False):
    row = metile.program_id(0) * ROWS + metile.arange(0, ROWS)[:, None]
    col = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (col < columns)
    offs = row * columns + col
    x = metile.load(X + offs, mask=inside, other=-float("inf")).to(metile.float32)
    m = row_max(x, ROWS)
    if HOLD:
        # the exponentials held in y's dtype (as many registers as the row in its own):
        # summed in float32 as computed, scaled once rounded
        e = metile.exp2((x - m) * LOG2E)
        y = e.to(Y.dtype).to(metile.float32) * (1.0 / row_sum(e, ROWS))
    else:
        # exp spelled at each use: recomputed from the held row (in its own dtype) instead
        # of a float32 copy held across the sum, which halved the rows in flight on the H200
        y = metile.exp2((x - m) * LOG2E) * (1.0 / row_sum(metile.exp2((x - m) * LOG2E), ROWS))
    metile.store(Y + offs, y.to(Y.dtype), mask=inside)
