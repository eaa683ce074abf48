// moegen device code for the W4A16 and MSD kernels: int4 -> fp16 dequantization in registers,
// tensor-core MMA, asynchronous copies, warp reductions, and the grouped W4A16 GEMM. Included by
// the generated .cu files (hand-written, not generated).
#pragma once
#include <cuda_fp16.h>


namespace moegen {

// (NVRTC has no <stdint.h> or <math.h>: the helpers use plain unsigned and this constant)
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// Two nibbles (bits 0-3 and 16-19 of w) -> two fp16 in one register: OR-ing a 4-bit value u into
// the mantissa of 1024.0 (0x6400) gives exactly 1024 + u; subtracting 1032 leaves u - 8, the
// signed value of a nibble stored as u = q + 8.
__device__ __forceinline__ unsigned lop3_or(unsigned a, unsigned mask, unsigned bits) {
  unsigned out;
  asm volatile("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(out) : "r"(a), "r"(mask), "r"(bits));
  return out;  // (a & mask) | bits
}

// One packed word holds 8 nibbles; returns four half2 registers:
// out[0] = (n0, n4), out[1] = (n1, n5), out[2] = (n2, n6), out[3] = (n3, n7), each value q in [-8, 7].
__device__ __forceinline__ void dequant8(unsigned w, half2 out[4]) {
  const unsigned LO = 0x000f000f, HI = 0x00f000f0, EXP = 0x64006400;
  const unsigned SUB = 0x64086408;   // 1032.0 in both halves
  const unsigned MUL = 0x2c002c00;   // 1/16
  const unsigned ADD = 0xd480d480;   // -72.0 = -(1024 / 16 + 8)
  unsigned lo0 = lop3_or(w, LO, EXP), hi0 = lop3_or(w, HI, EXP);
  unsigned w8 = w >> 8;
  unsigned lo1 = lop3_or(w8, LO, EXP), hi1 = lop3_or(w8, HI, EXP);
  out[0] = __hsub2(*reinterpret_cast<half2*>(&lo0), *reinterpret_cast<const half2*>(&SUB));
  out[1] = __hfma2(*reinterpret_cast<half2*>(&hi0), *reinterpret_cast<const half2*>(&MUL),
                   *reinterpret_cast<const half2*>(&ADD));
  out[2] = __hsub2(*reinterpret_cast<half2*>(&lo1), *reinterpret_cast<const half2*>(&SUB));
  out[3] = __hfma2(*reinterpret_cast<half2*>(&hi1), *reinterpret_cast<const half2*>(&MUL),
                   *reinterpret_cast<const half2*>(&ADD));
}

// D = A (16x16 fp16, row) x B (16x8 fp16, col) + C, fp32 accumulate.
__device__ __forceinline__ void mma_16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A (16x64 int4, row) x B (64x8 int4, col) + C, int32 accumulate.
__device__ __forceinline__ void mma_s4_16864(int c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// cp.async: 16-byte copies global -> shared that complete in groups, without registers. `.cg`
// keeps them out of L1; the zero-fill form copies `bytes` (0 or 16) and zeroes the rest.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// returns once at most PENDING of this thread's committed groups are still in flight
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// cp.async of 4, 8 or 16 bytes through L1 (for pieces smaller than the 16 bytes `.cg` needs)
template <int BYTES>
__device__ __forceinline__ void cp_async_ca(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "n"(BYTES)
               : "memory");
}

template <int BYTES>
__device__ __forceinline__ void cp_async_ca_zfill(void* dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
               "n"(BYTES), "r"(bytes)
               : "memory");
}

// mbarriers in shared memory: a phase completes when `count` threads have arrived; waiting on a
// phase's parity returns once it has completed (arrive releases, the wait acquires).
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [%0]; }\n"
               ::"r"(smem_addr(bar))
               : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
#else
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
#endif
  }
}

