// moegen device code: the grouped W4A16 GEMM of prefill-sized calls on mma.sync: the wide CTA
// (moegen::grouped_gemm_wide), its split-K gather and its epilogue.
#pragma once

namespace moegen {

// ---------------------------------------------------------------------------------------------
// The wide CTAs' copies of one ring stage, spread over the CTA's THREADS threads.
// Weights: chunk c (16 B) is lane c % 32 of column tile c / 32 % COLT at k16 step c / (32 COLT),
// stored in that order.
template <int COLT, int KS, int NTILES, int THREADS>
__device__ __forceinline__ void copy_weight_stage(unsigned char* st, const uint4* w_cta, int step) {
  constexpr int W_CHUNKS = COLT * KS * 32, W_COPIES = (W_CHUNKS + THREADS - 1) / THREADS;
#pragma unroll
  for (int q = 0; q < W_COPIES; ++q) {
    const int c = q * THREADS + threadIdx.x;
    if (W_CHUNKS % THREADS != 0 && c >= W_CHUNKS) continue;
    cp_async16(st + 16 * c,
               w_cta + (size_t)(step + c / (32 * COLT)) * NTILES * 32 + c % (32 * COLT));
  }
}

// The wide CTAs' accumulators, acc[column subtile t][n8 tile of rows][4], set to zero
template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[4][NT][4]) {
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[t][nt][c] = 0.0f;
}

// Split-K of the wide CTAs (SPLIT > 1, decode-sized calls): the CTAs of one tile, one per K
// range, leave their fp32 sums in `partials`, thread by thread in 16-byte pieces; the last to
// arrive adds them up in split order (so the result does not depend on which one that is) into
// v and returns true, the others return false. `splits`: the K ranges of this call (SPLIT,
// or fewer where call_split chose so).
template <int SPLIT, int THREADS, int N>
__device__ __forceinline__ bool split_k_gather(float (&v)[N], float* __restrict__ partials,
                                               int* __restrict__ counters, int tile_id, int split,
                                               int& flag, int splits = SPLIT) {
  static_assert(N % 4 == 0, "whole 16-byte pieces");
  constexpr int PIECES = N / 4;
  float4* base = reinterpret_cast<float4*>(partials) + (size_t)tile_id * SPLIT * PIECES * THREADS +
                 threadIdx.x;
  float4* mine = base + (size_t)split * PIECES * THREADS;
#pragma unroll
  for (int j = 0; j < PIECES; ++j)
    mine[j * THREADS] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
  if (!last_to_arrive(&counters[tile_id], splits, flag)) return false;
  // (unrolled over the splits: at the decode bucket's 128-register cap a split gate/up kernel
  // spills 28-76 bytes so, yet on the H200 the layer ran 1-2% faster than with the splits
  // added one at a time, each with all its pieces in flight, which does not spill)
#pragma unroll
  for (int j = 0; j < PIECES; ++j) {
    float4 sum = __ldcg(base + j * THREADS);
#pragma unroll
    for (int s = 1; s < SPLIT; ++s) {
      // (ranges past this call's add zeros: a branch here costs the decode CTA registers)
      const float4 p = s < splits ? __ldcg(base + ((size_t)s * PIECES + j) * THREADS)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      sum.x += p.x;
      sum.y += p.y;
      sum.z += p.z;
      sum.w += p.w;
    }
    v[4 * j] = sum.x;
    v[4 * j + 1] = sum.y;
    v[4 * j + 2] = sum.z;
    v[4 * j + 3] = sum.w;
  }
  return true;
}

// A split chosen per call (a decode bucket's wide CTA, whose grid has SPLIT CTAs along K): the
// call runs SPLIT_MANY of them, unless its moe blocks leave that grid (blocks x COL_CTAS x
// SPLIT_MANY CTAs) short of FILL_CTAS, most of the CTAs the SMs hold at once; then all SPLIT.
// (The number of blocks depends on how many experts the routing picks.)
template <int BLOCK, int COL_CTAS, int SPLIT, int SPLIT_MANY, int FILL_CTAS>
__device__ __forceinline__ int call_split(int total) {
  if constexpr (SPLIT_MANY == SPLIT)
    return SPLIT;
  else
    return total / BLOCK * COL_CTAS * SPLIT_MANY < FILL_CTAS ? SPLIT : SPLIT_MANY;
}

