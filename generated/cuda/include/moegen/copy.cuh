// moegen device code: copies into shared memory: cp.async (plain, zero-fill, L2-hinted) and
// ldmatrix.
#pragma once

namespace moegen {

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
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(
                     smem_addr(dst) | zero),
                 "l"(src), "l"(policy)
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
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, policy;\n}\n" ::"r"(
          smem_addr(dst) | opaque_zero()),
      "l"(src), "r"(bytes)
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

}  // namespace moegen
