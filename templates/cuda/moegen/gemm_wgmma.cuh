// moegen device code: the grouped W4A16 GEMM on warpgroup MMA (sm_90a): the wide CTA's wgmma form
// and the tall tile (moegen::grouped_gemm_wgmma, moegen::grouped_gemm_wgmma_tall).
#pragma once

namespace moegen {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---------------------------------------------------------------------------------------------
// Warpgroup MMA (sm_90a): the four warps of a warpgroup multiply a 64 x k16 A operand held in
// their registers (warp w rows 16 w .. 16 w + 15, each warp's fragment laid out as mma.sync
// m16n8k16's A) by an N x k16 B operand that the tensor cores read from shared memory through a
// descriptor, asynchronously: the warps go on (dequantizing the next weights) while it runs.

// the B operand's descriptor, K-major without swizzle: 8 x 16-byte core matrices, `lbo` bytes
// from one k8 half to the next, `sbo` bytes from one 8 rows of N to the next
__device__ __forceinline__ unsigned long long wgmma_desc(const void* p, unsigned lbo,
                                                         unsigned sbo) {
  return (unsigned long long)((smem_addr(p) & 0x3ffff) >> 4) |
         ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);
}

// orders this warpgroup's register writes before the wgmma that reads them
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// returns once at most PENDING of this warpgroup's committed wgmma groups are still running
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}

// this thread's shared-memory writes (cp.async included, once waited for) become visible to
// the tensor cores' reads (the async proxy)
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// keeps the compiler from moving accesses of v across this point (accumulators of a wgmma in
// flight)
__device__ __forceinline__ void reg_fence(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// reg_fence on each of a wide CTA's accumulators
template <int NT>
__device__ __forceinline__ void fence_acc(float (&acc)[4][NT][4]) {
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) reg_fence(acc[t][nt][c]);
}

// D (64 x N, fp32, accumulated) += A (64 x k16 act_t, registers) x B (k16 x N act_t, shared
// memory, K-major); d: this thread's N / 2 accumulators, d[4 q + c] = row 16 w + lane / 4 +
// 8 (c / 2), column 8 q + 2 (lane % 4) + c % 2 (w: the warp in the warpgroup)
template <int N>
__device__ __forceinline__ void wgmma_f16(float (&d)[N / 2], const unsigned (&a)[4],
                                          unsigned long long b_desc);

