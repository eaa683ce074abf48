// moegen device code: the grouped W4A16 GEMM of decode-sized calls: the K-split CTA
// (moegen::grouped_gemm).
#pragma once

namespace moegen {

// Which CTA of a GEMM's grid this is (its moe block, column tile and K range), and, for a
// FOLLOWS CTA of the one-launch layer, what its ring waits for: ready[its block] reaching
// `count` (the gate/up CTAs of its block done), instead of the kernel before.
struct CtaWork {
  int blk, tile, split;
  const int* ready;
  int count;
};

__device__ __forceinline__ CtaWork grid_work() {
  return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z),
          nullptr, 0};
}

// The shared memory of a K-split CTA: its warps' copy rings, reused for the partial sums after
// the K loop (what grouped_gemm declares, or takes from its caller: ONE_LAUNCH).
template <int BLOCK, int SPLIT, int KDIM, int G, int WARPS, int STAGES, int KS, bool DENSE,
          bool HAS_ZERO>
__host__ __device__ constexpr int ksplit_shared_bytes() {
  constexpr int ROWS = (BLOCK + 7) / 8 * 8;
  constexpr int WARP_STEPS = KDIM / 16 / SPLIT / WARPS;
  constexpr bool STAGED_SCALES = !DENSE && WARP_STEPS % (G / 16) == 0;
  constexpr int STAGE_BYTES = 512 * KS + ROWS * (32 * KS + 16) +
                              (STAGED_SCALES ? SCALE_STAGE_BYTES * (HAS_ZERO ? 2 : 1) : 0);
  constexpr int RING_BYTES = WARPS * STAGES * STAGE_BYTES, RED_BYTES = ROWS * 64 * 4;
  return RING_BYTES > RED_BYTES ? RING_BYTES : RED_BYTES;
}

// ---------------------------------------------------------------------------------------------
// Grouped W4A16 GEMM. CTA = one moe block (BLOCK rows of one expert) x 64 columns x one of SPLIT
// K ranges; its WARPS warps split that range. Each warp streams its k16 steps, KS per stage,
// through its own ring of STAGES shared-memory stages filled by cp.async (weights and the
// block's activation rows), STAGES - 1 stages ahead of the tensor cores, so a warp keeps
// several KB in flight without holding them in registers; the fragments of the next stage are
// read while the current one is multiplied, and a group's scales are held in registers (they
// come through the ring, or from global memory: STAGED_SCALES). Partial sums meet in shared
// memory in warp order, then (SPLIT > 1) in a workspace, where the last CTA of a tile adds them
// in split order: deterministic. DENSE: rows are the activation rows
// themselves (one expert, no routing) and the scales come as [K/G, NOUT] fp16, unpacked.
// SUM_TOPK > 0 (epilogue topk_sum): after its rows, the last CTA to finish a column tile adds
// every token's SUM_TOPK routed rows of that tile into sum_out, in k order (topk_sum_chunk).
// HAS_ZERO (asymmetric int4): `zeros` holds z - 8 per group and column in the scales' packed
// layout; they come where the scales come from, and each dequantized weight is less its zero
// before the scale (zero_frag).
// FOLLOWS (the down GEMM, launched with programmatic dependent launch): the routing is final
// when the CTA starts, its input activations are not; so it copies the weights of its first
// STAGES ring stages, then waits for the kernel before it, then copies those stages' rows.
// WAITS_FIRST (the gate/up GEMM, launched so after the align kernel): the CTA waits for that
// kernel before it reads anything (the routing comes from it), and only then releases its own
// dependents, whose early reads take the routing as final.
// ONE_LAUNCH (a CTA of the one-launch layer, which runs both GEMMs' CTAs in one grid): `work`
// says which CTA this is and what a FOLLOWS CTA waits for (other CTAs of the grid, not the
// kernel before), the kernel passes the rings' memory (one buffer for either GEMM's CTA:
// ksplit_shared_bytes) instead of each declaring its own, and no dependent launch is released.
template <int BLOCK, int SPLIT, int KDIM, int NTILES, int NOUT, int G, int WARPS, int STAGES,
          int KS, int ROW_DIV, int EPILOGUE, bool PERM_GATE_UP, bool MUL_WEIGHTS, bool DENSE,
          int SUM_TOPK = 0, bool FOLLOWS = false, bool RELEASE_AFTER_LOOP = false,
          bool WAITS_FIRST = false, bool HAS_ZERO = false, bool ONE_LAUNCH = false>