// The output column of 16-byte piece `ch` of a wide CTA's row of column tile `tile`: SwiGLU's
// 32 columns of the tile; or 64 columns, gate/up's (PERM_GATE_UP: 0..31 gate, 32..63 up) or
// the tile's own.
template <int EPILOGUE, bool PERM_GATE_UP, int NOUT>
__device__ __forceinline__ int wide_out_column(int tile, int ch) {
  if constexpr (EPILOGUE == 1)
    return tile * 32 + 8 * ch;
  else if constexpr (PERM_GATE_UP)
    return ch < 4 ? tile * 32 + 8 * ch : NOUT / 2 + tile * 32 + 8 * (ch - 4);
  else
    return tile * 64 + 8 * ch;
}

// SUM_TOPK (fuse-topk-sum): once every moe block's CTA of column tile `col_tile` (COLT 64-column
// tiles) has written its rows, the last to arrive sums the tile for every token, in k order
// (topk_sum_chunk)
template <int BLOCK, int COLT, int THREADS, int NOUT, int SUM_TOPK>
__device__ __forceinline__ void sum_topk_when_last(act_t* __restrict__ out,
                                                   act_t* __restrict__ sum_out,
                                                   int* __restrict__ sum_counters, int col_tile,
                                                   const int* __restrict__ total_ptr, int num_slots,
                                                   Routed routed) {
  __shared__ int last_cta;
  if (!last_to_arrive(&sum_counters[col_tile], *total_ptr / BLOCK, last_cta)) return;
  constexpr int PIECES = 8 * COLT;  // 8-column pieces of the CTA's columns
  const int tokens = num_slots / SUM_TOPK;
  for (int x = threadIdx.x; x < tokens * PIECES; x += THREADS) {
    const int col = col_tile * COLT * 64 + (x % PIECES) * 8;
    if (col < NOUT) topk_sum_chunk<SUM_TOPK, NOUT, true>(out, x / PIECES, col, sum_out, routed);
  }
}

// The wide CTAs' epilogue: each warp's accumulators (acc[t][nt]: columns 16 t .. 16 t + 15 of
// its 64-column tile, rows row0 + 8 nt .. + 7) as fp16 into shared memory (SwiGLU, or times the
// routing weight), then out in 16-byte pieces; padding rows write nothing. SUM_TOPK > 0: the
// last of the column tile's CTAs to arrive sums the tile for every token. `smem`: at least
// WARPS x WARP_ROWS x (OUT_COLS + 8) halves, free (the caller synchronised after its ring).
template <int BLOCK, int WARP_ROWS, int COLT, int NOUT, int EPILOGUE, bool PERM_GATE_UP,
          bool MUL_WEIGHTS, int SUM_TOPK>
__device__ __forceinline__ void wide_epilogue(const float (&acc)[4][WARP_ROWS / 8][4],
                                              unsigned char* smem, int row0, int tile,
                                              const int* __restrict__ sorted_ids,
                                              const int* __restrict__ total_ptr,
                                              const float* __restrict__ weights_flat, int num_slots,
                                              act_t* __restrict__ out, act_t* __restrict__ sum_out,
                                              int* __restrict__ sum_counters, Routed routed) {
  constexpr int NT = WARP_ROWS / 8, THREADS = 32 * COLT * (BLOCK / WARP_ROWS);
  constexpr int OUT_COLS = EPILOGUE == 1 ? 32 : 64, OUT_ROW = OUT_COLS + 8;
  const int blk = blockIdx.x, col_tile = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  act_t* rows_out = reinterpret_cast<act_t*>(smem) + warp * WARP_ROWS * OUT_ROW;
  const int kq = 2 * (lane % 4);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = nt * 8 + kq + (c & 1);          // row within the warp's
      const int col = lane / 4 + (c >= 2 ? 8 : 0);  // + 16 t
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        if constexpr (EPILOGUE == 1) {  // SwiGLU: t = 0, 1 gate, t = 2, 3 up (columns + 32)
          if (t < 2)
            rows_out[r * OUT_ROW + 16 * t + col] =
                act_from_float(silu(acc[t][nt][c]) * acc[t + 2][nt][c]);
        } else {
          float v = acc[t][nt][c];
          if constexpr (MUL_WEIGHTS) v *= weights_flat[blk * BLOCK + row0 + r];
          rows_out[r * OUT_ROW + 16 * t + col] = act_from_float(v);
        }
      }
    }
  __syncwarp();
  constexpr int OUT_CHUNKS = OUT_COLS / 8;  // 16-byte pieces of a row
  for (int x = lane; x < WARP_ROWS * OUT_CHUNKS; x += 32) {
    const int r = x / OUT_CHUNKS, ch = x % OUT_CHUNKS;
    const int slot = sorted_ids[blk * BLOCK + row0 + r];
    if (slot >= num_slots) continue;
    const int col = wide_out_column<EPILOGUE, PERM_GATE_UP, NOUT>(tile, ch);
    if (col >= NOUT) continue;
    *reinterpret_cast<uint4*>(out + (size_t)slot * NOUT + col) =
        *reinterpret_cast<const uint4*>(rows_out + r * OUT_ROW + 8 * ch);
  }

  if constexpr (SUM_TOPK > 0)
    sum_topk_when_last<BLOCK, COLT, THREADS, NOUT, SUM_TOPK>(out, sum_out, sum_counters, col_tile,
                                                             total_ptr, num_slots, routed);
}

