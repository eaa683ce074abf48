// moegen device code: ordering: programmatic dependent launch, mbarriers, named barriers, and the
// last CTA of a group to arrive (split-K and top-k sums).
#pragma once

namespace moegen {

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

// mbarriers in shared memory: a phase completes when `count` threads have arrived; waiting on a
// phase's parity returns once it has completed (arrive releases, the wait acquires).
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile(
      "{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [%0]; }\n" ::"r"(smem_addr(bar))
      : "memory");
}

// mbar_arrive where `arrive` holds, without a branch
__device__ __forceinline__ void mbar_arrive_if(unsigned long long* bar, bool arrive) {
  asm volatile(
      "{ .reg .pred p; .reg .b64 state; setp.ne.b32 p, %1, 0; "
      "@p mbarrier.arrive.shared::cta.b64 state, [%0]; }\n" ::"r"(smem_addr(bar)),
      "r"((unsigned)arrive)
      : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    // the warp sleeps until the phase completes (or 10 us pass) instead of spinning on issue slots
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; "
        "selp.u32 %0, 1, 0, p; }\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity), "n"(10000)
        : "memory");
#else
    asm volatile(
        "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; "
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
  if constexpr (THREADS == 0)
    __syncthreads();
  else
    named_barrier_sync<1, THREADS>();
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
    if (flag) *counter = 0;  // ready for the next call
  }
  arrival_sync<THREADS>();
  return flag;
}

// Counting CTAs of one grid done with a piece of work, and waiting for them (the one-launch
// layer: the down GEMM's CTAs of a moe block wait for the gate/up CTAs of that block). The CTA's
// threads meet, then thread 0 adds one with release semantics at GPU scope: the meeting orders
// every thread's writes before it. (The count is CTA-uniform work: every thread calls it.)
__device__ __forceinline__ void count_done(int* counter) {
  __syncthreads();
  if (threadIdx.x == 0)
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Every thread of the CTA waits until *counter reaches `count`: thread 0 reads it with acquire
// semantics at GPU scope until it does, and the meeting after passes that on to the others.
__device__ __forceinline__ void wait_for_count(const int* counter, int count) {
  if (threadIdx.x == 0) {
    int seen;
    while (true) {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= count) break;
#if __CUDA_ARCH__ >= 700
      __nanosleep(64);
#endif
    }
  }
  __syncthreads();
}

}  // namespace moegen
