"""The op vocabulary of Tile IR, grouped the way passes and emitters use it.

Tile form (frontend output)
  const{value}                          scalar constant
  program_id{axis} num_programs{axis}   program (threadgroup) geometry, int32
  thread_id num_threads                 thread geometry, int32
  arange{start,end}                     int32 tile
  splat(s){shape} broadcast(t){shape} expand_dims(t){axis}
  permute(t){dims}                      result axis i is operand axis dims[i] (trans, .T)
  reshape(t){shape}                     same elements in the same row-major order
  <elementwise>(a, b, ...)              operands of one shape (frontend broadcasts)
  ptr_add(p, offset)                    pointer + int32 offset (scalar or tile)
  load(p, [mask, other])                scalar or tile read; masked lanes read `other`
  store(p, value, [mask]){atomic?}      scalar or tile write; atomic=kind (add, max, min, xchg,
                                        cas, and, or, xor): atomic_<kind>, its result the old
                                        value (cas operands: p, value, compare)
  reduce(t){kind, axis}                 sum|max|min|argmax|argmin|xor|or; axis None -> scalar
                                        (arg kinds: int32 index, ties -> smallest or
                                        {tie_break_left: False} largest)
  reduce(t0..tn-1){kind="combine", axis} [combine(a0..an-1, b0..bn-1) -> yield(n)]
                                        reduce(): n results, the region as associative_scan's
  scan(t){kind, axis, reverse}          inclusive prefix sum|prod along axis, same shape
  scan(t0..tn-1){kind="combine", axis, reverse} [combine(a0..an-1, b0..bn-1) -> yield(n)]
                                        associative_scan: n results; the region combines the
                                        running value (a) with the next element (b), as scalars
  sort(t){descending?}                  sorted along the last axis (a power of two)
  join(a, b)                            result[..., 0] = a, result[..., 1] = b
  split(t){index}                       t[..., index] of a tile whose last axis is 2
  flip(t){axis}                         t reversed along axis
  cat(a, b)                             a then b along axis 0 (other extents equal)
  dot(a, b, acc)                        tile matrix product, fp32 accumulation
  shared_alloc{size}                    threadgroup pointer (root = its name)
  barrier
  device_print(*values){prefix, hex}    print (values: scalars, tiles of one shape)
  device_assert(cond){msg, where}       stop the launch where cond is false (debug builds)
  for(lb, ub, step, *init){kind} [body(iv, *carried) -> yield]
  if(cond) [then -> yield] [else -> yield]
  while(*init) [cond(*carried) -> condition(c, *carried)] [body(*carried) -> yield]

Thread form (after passes.lower_tiles; every value is a scalar)
  param{name}                           a runtime scalar parameter
  decl{name, storage, dtype, size}      hoisted storage: "local" array, "shared" array, "var"
  lane_loop{numel, slots, threads} [body(index, slot)]
                                        the elements of a tile this thread owns
  local_get(slot){name} local_set(slot, v){name}
  var_get{name} var_set(v){name}
  mem_load(index, [mask, other]){root, space}  mem_store(index, v, [mask]){root, space}
  mem_atomic(index, v, [compare | mask]){root, kind, init?, state?} -> the old value: device
                                        atomic (compare for kind "cas"; kind "read" takes no
                                        v and returns the current value); with init/state the
                                        element is first copied in from buffer `init` once,
                                        marking byte `state`[index] (passes/buffer_usage.py)
  simd_reduce(v){kind, lanes?, xor?} simd_lane simd_group barrier simd_barrier
                                        (lanes: aligned groups of that many lanes, a power
                                        of two below 32, each combined on its own; xor: a
                                        butterfly step with lane l ^ m for each m given)
  device_print(pid0, pid1, pid2, *index, *values){prefix, hex, index, rank}
  device_assert(cond, pid0, pid1, pid2, *index){head, msg, index, rank}
                                        passes/lower_debug.py: index "element" (the
                                        element's `rank` coordinates), "thread" (one
                                        operand: thread_id) or "none"
  decl{storage="fragment", role, dtype, size, shape}
                                        `size` opaque matrix fragments per thread (role a|b|acc,
                                        shape (rows, columns, depth) of the matrix unit)
  frag_fill{name, index, value}         fill fragment name[index] with a constant
  frag_load(offset){name, index, root, ld, convert}
                                        fragment name[index] <- the (rows x cols) block of the
                                        threadgroup array `root` starting at element `offset`,
                                        row stride `ld` (row-major)
  frag_mma{d, a, b, c}                  d = a @ b + c, each a (name, index) pair
  frag_store(index, offset){name, root, ld}
                                        the reverse of frag_load (index may be a runtime value)
  for(lb, ub, step) [body(iv)]   if(cond) [then] [else]   while [cond -> condition(c)] [body]
  and every scalar op of the tile form
"""

