"""Rotary position embedding, as `mx.fast.rope`.

The input is (B, *, T, D) row-major, seen as rows = B * prod(*) * T rows of D
features.  Row r is position t = r % T of batch entry r // per_batch (per_batch
= prod(*) * T).  Its first DIMS features rotate in pairs by the angle

    (offset + t) * scale * inv_freq[i],   inv_freq[i] = base ** (-2 i / DIMS)  (or 1 / freqs[i])

pair i being features (i, i + DIMS / 2) (TRADITIONAL=False: the two halves) or
(2 i, 2 i + 1) (TRADITIONAL=True: neighbours):

    first'  = first * cos - second * sin
    second' = first * sin + second * cos

and features past DIMS are copied.  Each output element reads its own feature
and its pair partner (a second, equally coalesced load of the same row), so the
kernel is elementwise: a tile of ROWS rows x BLOCK features per program, no
reductions, one read and one write of every element.  The angle and the rotation
run in float32, rounded once to the output dtype.

OFFSET says where the offset comes from: "scalar" (the runtime int `offset`, so
decoding steps reuse one compiled kernel), "array" (a one-element int32 array)
or "per_batch" (an int32 array of B offsets).  With FREQS, `Freqs` holds the
DIMS / 2 frequencies and `log2_base` is unused; otherwise `Freqs` is unread.
Grid: `grid(rows, ROWS)`; the 2-D tile store is proven to cover the output.
"""

import metile


def grid(rows: int, ROWS: int) -> tuple[int, int]:
    return (metile.cdiv(rows, ROWS), 1)


@metile.kernel
def rope(X, Offset, Freqs, Y, rows, seq, per_batch, columns, offset, scale, log2_base,
         DIMS: metile.constexpr, BLOCK: metile.constexpr, ROWS: metile.constexpr = 1,
         TRADITIONAL: metile.constexpr = False, OFFSET: metile.constexpr = "scalar",
         FREQS: metile.constexpr = False):
    row = metile.program_id(0) * ROWS + metile.arange(0, ROWS)[:, None]
    col = metile.program_id(1) * BLOCK + metile.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (col < columns)
    offs = row * columns + col
    rotated = col < DIMS
    if TRADITIONAL:
        first = (col % 2) == 0
        pair = col // 2
        partner = col ^ 1
    else:
        first = col < DIMS // 2
        pair = metile.where(first, col, col - DIMS // 2)
        partner = metile.where(first, col + DIMS // 2, col - DIMS // 2)
    x = metile.load(X + offs, mask=inside, other=0.0).to(metile.float32)
    other = metile.load(X + row * columns + partner, mask=inside & rotated,
                        other=0.0).to(metile.float32)
    if OFFSET == "scalar":
        start = offset
    elif OFFSET == "array":
        start = metile.load(Offset)
    else:
        start = metile.load(Offset + row // per_batch, mask=row < rows, other=0)
    # in 64 bits: an int32 offset array's last positions may pass int32 (its values are
    # not known to the launch, which range-checks an int offset)
    position = ((row % seq).to(metile.int64) + start.to(metile.int64)).to(metile.float32) * scale
    if FREQS:
        inv_freq = 1.0 / metile.load(Freqs + pair, mask=rotated, other=1.0).to(metile.float32)
    else:
        inv_freq = metile.exp2(pair.to(metile.float32) * (-2.0 / DIMS) * log2_base)
    angle = position * inv_freq
    c = metile.cos(angle)
    s = metile.sin(angle)
    y = metile.where(first, x * c - other * s, other * s + x * c)
    y = metile.where(rotated, y, x)
    metile.store(Y + offs, y.to(Y.dtype), mask=inside)