// D = A (16x32 int8, row) x B (32x8 int8, col) + C, int32 accumulate.
__device__ __forceinline__ void mma_s8_16832(int c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Eight signed nibbles -> two words of four sign-extended bytes: nibbles 0, 2, 4, 6 in `even`,
// 1, 3, 5, 7 in `odd`. (x ^ 8) - 8 per byte sign-extends a 4-bit two's-complement value.
__device__ __forceinline__ void widen_s4(unsigned w, unsigned& even, unsigned& odd) {
  even = __vsub4((w & 0x0f0f0f0fu) ^ 0x08080808u, 0x08080808u);
  odd = __vsub4(((w >> 4) & 0x0f0f0f0fu) ^ 0x08080808u, 0x08080808u);
}

// The int4 product of mma_s4_16864 on s8 tensor cores: both operands widened with widen_s4,
// which permutes k the same way in A and B, so two m16n8k32 steps give the same int32 sums.
__device__ __forceinline__ void mma_s4_as_s8(int c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  unsigned ae[4], ao[4], be0, bo0, be1, bo1;
#pragma unroll
  for (int i = 0; i < 4; ++i) widen_s4(a[i], ae[i], ao[i]);
  widen_s4(b0, be0, bo0);
  widen_s4(b1, be1, bo1);
  const unsigned lo[4] = {ae[0], ae[1], ao[0], ao[1]}, hi[4] = {ae[2], ae[3], ao[2], ao[3]};
  mma_s8_16832(c, lo, be0, bo0);
  mma_s8_16832(c, hi, be1, bo1);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Grouped W4A16 GEMM. CTA = one moe block (BLOCK rows of one expert) x 64 columns x one of SPLIT
// K ranges; its WARPS warps split that range. Each warp streams its k16 steps, KS per stage,
// through its own ring of STAGES shared-memory stages filled by cp.async (weights, the group's
// scales and the block's activation rows), STAGES - 1 stages ahead of the tensor cores, so a
// warp keeps several KB in flight without holding them in registers. Partial sums meet in
// shared memory in warp order, then (SPLIT > 1) in a workspace, where the last CTA of a tile adds them in split
// order: deterministic. DENSE: rows are the activation rows themselves (one expert, no routing)
// and the scales come as [K/G, NOUT] fp16, unpacked.
template <int BLOCK, int SPLIT, int KDIM, int NTILES, int NOUT, int G, int WARPS, int STAGES,
          int KS, int ROW_DIV, int EPILOGUE, bool PERM_GATE_UP, bool MUL_WEIGHTS, bool DENSE>
__device__ __forceinline__ void grouped_gemm(
    const half* __restrict__ a, const uint4* __restrict__ w, const uint4* __restrict__ scales,
    const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids,
    const int* __restrict__ total_ptr, const float* __restrict__ weights_flat, int num_slots,
    half* __restrict__ out, float* __restrict__ partials, int* __restrict__ counters) {
  constexpr int MT = (BLOCK + 15) / 16;          // m16 tiles per block
  constexpr int KSTEPS = KDIM / 16;
  constexpr int CTA_STEPS = KSTEPS / SPLIT;
  constexpr int WARP_STEPS = CTA_STEPS / WARPS;
  constexpr int WARP_ITERS = WARP_STEPS / KS;    // ring stages a warp goes through
  static_assert(KSTEPS % (SPLIT * WARPS * KS) == 0, "K must split evenly over CTAs, warps, stages");
  static_assert(G % (16 * KS) == 0, "the k16 steps of one stage share a scale group");
  static_assert(STAGES >= 2, "the copy ring needs two stages");
  constexpr int ROWS = MT * 16;
  // one ring stage holds KS k16 steps: weights (KS x 32 lanes x 16 B), the 64 columns' scales
  // (8 x 16 B), then the activation rows, 32 KS bytes of k each, padded by 16 so fragment reads
  // hit 32 distinct banks
  constexpr int W_BYTES = 512 * KS, S_BYTES = 128, A_ROW = 32 * KS + 16;
  constexpr int STAGE_BYTES = W_BYTES + S_BYTES + ROWS * A_ROW;
  constexpr int RING_BYTES = WARPS * STAGES * STAGE_BYTES;
  constexpr int RED_BYTES = ROWS * 64 * 4;
  __shared__ __align__(16) unsigned char smem[RING_BYTES > RED_BYTES ? RING_BYTES : RED_BYTES];
  __shared__ int last_cta;
  float(*red)[64] = reinterpret_cast<float(*)[64]>(smem);   // after the K loop

  // blocks vary fastest, so the CTAs that read one weight tile (all blocks of an expert) run
  // close together and the tile comes from DRAM once, from L2 after
  const int blk = blockIdx.x, tile = blockIdx.y, split = blockIdx.z;
  if (!DENSE && blk * BLOCK >= *total_ptr) return;          // grid is sized for the worst case
  const int expert = DENSE ? 0 : expert_ids[blk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto slot_of = [&](int r) {          // the slot of block row r, num_slots for padding
    if (DENSE) return blk * BLOCK + r < num_slots ? blk * BLOCK + r : num_slots;
    return r < BLOCK ? sorted_ids[blk * BLOCK + r] : num_slots;
  };

  // the activation rows this lane copies: a row is CHUNKS 16-byte chunks per stage, so chunk
  // q * 32 + lane is part lane % CHUNKS of row q * (32 / CHUNKS) + lane / CHUNKS
  constexpr int CHUNKS = 2 * KS, COPIES = MT * KS;
  const half* copy_row[COPIES];
#pragma unroll
  for (int q = 0; q < COPIES; ++q) {
    const int slot = slot_of(q * (32 / CHUNKS) + lane / CHUNKS);
    copy_row[q] = slot < num_slots ? a + (size_t)(slot / ROW_DIV) * KDIM + 8 * (lane % CHUNKS)
                                   : nullptr;
  }

  float acc[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][j][c] = 0.0f;

  const int step0 = split * CTA_STEPS + warp * WARP_STEPS;
  const uint4* wp = w + ((size_t)expert * KSTEPS * NTILES + tile) * 32 + lane;
  const uint4* sp = scales + ((size_t)expert * (KDIM / G) * NTILES + tile) * 8 + lane;
  unsigned char* ring = smem + warp * STAGES * STAGE_BYTES;
  auto issue = [&](int i) {            // copy the k16 steps of iteration i into its stage
    unsigned char* st = ring + (i % STAGES) * STAGE_BYTES;
    const int step = step0 + i * KS;
#pragma unroll
    for (int sub = 0; sub < KS; ++sub)
      cp_async16(st + sub * 512 + lane * 16, wp + (size_t)(step + sub) * NTILES * 32);
    if (lane < 8) {
      if constexpr (DENSE) {   // scales [K/G, NOUT] as given: 8 columns per 16-byte chunk
        const int col = tile * 64 + lane * 8;
        const half* src = reinterpret_cast<const half*>(scales) + (size_t)(step * 16 / G) * NOUT + col;
        cp_async16_zfill(st + W_BYTES + lane * 16, col < NOUT ? src : a, col < NOUT ? 16u : 0u);
      } else {
        cp_async16(st + W_BYTES + lane * 16, sp + (size_t)(step * 16 / G) * NTILES * 8);
      }
    }
#pragma unroll
    for (int q = 0; q < COPIES; ++q) {
      unsigned char* dst = st + W_BYTES + S_BYTES +
                           (q * (32 / CHUNKS) + lane / CHUNKS) * A_ROW + 16 * (lane % CHUNKS);
      if (copy_row[q]) cp_async16(dst, copy_row[q] + step * 16);
      else cp_async16_zfill(dst, a, 0u);            // padding row: zeros
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < WARP_ITERS) issue(s);
    cp_async_commit();
  }

  const int kq = 2 * (lane % 4);
  for (int i = 0; i < WARP_ITERS; ++i) {
    cp_async_wait<STAGES - 2>();           // stage i has landed (for this lane's copies) ...
    __syncwarp();                          // ... and for the whole warp's
    const unsigned char* st = ring + (i % STAGES) * STAGE_BYTES;
    uint4 wv[KS];
#pragma unroll
    for (int sub = 0; sub < KS; ++sub)
      wv[sub] = *reinterpret_cast<const uint4*>(st + sub * 512 + lane * 16);
    uint4 scale8;                          // the scales of n8 tiles 0..7 at column lane / 4
    if constexpr (DENSE) {
      const half* col_sc = reinterpret_cast<const half*>(st + W_BYTES) + lane / 4;
      half* s8 = reinterpret_cast<half*>(&scale8);
#pragma unroll
      for (int j = 0; j < 8; ++j) s8[j] = col_sc[8 * j];
    } else {
      scale8 = *reinterpret_cast<const uint4*>(st + W_BYTES + (lane / 4) * 16);
    }
    unsigned afr[KS][MT][4];
#pragma unroll
    for (int sub = 0; sub < KS; ++sub)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const unsigned char* r0 =
            st + W_BYTES + S_BYTES + (mt * 16 + lane / 4) * A_ROW + sub * 32 + 2 * kq;
        afr[sub][mt][0] = *reinterpret_cast<const unsigned*>(r0);
        afr[sub][mt][1] = *reinterpret_cast<const unsigned*>(r0 + 8 * A_ROW);
        afr[sub][mt][2] = *reinterpret_cast<const unsigned*>(r0 + 16);
        afr[sub][mt][3] = *reinterpret_cast<const unsigned*>(r0 + 8 * A_ROW + 16);
      }
    __syncwarp();                          // every lane has read the stage refilled next
    if (i + STAGES - 1 < WARP_ITERS) issue(i + STAGES - 1);
    cp_async_commit();
    const half2* sc = reinterpret_cast<const half2*>(&scale8);   // scales of n8 tiles 0..7
#pragma unroll
    for (int sub = 0; sub < KS; ++sub) {
      const unsigned words[4] = {wv[sub].x, wv[sub].y, wv[sub].z, wv[sub].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {        // word q: n8 tiles 2q and 2q + 1
        half2 b[4];
        dequant8(words[q], b);
        const half2 scale0 = __half2half2(sc[q].x), scale1 = __half2half2(sc[q].y);
        b[0] = __hmul2(b[0], scale0);
        b[1] = __hmul2(b[1], scale0);
        b[2] = __hmul2(b[2], scale1);
        b[3] = __hmul2(b[3], scale1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816(acc[mt][2 * q], afr[sub][mt], *reinterpret_cast<unsigned*>(&b[0]),
                    *reinterpret_cast<unsigned*>(&b[1]));
          mma_16816(acc[mt][2 * q + 1], afr[sub][mt], *reinterpret_cast<unsigned*>(&b[2]),
                    *reinterpret_cast<unsigned*>(&b[3]));
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();                         // the rings are free: red reuses their memory

  // warps add their partial sums into shared memory, in warp order
  for (int wi = 0; wi < WARPS; ++wi) {
    if (warp == wi) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int r = mt * 16 + lane / 4 + (c >= 2 ? 8 : 0);
            const int col = j * 8 + kq + (c & 1);
            red[r][col] = wi == 0 ? acc[mt][j][c] : red[r][col] + acc[mt][j][c];
          }
    }
    __syncthreads();
  }

  if constexpr (SPLIT > 1) {
    const int tile_id = blk * NTILES + tile;
    float* mine = partials + ((size_t)tile_id * SPLIT + split) * ROWS * 64;
    for (int x = threadIdx.x; x < ROWS * 64; x += WARPS * 32) mine[x] = red[x / 64][x % 64];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int done = atomicAdd(&counters[tile_id], 1);
      last_cta = done == SPLIT - 1;
      if (last_cta) counters[tile_id] = 0;      // ready for the next call
    }
    __syncthreads();
    if (!last_cta) return;
    __threadfence();
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
    if constexpr (EPILOGUE == 1) {      // SwiGLU: columns 0..31 gate, 32..63 up
      const float v = silu(red[r][c]) * red[r][c + 32];
      out[(size_t)slot * NOUT + tile * 32 + c] = __float2half_rn(v);
    } else {
      const int col = PERM_GATE_UP ? (c < 32 ? tile * 32 + c : NOUT / 2 + tile * 32 + c - 32)
                                   : tile * 64 + c;
      if (col >= NOUT) continue;
      float v = red[r][c];
      if constexpr (MUL_WEIGHTS) v *= weights_flat[blk * BLOCK + r];
      out[(size_t)slot * NOUT + col] = __float2half_rn(v);
    }
  }
}

}  // namespace moegen

// true when a loop action with this iteration offset runs at `step` (schedule rendering)
__device__ __forceinline__ bool moegen_runs(int step, int offset, int iterations) {
  return step >= offset && step - offset < iterations;
}
