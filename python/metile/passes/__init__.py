"""Passes over Tile IR, one module each, in the order compiler/pipeline.py runs them.

Checks and analyses on tile form:
  uniformity            barriers / tile ops only under thread-uniform control flow; marks
                        uniform scalar stores and atomics once per program
  pointer_recurrence    (rewrites) a dot loop's carried pointers / int32/int64 offsets advanced by
                        invariant amounts in closed form; acc += dot(a, b) -> dot(a, b, acc)
  buffer_usage          which buffers are loaded / stored; store-coverage proofs
  gemm                  the canonical dot-over-K recurrence and its fused epilogue
  gemm_bounds           prove_gemm_bounds: which GEMM staging loads are provably in bounds
                        and 4-aligned (interval proofs)
  shared_hazards        the shared-memory contract of simdgroup_inline kernels
  placement             recompute / registers / threadgroup memory for each tile
  mma_layout            which tiles a kernel of general products holds in the matrix unit's
                        accumulator layout (products, the softmax between them, row values)

Lowering, tile form -> thread form:
  lower_tiles           lane loops, reductions and dot (mixins below); GEMM-shaped kernels
                        through lower_matmul
    lane_layout         which lane owns which tile element
    lower_reductions    block reductions and dot (SIMD-group collectives + shared memory)
    vectorize_elementwise  4-wide interiors for canonical 1-D elementwise kernels
    lower_matmul        staged operands, matrix fragments (the unit from the plan) or FFMA
                        micro-tiles, the epilogue at the single store
    gemm_staging        split_k_loop, vectorize_staging, double_buffer_staging
    gemm_async          16-byte asynchronous copies through a multi-stage swizzled ring
                        (CUDA), register epilogue
    gemm_wgmma          Hopper warpgroup MMA from 128-byte-swizzled shared memory (sm_90a)
    gemm_tensor_ops     Metal 4 tensor ops (matmul2d) on cooperative destinations (apple10)
    gemm_epilogue_reads bias / residual loads inside the fused epilogue
    lower_sort          bitonic sort of a tile's last axis in threadgroup memory
    lower_dot_fragments a general product on matrix fragments through threadgroup memory
    lower_mma_layout    mma_layout's tiles in registers: fragment products from registers
                        (warpgroup MMA from swizzled tiles on sm_90), row reductions by
                        lane shuffles, operand blocks copied one iteration ahead (CUDA
                        cp.async, one barrier an iteration)
    vectorize_rows      runs of 16 bytes a lane; 16-byte asynchronous copies into
                        threadgroup tiles (CUDA), bare where one test a thread proves its
                        chunks aligned and whole
    lower_debug         device_print / device_assert per element
  lower_fragments       simdgroup_inline kernels: kernel-written 8x8 fragments

Each pass that runs records its name in the compiled kernel's steps (the execution
report's `passes`).  Every pass leaves IR that `ir.verify` accepts.
"""