BINARY = frozenset({"add", "sub", "mul", "div", "idiv", "mod", "maximum", "minimum",
                    "and", "or", "xor", "shl", "shr", "pow", "atan2", "umulhi"})
COMPARE = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
# Float math computed in float32 on every backend (half and bfloat16 convert around it).
MATH_UNARY = frozenset({"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "erf",
                        "sin", "cos", "tan", "asin", "acos", "atan", "floor", "ceil"})
MATH_BINARY = frozenset({"pow", "atan2"})
UNARY = frozenset({"neg", "not", "abs"}) | MATH_UNARY
FLOAT_ONLY = frozenset({"div"}) | MATH_UNARY | MATH_BINARY
# umulhi: the high 32 bits of the unsigned 64-bit product (Triton's tl.umulhi)
INT_ONLY = frozenset({"idiv", "mod", "shl", "shr", "umulhi"})
# pair_fma(a, b, c){pair}: uint32 words each holding two 16-bit floats of dtype `pair`
# (float16 | bfloat16, low half first); both halves a * b + c, each rounded once to `pair`
# (CUDA's HFMA2, Metal's half2 fma): the packed arithmetic a dequantizing GEMV needs to
# spend one instruction on two weights
PAIR = frozenset({"pair_fma"})
ELEMENTWISE = BINARY | COMPARE | UNARY | PAIR | {"cast", "where", "ptr_add"}
SCALAR_SOURCES = frozenset({"const", "program_id", "num_programs", "thread_id", "num_threads"})
TILE_ONLY = frozenset({"arange", "splat", "broadcast", "expand_dims", "permute", "reshape",
                       "scan", "dot", "sort", "join", "split", "flip", "cat"})
CONTROL = frozenset({"for", "if", "while"})
# Thread-form matrix fragments (see passes/lower_matmul.py): opaque per-SIMD-group
# matrices whose lane ownership no pass or emitter depends on.
FRAGMENT = frozenset({"frag_fill", "frag_load", "frag_mma", "frag_store", "simd_barrier"})
TERMINATORS = frozenset({"yield", "condition"})
# simdgroup_inline kernels (see frontend/fragments.py, passes/lower_fragments.py):
# tile-form 8x8 matrix-view accesses, and thread-form per-lane element access of an
# opaque fragment (frag_get(e){name,index} / frag_set(e, v){name,index}: element e of
# the FRAGMENT_ELEMENTS a lane holds; which matrix element that is stays unknown).
FRAGMENT_VIEW = frozenset({"frag_view_load", "frag_view_store"})
# frag_set_pair(lo, hi){name, index, pair}: register `pair` of a left-operand fragment from
# two elements of the accumulator layout (passes/lower_mma_layout.py: the lane-to-element
# mapping is the emitter's acc_coord)
FRAGMENT_ELEMS = frozenset({"frag_get", "frag_set", "frag_set_pair"})
FRAGMENT_ELEMENTS = 2

# 4-wide device loads of proven-aligned, in-bounds groups (passes/lower_matmul.py):
# vec_load(index){root, space, width} -> `width` scalar results (elements index...);
# vec_store(index, v0, v1){root, space} writes elements index and index+1 as one 2-element
# vector (an address aligned to its size: the wgmma epilogue's pairs, passes/gemm_wgmma.py).
VECTOR = frozenset({"vec_load", "vec_store"})

# Asynchronous GEMM staging and register epilogues (passes/gemm_async.py; emitted only for
# a matrix unit that declares them): cp_async(dst_offset, src_index[, size]){dst, src, bytes}
# (size: the bytes read, the rest zero-filled),
# cp_async_commit, cp_async_wait{pending}, aligned16(index){root[, bytes]} -> bool (the
# element's address a multiple of `bytes`, 16 unless given),
# block_all(pred) -> bool (every thread's pred, a barrier: CUDA's __syncthreads_and),
# acc_coord{e, axis} -> the row/column of accumulator element e this lane holds.
ASYNC = frozenset({"cp_async", "cp_async_commit", "cp_async_wait", "aligned16", "acc_coord",
                   "block_all"})