__device__ __forceinline__ void grouped_gemm(
    const act_t* __restrict__ a, const uint4* __restrict__ w, const uint4* __restrict__ scales,
    const uint4* __restrict__ zeros, const int* __restrict__ sorted_ids,
    const int* __restrict__ expert_ids, const int* __restrict__ total_ptr,
    const float* __restrict__ weights_flat, int num_slots, act_t* __restrict__ out,
    float* __restrict__ partials, int* __restrict__ counters, act_t* __restrict__ sum_out = nullptr,
    int* __restrict__ sum_counters = nullptr, Routed routed = {}, CtaWork work = grid_work(),
    unsigned char* caller_shared = nullptr) {
  constexpr int NT = (BLOCK + 7) / 8;  // n8 tiles of block rows (the MMA's N)
  constexpr int KSTEPS = KDIM / 16;
  constexpr int CTA_STEPS = KSTEPS / SPLIT;
  constexpr int WARP_STEPS = CTA_STEPS / WARPS;
  constexpr int WARP_ITERS = WARP_STEPS / KS;  // ring stages a warp goes through
  static_assert(KSTEPS % (SPLIT * WARPS * KS) == 0, "K must split evenly over CTAs, warps, stages");
  static_assert(G % (16 * KS) == 0, "the k16 steps of one stage share a scale group");
  static_assert(STAGES >= 2, "the copy ring needs two stages");
  static_assert(!(DENSE && HAS_ZERO), "dense weights (the MSD dequant lowering) are symmetric");
  constexpr int ROWS = NT * 8;
  // Scales: a group's are the same for its G / 16 steps, so each lane holds its 8 (columns
  // 8 j + lane / 4) for the current group in registers. STAGED_SCALES (packed scales, each
  // warp's range whole groups): they come through the ring with the weights of the stage where
  // their group starts and are read from there (as in the wide CTAs: copy_group_scales says
  // why). Otherwise (DENSE: scales [K/G, NOUT] as given, rows of any alignment; or a range of
  // part groups, which measured slower staged: Qwen3's down GEMM at T = 16, 1.5 groups a warp,
  // 8%) each group's come from global memory while the one before runs.
  constexpr bool STAGED_SCALES = !DENSE && WARP_STEPS % (G / 16) == 0;
  // one ring stage holds KS k16 steps: weights (KS x 32 lanes x 16 B), then the block's rows,
  // 32 KS bytes of k each, padded by 16 so fragment reads hit 32 distinct banks, then
  // (STAGED_SCALES) where a scale group starts, the group's scales of the tile (and zeros)
  constexpr int W_BYTES = 512 * KS, A_ROW = 32 * KS + 16;
  constexpr int S_OFFSET = W_BYTES + ROWS * A_ROW, Z_OFFSET = S_OFFSET + SCALE_STAGE_BYTES;
  constexpr int STAGE_BYTES =
      S_OFFSET + (STAGED_SCALES ? SCALE_STAGE_BYTES * (HAS_ZERO ? 2 : 1) : 0);
  constexpr int RING_BYTES = WARPS * STAGES * STAGE_BYTES;
  constexpr int RED_BYTES = ROWS * 64 * 4;
  constexpr int GROUPS = KDIM / G;
  // every stage on a 128-byte line (a ring 16 bytes off a 32-byte boundary measured 10-20%
  // slower in the MSD kernel: docs/DESIGN.md)
  static_assert(STAGE_BYTES % 128 == 0, "ring stages on 128-byte lines");
  constexpr int SMEM_BYTES =
      ksplit_shared_bytes<BLOCK, SPLIT, KDIM, G, WARPS, STAGES, KS, DENSE, HAS_ZERO>();
  static_assert(SMEM_BYTES == (RING_BYTES > RED_BYTES ? RING_BYTES : RED_BYTES),
                "ksplit_shared_bytes sizes this CTA's rings");
  unsigned char* smem;
  if constexpr (ONE_LAUNCH) {
    smem = caller_shared;
  } else {
    __shared__ __align__(128) unsigned char own[SMEM_BYTES];
    smem = own;
  }
  __shared__ int last_cta;
  float (*red)[64] = reinterpret_cast<float (*)[64]>(smem);  // after the K loop

  // A kernel launched after this one with programmatic dependent launch (the down GEMM after
  // gate/up) may start once every CTA is here: its CTAs take the SMs this grid's last wave
  // leaves free and stream their first weights (measured: releasing after the K loop instead
  // gains less at T = 16 and loses 3% at Mixtral T = 64). RELEASE_AFTER_LOOP (a single token,
  // one wave of CTAs, no last wave to fill): only after the K loop, so that the dependents do
  // not take issue slots and bandwidth from it while they wait (measured: 2 us faster than
  // plain launches at Mixtral T = 1, where releasing at the start was 5 us slower).
  if constexpr (WAITS_FIRST) wait_for_previous_kernel();
  if constexpr (!RELEASE_AFTER_LOOP && !ONE_LAUNCH) release_dependents();
  // blocks vary fastest, so the CTAs that read one weight tile (all blocks of an expert) run
  // close together and the tile comes from DRAM once, from L2 after
  const int blk = work.blk, tile = work.tile, split = work.split;
  if (!DENSE && blk * BLOCK >= *total_ptr) return;  // grid is sized for the worst case
  const int expert = DENSE ? 0 : expert_ids[blk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto slot_of = [&](int r) {  // the slot of block row r, num_slots for padding
    if (DENSE) return blk * BLOCK + r < num_slots ? blk * BLOCK + r : num_slots;
    return r < BLOCK ? sorted_ids[blk * BLOCK + r] : num_slots;
  };

  // the activation chunks this lane copies: a staged row is CHUNKS 16-byte chunks, chunk
  // c = q * 32 + lane is part c % CHUNKS of row c / CHUNKS (lanes past A_CHUNKS copy nothing)
  constexpr int CHUNKS = 2 * KS, A_CHUNKS = ROWS * CHUNKS, COPIES = (A_CHUNKS + 31) / 32;
  // Each lane's copy sources (at the warp's first step), shared addresses (in stage 0) and
  // whether it copies at all are pinned: kept in registers, not recomputed in the main loop.
  const act_t* copy_src[COPIES];
  unsigned copy_bytes[COPIES];  // 16, or 0 for a padding row (which reads row 0)
  unsigned copy_dst[COPIES];
  unsigned copy_on[COPIES];
  const int step0 = split * CTA_STEPS + warp * WARP_STEPS;
  unsigned char* ring = smem + warp * STAGES * STAGE_BYTES;
#pragma unroll
  for (int q = 0; q < COPIES; ++q) {
    const int c = q * 32 + lane;
    const int slot = c < A_CHUNKS ? slot_of(c / CHUNKS) : num_slots;
    copy_bytes[q] = slot < num_slots ? 16u : 0u;
    copy_src[q] = pinned(a + (size_t)(slot < num_slots ? slot / ROW_DIV : 0) * KDIM +
                         8 * (c % CHUNKS) + step0 * 16);
    copy_dst[q] = pinned(smem_addr(ring + W_BYTES + (c / CHUNKS) * A_ROW + 16 * (c % CHUNKS)));
    copy_on[q] = pinned(c < A_CHUNKS ? 1u : 0u);
  }

  // acc[t][nt]: the m16n8 tile of columns 16 t .. 16 t + 15 and block rows 8 nt .. 8 nt + 7.
  // SCALE_AFTER (up to 16 rows, where registers allow): the MMAs multiply the unscaled int4
  // values (exact in fp16) into `part`, which is scaled in fp32 and added to acc once per
  // scale group, instead of scaling every dequantized pair before the MMA.
  constexpr bool SCALE_AFTER = NT <= 2;
  constexpr int PART_NT = SCALE_AFTER ? NT : 1;
  float acc[4][NT][4], part[4][PART_NT][4];
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[t][nt][c] = 0.0f;
#pragma unroll
      for (int nt = 0; nt < PART_NT; ++nt) part[t][nt][c] = 0.0f;
    }

  const uint4* wp = w + ((size_t)expert * KSTEPS * NTILES + tile) * 32 + lane;
  const WeightStream weights;
  const uint4* sp = scales + ((size_t)expert * GROUPS * NTILES + tile) * 8;  // (packed)
  const uint4* zp = zeros + ((size_t)expert * GROUPS * NTILES + tile) * 8;   // (HAS_ZERO)
  // copy the k16 steps of iteration i into its stage: the weights (and the scales of a group
  // that starts there), then the block's rows
  auto issue_weights = [&](int i) {
    unsigned char* st = ring + (i % STAGES) * STAGE_BYTES;
    const int step = step0 + i * KS;
#pragma unroll
    for (int sub = 0; sub < KS; ++sub)
      weights.copy16(st + sub * 512 + lane * 16, wp + (size_t)(step + sub) * NTILES * 32);
    if constexpr (STAGED_SCALES) {  // (the layout of copy_group_scales, one tile)
      if (lane < 8 && step * 16 % G == 0) {
        cp_async_ca<16>(st + S_OFFSET + lane * 16,
                        sp + (size_t)(step * 16 / G) * NTILES * 8 + lane);
        if constexpr (HAS_ZERO)
          cp_async_ca<16>(st + Z_OFFSET + lane * 16,
                          zp + (size_t)(step * 16 / G) * NTILES * 8 + lane);
      }
    }
  };
  auto issue_rows = [&](int i) {
#pragma unroll
    for (int q = 0; q < COPIES; ++q) {
      if (A_CHUNKS % 32 != 0 && !copy_on[q]) continue;
      // a padding row copies 0 bytes and zero-fills: one copy instruction either way
      cp_async16_zfill_at(copy_dst[q] + (i % STAGES) * STAGE_BYTES, copy_src[q] + i * KS * 16,
                          copy_bytes[q]);
    }
  };
  auto issue = [&](int i) {
    issue_weights(i);
    issue_rows(i);
  };

  // the lane's scales of a group from global memory (not STAGED_SCALES); DENSE: zero past the
  // last column
  auto load_scales = [&](int group) {
    uint4 v;
    if constexpr (DENSE) {
      act_t* h = reinterpret_cast<act_t*>(&v);
      const act_t* row = reinterpret_cast<const act_t*>(scales) + (size_t)group * NOUT;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = tile * 64 + j * 8 + lane / 4;
        h[j] = col < NOUT ? row[col] : act_from_float(0.0f);
      }
    } else {
      v = __ldg(sp + (size_t)group * NTILES * 8 + lane / 4);
    }
    return v;
  };
  auto load_zeros = [&](int group) {  // (HAS_ZERO, not STAGED_SCALES)
    return __ldg(zp + (size_t)group * NTILES * 8 + lane / 4);
  };
  auto staged_scales = [&](int i) {  // the scales in iteration i's stage (STAGED_SCALES)
    return staged_group_scales(ring + (i % STAGES) * STAGE_BYTES + S_OFFSET, 0, lane);
  };
  auto staged_zeros = [&](int i) {  // and the zeros (HAS_ZERO)
    return staged_group_scales(ring + (i % STAGES) * STAGE_BYTES + Z_OFFSET, 0, lane);
  };
  const int group0 = step0 * 16 / G;
  uint4 scale_now, scale_next, zero_now = {}, zero_next = {};
  if constexpr (!STAGED_SCALES) {
    const int group1 = group0 + 1 < GROUPS ? group0 + 1 : group0;
    scale_now = load_scales(group0);
    scale_next = load_scales(group1);
    if constexpr (HAS_ZERO) {
      zero_now = load_zeros(group0);
      zero_next = load_zeros(group1);
    }
  }

  // One stage's operands in registers: the weight words and the block rows' B fragments. The
  // fragments of stage i + 1 are read from shared memory while stage i's are multiplied.
  struct Frags {
    uint4 w[KS];
    unsigned b[KS][NT][2];
  };
  const int kq = 2 * (lane % 4);
  auto load_frags = [&](int i, Frags& f) {
    const unsigned char* st = ring + (i % STAGES) * STAGE_BYTES;
#pragma unroll
    for (int sub = 0; sub < KS; ++sub) {
      f.w[sub] = *reinterpret_cast<const uint4*>(st + sub * 512 + lane * 16);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {  // row 8 nt + lane / 4, k = kq, kq + 1 and + 8
        const unsigned char* r0 = st + W_BYTES + (nt * 8 + lane / 4) * A_ROW + sub * 32 + 2 * kq;
        f.b[sub][nt][0] = *reinterpret_cast<const unsigned*>(r0);
        f.b[sub][nt][1] = *reinterpret_cast<const unsigned*>(r0 + 16);
      }
    }
  };
  // The weights are the MMA's A operand (16 columns x k16 per word), the block rows its B
  // operand (n8 per 8 rows): a block of 8 rows wastes no tensor-core work on padding.
  auto multiply = [&](const Frags& f) {
    const act2_t* sc = reinterpret_cast<const act2_t*>(&scale_now);  // (column r, r + 8) per t
    const act2_t* zc = reinterpret_cast<const act2_t*>(&zero_now);
#pragma unroll
    for (int sub = 0; sub < KS; ++sub) {
      const unsigned words[4] = {f.w[sub].x, f.w[sub].y, f.w[sub].z, f.w[sub].w};
#pragma unroll
      for (int t = 0; t < 4; ++t) {  // word t: the A fragment of columns 16 t .. 16 t + 15
        act2_t frag[4];
        dequant8(words[t], frag);  // rows r, r + 8, r, r + 8 (r = lane / 4)
        if constexpr (HAS_ZERO) zero_frag(frag, zc[t]);
        if constexpr (!SCALE_AFTER) scale_frag(frag, sc[t]);
        const unsigned* af = reinterpret_cast<const unsigned*>(frag);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if constexpr (SCALE_AFTER)
            mma_16816(part[t][nt], af, f.b[sub][nt][0], f.b[sub][nt][1]);
          else
            mma_16816(acc[t][nt], af, f.b[sub][nt][0], f.b[sub][nt][1]);
        }
      }
    }
  };
  // iteration i: read stage i + 1 into `next`, refill stage i's slot (its fragments are in
  // registers since iteration i - 1), then multiply `cur`. Groups are committed one per stage
  // in stage order, so "stage i + 1 has landed" is "at most STAGES - 2 groups pending".
  auto iteration = [&](int i, const Frags& cur, Frags& next) {
    if (i + 1 < WARP_ITERS) {
      cp_async_wait<STAGES - 2>();  // stage i + 1 has landed (for this lane's copies) ...
      __syncwarp();                 // ... and for the warp's; every lane has read stage i
      load_frags(i + 1, next);
    }
    if (i + STAGES < WARP_ITERS) issue(i + STAGES);
    cp_async_commit();
    multiply(cur);
  };
  auto end_group = [&]() {  // SCALE_AFTER: acc += part x the group's scales
    if constexpr (SCALE_AFTER) {
      const act2_t* sc = reinterpret_cast<const act2_t*>(&scale_now);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const float s_lo = act_low(sc[t]), s_hi = act_high(sc[t]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc[t][nt][c] += part[t][nt][c] * (c < 2 ? s_lo : s_hi);
            part[t][nt][c] = 0.0f;
          }
      }
    }
  };
  auto next_group = [&](int i) {  // a group starts at iteration i (its stage landed)
    end_group();
    if constexpr (STAGED_SCALES) {
      scale_now = staged_scales(i);
      if constexpr (HAS_ZERO) zero_now = staged_zeros(i);
    } else {
      const int group = (step0 + i * KS) * 16 / G;
      scale_now = scale_next;
      if (group + 1 < GROUPS) scale_next = load_scales(group + 1);
      if constexpr (HAS_ZERO) {
        zero_now = zero_next;
        if (group + 1 < GROUPS) zero_next = load_zeros(group + 1);
      }
    }
  };

  prime_ring<STAGES, FOLLOWS>(WARP_ITERS, issue_weights, issue_rows, [&] {
    if constexpr (ONE_LAUNCH)
      wait_for_count(work.ready + blk, work.count);
    else
      wait_for_previous_kernel();
  });
  cp_async_wait<STAGES - 1>();  // stage 0 has landed
  __syncwarp();
  Frags f0, f1;  // trade roles every iteration, in registers
  load_frags(0, f0);
  if constexpr (STAGED_SCALES) {
    scale_now = staged_scales(0);
    if constexpr (HAS_ZERO) zero_now = staged_zeros(0);
  }
  constexpr int GROUP_ITERS = G / (16 * KS);  // iterations per scale group
  constexpr int GROUP_UNROLL = GROUP_ITERS % 2 ? 2 * GROUP_ITERS : GROUP_ITERS;
  // whole groups, and whole turns of the ring where one is a multiple of the other (the tile
  // pass makes STAGES a power of two): every ring offset of the unrolled body is a constant
  constexpr int UNROLL = STAGES % GROUP_UNROLL == 0 ? STAGES : GROUP_UNROLL;
  if constexpr (WARP_STEPS % (G / 16) == 0 && WARP_ITERS % UNROLL == 0) {
    // the warp's range starts on a group: unrolled over whole groups, the group changes at
    // fixed iterations
    for (int i0 = 0; i0 < WARP_ITERS; i0 += UNROLL) {
#pragma unroll
      for (int u = 0; u < UNROLL; u += 2) {
        if (u % GROUP_ITERS == 0 && (u > 0 || i0 > 0)) next_group(i0 + u);
        iteration(i0 + u, f0, f1);
        if ((u + 1) % GROUP_ITERS == 0) next_group(i0 + u + 1);
        iteration(i0 + u + 1, f1, f0);
      }
    }
  } else {  // a group may start at any iteration
    for (int i = 0; i < WARP_ITERS; i += 2) {
      for (int u = 0; u < 2 && i + u < WARP_ITERS; ++u) {  // u: which of f0, f1 is current
        const int step = step0 + (i + u) * KS;
        if (i + u > 0 && step * 16 % G == 0) next_group(i + u);
        if (u == 0)
          iteration(i, f0, f1);
        else
          iteration(i + 1, f1, f0);
      }
    }
  }
  if constexpr (RELEASE_AFTER_LOOP && !ONE_LAUNCH) release_dependents();
  end_group();
  cp_async_wait<0>();
  __syncthreads();  // the rings are free: red reuses their memory

  // the warps' partial sums added in warp order into red[row][column]. Where the CTA's shared
  // memory holds one copy a warp (RED_APART), every warp stores its own at once and each thread
  // then adds up its elements' copies; else the warps take turns adding into red, a barrier
  // each. (Measured on the H200, a call of one token on Qwen3 or DeepSeek: 0.7 us of a gate/up
  // CTA in turns, 0.45 us so.)
  auto acc_at = [&](auto f) {  // f(row, column, value) for each accumulator
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          f(nt * 8 + kq + (c & 1), t * 16 + lane / 4 + (c >= 2 ? 8 : 0), acc[t][nt][c]);
  };
  constexpr bool RED_APART = WARPS * RED_BYTES <= SMEM_BYTES;
  if constexpr (RED_APART) {
    float (*mine)[64] = reinterpret_cast<float (*)[64]>(smem + warp * RED_BYTES);
    acc_at([&](int r, int col, float v) { mine[r][col] = v; });
    __syncthreads();
    for (int x = threadIdx.x; x < ROWS * 64; x += WARPS * 32) {  // (red is warp 0's copy)
      float sum = red[x / 64][x % 64];
#pragma unroll
      for (int wi = 1; wi < WARPS; ++wi)
        sum += reinterpret_cast<const float*>(smem + wi * RED_BYTES)[x];
      red[x / 64][x % 64] = sum;
    }
    __syncthreads();
  } else {
    for (int wi = 0; wi < WARPS; ++wi) {
      if (warp == wi)
        acc_at([&](int r, int col, float v) { red[r][col] = wi == 0 ? v : red[r][col] + v; });
      __syncthreads();
    }
  }

  if constexpr (SPLIT > 1) {
    const int tile_id = blk * NTILES + tile;
    float* mine = partials + ((size_t)tile_id * SPLIT + split) * ROWS * 64;
    for (int x = threadIdx.x; x < ROWS * 64; x += WARPS * 32) mine[x] = red[x / 64][x % 64];
    if (!last_to_arrive(&counters[tile_id], SPLIT, last_cta)) return;
    const float* all = partials + (size_t)tile_id * SPLIT * ROWS * 64;
    for (int x = threadIdx.x; x < ROWS * 64; x += WARPS * 32) {
      float sum = 0.0f;
#pragma unroll
      for (int sp_i = 0; sp_i < SPLIT; ++sp_i) sum += __ldcg(all + (size_t)sp_i * ROWS * 64 + x);
      red[x / 64][x % 64] = sum;
    }
    __syncthreads();
  }

  // epilogue: rows go back to their slot; padding rows write nothing
  constexpr int COLS = EPILOGUE == 1 ? 32 : 64;
  for (int x = threadIdx.x; x < BLOCK * COLS; x += WARPS * 32) {
    const int r = x / COLS, c = x % COLS;
    const int slot = slot_of(r);
    if (slot >= num_slots) continue;
    if constexpr (EPILOGUE == 1) {  // SwiGLU: columns 0..31 gate, 32..63 up
      const float v = silu(red[r][c]) * red[r][c + 32];
      out[(size_t)slot * NOUT + tile * 32 + c] = act_from_float(v);
    } else {
      const int col =
          PERM_GATE_UP ? (c < 32 ? tile * 32 + c : NOUT / 2 + tile * 32 + c - 32) : tile * 64 + c;
      if (col >= NOUT) continue;
      float v = red[r][c];
      if constexpr (MUL_WEIGHTS) v *= weights_flat[blk * BLOCK + r];
      out[(size_t)slot * NOUT + col] = act_from_float(v);
    }
  }

  if constexpr (SUM_TOPK > 0) {
    // one CTA per moe block writes this column tile (the split-K ones returned above); the
    // last of them to arrive sums the tile for every token
    if (!last_to_arrive(&sum_counters[tile], *total_ptr / BLOCK, last_cta)) return;
    const int tokens = num_slots / SUM_TOPK;
    for (int x = threadIdx.x; x < tokens * 8; x += WARPS * 32) {  // 8 chunks of 8 columns
      const int col = tile * 64 + (x % 8) * 8;
      if (col < NOUT) topk_sum_chunk<SUM_TOPK, NOUT, true>(out, x / 8, col, sum_out, routed);
    }
  }
}

}  // namespace moegen
