// moegen device helpers for the W4A16 and MSD kernels: int4 -> fp16 dequantization in registers, tensor-core
// MMA, warp reductions. Included by the generated .cu files (hand-written, not generated).
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

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  // weights are read once: do not keep them in L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
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

__device__ __forceinline__ unsigned ld_u32_or_zero(const half* row, int col) {
  return row ? *reinterpret_cast<const unsigned*>(row + col) : 0u;
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

}  // namespace moegen

// true when a loop action with this iteration offset runs at `step` (schedule rendering)
__device__ __forceinline__ bool moegen_runs(int step, int offset, int iterations) {
  return step >= offset && step - offset < iterations;
}
