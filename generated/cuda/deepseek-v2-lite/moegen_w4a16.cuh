// moegen device code for the W4A16 and MSD kernels: int4 -> fp16 or bf16 dequantization in
// registers, tensor-core MMA, asynchronous copies, warp reductions, and the grouped W4A16 GEMM.
// Included by the generated .cu files (hand-written, not generated).
#pragma once
#include <cuda_fp16.h>
#if defined(MOEGEN_BF16)
#include <cuda_bf16.h>
#endif


namespace moegen {

// The activations' type (x, scales, zero points, the GEMMs' and the layer's output rows): fp16,
// or bf16 where the including file defines MOEGEN_BF16 first (a module is one or the other).
// The MMAs multiply act_t x act_t into fp32.
#if defined(MOEGEN_BF16)
using act_t = __nv_bfloat16;
using act2_t = __nv_bfloat162;
#define MOEGEN_MMA_TYPE "bf16"
__device__ __forceinline__ float act_to_float(act_t v) { return __bfloat162float(v); }
__device__ __forceinline__ act_t act_from_float(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ act2_t act2_both(act_t v) { return __bfloat162bfloat162(v); }
#else
using act_t = half;
using act2_t = half2;
#define MOEGEN_MMA_TYPE "f16"
__device__ __forceinline__ float act_to_float(act_t v) { return __half2float(v); }
__device__ __forceinline__ act_t act_from_float(float v) { return __float2half_rn(v); }
__device__ __forceinline__ act2_t act2_both(act_t v) { return __half2half2(v); }
#endif
__device__ __forceinline__ float act_low(act2_t v) { return act_to_float(v.x); }
__device__ __forceinline__ float act_high(act2_t v) { return act_to_float(v.y); }

// Which slots of a call are routed: a slot whose expert id (given by the caller) lies outside
// [0, experts) is skipped, and adds nothing to its token's sum. ids = nullptr: all are routed
// (the layer computed the ids itself).
struct Routed {
  const int* ids = nullptr;
  int experts = 0;
  __device__ __forceinline__ bool operator()(size_t slot) const {
    return ids == nullptr || static_cast<unsigned>(ids[slot]) < static_cast<unsigned>(experts);
  }
};

// (NVRTC has no <stdint.h> or <math.h>: the helpers use plain unsigned and this constant)
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// Programmatic dependent launch (sm_90 and later; no-ops before). A kernel launched with it
// (moegen/targets/cuda/launch.py) may start once every CTA of the kernel before it has called
// release_dependents, and sees that kernel's writes only after wait_for_previous_kernel. Without
// the launch attribute, wait returns at once and release does nothing.
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Two nibbles (bits 0-3 and 16-19 of w) -> two fp16 in one register: OR-ing a 4-bit value u into
// the mantissa of 1024.0 (0x6400) gives exactly 1024 + u; subtracting 1032 leaves u - 8, the
// signed value of a nibble stored as u = q + 8.
__device__ __forceinline__ unsigned lop3_or(unsigned a, unsigned mask, unsigned bits) {
  unsigned out;
  asm volatile("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(out) : "r"(a), "r"(mask), "r"(bits));
  return out;  // (a & mask) | bits
}

// One packed word holds 8 nibbles; returns four act2_t registers:
// out[0] = (n0, n4), out[1] = (n1, n5), out[2] = (n2, n6), out[3] = (n3, n7), each value q in
// [-8, 7].
#if defined(MOEGEN_BF16)
// bf16 (7 mantissa bits): OR-ing a nibble u into 128.0 (0x4300) gives exactly 128 + u, and
// subtracting 136 leaves u - 8; each pair of nibbles is shifted down to bits 0-3 and 16-19.
__device__ __forceinline__ void dequant8(unsigned w, act2_t out[4]) {
  const unsigned LO = 0x000f000f, EXP = 0x43004300, SUB = 0x43084308;   // 136.0 in both halves
  const unsigned q[4] = {lop3_or(w, LO, EXP), lop3_or(w >> 4, LO, EXP), lop3_or(w >> 8, LO, EXP),
                         lop3_or(w >> 12, LO, EXP)};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    out[i] = __hsub2(*reinterpret_cast<const act2_t*>(&q[i]),
                     *reinterpret_cast<const act2_t*>(&SUB));
}
#else
__device__ __forceinline__ void dequant8(unsigned w, act2_t out[4]) {
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
#endif

// An A fragment from dequant8 (rows r, r + 8, r, r + 8) times its rows' scales, given as
// (scale of r, scale of r + 8).
__device__ __forceinline__ void scale_frag(act2_t frag[4], act2_t scales) {
  const act2_t s_lo = act2_both(scales.x), s_hi = act2_both(scales.y);
  frag[0] = __hmul2(frag[0], s_lo);
  frag[1] = __hmul2(frag[1], s_hi);
  frag[2] = __hmul2(frag[2], s_lo);
  frag[3] = __hmul2(frag[3], s_hi);
}

// The same fragment less its rows' zero points (z - 8, given as (zero of r, zero of r + 8)):
// q - (z - 8) = u - z, exact, before the scale (asymmetric int4: w = (u - z) * s).
__device__ __forceinline__ void zero_frag(act2_t frag[4], act2_t zeros) {
  const act2_t z_lo = act2_both(zeros.x), z_hi = act2_both(zeros.y);
  frag[0] = __hsub2(frag[0], z_lo);
  frag[1] = __hsub2(frag[1], z_hi);
  frag[2] = __hsub2(frag[2], z_lo);
  frag[3] = __hsub2(frag[3], z_hi);
}

// D = A (16x16 act_t, row) x B (16x8 act_t, col) + C, fp32 accumulate.
__device__ __forceinline__ void mma_16816(float c[4], const unsigned a[4], unsigned b0,
                                          unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE ".f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A (16x64 int4, row) x B (64x8 unsigned int4, col) + C, int32 accumulate.
__device__ __forceinline__ void mma_s4u4_16864(int c[4], const unsigned a[4], unsigned b0,
                                               unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.s32.s4.u4.s32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// cp.async: 16-byte copies global -> shared that complete in groups, without registers. `.cg`
// keeps them out of L1; the zero-fill form copies `bytes` (0 or 16) and zeroes the rest.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// the copy to a shared address already computed
__device__ __forceinline__ void cp_async16_at(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  cp_async16_at(smem_addr(dst), src);
}

// The value, pinned in a register for the rest of the kernel. To save registers ptxas recomputes
// address arithmetic from tid.x inside a main loop (about ten instructions a copy, in loops
// bound by instruction issue); it does not recompute a shuffle's result. Every lane of the
// warp must call it.
__device__ __forceinline__ unsigned pinned(unsigned v) {
  return __shfl_xor_sync(0xffffffffu, v, 0);
}

template <typename T>
__device__ __forceinline__ const T* pinned(const T* p) {
  const unsigned long long v = reinterpret_cast<unsigned long long>(p);
  return reinterpret_cast<const T*>(__shfl_xor_sync(0xffffffffu, v, 0));
}

// the zero-fill copy to a shared address already computed
__device__ __forceinline__ void cp_async16_zfill_at(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, unsigned bytes) {
  cp_async16_zfill_at(smem_addr(dst), src, bytes);
}

// A weight stream read once per call copies with an evict-first policy: a new weight line
// displaces an older weight line before anything else L2 holds (activations, data of the kernels
// around this one, dirty lines that would first have to be written back). Measured on the H200
// (docs/DESIGN.md): faster in the K-split GEMMs
// and the MSD matmul; the wide prefill CTA keeps plain copies (Mixtral T = 2048 ran slower).
//
// ptxas (CUDA 13, sm_90) miscompiles a hinted cp.async whose shared address it splits into a
// register plus a uniform register (a static array's base, a stage offset): the policy's
// descriptor is built over that uniform register and the copy faults (illegal instruction).
// The address is OR-ed with a zero ptxas cannot prove uniform (tid.x >= ntid.x, never true;
// one value per kernel), which it cannot split; that costs one LOP3 a copy.
__device__ __forceinline__ unsigned opaque_zero() {
  unsigned zero;
  asm("{\n.reg .pred past;\n.reg .u32 t, n;\nmov.u32 t, %%tid.x;\nmov.u32 n, %%ntid.x;\n"
      "setp.ge.u32 past, t, n;\nselp.u32 %0, 1, 0, past;\n}\n"
      : "=r"(zero));
  return zero;
}

// The K-split GEMMs' weight copies. The zero and the policy are made once, by the constructor:
// made in each copy (as cp_async16_stream_zfill does) they cost about ten more instructions a
// copy in these kernels (the policy descriptor's moves and shifts, the compare), which issue
// instructions, not bytes, limit.
struct WeightStream {
  unsigned zero;
  unsigned long long policy;

  __device__ __forceinline__ WeightStream() : zero(opaque_zero()) {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  }

  __device__ __forceinline__ void copy16(void* dst, const void* src) const {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n"
                 ::"r"(smem_addr(dst) | zero), "l"(src), "l"(policy)
                 : "memory");
  }
};

// The MSD matmul's weight copies: the policy made inside the copy's asm (ptxas folds it to a
// constant). Measured there, this form is as fast as WeightStream or a little faster (M = 4
// basic: 35.3 against 36.4 us; preload the same).
__device__ __forceinline__ void cp_async16_stream_zfill(void* dst, const void* src,
                                                        unsigned bytes) {
  asm volatile(
      "{\n.reg .b64 policy;\n"
      "createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, policy;\n}\n"
      ::"r"(smem_addr(dst) | opaque_zero()), "l"(src), "r"(bytes)
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

// ldmatrix: four 8x8 fp16 matrices from shared memory; lane l gives the address of row l % 8
// of matrix l / 8 (16 bytes) and receives, of each matrix, row l / 4, columns 2 (l % 4) and +1
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
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

// mbar_arrive where `arrive` holds, without a branch
__device__ __forceinline__ void mbar_arrive_if(unsigned long long* bar, bool arrive) {
  asm volatile("{ .reg .pred p; .reg .b64 state; setp.ne.b32 p, %1, 0; "
               "@p mbarrier.arrive.shared::cta.b64 state, [%0]; }\n"
               ::"r"(smem_addr(bar)), "r"((unsigned)arrive)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    // the warp sleeps until the phase completes (or 10 us pass) instead of spinning on issue slots
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; "
                 "selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity), "n"(10000)
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

// arrives on the mbarrier once every cp.async this thread has issued so far has landed (the
// barrier counts the arrival: .noinc, so its count includes the copying threads)
__device__ __forceinline__ void cp_async_mbar_arrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}

// D = A (16x32 int8, row) x B (32x8 int8, col) + C, int32 accumulate.
__device__ __forceinline__ void mma_s8s8_16832(int c[4], const unsigned a[4], unsigned b0,
                                               unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Eight offset-binary nibbles (u = q + 8) -> two words of four signed bytes, each 16 q: nibbles
// 0, 2, 4, 6 in `even`, 1, 3, 5, 7 in `odd` (so k is permuted; the other MMA operand is laid out
// the same way). A nibble at the top of its byte with that byte's top bit flipped is 16 q, since
// u ^ 8 is q in two's complement. `flip` is 0x80808080 held in a register (WIDEN_FLIP): with
// both masks immediates ptxas splits each mask-and-flip into two LOP3s.
constexpr unsigned WIDEN_FLIP = 0x80808080u;
__device__ __forceinline__ void widen_s4_x16(unsigned w, unsigned flip, unsigned& even,
                                             unsigned& odd) {
  even = ((w << 4) & 0xf0f0f0f0u) ^ flip;
  odd = (w & 0xf0f0f0f0u) ^ flip;
}

// the low N bytes (1, 2 or 4) of v to an N-aligned shared-memory address
template <int N>
__device__ __forceinline__ void store_low_bytes(unsigned char* p, unsigned v) {
  if constexpr (N == 1) *p = static_cast<unsigned char>(v);
  else if constexpr (N == 2) *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(v);
  else *reinterpret_cast<unsigned*>(p) = v;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// a / b rounded to nearest (div.rn's result) from inv = __frcp_rn(b), the correctly rounded
// reciprocal: q = RN(a inv) is within an ulp of a / b, the FMA gives the remainder a - b q
// exactly, and RN(q + remainder inv) is RN(a / b) (Markstein's theorem, which holds while nothing
// overflows or underflows: true for fp16 values a and b, b != 0), except that a zero quotient
// may come out +0 where div.rn gives -0. Three instructions a quotient where div.rn takes about a
// dozen, with one reciprocal shared by the quotients of a divisor. tests/test_cuda_msd.py checks
// it against a / b for every pair of finite fp16 values.
__device__ __forceinline__ float div_rn_by(float a, float b, float inv) {
  const float q = __fmul_rn(a, inv);
  return __fmaf_rn(__fmaf_rn(-q, b, a), inv, q);
}

// The largest of the warp's values, all >= 0 (not NaN): such floats order as their bit patterns,
// so one integer max reduction finds it (redux.sync, sm_80+), bit for bit warp_max's result.
__device__ __forceinline__ float warp_max_nonnegative(float v) {
  return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(v)));
}

// float -> unsigned of the same order (for redux.sync, which compares unsigned integers): -0
// as +0, NaN as 1 (below -inf), so 0 can stand for "no expert"
__device__ __forceinline__ unsigned order_key(float f) {
  if (f != f) return 1u;
  unsigned b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// the float of a key (its inverse for every key order_key gives above 1)
__device__ __forceinline__ float key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The THREADS threads (whole warps) that reach named barrier ID meet there, and their
// shared-memory writes before it are seen by all of them after it. The operands are constants:
// an ID in a register would make ptxas reserve all 16 of the CTA's barriers.
template <int ID, int THREADS>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}

// The threads of a CTA that call last_to_arrive meet: all of them (THREADS = 0), or the first
// THREADS, on named barrier 1, while the other warps are elsewhere.
template <int THREADS>
__device__ __forceinline__ void arrival_sync() {
  if constexpr (THREADS == 0) __syncthreads();
  else named_barrier_sync<1, THREADS>();
}

// Every CTA of a group calls this once its global writes are done: true in the last one to
// arrive, which then sees all of them; the counter is reset for the next call. `flag`: a
// __shared__ int of the CTA. THREADS: as arrival_sync (thread 0 among them).
// The CTA's threads meet, then thread 0 alone counts with an acquire-release atomic at GPU
// scope: the release covers the writes the meeting ordered before it, and in the last CTA the
// acquire (passed on to the other threads by the second meeting) covers every other CTA's. A
// fence in every thread around the count instead (membar.gl) cost the MSD matmul 0.4 us at
// M = 1 and 0.8 us at M = 16 (docs/DESIGN.md).
template <int THREADS = 0>
__device__ __forceinline__ bool last_to_arrive(int* counter, int arrivals, int& flag) {
  arrival_sync<THREADS>();
  if (threadIdx.x == 0) {
    int done;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                 : "=r"(done)
                 : "l"(counter)
                 : "memory");
    flag = done == arrivals - 1;
    if (flag) *counter = 0;                // ready for the next call
  }
  arrival_sync<THREADS>();
  return flag;
}

// sum_out[t, col .. col + 7] = sum over k of rows[t * TOPK + k, same columns], in fp32 in k
// order, rounded once: the top-k sum of moe_aggregate and of the topk_sum epilogue (so the two
// agree bit for bit). A slot that `routed` skips (no GEMM wrote its row) adds nothing. FROM_L2:
// read through L2 only (__ldcg), for rows that other CTAs of the same kernel wrote.
template <int TOPK, int NOUT, bool FROM_L2>
__device__ __forceinline__ void topk_sum_chunk(const act_t* __restrict__ rows, size_t t,
                                               size_t col, act_t* __restrict__ sum_out,
                                               Routed routed) {
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < TOPK; ++k) {
    if (!routed(t * TOPK + k)) continue;
    const uint4* p = reinterpret_cast<const uint4*>(rows + ((t * TOPK + k) * NOUT) + col);
    const uint4 v = FROM_L2 ? __ldcg(p) : *p;
    const act_t* hv = reinterpret_cast<const act_t*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) sum[j] += act_to_float(hv[j]);
  }
  uint4 o;
  act_t* ho = reinterpret_cast<act_t*>(&o);
#pragma unroll
  for (int j = 0; j < 8; ++j) ho[j] = act_from_float(sum[j]);
  *reinterpret_cast<uint4*>(sum_out + t * NOUT + col) = o;
}

// The first AHEAD stages of a copy ring, one commit group each, for a K range of `iters`
// stages: issue_weights(s) then issue_rows(s). FOLLOWS (a kernel launched with programmatic
// dependent launch, whose input rows the kernel before it writes): every one of those stages'
// weights first, then the wait for that kernel, then the rows (the first commit group holds
// all the early weights).
template <int AHEAD, bool FOLLOWS, typename Weights, typename Rows>
__device__ __forceinline__ void prime_ring(int iters, Weights issue_weights, Rows issue_rows) {
  if constexpr (FOLLOWS) {
#pragma unroll
    for (int s = 0; s < AHEAD; ++s)
      if (s < iters) issue_weights(s);
    wait_for_previous_kernel();
  }
#pragma unroll
  for (int s = 0; s < AHEAD; ++s) {
    if (s < iters) {
      if constexpr (!FOLLOWS) issue_weights(s);
      issue_rows(s);
    }
    cp_async_commit();
  }
}

// Group scales in a copy ring: the stage of a scale group's first iteration holds, after its
// weights and rows, that group's scales of TILES 64-column tiles (SCALE_STAGE_BYTES each; tile
// c's uint4 j, columns 8 j' + j of it, at 16 (8 c + j): the packed layout, so one contiguous
// copy); a warp reads its lanes' from there when the group starts. (Loaded into registers a
// group ahead instead, the register copy ptxas placed right after the load held every warp for
// the load's whole latency once a group: 16% of the stall samples of Mixtral's gate/up GEMM at
// T = 64, 22% at T = 16.) The wide CTAs copy them with their threads 0 .. 8 TILES - 1, the
// K-split CTA with the lanes 0 .. 7 of each warp.
constexpr int SCALE_STAGE_BYTES = 128;

// The dynamic shared memory of a CTA (the tall tile's, and the wide CTA's in its place where the
// GPU has no warpgroup MMA: more than the 48 KB a CTA may declare statically)
extern __shared__ __align__(128) unsigned char dynamic_shared[];
template <int TILES>
__device__ __forceinline__ void copy_group_scales(unsigned char* dst, const uint4* src) {
  if (threadIdx.x < TILES * 8) cp_async_ca<16>(dst + 16 * threadIdx.x, src + threadIdx.x);
}
// the lane's scales (columns 8 j + lane / 4 of tile `tile`) among those staged at `staged`
__device__ __forceinline__ uint4 staged_group_scales(const unsigned char* staged, int tile,
                                                     int lane) {
  return *reinterpret_cast<const uint4*>(staged + (tile * 8 + lane / 4) * 16);
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
template <int BLOCK, int SPLIT, int KDIM, int NTILES, int NOUT, int G, int WARPS, int STAGES,
          int KS, int ROW_DIV, int EPILOGUE, bool PERM_GATE_UP, bool MUL_WEIGHTS, bool DENSE,
          int SUM_TOPK = 0, bool FOLLOWS = false, bool RELEASE_AFTER_LOOP = false,
          bool WAITS_FIRST = false, bool HAS_ZERO = false>
__device__ __forceinline__ void grouped_gemm(
    const act_t* __restrict__ a, const uint4* __restrict__ w, const uint4* __restrict__ scales,
    const uint4* __restrict__ zeros, const int* __restrict__ sorted_ids,
    const int* __restrict__ expert_ids, const int* __restrict__ total_ptr,
    const float* __restrict__ weights_flat, int num_slots, act_t* __restrict__ out,
    float* __restrict__ partials, int* __restrict__ counters, act_t* __restrict__ sum_out = nullptr,
    int* __restrict__ sum_counters = nullptr, Routed routed = {}) {
  constexpr int NT = (BLOCK + 7) / 8;            // n8 tiles of block rows (the MMA's N)
  constexpr int KSTEPS = KDIM / 16;
  constexpr int CTA_STEPS = KSTEPS / SPLIT;
  constexpr int WARP_STEPS = CTA_STEPS / WARPS;
  constexpr int WARP_ITERS = WARP_STEPS / KS;    // ring stages a warp goes through
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
  __shared__ __align__(128) unsigned char smem[RING_BYTES > RED_BYTES ? RING_BYTES : RED_BYTES];
  __shared__ int last_cta;
  float(*red)[64] = reinterpret_cast<float(*)[64]>(smem);   // after the K loop

  // A kernel launched after this one with programmatic dependent launch (the down GEMM after
  // gate/up) may start once every CTA is here: its CTAs take the SMs this grid's last wave
  // leaves free and stream their first weights (measured: releasing after the K loop instead
  // gains less at T = 16 and loses 3% at Mixtral T = 64). RELEASE_AFTER_LOOP (a single token,
  // one wave of CTAs, no last wave to fill): only after the K loop, so that the dependents do
  // not take issue slots and bandwidth from it while they wait (measured: 2 us faster than
  // plain launches at Mixtral T = 1, where releasing at the start was 5 us slower).
  if constexpr (WAITS_FIRST) wait_for_previous_kernel();
  if constexpr (!RELEASE_AFTER_LOOP) release_dependents();
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

  // the activation chunks this lane copies: a staged row is CHUNKS 16-byte chunks, chunk
  // c = q * 32 + lane is part c % CHUNKS of row c / CHUNKS (lanes past A_CHUNKS copy nothing)
  constexpr int CHUNKS = 2 * KS, A_CHUNKS = ROWS * CHUNKS, COPIES = (A_CHUNKS + 31) / 32;
  // Each lane's copy sources (at the warp's first step), shared addresses (in stage 0) and
  // whether it copies at all are pinned: kept in registers, not recomputed in the main loop.
  const act_t* copy_src[COPIES];
  unsigned copy_bytes[COPIES];         // 16, or 0 for a padding row (which reads row 0)
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
  const uint4* sp = scales + ((size_t)expert * GROUPS * NTILES + tile) * 8;   // (packed)
  const uint4* zp = zeros + ((size_t)expert * GROUPS * NTILES + tile) * 8;    // (HAS_ZERO)
  // copy the k16 steps of iteration i into its stage: the weights (and the scales of a group
  // that starts there), then the block's rows
  auto issue_weights = [&](int i) {
    unsigned char* st = ring + (i % STAGES) * STAGE_BYTES;
    const int step = step0 + i * KS;
#pragma unroll
    for (int sub = 0; sub < KS; ++sub)
      weights.copy16(st + sub * 512 + lane * 16, wp + (size_t)(step + sub) * NTILES * 32);
    if constexpr (STAGED_SCALES) {     // (the layout of copy_group_scales, one tile)
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
  auto load_zeros = [&](int group) {     // (HAS_ZERO, not STAGED_SCALES)
    return __ldg(zp + (size_t)group * NTILES * 8 + lane / 4);
  };
  auto staged_scales = [&](int i) {      // the scales in iteration i's stage (STAGED_SCALES)
    return staged_group_scales(ring + (i % STAGES) * STAGE_BYTES + S_OFFSET, 0, lane);
  };
  auto staged_zeros = [&](int i) {       // and the zeros (HAS_ZERO)
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
      for (int nt = 0; nt < NT; ++nt) {   // row 8 nt + lane / 4, k = kq, kq + 1 and + 8
        const unsigned char* r0 = st + W_BYTES + (nt * 8 + lane / 4) * A_ROW + sub * 32 + 2 * kq;
        f.b[sub][nt][0] = *reinterpret_cast<const unsigned*>(r0);
        f.b[sub][nt][1] = *reinterpret_cast<const unsigned*>(r0 + 16);
      }
    }
  };
  // The weights are the MMA's A operand (16 columns x k16 per word), the block rows its B
  // operand (n8 per 8 rows): a block of 8 rows wastes no tensor-core work on padding.
  auto multiply = [&](const Frags& f) {
    const act2_t* sc = reinterpret_cast<const act2_t*>(&scale_now);   // (column r, r + 8) per t
    const act2_t* zc = reinterpret_cast<const act2_t*>(&zero_now);
#pragma unroll
    for (int sub = 0; sub < KS; ++sub) {
      const unsigned words[4] = {f.w[sub].x, f.w[sub].y, f.w[sub].z, f.w[sub].w};
#pragma unroll
      for (int t = 0; t < 4; ++t) {        // word t: the A fragment of columns 16 t .. 16 t + 15
        act2_t frag[4];
        dequant8(words[t], frag);          // rows r, r + 8, r, r + 8 (r = lane / 4)
        if constexpr (HAS_ZERO) zero_frag(frag, zc[t]);
        if constexpr (!SCALE_AFTER) scale_frag(frag, sc[t]);
        const unsigned* af = reinterpret_cast<const unsigned*>(frag);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if constexpr (SCALE_AFTER) mma_16816(part[t][nt], af, f.b[sub][nt][0], f.b[sub][nt][1]);
          else mma_16816(acc[t][nt], af, f.b[sub][nt][0], f.b[sub][nt][1]);
        }
      }
    }
  };
  // iteration i: read stage i + 1 into `next`, refill stage i's slot (its fragments are in
  // registers since iteration i - 1), then multiply `cur`. Groups are committed one per stage
  // in stage order, so "stage i + 1 has landed" is "at most STAGES - 2 groups pending".
  auto iteration = [&](int i, const Frags& cur, Frags& next) {
    if (i + 1 < WARP_ITERS) {
      cp_async_wait<STAGES - 2>();         // stage i + 1 has landed (for this lane's copies) ...
      __syncwarp();                        // ... and for the warp's; every lane has read stage i
      load_frags(i + 1, next);
    }
    if (i + STAGES < WARP_ITERS) issue(i + STAGES);
    cp_async_commit();
    multiply(cur);
  };
  auto end_group = [&]() {                 // SCALE_AFTER: acc += part x the group's scales
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
  auto next_group = [&](int i) {           // a group starts at iteration i (its stage landed)
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

  prime_ring<STAGES, FOLLOWS>(WARP_ITERS, issue_weights, issue_rows);
  cp_async_wait<STAGES - 1>();             // stage 0 has landed
  __syncwarp();
  Frags f0, f1;                            // trade roles every iteration, in registers
  load_frags(0, f0);
  if constexpr (STAGED_SCALES) {
    scale_now = staged_scales(0);
    if constexpr (HAS_ZERO) zero_now = staged_zeros(0);
  }
  constexpr int GROUP_ITERS = G / (16 * KS);                   // iterations per scale group
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
  } else {                                 // a group may start at any iteration
    for (int i = 0; i < WARP_ITERS; i += 2) {
      for (int u = 0; u < 2 && i + u < WARP_ITERS; ++u) {   // u: which of f0, f1 is current
        const int step = step0 + (i + u) * KS;
        if (i + u > 0 && step * 16 % G == 0) next_group(i + u);
        if (u == 0) iteration(i, f0, f1);
        else iteration(i + 1, f1, f0);
      }
    }
  }
  if constexpr (RELEASE_AFTER_LOOP) release_dependents();
  end_group();
  cp_async_wait<0>();
  __syncthreads();                         // the rings are free: red reuses their memory

  // the warps' partial sums added in warp order into red[row][column]. Where the CTA's shared
  // memory holds one copy a warp (RED_APART), every warp stores its own at once and each thread
  // then adds up its elements' copies; else the warps take turns adding into red, a barrier
  // each. (Measured on the H200, a call of one token on Qwen3 or DeepSeek: 0.7 us of a gate/up
  // CTA in turns, 0.45 us so.)
  auto acc_at = [&](auto f) {              // f(row, column, value) for each accumulator
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          f(nt * 8 + kq + (c & 1), t * 16 + lane / 4 + (c >= 2 ? 8 : 0), acc[t][nt][c]);
  };
  constexpr bool RED_APART = WARPS * RED_BYTES <= sizeof(smem);
  if constexpr (RED_APART) {
    float(*mine)[64] = reinterpret_cast<float(*)[64]>(smem + warp * RED_BYTES);
    acc_at([&](int r, int col, float v) { mine[r][col] = v; });
    __syncthreads();
    for (int x = threadIdx.x; x < ROWS * 64; x += WARPS * 32) {   // (red is warp 0's copy)
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
    if constexpr (EPILOGUE == 1) {      // SwiGLU: columns 0..31 gate, 32..63 up
      const float v = silu(red[r][c]) * red[r][c + 32];
      out[(size_t)slot * NOUT + tile * 32 + c] = act_from_float(v);
    } else {
      const int col = PERM_GATE_UP ? (c < 32 ? tile * 32 + c : NOUT / 2 + tile * 32 + c - 32)
                                   : tile * 64 + c;
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
    for (int x = threadIdx.x; x < tokens * 8; x += WARPS * 32) {   // 8 chunks of 8 columns
      const int col = tile * 64 + (x % 8) * 8;
      if (col < NOUT) topk_sum_chunk<SUM_TOPK, NOUT, true>(out, x / 8, col, sum_out, routed);
    }
  }
}


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
    cp_async16(st + 16 * c, w_cta + (size_t)(step + c / (32 * COLT)) * NTILES * 32 +
                                c % (32 * COLT));
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
  if constexpr (SPLIT_MANY == SPLIT) return SPLIT;
  else return total / BLOCK * COL_CTAS * SPLIT_MANY < FILL_CTAS ? SPLIT : SPLIT_MANY;
}

// The output column of 16-byte piece `ch` of a wide CTA's row of column tile `tile`: SwiGLU's
// 32 columns of the tile; or 64 columns, gate/up's (PERM_GATE_UP: 0..31 gate, 32..63 up) or
// the tile's own.
template <int EPILOGUE, bool PERM_GATE_UP, int NOUT>
__device__ __forceinline__ int wide_out_column(int tile, int ch) {
  if constexpr (EPILOGUE == 1) return tile * 32 + 8 * ch;
  else if constexpr (PERM_GATE_UP)
    return ch < 4 ? tile * 32 + 8 * ch : NOUT / 2 + tile * 32 + 8 * (ch - 4);
  else return tile * 64 + 8 * ch;
}

// SUM_TOPK (fuse-topk-sum): once every moe block's CTA of column tile `col_tile` (COLT 64-column
// tiles) has written its rows, the last to arrive sums the tile for every token, in k order
// (topk_sum_chunk)
template <int BLOCK, int COLT, int THREADS, int NOUT, int SUM_TOPK>
__device__ __forceinline__ void sum_topk_when_last(act_t* __restrict__ out,
                                                   act_t* __restrict__ sum_out,
                                                   int* __restrict__ sum_counters, int col_tile,
                                                   const int* __restrict__ total_ptr,
                                                   int num_slots, Routed routed) {
  __shared__ int last_cta;
  if (!last_to_arrive(&sum_counters[col_tile], *total_ptr / BLOCK, last_cta)) return;
  constexpr int PIECES = 8 * COLT;       // 8-column pieces of the CTA's columns
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
__device__ __forceinline__ void wide_epilogue(
    const float (&acc)[4][WARP_ROWS / 8][4], unsigned char* smem, int row0, int tile,
    const int* __restrict__ sorted_ids, const int* __restrict__ total_ptr,
    const float* __restrict__ weights_flat, int num_slots, act_t* __restrict__ out,
    act_t* __restrict__ sum_out, int* __restrict__ sum_counters, Routed routed) {
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
      const int r = nt * 8 + kq + (c & 1);                 // row within the warp's
      const int col = lane / 4 + (c >= 2 ? 8 : 0);          // + 16 t
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        if constexpr (EPILOGUE == 1) {     // SwiGLU: t = 0, 1 gate, t = 2, 3 up (columns + 32)
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
  constexpr int OUT_CHUNKS = OUT_COLS / 8;                 // 16-byte pieces of a row
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
          int SPLIT = 1, int SPLIT_MANY = SPLIT, int FILL_CTAS = 0, bool DYNAMIC_SHARED = false,
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
  constexpr int NT = WARP_ROWS / 8;              // n8 tiles of a warp's rows
  constexpr int KSTEPS = KDIM / 16, ITERS = KSTEPS / KS, GROUPS = KDIM / G;
  static_assert((WARP_ROWS == 32 || WARP_ROWS == 64) && BLOCK % WARP_ROWS == 0 &&
                NTILES % COLT == 0, "whole row groups of 32 or 64 and whole column tiles");
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
  // (DYNAMIC_SHARED: the launch gives the larger of the two as dynamic shared memory)
  __shared__ __align__(128) unsigned char
      static_shared[DYNAMIC_SHARED ? 16 : RING_BYTES > OUT_BYTES ? RING_BYTES : OUT_BYTES];
  unsigned char* smem = DYNAMIC_SHARED ? dynamic_shared : static_shared;

  const int blk = blockIdx.x, col_tile = blockIdx.y;   // blocks vary fastest (weights from L2)
  const int split = SPLIT > 1 ? blockIdx.z : 0;         // (a constant for the whole K)
  // this call's split (SPLIT unless SPLIT_MANY differs: call_split) and K range
  const int total = *total_ptr;
  const int split_now = call_split<BLOCK, NTILES / COLT, SPLIT, SPLIT_MANY, FILL_CTAS>(total);
  const int cta_iters = ITERS / split_now;
  const int it0 = split * cta_iters, group0 = it0 / GROUP_ITERS;
  if (blk * BLOCK >= total || (SPLIT_MANY != SPLIT && split >= split_now)) return;
  const int expert = expert_ids[blk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ct = warp % COLT, row0 = warp / COLT * WARP_ROWS;   // column tile, first row
  const int tile = col_tile * COLT + ct;                // this warp's 64-column tile

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
  const uint4* z_cta = zeros + group_offset;       // (HAS_ZERO)
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
        dequant8(words[t], frag);          // rows r, r + 8, r, r + 8 of the A fragment
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
    cp_async_wait<STAGES - 2>();           // stage i has landed (this thread's copies) ...
    __syncthreads();                       // ... everyone's; and stage i - 1 is read by all
    if (i + STAGES - 1 < cta_iters) issue(i + STAGES - 1);   // into stage i - 1's slot
    cp_async_commit();
    if (i % GROUP_ITERS == 0) {            // a scale group starts: its scales are in stage i
      scale_now = staged_group_scales(smem + (i % STAGES) * STAGE_BYTES + S_OFFSET, ct, lane);
      if constexpr (HAS_ZERO)
        zero_now = staged_group_scales(smem + (i % STAGES) * STAGE_BYTES + Z_OFFSET, ct, lane);
    }
    multiply_stage(i);
  }
  cp_async_wait<0>();
  __syncthreads();                         // the ring is free: the output rows reuse it
  if constexpr (SPLIT > 1) {
    __shared__ int last_cta;
    auto& v = reinterpret_cast<float(&)[4 * NT * 4]>(acc);
    const int tile_id = blk * (NTILES / COLT) + col_tile;
    if (!split_k_gather<SPLIT, THREADS>(v, partials, counters, tile_id, split, last_cta,
                                        split_now))
      return;
  }

  wide_epilogue<BLOCK, WARP_ROWS, COLT, NOUT, EPILOGUE, PERM_GATE_UP, MUL_WEIGHTS, SUM_TOPK>(
      acc, smem, row0, tile, sorted_ids, total_ptr, weights_flat, num_slots, out, sum_out,
      sum_counters, routed);
}

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
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE " "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[32], const unsigned (&a)[4],
                                             unsigned long long b_desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE " "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_f16<96>(float (&d)[48], const unsigned (&a)[4],
                                             unsigned long long b_desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %53, 0; "
      "wgmma.mma_async.sync.aligned.m64n96k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE " "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
      "}, {%48, %49, %50, %51}, %52, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_f16<128>(float (&d)[64], const unsigned (&a)[4],
                                              unsigned long long b_desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %69, 0; "
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE " "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

// The block's activation rows as the warpgroup MMA's B operand: a stage's KS k16 steps of the
// BLOCK rows, 2 KS chunks of 16 bytes a row, stored chunk-major (k8 chunk c of row r at
// (c BLOCK + r) x 16 bytes: the B descriptor's layout without swizzle). The CTA's THREADS
// threads copy chunk q THREADS + thread; a warp's 32 chunks are LANES_PER_ROW = 4 adjacent
// chunks (64 bytes, whole sectors) of each of 8 rows (2 of 16 rows where a stage holds one k16
// step). Its shared-memory writes then fall 4 to a bank, the fewest 512 bytes allow; a warp over
// 2 rows of 16 chunks each would write 16 to a bank, as the chunk-major stride puts a row's
// chunks on the same banks. Padding rows copy 0 bytes and zero-fill.
template <int BLOCK, int KS, int THREADS, int KDIM, int ROW_DIV>
struct ChunkMajorRows {
  static constexpr int CHUNKS = 2 * KS, A_CHUNKS = BLOCK * CHUNKS;
  static constexpr int COPIES = (A_CHUNKS + THREADS - 1) / THREADS;   // threads past A_CHUNKS idle
  static constexpr int LANES_PER_ROW = CHUNKS < 4 ? CHUNKS : 4, WARP_ROWS = 32 / LANES_PER_ROW;
  static_assert(CHUNKS % LANES_PER_ROW == 0 && BLOCK % WARP_ROWS == 0,
                "a warp's chunks: whole row pieces of whole row groups");
  const act_t* row[COPIES];
  unsigned bytes[COPIES];

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
    return 16 * (part_of(chunk(q)) * BLOCK + row_of(chunk(q)));
  }
  // copy k16 steps step .. step + KS - 1 into a stage's rows at `dst`
  __device__ __forceinline__ void copy(unsigned char* dst, int step) const {
#pragma unroll
    for (int q = 0; q < COPIES; ++q)
      if (copies(q)) cp_async16_zfill(dst + offset(q), row[q] + step * 16, bytes[q]);
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
  constexpr int W_BYTES = COLT * KS * 512, A_BYTES = BLOCK * KS * 32;
  constexpr int S_OFFSET = W_BYTES + A_BYTES;      // a group's scales (copy_group_scales)
  constexpr int Z_OFFSET = S_OFFSET + COLT * SCALE_STAGE_BYTES;     // and zeros (HAS_ZERO)
  constexpr int STAGE_BYTES = S_OFFSET + group_stage_bytes<COLT, HAS_ZERO>();
  constexpr int RING_BYTES = STAGES * STAGE_BYTES;
  constexpr int OUT_COLS = EPILOGUE == 1 ? 32 : 64;
  constexpr int OUT_BYTES = COLT * BLOCK * (OUT_COLS + 8) * 2;
  constexpr int AHEAD = STAGES - 2;                // stages in flight ahead of the current one
  __shared__ __align__(128) unsigned char smem[RING_BYTES > OUT_BYTES ? RING_BYTES : OUT_BYTES];

  const int blk = blockIdx.x, col_tile = blockIdx.y;   // blocks vary fastest (weights from L2)
  const int split = SPLIT > 1 ? blockIdx.z : 0;         // (a constant for the whole K)
  // this call's split (SPLIT unless SPLIT_MANY differs: call_split) and K range
  const int total = *total_ptr;
  const int split_now = call_split<BLOCK, NTILES / COLT, SPLIT, SPLIT_MANY, FILL_CTAS>(total);
  const int cta_iters = ITERS / split_now;
  const int it0 = split * cta_iters, group0 = it0 / GROUP_ITERS;
  if (blk * BLOCK >= total || (SPLIT_MANY != SPLIT && split >= split_now)) return;
  const int expert = expert_ids[blk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile = col_tile * COLT + warp;             // the column tile warp w dequantizes

  // copies of one stage: the weights by copy_weight_stage, the rows by ChunkMajorRows
  using BlockRows = ChunkMajorRows<BLOCK, KS, THREADS, KDIM, ROW_DIV>;
  constexpr int A_COPIES = BlockRows::COPIES;
  const BlockRows block_rows(a, sorted_ids, blk, num_slots);
  const uint4* w_cta = w + ((size_t)expert * KSTEPS * NTILES + col_tile * COLT) * 32;
  const size_t group_offset = (((size_t)expert * GROUPS + group0) * NTILES + col_tile * COLT) * 8;
  const uint4* s_cta = scales + group_offset;
  const uint4* z_cta = zeros + group_offset;       // (HAS_ZERO)
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
        if (BlockRows::copies(q))
          cp_async16_zfill_at(row_dst[q] + (i % STAGES) * STAGE_BYTES,
                              block_rows.row[q] + step * 16, block_rows.bytes[q]);
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

  // PIN_ADDRESSES: the B descriptors are the ring's own with the address field moved on by a
  // stage's offset in the ring
  const unsigned long long desc_ring = PIN_ADDRESSES ? wgmma_desc(smem, BLOCK * 16, 128) : 0;

  unsigned frag[2][4][4];                // [step parity][subtile t]: A fragments
  auto multiply_step = [&](const unsigned char* st, int sub, const uint4& wv,
                           unsigned (&f)[4][4]) {
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
      desc = desc_ring + ((unsigned)(st - smem + W_BYTES + sub * 2 * BLOCK * 16) >> 4);
    else
      desc = wgmma_desc(st + W_BYTES + sub * 2 * BLOCK * 16, BLOCK * 16, 128);
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < 4; ++t)
      wgmma_f16<BLOCK>(reinterpret_cast<float(&)[NT * 4]>(acc[t]), f[t], desc);
    wgmma_commit();
  };

  prime_ring<AHEAD, false>(cta_iters, issue_weights, issue_rows);
  for (int i = 0; i < cta_iters; ++i) {
    wgmma_wait<1>();                       // step i KS - 2 is done: its A set and stage free
    cp_async_wait<AHEAD - 1>();            // stage i has landed (this thread's copies) ...
    fence_proxy_async();                   // ... where the tensor cores will read it
    __syncthreads();                       // everyone's; stage i - 2 is no longer read
    // the warp's weight words of every step of the stage, read before the copies are issued
    // so that the reads are in flight while they are
    const unsigned char* st = smem + (i % STAGES) * STAGE_BYTES;
    uint4 wv[KS];
#pragma unroll
    for (int sub = 0; sub < KS; ++sub)
      wv[sub] = *reinterpret_cast<const uint4*>(st + (sub * COLT + warp) * 512 + lane * 16);
    if (i + AHEAD < cta_iters) issue(i + AHEAD);   // into stage i - 2's slot
    cp_async_commit();
    if (i % GROUP_ITERS == 0) {            // a scale group starts: its scales are in stage i
      scale_now = staged_group_scales(st + S_OFFSET, warp, lane);
      if constexpr (HAS_ZERO) zero_now = staged_group_scales(st + Z_OFFSET, warp, lane);
    }
#pragma unroll
    for (int sub = 0; sub < KS; ++sub) {
      if (sub > 0) wgmma_wait<1>();        // step sub - 2's wgmmas are done with frag[sub % 2]
      multiply_step(st, sub, wv[sub], frag[sub % 2]);
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) reg_fence(acc[t][nt][c]);
  cp_async_wait<0>();
  __syncthreads();                         // the ring is free: the output rows reuse it
  if constexpr (SPLIT > 1) {
    __shared__ int last_cta;
    // (the call's split worked out again from the block count: the value of split_now)
    if (!split_k_gather<SPLIT, THREADS>(reinterpret_cast<float(&)[4 * NT * 4]>(acc), partials,
                                        counters, blk * (NTILES / COLT) + col_tile, split,
                                        last_cta, call_split<BLOCK, NTILES / COLT, SPLIT,
                                                             SPLIT_MANY, FILL_CTAS>(*total_ptr)))
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
// through shared memory as fp32 into the epilogue. Dynamic shared memory: the larger of the
// ring and the staged outputs (tall_shared_bytes in the tile pass). HAS_ZERO: zeros staged
// after the scales, as the wide CTA.
template <int BLOCK, int KDIM, int NTILES, int NOUT, int G, int STAGES, int KS, int ROW_DIV,
          int EPILOGUE, bool PERM_GATE_UP, bool MUL_WEIGHTS, int SUM_TOPK = 0,
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
  constexpr int COLT = 4, THREADS = 128 * COLT;    // a warpgroup per column tile
  constexpr int KSTEPS = KDIM / 16, ITERS = KSTEPS / KS, GROUPS = KDIM / G;
  static_assert(BLOCK == 128, "4 groups of 32 rows (block 64 measured 30-60% slower)");
  static_assert(NTILES % COLT == 0, "whole CTAs of 4 column tiles");
  static_assert(KSTEPS % KS == 0 && G % (16 * KS) == 0, "the k16 steps of a stage share a group");
  static_assert(KS % 2 == 0, "A fragments alternate between two register sets by step parity");
  static_assert(STAGES >= 3, "the ring keeps a stage for the wgmma in flight");
  constexpr int GROUP_ITERS = G / (16 * KS);
  constexpr int W_BYTES = COLT * KS * 512, A_BYTES = BLOCK * KS * 32;
  constexpr int S_OFFSET = W_BYTES + A_BYTES;      // a group's scales (copy_group_scales)
  constexpr int Z_OFFSET = S_OFFSET + COLT * SCALE_STAGE_BYTES;     // and zeros (HAS_ZERO)
  constexpr int STAGE_BYTES = S_OFFSET + group_stage_bytes<COLT, HAS_ZERO>();
  constexpr int AHEAD = STAGES - 2;
  constexpr int RED_ROW = 64 + 4;    // fp32 words of a staged output row (conflict-free writes)
  unsigned char* smem = dynamic_shared;

  const int blk = blockIdx.x, col_tile = blockIdx.y;   // blocks vary fastest (weights from L2)
  if (blk * BLOCK >= *total_ptr) return;
  const int expert = expert_ids[blk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4, subtile = warp % 4;   // column tile wg of the CTA's, warp subtile of it
  // The 16-column subtile whose packed words this lane dequantizes: warp `subtile`'s own, turned
  // by lane / 8. The packed tile keeps a lane's 4 subtiles in one 16-byte piece, so word
  // `subtile` of every lane's piece would fall on 8 banks (4-way conflicted); turned, a warp's 32
  // words fall on 32. The wgmma's A rows 16 subtile + lane / 4 (+ 8) are then columns 16 src +
  // lane / 4 (+ 8) of the tile, and so are the lane's accumulator rows.
  const int src = (subtile + lane / 8) % 4;

  // copies of one stage: the weights by copy_weight_stage, the rows by ChunkMajorRows
  const ChunkMajorRows<BLOCK, KS, THREADS, KDIM, ROW_DIV> block_rows(a, sorted_ids, blk,
                                                                      num_slots);
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
  act2_t scale_now;                      // the lane's two columns' scales, the current group's
  act2_t zero_now = {};                  // (and zeros, HAS_ZERO)
  unsigned frag[2][4];                   // [step parity]: A fragments

  // full[s]: ring slot s has landed (every thread's copies of it); empty[s]: every warp's
  // wgmmas are done with it. Every thread copies and multiplies, and waits only for the stage
  // it reads and the slot it refills (a CTA-wide barrier a stage measured 11% slower).
  __shared__ unsigned long long full[STAGES], empty[STAGES];
  if (threadIdx.x < STAGES) {
    mbar_init(&full[threadIdx.x], THREADS);
    mbar_init(&empty[threadIdx.x], THREADS);
  }
  // the block's rows that hold slots (its expert's come first, then padding): the wgmmas
  // multiply only the 32-row groups that hold any (an expert's last block is mostly part full)
  const int rows = __syncthreads_count(threadIdx.x < BLOCK &&
                                       sorted_ids[blk * BLOCK + threadIdx.x] < num_slots);
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
      fence_proxy_async();                 // the copies, where the tensor cores will read them
      const unsigned char* st = smem + slot * STAGE_BYTES;
      // the lane's weight words of every step of the stage (word `src` of its 16 bytes of the
      // tile) and a group's scales, read before the copies are issued (their loads then wait
      // behind no copy, and the copies' address registers are not yet taken)
      unsigned words[KS];
#pragma unroll
      for (int sub = 0; sub < KS; ++sub)
        words[sub] = *reinterpret_cast<const unsigned*>(st + (sub * COLT + wg) * 512 + lane * 16 +
                                                        4 * src);
      if (i % GROUP_ITERS == 0) {          // a scale group starts: its scales are in stage i
        scale_now = *reinterpret_cast<const act2_t*>(st + S_OFFSET + (wg * 8 + lane / 4) * 16 +
                                                      4 * src);
        if constexpr (HAS_ZERO)
          zero_now = *reinterpret_cast<const act2_t*>(st + Z_OFFSET + (wg * 8 + lane / 4) * 16 +
                                                       4 * src);
      }
      const int next = i + AHEAD;
      if (next < ITERS) {                  // into the slot of stage next - STAGES, once consumed
        if (next >= STAGES) mbar_wait(&empty[next % STAGES], (next / STAGES - 1) & 1);
        issue_weights(next);
        issue_rows(next);
        cp_async_mbar_arrive(&full[next % STAGES]);
      }
#pragma unroll
      for (int sub = 0; sub < KS; ++sub) {
        wgmma_wait<1>();                   // frag[sub % 2]'s last wgmma is done
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
            wgmma_desc(st + W_BYTES + sub * 2 * BLOCK * 16, BLOCK * 16, 128);
        wgmma_fence();
        wgmma_f16<N>(reinterpret_cast<float(&)[N / 2]>(acc), f, desc);
        wgmma_commit();
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < N / 2; ++j) reg_fence(acc[j]);
#pragma unroll
    for (int j = N / 2; j < BLOCK / 2; ++j) acc[j] = 0.0f;
  };
  if (rows > 96) k_loop(RowCount<128>());
  else if (rows > 64) k_loop(RowCount<96>());
  else if (rows > 32) k_loop(RowCount<64>());
  else k_loop(RowCount<32>());
  __syncthreads();                         // the ring is free: the outputs reuse it

  // the accumulators as fp32 rows of each column tile: red[tile][row][column]
  float* red = reinterpret_cast<float*>(smem);
  {
    float* mine = red + wg * BLOCK * RED_ROW + 16 * src + lane / 4;
#pragma unroll
    for (int q = 0; q < BLOCK / 8; ++q)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        mine[(8 * q + 2 * (lane % 4) + (c & 1)) * RED_ROW + (c >= 2 ? 8 : 0)] = acc[4 * q + c];
  }
  __syncthreads();
  constexpr int OUT_CHUNKS = (EPILOGUE == 1 ? 32 : 64) / 8;   // 16-byte pieces of a tile's row
  for (int x = threadIdx.x; x < COLT * BLOCK * OUT_CHUNKS; x += THREADS) {
    const int ch = x % OUT_CHUNKS, r = x / OUT_CHUNKS % BLOCK, t = x / (OUT_CHUNKS * BLOCK);
    const int slot = sorted_ids[blk * BLOCK + r];
    if (slot >= num_slots) continue;
    const int tile = col_tile * COLT + t;
    const float* row = red + (t * BLOCK + r) * RED_ROW;
    const int col = wide_out_column<EPILOGUE, PERM_GATE_UP, NOUT>(tile, ch);
    if (col >= NOUT) continue;
    const float weight = MUL_WEIGHTS ? weights_flat[blk * BLOCK + r] : 1.0f;
    uint4 packed;
    act_t* h = reinterpret_cast<act_t*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (EPILOGUE == 1)         // SwiGLU: columns 0..31 gate, 32..63 up
        h[j] = act_from_float(silu(row[8 * ch + j]) * row[8 * ch + j + 32]);
      else if constexpr (MUL_WEIGHTS)
        h[j] = act_from_float(row[8 * ch + j] * weight);
      else
        h[j] = act_from_float(row[8 * ch + j]);
    }
    *reinterpret_cast<uint4*>(out + (size_t)slot * NOUT + col) = packed;
  }

  if constexpr (SUM_TOPK > 0)
    sum_topk_when_last<BLOCK, COLT, THREADS, NOUT, SUM_TOPK>(out, sum_out, sum_counters, col_tile,
                                                              total_ptr, num_slots, routed);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace moegen

// true when a loop action with this iteration offset runs at `step` (schedule rendering)
__device__ __forceinline__ bool moegen_runs(int step, int offset, int iterations) {
  return step >= offset && step - offset < iterations;
}