// The scales (and HAS_ZERO: zeros) a ring stage holds after its weights and rows where a scale
// group starts: COLT tiles' of each, SCALE_STAGE_BYTES a tile
template <int COLT, bool HAS_ZERO>
__host__ __device__ constexpr int group_stage_bytes() {
  return COLT * SCALE_STAGE_BYTES * (HAS_ZERO ? 2 : 1);
}

// Prefill-sized grouped W4A16 GEMM: the "wide" CTA. BLOCK rows (32 or 64) of one expert x COLT
// 64-column tiles over the whole K (or, SPLIT > 1, one of SPLIT ranges of whole scale groups,
// for decode-sized calls; the partial sums meet in split_k_gather); warp (c, h) multiplies
// column tile c with block rows WARP_ROWS h .. WARP_ROWS (h + 1) - 1 (32 or 64 rows: 64 halve
// the dequantization work per MMA at twice the accumulator registers). The CTA's threads fill
// one ring of STAGES shared-memory stages together, each stage KS k16 steps of the COLT weight
// tiles and the block's rows, so a staged activation row serves COLT x 64 columns and a staged
// weight tile every row group (the K-split CTA above stages both per warp: at prefill sizes its
// L2 traffic, not the tensor cores, sets its pace). The rows' B fragments come from ldmatrix;
// the weights are scaled before the MMA (a warp's rows leave no registers for per-group partial
// sums). The epilogue goes through shared memory so that each output row is written in 16-byte
// pieces. HAS_ZERO: a group's zeros are staged after its scales, and each dequantized weight is
// less its zero before the scale.
template <int BLOCK, int WARP_ROWS, int COLT, int KDIM, int NTILES, int NOUT, int G, int STAGES,
          int KS, int ROW_DIV, int EPILOGUE, bool PERM_GATE_UP, bool MUL_WEIGHTS, int SUM_TOPK = 0,
          int SPLIT = 1, int SPLIT_MANY = SPLIT, int FILL_CTAS = 0, int DYNAMIC_BYTES = 0,
          bool HAS_ZERO = false>