# Warpgroup MMA (passes/gemm_wgmma.py; the wgmma unit only): wgmma(a_offset, b_offset)
# {acc, n, dtype, a, b, a_lbo, a_sbo, b_lbo, b_sbo, trans_b} issues one m64nNk16 product
# from shared-memory descriptors into the float accumulator array `acc`;
# wgmma_fence / wgmma_commit / wgmma_wait{pending, acc} order it; fence_proxy_async makes
# this thread's shared-memory writes visible to the tensor cores.
WGMMA = frozenset({"wgmma", "wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_proxy_async",
                   "warp_uniform"})   # warp_uniform(x) -> x read from lane 0 (a proven-uniform role)

# Bulk tensor copies (TMA; passes/gemm_wgmma.py, the bulk_tensor unit only).  The maps live
# in shared array `smem` (16 uint64 per map, then one mbarrier per stage):
# tma_prepare(index, inner, outer, ld, ... per map){roots, sizes, smem, stages} encodes each
# map from the launch's template (the operand's address &root[index], its extents along
# the contiguous and the other axis and the row stride in elements) and publishes it to
# the block's slot of the launch's scratch; tma_expect(stage){smem, maps, bytes} arms the
# stage's barrier; tma_copy(dst_offset, inner, outer, stage){dst, map, smem, maps} copies
# one box into `dst`; tma_wait(stage, parity){smem, maps} waits for the stage's phase.
# With tma_prepare's attr empty (an arrival count) each stage also has an "empty" barrier
# after the stages' barriers: tma_release(stage){smem, maps, stages} arrives there once a
# warp; tma_empty_wait(stage, parity){smem, maps, stages} waits for its phase.
TMA = frozenset({"tma_prepare", "tma_expect", "tma_copy", "tma_wait", "tma_release",
                 "tma_empty_wait"})
# The names of the template input and scratch output a TMA kernel takes (after the rest).
TMA_TEMPLATE, TMA_SLOTS = "metile_tmap_template", "metile_tmap_slots"

# Run-time debugging output and checks (frontend/debug_ops.py, passes/lower_debug.py).
DEBUG = frozenset({"device_print", "device_assert"})

TILE_FORM = (ELEMENTWISE | SCALAR_SOURCES | TILE_ONLY | CONTROL | TERMINATORS
             | {"load", "store", "reduce", "shared_alloc", "barrier"} | FRAGMENT_VIEW | DEBUG)
THREAD_FORM = (ELEMENTWISE | SCALAR_SOURCES | CONTROL | TERMINATORS
               | {"decl", "param", "lane_loop", "local_get", "local_set", "local_set_pair", "var_get", "var_set",
                  "pack_pair", "unpack_half",
                  "mem_load", "mem_store", "mem_atomic", "simd_reduce", "simd_lane", "simd_group", "barrier"}
               | FRAGMENT | FRAGMENT_ELEMS | VECTOR | ASYNC | WGMMA | TMA | DEBUG)

# Reductions: identity element per kind, by dtype kind.
REDUCE_KINDS = ("sum", "max", "min", "argmax", "argmin", "xor", "or", "combine")
SCAN_KINDS = ("sum", "prod")

# Metal 4 tensor ops (passes/gemm_tensor_ops.py; MSL, the tensor_ops and nax units only):
# mpp_setup{op, accs, m, n, k, transpose_left, transpose_right, relaxed, left, right} declares
# the matmul2d operation `op` (descriptor m x n x k, multiply_accumulate, execution_simdgroup)
# and its float destination cooperative tensors `accs`, zero-filled, for inline-tensor
# operands of dtypes left/right; mpp_step(a_offset, a_x, a_y, a_ld, b_offset, b_x, b_y, b_ld)
# {op, acc, a, b, transpose_left, transpose_right, k} runs it on inline tensors over device
# buffers a and b (extents (x, y), strides (1, ld)) into `acc`; mpp_capacity{acc} -> int32,
# mpp_valid(i){acc} -> bool, mpp_coord(i){acc, axis} -> the row (axis 0) or column (1) of
# element i in the destination tile, mpp_get(i){acc} -> float32 element i.
TENSOR_OPS = frozenset({"mpp_setup", "mpp_step", "mpp_capacity", "mpp_valid", "mpp_coord",
                        "mpp_get"})
THREAD_FORM = THREAD_FORM | TENSOR_OPS
