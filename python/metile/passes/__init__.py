"""Passes over Tile IR, one module each, in pipeline order:

  uniformity      (check)   barriers / tile ops only under thread-uniform control flow
  buffer_usage    (analysis) which buffers are loaded / stored; store-coverage proofs
  placement       (analysis) recompute / registers / threadgroup memory for each tile
  gemm            (analysis) the canonical dot-over-K recurrence and its fused epilogue
  lower_tiles     tile form -> thread form (lane loops, reductions, dot); GEMM-shaped
                  kernels through lower_matmul (staged operands, matrix fragments or
                  FFMA micro-tiles, per-element epilogue at the single store)

The runtime (`runtime/kernel.py`) runs them and records the list it ran in the
compiled kernel's metadata (`passes`).  Every pass leaves IR that `ir.verify`
accepts.
"""