__device__ __forceinline__ void grouped_gemm_wide(
    const act_t* __restrict__ a, const uint4* __restrict__ w, const uint4* __restrict__ scales,
    const uint4* __restrict__ zeros, const int* __restrict__ sorted_ids,
    const int* __restrict__ expert_ids, const int* __restrict__ total_ptr,
    const float* __restrict__ weights_flat, int num_slots, act_t* __restrict__ out,
    act_t* __restrict__ sum_out = nullptr, int* __restrict__ sum_counters = nullptr,
    float* __restrict__ partials = nullptr, int* __restrict__ counters = nullptr,
    Routed routed = {}) {
  constexpr int ROW_GROUPS = BLOCK / WARP_ROWS, WARPS = COLT * ROW_GROUPS, THREADS = 32 * WARPS;
  constexpr int NT = WARP_ROWS / 8;  // n8 tiles of a warp's rows
  constexpr int KSTEPS = KDIM / 16, ITERS = KSTEPS / KS, GROUPS = KDIM / G;
  static_assert(
      (WARP_ROWS == 32 || WARP_ROWS == 64) && BLOCK % WARP_ROWS == 0 && NTILES % COLT == 0,
      "whole row groups of 32 or 64 and whole column tiles");
  static_assert(KSTEPS % KS == 0 && G % (16 * KS) == 0, "the k16 steps of a stage share a group");
  static_assert(STAGES >= 2, "the copy ring needs two stages");
  constexpr int GROUP_ITERS = G / (16 * KS), CTA_ITERS = ITERS / SPLIT;
  static_assert(ITERS % SPLIT == 0 && CTA_ITERS % GROUP_ITERS == 0,
                "K splits into whole scale groups");
  // a stage: weights [KS][COLT][32 lanes] x 16 B, then the block's rows, 32 KS bytes of k each,
  // padded by 16 so that ldmatrix's eight row addresses hit distinct banks, then the group's
  // scales where a group starts (copy_group_scales)
  constexpr int W_BYTES = COLT * KS * 512, A_ROW = 32 * KS + 16;
  constexpr int S_OFFSET = W_BYTES + BLOCK * A_ROW, Z_OFFSET = S_OFFSET + COLT * SCALE_STAGE_BYTES;
  constexpr int STAGE_BYTES = S_OFFSET + group_stage_bytes<COLT, HAS_ZERO>();
  static_assert(STAGE_BYTES % 128 == 0, "ring stages on 128-byte lines");
  constexpr int RING_BYTES = STAGES * STAGE_BYTES;
  // the epilogue's output rows: per warp WARP_ROWS rows of OUT_COLS halves, padded by 8
  constexpr int OUT_COLS = EPILOGUE == 1 ? 32 : 64, OUT_ROW = OUT_COLS + 8;
  constexpr int OUT_BYTES = WARPS * WARP_ROWS * OUT_ROW * 2;
  // (DYNAMIC_BYTES > 0: the launch gives that much dynamic shared memory, which must hold both)
  constexpr bool DYNAMIC = DYNAMIC_BYTES > 0;
  static_assert(!DYNAMIC || (RING_BYTES <= DYNAMIC_BYTES && OUT_BYTES <= DYNAMIC_BYTES),
                "the launch's dynamic shared memory holds the ring and the output rows");
  __shared__ __align__(128) unsigned char static_shared[DYNAMIC                  ? 16
                                                        : RING_BYTES > OUT_BYTES ? RING_BYTES
                                                                                 : OUT_BYTES];
  unsigned char* smem = DYNAMIC ? dynamic_shared : static_shared;

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
  const int ct = warp % COLT, row0 = warp / COLT * WARP_ROWS;  // column tile, first row
  const int tile = col_tile * COLT + ct;                       // this warp's 64-column tile

  // copies of one stage, spread over the CTA's threads: the weights by copy_weight_stage;
  // activation chunk c is part c % CHUNKS of row c / CHUNKS (padding rows copy 0 bytes of row 0
  // and zero-fill)
  constexpr int CHUNKS = 2 * KS, A_CHUNKS = BLOCK * CHUNKS;
  constexpr int A_COPIES = (A_CHUNKS + THREADS - 1) / THREADS;
  const act_t* copy_row[A_COPIES];
  unsigned copy_bytes[A_COPIES];
#pragma unroll
  for (int q = 0; q < A_COPIES; ++q) {
    const int c = q * THREADS + threadIdx.x;
    const int slot = c < A_CHUNKS ? sorted_ids[blk * BLOCK + c / CHUNKS] : num_slots;
    copy_bytes[q] = slot < num_slots ? 16u : 0u;
    copy_row[q] = a + (size_t)(slot < num_slots ? slot / ROW_DIV : 0) * KDIM + 8 * (c % CHUNKS);
  }
  const uint4* w_cta = w + ((size_t)expert * KSTEPS * NTILES + col_tile * COLT) * 32;
  const size_t group_offset = (((size_t)expert * GROUPS + group0) * NTILES + col_tile * COLT) * 8;
  const uint4* s_cta = scales + group_offset;
  const uint4* z_cta = zeros + group_offset;  // (HAS_ZERO)
  // copy iteration i's k16 steps into its stage: the weights (and a group's scales and zeros),
  // then the rows
  auto issue_weights = [&](int i) {
    unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
    copy_weight_stage<COLT, KS, NTILES, THREADS>(st, w_cta, (it0 + i) * KS);
    if (i % GROUP_ITERS == 0) {
      copy_group_scales<COLT>(st + S_OFFSET, s_cta + (size_t)(i / GROUP_ITERS) * NTILES * 8);
      if constexpr (HAS_ZERO)
        copy_group_scales<COLT>(st + Z_OFFSET, z_cta + (size_t)(i / GROUP_ITERS) * NTILES * 8);
    }
  };
  auto issue_rows = [&](int i) {
    unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
    const int step = (it0 + i) * KS;
#pragma unroll
    for (int q = 0; q < A_COPIES; ++q) {
      const int c = q * THREADS + threadIdx.x;
      if (A_CHUNKS % THREADS != 0 && c >= A_CHUNKS) continue;
      cp_async16_zfill(st + W_BYTES + (c / CHUNKS) * A_ROW + 16 * (c % CHUNKS),
                       copy_row[q] + step * 16, copy_bytes[q]);
    }
  };
  auto issue = [&](int i) {
    issue_weights(i);
    issue_rows(i);
  };

  // the lane's scales (columns 8 j + lane / 4 of its tile), the current group's (and zeros)
  uint4 scale_now, zero_now = {};

  // acc[t][nt]: columns 16 t .. 16 t + 15 of the tile, rows row0 + 8 nt .. + 7
  float acc[4][NT][4];
  zero_acc(acc);

  // ldmatrix.x4 rows: lane l gives row l % 8 of matrix l / 8 = (n8 tile pair half l / 16,
  // k half l / 8 % 2), so one call returns b0, b1 of two n8 tiles
  const int ld_row = row0 + (lane / 16) * 8 + lane % 8, ld_k = (lane / 8) % 2 * 16;
  auto multiply_stage = [&](int i) {
    const unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
    const act2_t* sc = reinterpret_cast<const act2_t*>(&scale_now);  // (column r, r + 8) per t
    const act2_t* zc = reinterpret_cast<const act2_t*>(&zero_now);
#pragma unroll
    for (int sub = 0; sub < KS; ++sub) {
      const uint4 wv = *reinterpret_cast<const uint4*>(st + (sub * COLT + ct) * 512 + lane * 16);
      unsigned b[NT][2];
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        unsigned r[4];
        ldmatrix_x4(r, st + W_BYTES + (ld_row + 16 * p) * A_ROW + sub * 32 + ld_k);
        b[2 * p][0] = r[0];
        b[2 * p][1] = r[1];
        b[2 * p + 1][0] = r[2];
        b[2 * p + 1][1] = r[3];
      }
      const unsigned words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        act2_t frag[4];
        dequant8(words[t], frag);  // rows r, r + 8, r, r + 8 of the A fragment
        if constexpr (HAS_ZERO) zero_frag(frag, zc[t]);
        scale_frag(frag, sc[t]);
        const unsigned* af = reinterpret_cast<const unsigned*>(frag);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_16816(acc[t][nt], af, b[nt][0], b[nt][1]);
      }
    }
  };

  prime_ring<STAGES - 1, false>(cta_iters, issue_weights, issue_rows);
  // (not unrolled: where a split leaves a CTA a few iterations, a constant, ptxas unrolled
  // them whole and spilled 100-180 bytes at the decode bucket's 128-register cap)
