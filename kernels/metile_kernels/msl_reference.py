"""Hand-written MSL kernels that validate metile's MSL CPU runtime and serve
as baselines in benchmarks.

They are written against the `mx.fast.metal_kernel` signature contract (see
`metile.metal_kernel`).
"""

# A 64x64-tile GEMM: grid = (N / 64 * 128, M / 64, 1) threads, threadgroup =
# (128, 1, 1); M, N multiples of 64 and K a multiple of 16.
GEMM_SOURCE = """
    // 64x64 output tile per threadgroup of 4 SIMD-groups; each SIMD-group owns
    // a 32x32 quarter as 4x4 fragments of 8x8.  K is staged through
    // threadgroup memory 16 columns at a time.
    threadgroup float As[64 * 16];
    threadgroup float Bs[16 * 64];
    uint tid = thread_index_in_threadgroup;
    uint sg = simdgroup_index_in_threadgroup;
    uint row0 = threadgroup_position_in_grid.y * 64;
    uint col0 = threadgroup_position_in_grid.x * 64;
    uint sg_row = (sg / 2) * 32, sg_col = (sg % 2) * 32;
    simdgroup_float8x8 acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k0 = 0; k0 < K; k0 += 16) {
        for (uint e = tid; e < 64 * 16; e += 128) {
            uint r = e / 16, c = e % 16;
            As[e] = A[(row0 + r) * K + k0 + c];
            uint br = e / 64, bc = e % 64;
            Bs[e] = B[(k0 + br) * N + col0 + bc];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kk = 0; kk < 16; kk += 8) {
            simdgroup_float8x8 a[4], b[4];
            for (int i = 0; i < 4; ++i)
                simdgroup_load(a[i], As + (sg_row + i * 8) * 16 + kk, 16);
            for (int j = 0; j < 4; ++j)
                simdgroup_load(b[j], Bs + kk * 64 + sg_col + j * 8, 64);
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j)
                    simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            simdgroup_store(acc[i][j], C + (row0 + sg_row + i * 8) * N + col0 + sg_col + j * 8, N);
"""
