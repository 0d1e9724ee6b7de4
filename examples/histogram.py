"""metile example: a histogram with atomic_add, tuned with @metile.autotune.

    python examples/histogram.py

Each program loads a block of values and adds 1 to their bins atomically; the
launch returns the passed counts plus every added value.  The block size and
SIMD-group count are tuned once per operand signature (the winner is kept in
metile's tuning cache).  Checked against NumPy; the tuning result is printed.
"""

import mlx.core as mx
import numpy as np

import metile


@metile.autotune(configs=[metile.Config(BLOCK=256), metile.Config(BLOCK=1024, num_simdgroups=8)],
                 key=["n"])
@metile.kernel
def histogram(Values, Counts, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    # counts order nothing else: relaxed, without the fences Triton's default acq_rel adds
    metile.atomic_add(Counts + metile.load(Values + offs, mask=mask), 1, mask=mask,
                      sem="relaxed")


def main():
    n, bins = 100_000, 16
    values = np.random.default_rng(0).integers(0, bins, n).astype(np.int32)
    grid = lambda meta: (metile.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731
    counts = histogram[grid](mx.array(values), mx.zeros((bins,), mx.int32), n)
    np.testing.assert_array_equal(np.array(counts), np.bincount(values, minlength=bins))
    result = histogram.last_result
    print(f"{bins}-bin histogram of {n} values on {mx.default_device()}: matches NumPy")
    timings = ", ".join(f"{c}: {t * 1e6:.0f} us" for c, t in result.timings.items())
    print(f"tuned config {result.config.key()} ({'from cache' if result.from_cache else 'measured'}; "
          f"{timings or 'cached winner'})")
    print("OK")


if __name__ == "__main__":
    main()