#pragma unroll 1
  for (int i = 0; i < cta_iters; ++i) {
    cp_async_wait<STAGES - 2>();  // stage i has landed (this thread's copies) ...
    __syncthreads();              // ... everyone's; and stage i - 1 is read by all
    if (i + STAGES - 1 < cta_iters) issue(i + STAGES - 1);  // into stage i - 1's slot
    cp_async_commit();
    if (i % GROUP_ITERS == 0) {  // a scale group starts: its scales are in stage i
      scale_now = staged_group_scales(smem + (i % STAGES) * STAGE_BYTES + S_OFFSET, ct, lane);
      if constexpr (HAS_ZERO)
        zero_now = staged_group_scales(smem + (i % STAGES) * STAGE_BYTES + Z_OFFSET, ct, lane);
    }
    multiply_stage(i);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: the output rows reuse it
  if constexpr (SPLIT > 1) {
    __shared__ int last_cta;
    auto& v = reinterpret_cast<float (&)[4 * NT * 4]>(acc);
    const int tile_id = blk * (NTILES / COLT) + col_tile;
    if (!split_k_gather<SPLIT, THREADS>(v, partials, counters, tile_id, split, last_cta, split_now))
      return;
  }

  wide_epilogue<BLOCK, WARP_ROWS, COLT, NOUT, EPILOGUE, PERM_GATE_UP, MUL_WEIGHTS, SUM_TOPK>(
      acc, smem, row0, tile, sorted_ids, total_ptr, weights_flat, num_slots, out, sum_out,
      sum_counters, routed);
}

}  // namespace moegen
