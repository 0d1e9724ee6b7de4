"""metile example: batched softmax(Q Kᵀ / √d) V from 8x8 matrix fragments.

    python examples/attention_block.py

One program per head: two fragment products (Q Kᵀ, then P V) with the row
softmax computed by ordinary scalar code on the scores in shared memory, under
Schedule(backend="simdgroup_inline").  The compiler checks the shared-memory
contract (the barriers between the fragment stores, the scalar softmax and the
fragment loads are required: delete one and compilation fails, naming the
missing barrier and the line that needs it).
Runs inside mx.compile between MLX ops; checked against NumPy.
"""

import math

import mlx.core as mx
import numpy as np

import metile

HEADS, N = 8, 32
INLINE = metile.Schedule(backend="simdgroup_inline")


@metile.kernel
def attention(Q, K, V, Output, *, N: metile.constexpr, SCALE: metile.constexpr,
              BLOCK: metile.constexpr = 64):
    head = metile.program_id(0) * N * N
    score_memory = metile.shared(N * N, dtype="f32")
    queries = metile.tensor(Q + head, shape=(N, N), strides=(N, 1), block_shape=(8, 8),
                            access="read")
    keys_t = metile.tensor(K + head, shape=(N, N), strides=(1, N), block_shape=(8, 8),
                           access="read")
    values = metile.tensor(V + head, shape=(N, N), strides=(N, 1), block_shape=(8, 8),
                           access="read")
    output = metile.tensor(Output + head, shape=(N, N), strides=(N, 1), block_shape=(8, 8),
                           access="write")
    score_matrix = metile.tensor(score_memory, shape=(N, N), block_shape=(8, 8))
    scores = metile.tensor(score_memory, shape=(N, N))
    for i in metile.tile_range(0, N, 8):
        for j in metile.tile_range(0, N, 8):
            acc = metile.loop_state(metile.zeros((8, 8)))
            for k in metile.tile_range(0, N, 8):
                acc = metile.dot(queries.load((i, k)), keys_t.load((k, j)), acc)
            score_matrix.store((i, j), acc * SCALE)
    metile.barrier()
    for row in metile.tile_range(metile.thread_id(), N, BLOCK):
        largest = scores.load((row, 0))
        for column in metile.tile_range(1, N):
            largest = metile.maximum(largest, scores.load((row, column)))
        total = 0.0
        for column in metile.tile_range(0, N):
            p = metile.exp(scores.load((row, column)) - largest)
            scores.store((row, column), p)
            total = total + p
        for column in metile.tile_range(0, N):
            scores.store((row, column), scores.load((row, column)) / total)
    metile.barrier()
    for i in metile.tile_range(0, N, 8):
        for j in metile.tile_range(0, N, 8):
            acc = metile.loop_state(metile.zeros((8, 8)))
            for k in metile.tile_range(0, N, 8):
                acc = metile.dot(score_matrix.load((i, k)), values.load((k, j)), acc)
            output.store((i, j), acc)


@mx.compile
def layer(x, wq, wk, wv):
    q, k, v = (mx.tanh(x @ w) for w in (wq, wk, wv))      # MLX ops
    o = attention[(HEADS,)](q, k, v, mx.zeros(q.shape), N=N, SCALE=1 / math.sqrt(N),
                            STRICT_MATH=True, SCHEDULE=INLINE)
    return o + x                                            # MLX op


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((HEADS, N, N)).astype(np.float32)
    w = [rng.standard_normal((N, N)).astype(np.float32) / math.sqrt(N) for _ in range(3)]
    out = np.array(layer(mx.array(x), *map(mx.array, w)))
    q, k, v = (np.tanh(x.astype(np.float64) @ wi) for wi in w)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(N)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out, p @ v + x, rtol=3e-4, atol=3e-5)
    print(f"{HEADS} heads of {N}x{N} attention on {mx.default_device()}: matches NumPy")
    print(attention.explain())
    print("OK")


if __name__ == "__main__":
    main()