template <>
__device__ __forceinline__ void wgmma_f16<32>(float (&d)[16], const unsigned (&a)[4],
                                              unsigned long long b_desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %21, 0; "
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE
      " "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[32], const unsigned (&a)[4],
                                              unsigned long long b_desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE
      " "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_f16<96>(float (&d)[48], const unsigned (&a)[4],
                                              unsigned long long b_desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %53, 0; "
      "wgmma.mma_async.sync.aligned.m64n96k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE
      " "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
      "}, {%48, %49, %50, %51}, %52, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_f16<128>(float (&d)[64], const unsigned (&a)[4],
                                               unsigned long long b_desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %69, 0; "
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE
      " "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

// The block's activation rows as the warpgroup MMA's B operand: a stage's KS k16 steps of the
// BLOCK rows, 2 KS chunks of 16 bytes a row, stored chunk-major (k8 chunk c of row r at
// c COLUMN_BYTES + 16 r: the B descriptor's layout without swizzle, its leading byte offset
// COLUMN_BYTES). The CTA's THREADS threads copy chunk q THREADS + thread; a warp's 32 chunks are
// LANES_PER_ROW = 4 adjacent chunks (64 bytes, whole sectors) of each of 8 rows (2 of 16 rows
// where a stage holds one k16 step). A chunk column is BLOCK rows and 16 bytes of padding long,
// so that the adjacent chunks of a row, which one copy fetches together, land on different banks
// (2-5% faster at prefill sizes on the H200: docs/DESIGN.md). Padding rows copy nothing: what
// their place holds (an earlier stage's rows, or whatever shared memory held) reaches only their
// own output rows, which the epilogues never write (a block row is a column of the MMA's B and
// of its result). (The capped wide CTA's pinned copies of more than 4 stages zero-fill them.)
template <int BLOCK, int KS, int THREADS, int KDIM, int ROW_DIV>
struct ChunkMajorRows {
  static constexpr int CHUNKS = 2 * KS, A_CHUNKS = BLOCK * CHUNKS;
  static constexpr int COPIES = (A_CHUNKS + THREADS - 1) / THREADS;  // threads past A_CHUNKS idle
  static constexpr int LANES_PER_ROW = CHUNKS < 4 ? CHUNKS : 4, WARP_ROWS = 32 / LANES_PER_ROW;
  // a k8 chunk column (the B descriptor's leading byte offset) and a stage's rows, in bytes
  static constexpr int COLUMN_BYTES = (BLOCK + 1) * 16;
  static constexpr int BYTES = (CHUNKS * COLUMN_BYTES + 127) / 128 * 128;
  static_assert(CHUNKS % LANES_PER_ROW == 0 && BLOCK % WARP_ROWS == 0,
                "a warp's chunks: whole row pieces of whole row groups");
  const act_t* row[COPIES];  // a padding row: row 0, copied by nothing or zero-filled
  unsigned bytes[COPIES];    // 16, or 0 for a padding row

  __device__ __forceinline__ ChunkMajorRows(const act_t* __restrict__ a,
                                            const int* __restrict__ sorted_ids, int blk,
                                            int num_slots) {
#pragma unroll
    for (int q = 0; q < COPIES; ++q) {
      const int c = chunk(q);
      const int slot = copies(q) ? sorted_ids[blk * BLOCK + row_of(c)] : num_slots;
      bytes[q] = slot < num_slots ? 16u : 0u;
      row[q] = a + (size_t)(slot < num_slots ? slot / ROW_DIV : 0) * KDIM + 8 * part_of(c);
    }
  }
  __device__ __forceinline__ static int chunk(int q) { return q * THREADS + threadIdx.x; }
  __device__ __forceinline__ static bool copies(int q) {
    return A_CHUNKS % THREADS == 0 || chunk(q) < A_CHUNKS;
  }
  // the block row and the k8 chunk of the row (of the stage's 2 KS) that chunk c copies
  __device__ __forceinline__ static int row_of(int c) {
    return c / (WARP_ROWS * CHUNKS) * WARP_ROWS + c / LANES_PER_ROW % WARP_ROWS;
  }
  __device__ __forceinline__ static int part_of(int c) {
    return c / 32 % (CHUNKS / LANES_PER_ROW) * LANES_PER_ROW + c % LANES_PER_ROW;
  }
  // the chunk's offset in a stage's rows
  __device__ __forceinline__ static unsigned offset(int q) {
    return part_of(chunk(q)) * COLUMN_BYTES + 16 * row_of(chunk(q));
  }
  // copy k16 steps step .. step + KS - 1 of the rows that hold slots into a stage's rows at `dst`
  __device__ __forceinline__ void copy(unsigned char* dst, int step) const {
#pragma unroll
    for (int q = 0; q < COPIES; ++q)
      if (copies(q) && bytes[q]) cp_async16(dst + offset(q), row[q] + step * 16);
  }
};

// ---------------------------------------------------------------------------------------------
// Prefill-sized grouped W4A16 GEMM on warpgroup MMA (sm_90a): the wide CTA's tile (BLOCK rows
// of one expert x COLT = 4 or 8 column tiles of 64, over the whole K or one of SPLIT ranges of
// it as the wide CTA) with COLT / 4 warpgroups
// (two share each staged activation row over 512 columns). Warp w dequantizes
// the weights of column tile w (the A fragments of its four 16-column subtiles, scaled before
// the MMA as in the wide CTA) and its warpgroup issues, per k16 step, one wgmma per subtile t:
// A = subtile t of its four tiles (rows 16 (w % 4) .. of the 64-row operand), B = the
// block's BLOCK rows, read by the tensor cores straight from the ring. The MMAs run while the
// warps dequantize the next step (A fragments double-buffered in registers, at most one step's
// wgmma group in flight behind the one being prepared). The ring: STAGES stages of KS k16 steps,
// filled by all threads with cp.async STAGES - 2 stages ahead (the stage before the current one
// may still be read by a running wgmma); the rows of a stage are stored chunk-major (k8 chunk c
// of row r at (c BLOCK + r) x 16 bytes), the layout of the wgmma B descriptor without swizzle.
// Accumulators and epilogue are those of grouped_gemm_wide with WARP_ROWS = BLOCK, so the
// output is the same computation in another summation order. SPLIT_MANY, FILL_CTAS: a split
// chosen per call (call_split). HAS_ZERO: zeros staged after the scales, as the wide CTA.
template <int BLOCK, int COLT, int KDIM, int NTILES, int NOUT, int G, int STAGES, int KS,
          int ROW_DIV, int EPILOGUE, bool PERM_GATE_UP, bool MUL_WEIGHTS, int SUM_TOPK = 0,
          int SPLIT = 1, bool PIN_ADDRESSES = false, int SPLIT_MANY = SPLIT, int FILL_CTAS = 0,
          bool HAS_ZERO = false>
__device__ __forceinline__ void grouped_gemm_wgmma(
    const act_t* __restrict__ a, const uint4* __restrict__ w, const uint4* __restrict__ scales,
    const uint4* __restrict__ zeros, const int* __restrict__ sorted_ids,
    const int* __restrict__ expert_ids, const int* __restrict__ total_ptr,
    const float* __restrict__ weights_flat, int num_slots, act_t* __restrict__ out,
    act_t* __restrict__ sum_out = nullptr, int* __restrict__ sum_counters = nullptr,
    float* __restrict__ partials = nullptr, int* __restrict__ counters = nullptr,
    Routed routed = {}) {
  constexpr int THREADS = 32 * COLT, NT = BLOCK / 8;
  constexpr int KSTEPS = KDIM / 16, ITERS = KSTEPS / KS, GROUPS = KDIM / G;
  static_assert((BLOCK == 32 || BLOCK == 64) && (COLT == 4 || COLT == 8) && NTILES % COLT == 0,
                "32 or 64 rows, whole warpgroups of 4 column tiles");
  static_assert(KSTEPS % KS == 0 && G % (16 * KS) == 0, "the k16 steps of a stage share a group");
  static_assert(KS % 2 == 0, "A fragments alternate between two register sets by step parity");
  static_assert(STAGES >= 3, "the ring keeps a stage for the wgmma in flight");
  constexpr int GROUP_ITERS = G / (16 * KS), CTA_ITERS = ITERS / SPLIT;
  static_assert(ITERS % SPLIT == 0 && CTA_ITERS % GROUP_ITERS == 0,
                "K splits into whole scale groups");
  using BlockRows = ChunkMajorRows<BLOCK, KS, THREADS, KDIM, ROW_DIV>;
  constexpr int COLUMN_BYTES = BlockRows::COLUMN_BYTES;  // the rows' k8 chunk columns
  constexpr int W_BYTES = COLT * KS * 512, A_BYTES = BlockRows::BYTES;
  constexpr int S_OFFSET = W_BYTES + A_BYTES;  // a group's scales (copy_group_scales)
  constexpr int Z_OFFSET = S_OFFSET + COLT * SCALE_STAGE_BYTES;  // and zeros (HAS_ZERO)
  constexpr int STAGE_BYTES = S_OFFSET + group_stage_bytes<COLT, HAS_ZERO>();
  constexpr int RING_BYTES = STAGES * STAGE_BYTES;
  constexpr int OUT_COLS = EPILOGUE == 1 ? 32 : 64;
  constexpr int OUT_BYTES = COLT * BLOCK * (OUT_COLS + 8) * 2;
  constexpr int AHEAD = STAGES - 2;  // stages in flight ahead of the current one
  __shared__ __align__(128) unsigned char smem[RING_BYTES > OUT_BYTES ? RING_BYTES : OUT_BYTES];

  const int blk = blockIdx.x, col_tile = blockIdx.y;  // blocks vary fastest (weights from L2)
  const int split = SPLIT > 1 ? blockIdx.z : 0;       // (a constant for the whole K)
  // this call's split (SPLIT unless SPLIT_MANY differs: call_split) and K range
  const int total = *total_ptr;
  const int split_now = call_split<BLOCK, NTILES / COLT, SPLIT, SPLIT_MANY, FILL_CTAS>(total);
  const int cta_iters = ITERS / split_now;
  const int it0 = split * cta_iters, group0 = it0 / GROUP_ITERS;
  if (blk * BLOCK >= total || (SPLIT_MANY != SPLIT && split >= split_now)) return;
  const int expert = expert_ids[blk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile = col_tile * COLT + warp;  // the column tile warp w dequantizes

  // copies of one stage: the weights by copy_weight_stage, the rows by ChunkMajorRows
  constexpr int A_COPIES = BlockRows::COPIES;
  const BlockRows block_rows(a, sorted_ids, blk, num_slots);
  const uint4* w_cta = w + ((size_t)expert * KSTEPS * NTILES + col_tile * COLT) * 32;
  const size_t group_offset = (((size_t)expert * GROUPS + group0) * NTILES + col_tile * COLT) * 8;
  const uint4* s_cta = scales + group_offset;
  const uint4* z_cta = zeros + group_offset;  // (HAS_ZERO)
  // PIN_ADDRESSES: this thread's copy addresses are pinned in registers (ptxas, capped at 128
  // of them, would otherwise recompute them from tid.x at every copy): its 16 B of each k16
  // step's weight tiles, step q of a stage at q * THREADS * 16 in it, and its chunks of the rows.
  // (Measured on the H200: 2% faster in the decode bucket, Mixtral T = 56..64; the prefill
  // kernels, not capped, ran 1-4% slower so.)
  const uint4* w_thread = nullptr;
  unsigned w_dst = 0, row_dst[A_COPIES] = {};
  if constexpr (PIN_ADDRESSES) {
    w_thread = pinned(w_cta + (size_t)it0 * KS * NTILES * 32 + threadIdx.x);
    w_dst = pinned(smem_addr(smem) + 16 * threadIdx.x);
#pragma unroll
    for (int q = 0; q < A_COPIES; ++q)
      row_dst[q] = pinned(smem_addr(smem) + W_BYTES + BlockRows::offset(q));
  }
  // copy iteration i's k16 steps into its stage: the weights (and a group's scales), then the
  // rows
  auto issue_weights = [&](int i) {
    unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
    if constexpr (PIN_ADDRESSES) {
      const unsigned st_dst = w_dst + (i % STAGES) * STAGE_BYTES;
      const uint4* src = w_thread + (size_t)i * KS * NTILES * 32;
#pragma unroll
      for (int q = 0; q < KS; ++q) cp_async16_at(st_dst + q * THREADS * 16, src + q * NTILES * 32);
    } else {
      copy_weight_stage<COLT, KS, NTILES, THREADS>(st, w_cta, (it0 + i) * KS);
    }
    if (i % GROUP_ITERS == 0) {
      copy_group_scales<COLT>(st + S_OFFSET, s_cta + (size_t)(i / GROUP_ITERS) * NTILES * 8);
      if constexpr (HAS_ZERO)
        copy_group_scales<COLT>(st + Z_OFFSET, z_cta + (size_t)(i / GROUP_ITERS) * NTILES * 8);
    }
  };
  auto issue_rows = [&](int i) {
    const int step = (it0 + i) * KS;
    if constexpr (PIN_ADDRESSES) {
#pragma unroll
      for (int q = 0; q < A_COPIES; ++q)
        if constexpr (STAGES <= 4) {  // padding rows copy nothing, as in BlockRows::copy
          if (BlockRows::copies(q) && block_rows.bytes[q])
            cp_async16_at(row_dst[q] + (i % STAGES) * STAGE_BYTES, block_rows.row[q] + step * 16);
        } else if (BlockRows::copies(q)) {  // (zero-filled: skipping them spilled at 6 stages)
          cp_async16_zfill_at(row_dst[q] + (i % STAGES) * STAGE_BYTES,
                              block_rows.row[q] + step * 16, block_rows.bytes[q]);
        }
    } else {
      block_rows.copy(smem + (i % STAGES) * STAGE_BYTES + W_BYTES, step);
    }
  };
  auto issue = [&](int i) {
    issue_weights(i);
    issue_rows(i);
  };

  // the lane's scales (columns 8 j + lane / 4 of its tile), the current group's (and zeros)
  uint4 scale_now, zero_now = {};

  // acc[t][nt]: columns 16 t .. 16 t + 15 of tile `tile`, rows 8 nt .. 8 nt + 7 (the wgmma of
  // subtile t: its accumulator rows 16 w + lane / 4 (+ 8) are columns of warp w's tile)
  float acc[4][NT][4];
  zero_acc(acc);
  // A CTA over the whole K with its registers capped (the plan caps block 32's, whose copy
  // addresses it pins) unrolls its K loop over a turn of the ring: every stage offset (and,
  // where a turn holds whole scale groups, every group start) is a constant.
  constexpr int UNROLL = SPLIT == 1 && PIN_ADDRESSES ? STAGES : 1;
  // Where that turn is the whole loop (K = 128 at 32 k a stage), the compiler moves these zeros
  // in between the first step's wgmmas and ptxas has to wait there (C7519): fenced, they stay
  // before the loop. (Elsewhere left as it was: the same code.)
  if constexpr (UNROLL > 1 && ITERS <= UNROLL) fence_acc(acc);

  // PIN_ADDRESSES: the B descriptors are the ring's own with the address field moved on by a
  // stage's offset in the ring
  const unsigned long long desc_ring = PIN_ADDRESSES ? wgmma_desc(smem, COLUMN_BYTES, 128) : 0;

  unsigned frag[2][4][4];  // [step parity][subtile t]: A fragments
  auto multiply_step = [&](const unsigned char* st, int sub, const uint4& wv, unsigned (&f)[4][4]) {
    const unsigned words[4] = {wv.x, wv.y, wv.z, wv.w};
    const act2_t* sc = reinterpret_cast<const act2_t*>(&scale_now);
    const act2_t* zc = reinterpret_cast<const act2_t*>(&zero_now);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      act2_t h[4];
      dequant8(words[t], h);
      if constexpr (HAS_ZERO) zero_frag(h, zc[t]);
      scale_frag(h, sc[t]);
#pragma unroll
      for (int r = 0; r < 4; ++r) f[t][r] = *reinterpret_cast<const unsigned*>(&h[r]);
    }
    // B: rows 0 .. BLOCK - 1 of k16 step `sub`: k8 chunks 2 sub and 2 sub + 1
    unsigned long long desc;
    if constexpr (PIN_ADDRESSES)
      desc = desc_ring + ((unsigned)(st - smem + W_BYTES + sub * 2 * COLUMN_BYTES) >> 4);
    else
      desc = wgmma_desc(st + W_BYTES + sub * 2 * COLUMN_BYTES, COLUMN_BYTES, 128);
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < 4; ++t)
      wgmma_f16<BLOCK>(reinterpret_cast<float (&)[NT * 4]>(acc[t]), f[t], desc);
    wgmma_commit();
  };

  prime_ring<AHEAD, false>(cta_iters, issue_weights, issue_rows);
#pragma unroll UNROLL
  for (int i = 0; i < cta_iters; ++i) {
    wgmma_wait<1>();             // step i KS - 2 is done: its A set and stage free
    cp_async_wait<AHEAD - 1>();  // stage i has landed (this thread's copies) ...
    fence_proxy_async();         // ... where the tensor cores will read it
    __syncthreads();             // everyone's; stage i - 2 is no longer read
    // the warp's weight words of every step of the stage, read before the copies are issued
    // so that the reads are in flight while they are
    const unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
    uint4 wv[KS];
#pragma unroll
    for (int sub = 0; sub < KS; ++sub)
      wv[sub] = *reinterpret_cast<const uint4*>(st + (sub * COLT + warp) * 512 + lane * 16);
    if (i + AHEAD < cta_iters) issue(i + AHEAD);  // into stage i - 2's slot
    cp_async_commit();
    if (i % GROUP_ITERS == 0) {  // a scale group starts: its scales are in stage i
      scale_now = staged_group_scales(st + S_OFFSET, warp, lane);
      if constexpr (HAS_ZERO) zero_now = staged_group_scales(st + Z_OFFSET, warp, lane);
    }
#pragma unroll
    for (int sub = 0; sub < KS; ++sub) {
      if (sub > 0) wgmma_wait<1>();  // step sub - 2's wgmmas are done with frag[sub % 2]
      multiply_step(st, sub, wv[sub], frag[sub % 2]);
    }
  }
  wgmma_wait<0>();
  fence_acc(acc);
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: the output rows reuse it
  if constexpr (SPLIT > 1) {
    __shared__ int last_cta;
    // (the call's split worked out again from the block count: the value of split_now)
    if (!split_k_gather<SPLIT, THREADS>(
            reinterpret_cast<float (&)[4 * NT * 4]>(acc), partials, counters,
            blk * (NTILES / COLT) + col_tile, split, last_cta,
            call_split<BLOCK, NTILES / COLT, SPLIT, SPLIT_MANY, FILL_CTAS>(*total_ptr)))
      return;
  }

  wide_epilogue<BLOCK, BLOCK, COLT, NOUT, EPILOGUE, PERM_GATE_UP, MUL_WEIGHTS, SUM_TOPK>(
      acc, smem, 0, tile, sorted_ids, total_ptr, weights_flat, num_slots, out, sum_out,
      sum_counters, routed);
}

// a row count as a type (the tall tile's K loop, instantiated per wgmma width)
template <int N>
struct RowCount {
  static constexpr int value = N;
};

// ---------------------------------------------------------------------------------------------
// Prefill-sized grouped W4A16 GEMM on warpgroup MMA, the tall tile (sm_90a): BLOCK = 128 rows
// of one expert x 4 column tiles of 64 over the whole K, by four warpgroups: warpgroup c
// multiplies column tile c, its warp w dequantizing 16 of its columns (one packed word a lane
// and k16 step, the lanes' words turned across the 4 subtiles so that a warp's reads are free
// of bank conflicts) for one wgmma of 64 columns x BLOCK rows x k16 a step. Each dequantized
// weight serves BLOCK rows (32 in the wide CTA's tile) and each staged row 256 columns, as
// there. The ring's stages are laid out as the wide warpgroup CTA's (weights, chunk-major rows,
// a group's scales); every thread copies, STAGES - 2 stages ahead (the stage before the current
// one may still be read by a running wgmma), and mbarriers, not CTA barriers, say when a stage
// has landed and when every warp is done with it. The wgmmas multiply only the 32-row groups
// that hold slots. A tile's gate and up columns sit in different warps, so the accumulators go
// through shared memory as fp32 into the epilogue. Dynamic shared memory: DYNAMIC_BYTES, at
// least the larger of the ring and the staged outputs (tall_shared_bytes in the tile pass).
// HAS_ZERO: zeros staged after the scales, as the wide CTA.
template <int BLOCK, int KDIM, int NTILES, int NOUT, int G, int STAGES, int KS, int DYNAMIC_BYTES,
          int ROW_DIV, int EPILOGUE, bool PERM_GATE_UP, bool MUL_WEIGHTS, int SUM_TOPK = 0,
          bool HAS_ZERO = false>
__device__ __forceinline__ void grouped_gemm_wgmma_tall(
    const act_t* __restrict__ a, const uint4* __restrict__ w, const uint4* __restrict__ scales,
    const uint4* __restrict__ zeros, const int* __restrict__ sorted_ids,
    const int* __restrict__ expert_ids, const int* __restrict__ total_ptr,
    const float* __restrict__ weights_flat, int num_slots, act_t* __restrict__ out,
    act_t* __restrict__ sum_out = nullptr, int* __restrict__ sum_counters = nullptr,
    float* __restrict__ partials = nullptr, int* __restrict__ counters = nullptr,
    Routed routed = {}) {
  // (partials and counters: the wide CTAs' arguments, unused: the tall tile never splits K)
  constexpr int COLT = 4, THREADS = 128 * COLT;  // a warpgroup per column tile
  constexpr int KSTEPS = KDIM / 16, ITERS = KSTEPS / KS, GROUPS = KDIM / G;
  static_assert(BLOCK == 128, "4 groups of 32 rows (block 64 measured 30-60% slower)");
  static_assert(NTILES % COLT == 0, "whole CTAs of 4 column tiles");
  static_assert(KSTEPS % KS == 0 && G % (16 * KS) == 0, "the k16 steps of a stage share a group");
  static_assert(KS % 2 == 0, "A fragments alternate between two register sets by step parity");
  static_assert(STAGES >= 3, "the ring keeps a stage for the wgmma in flight");
  constexpr int GROUP_ITERS = G / (16 * KS);
  using BlockRows = ChunkMajorRows<BLOCK, KS, THREADS, KDIM, ROW_DIV>;
  constexpr int COLUMN_BYTES = BlockRows::COLUMN_BYTES;  // the rows' k8 chunk columns
  constexpr int W_BYTES = COLT * KS * 512, A_BYTES = BlockRows::BYTES;
  constexpr int S_OFFSET = W_BYTES + A_BYTES;  // a group's scales (copy_group_scales)
  constexpr int Z_OFFSET = S_OFFSET + COLT * SCALE_STAGE_BYTES;  // and zeros (HAS_ZERO)
  constexpr int STAGE_BYTES = S_OFFSET + group_stage_bytes<COLT, HAS_ZERO>();
  constexpr int AHEAD = STAGES - 2;
  constexpr int RED_ROW = 64 + 4;  // fp32 words of a staged output row (conflict-free writes)
  // fp32 words from one column tile's staged rows to the next's: 4 more than the rows, so that
  // the epilogue's 16-byte reads of a row's adjacent tiles fall on different banks
  constexpr int RED_TILE = BLOCK * RED_ROW + 4;
  static_assert(STAGES * STAGE_BYTES <= DYNAMIC_BYTES && COLT * RED_TILE * 4 <= DYNAMIC_BYTES,
                "the launch's dynamic shared memory holds the ring and the fp32 outputs");
  unsigned char* smem = dynamic_shared;

  const int blk = blockIdx.x, col_tile = blockIdx.y;  // blocks vary fastest (weights from L2)
  // The call's padded total, the block's expert and its rows' slot ids (and MUL_WEIGHTS: router
  // weights) are read together, before the test that ends the CTAs past the call's blocks: one
  // global-memory latency at the CTA's start, not two. (The grid and the buffers are sized for
  // the largest call's blocks, so the reads stay inside the buffers.)
  const int total = *total_ptr;
  const int expert = expert_ids[blk];
  const int slot_here = threadIdx.x < BLOCK ? sorted_ids[blk * BLOCK + threadIdx.x] : num_slots;
  const float weight_here =
      MUL_WEIGHTS && threadIdx.x < BLOCK ? weights_flat[blk * BLOCK + threadIdx.x] : 1.0f;
  // copies of one stage: the weights by copy_weight_stage, the rows by ChunkMajorRows
  const BlockRows block_rows(a, sorted_ids, blk, num_slots);
  if (blk * BLOCK >= total) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4, subtile = warp % 4;  // column tile wg of the CTA's, warp subtile of it
  // The 16-column subtile whose packed words this lane dequantizes: warp `subtile`'s own, turned
  // by lane / 8. The packed tile keeps a lane's 4 subtiles in one 16-byte piece, so word
  // `subtile` of every lane's piece would fall on 8 banks (4-way conflicted); turned, a warp's 32
  // words fall on 32. The wgmma's A rows 16 subtile + lane / 4 (+ 8) are then columns 16 src +
  // lane / 4 (+ 8) of the tile, and so are the lane's accumulator rows.
  const int src = (subtile + lane / 8) % 4;

  const uint4* w_cta = w + ((size_t)expert * KSTEPS * NTILES + col_tile * COLT) * 32;
  const uint4* s_cta = scales + ((size_t)expert * GROUPS * NTILES + col_tile * COLT) * 8;
  const uint4* z_cta = zeros + ((size_t)expert * GROUPS * NTILES + col_tile * COLT) * 8;
  auto issue_weights = [&](int i) {
    unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
    copy_weight_stage<COLT, KS, NTILES, THREADS>(st, w_cta, i * KS);
    if (i % GROUP_ITERS == 0) {
      copy_group_scales<COLT>(st + S_OFFSET, s_cta + (size_t)(i / GROUP_ITERS) * NTILES * 8);
      if constexpr (HAS_ZERO)
        copy_group_scales<COLT>(st + Z_OFFSET, z_cta + (size_t)(i / GROUP_ITERS) * NTILES * 8);
    }
  };
  auto issue_rows = [&](int i) {
    block_rows.copy(smem + (i % STAGES) * STAGE_BYTES + W_BYTES, i * KS);
  };

  // acc[4 q + c]: column 16 src + lane / 4 + 8 (c / 2) of the warpgroup's tile, block row
  // 8 q + 2 (lane % 4) + c % 2
  float acc[BLOCK / 2];
  act2_t scale_now;      // the lane's two columns' scales, the current group's
  act2_t zero_now = {};  // (and zeros, HAS_ZERO)
  unsigned frag[2][4];   // [step parity]: A fragments

  // full[s]: ring slot s has landed (every thread's copies of it); empty[s]: every warp's
  // wgmmas are done with it. Every thread copies and multiplies, and waits only for the stage
  // it reads and the slot it refills (a CTA-wide barrier a stage measured 11% slower).
  __shared__ unsigned long long full[STAGES], empty[STAGES];
  if (threadIdx.x < STAGES) {
    mbar_init(&full[threadIdx.x], THREADS);
    mbar_init(&empty[threadIdx.x], THREADS);
  }
  // The block's slot ids and router weights, staged for the epilogue (read there from global
  // memory a row at a time, they held 7% of the down GEMM's stall samples at Qwen3 T = 2048)
  __shared__ int row_slot[BLOCK];
  __shared__ float row_weight[MUL_WEIGHTS ? BLOCK : 1];
  if (threadIdx.x < BLOCK) {
    row_slot[threadIdx.x] = slot_here;
    if constexpr (MUL_WEIGHTS) row_weight[threadIdx.x] = weight_here;
  }
  // the block's rows that hold slots (its expert's come first, then padding): the wgmmas
  // multiply only the 32-row groups that hold any (an expert's last block is mostly part full)
  const int rows = __syncthreads_count(slot_here < num_slots);
#pragma unroll
  for (int s = 0; s < AHEAD; ++s)
    if (s < ITERS) {
      issue_weights(s);
      issue_rows(s);
      cp_async_mbar_arrive(&full[s]);
    }

  // the K loop whose wgmmas multiply the block's first N rows
  // (the accumulators are zeroed here, and those past N after the loop: zeroed before the
  // branch, ptxas serializes the wgmmas)
  auto k_loop = [&](auto n_rows) {
    constexpr int N = decltype(n_rows)::value;
#pragma unroll
    for (int j = 0; j < N / 2; ++j) acc[j] = 0.0f;
    for (int i = 0; i < ITERS; ++i) {
      const int slot = i % STAGES;
      mbar_wait(&full[slot], (i / STAGES) & 1);
      fence_proxy_async();  // the copies, where the tensor cores will read them
      const unsigned char* st = smem + slot * STAGE_BYTES;
      // the lane's weight words of every step of the stage (word `src` of its 16 bytes of the
      // tile) and a group's scales, read before the copies are issued (their loads then wait
      // behind no copy, and the copies' address registers are not yet taken)
      unsigned words[KS];
#pragma unroll
      for (int sub = 0; sub < KS; ++sub)
        words[sub] =
            *reinterpret_cast<const unsigned*>(st + (sub * COLT + wg) * 512 + lane * 16 + 4 * src);
      if (i % GROUP_ITERS == 0) {  // a scale group starts: its scales are in stage i
        scale_now =
            *reinterpret_cast<const act2_t*>(st + S_OFFSET + (wg * 8 + lane / 4) * 16 + 4 * src);
        if constexpr (HAS_ZERO)
          zero_now =
              *reinterpret_cast<const act2_t*>(st + Z_OFFSET + (wg * 8 + lane / 4) * 16 + 4 * src);
      }
      const int next = i + AHEAD;
      if (next < ITERS) {  // into the slot of stage next - STAGES, once consumed
        if (next >= STAGES) mbar_wait(&empty[next % STAGES], (next / STAGES - 1) & 1);
        issue_weights(next);
        issue_rows(next);
        cp_async_mbar_arrive(&full[next % STAGES]);
      }
#pragma unroll
      for (int sub = 0; sub < KS; ++sub) {
        wgmma_wait<1>();  // frag[sub % 2]'s last wgmma is done
        // ... and with sub = 1 every wgmma of stage i - 1 (a predicated arrive: a branch
        // between the wgmmas makes ptxas serialize them)
        if (sub == 1) mbar_arrive_if(&empty[(i + STAGES - 1) % STAGES], i > 0);
        unsigned (&f)[4] = frag[sub % 2];
        act2_t h[4];
        dequant8(words[sub], h);
        if constexpr (HAS_ZERO) zero_frag(h, zero_now);
        scale_frag(h, scale_now);
#pragma unroll
        for (int r = 0; r < 4; ++r) f[r] = *reinterpret_cast<const unsigned*>(&h[r]);
        // B: rows 0 .. N - 1 of k16 step `sub`: k8 chunks 2 sub and 2 sub + 1
        const unsigned long long desc =
            wgmma_desc(st + W_BYTES + sub * 2 * COLUMN_BYTES, COLUMN_BYTES, 128);
        wgmma_fence();
        wgmma_f16<N>(reinterpret_cast<float (&)[N / 2]>(acc), f, desc);
        wgmma_commit();
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < N / 2; ++j) reg_fence(acc[j]);
#pragma unroll
    for (int j = N / 2; j < BLOCK / 2; ++j) acc[j] = 0.0f;
  };
  if (rows > 96)
    k_loop(RowCount<128>());
  else if (rows > 64)
    k_loop(RowCount<96>());
  else if (rows > 32)
    k_loop(RowCount<64>());
  else
    k_loop(RowCount<32>());
  __syncthreads();  // the ring is free: the outputs reuse it

  // the accumulators as fp32 rows of each column tile: red[tile][row][column] (every row: the
  // stores skipping the row groups past `rows` made Mixtral T = 256 1.4% slower)
  float* red = reinterpret_cast<float*>(smem);
  {
    float* mine = red + wg * RED_TILE + 16 * src + lane / 4;
#pragma unroll
    for (int q = 0; q < BLOCK / 8; ++q)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        mine[(8 * q + 2 * (lane % 4) + (c & 1)) * RED_ROW + (c >= 2 ? 8 : 0)] = acc[4 * q + c];
  }
  __syncthreads();
  // the 16-byte output pieces of the block's first `rows` rows, those that hold slots (an
  // expert's last block is mostly padding), x = (row, tile, piece), pieces fastest: a warp
  // writes whole stretches of output rows (the tiles' columns are adjacent)
  constexpr int OUT_CHUNKS = (EPILOGUE == 1 ? 32 : 64) / 8;  // 16-byte pieces of a tile's row
  for (int x = threadIdx.x; x < rows * COLT * OUT_CHUNKS; x += THREADS) {
    const int ch = x % OUT_CHUNKS, t = x / OUT_CHUNKS % COLT, r = x / (OUT_CHUNKS * COLT);
    const int slot = row_slot[r];
    if (slot >= num_slots) continue;
    const int tile = col_tile * COLT + t;
    const int col = wide_out_column<EPILOGUE, PERM_GATE_UP, NOUT>(tile, ch);
    if (col >= NOUT) continue;
    // the chunk's 8 fp32 values (and SwiGLU: the up values 32 columns on), 16 bytes a read
    // (rows of 272 bytes, tiles 16 bytes apart: 8 ch words into a row is 16-byte aligned)
    const float4* row = reinterpret_cast<const float4*>(red + t * RED_TILE + r * RED_ROW + 8 * ch);
    float v[8], up[8];
    *reinterpret_cast<float4*>(&v[0]) = row[0];
    *reinterpret_cast<float4*>(&v[4]) = row[1];
    if constexpr (EPILOGUE == 1) {
      *reinterpret_cast<float4*>(&up[0]) = row[8];
      *reinterpret_cast<float4*>(&up[4]) = row[9];
    }
    const float weight = MUL_WEIGHTS ? row_weight[r] : 1.0f;
    uint4 packed;
    act_t* h = reinterpret_cast<act_t*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (EPILOGUE == 1)  // SwiGLU: columns 0..31 gate, 32..63 up
        h[j] = act_from_float(silu(v[j]) * up[j]);
      else if constexpr (MUL_WEIGHTS)
        h[j] = act_from_float(v[j] * weight);
      else
        h[j] = act_from_float(v[j]);
    }
    *reinterpret_cast<uint4*>(out + (size_t)slot * NOUT + col) = packed;
  }

  if constexpr (SUM_TOPK > 0)
    sum_topk_when_last<BLOCK, COLT, THREADS, NOUT, SUM_TOPK>(out, sum_out, sum_counters, col_tile,
                                                             total_ptr, num_slots, routed);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace moegen
