// moegen device code: the copy rings: their first stages (before or after the previous kernel's
// writes) and the group scales a ring carries.
#pragma once

namespace moegen {

// What a FOLLOWS ring waits for before it copies rows: by default the kernel before it
// (programmatic dependent launch).
struct PreviousKernel {
  __device__ __forceinline__ void operator()() const { wait_for_previous_kernel(); }
};

// The first AHEAD stages of a copy ring, one commit group each, for a K range of `iters`
// stages: issue_weights(s) then issue_rows(s). FOLLOWS (a kernel launched with programmatic
// dependent launch, whose input rows the kernel before it writes, or a CTA whose rows other
// CTAs of its grid write): every one of those stages' weights first, then wait() (for that
// kernel, or those CTAs), then the rows (the first commit group holds all the early weights).
template <int AHEAD, bool FOLLOWS, typename Weights, typename Rows, typename Wait = PreviousKernel>
__device__ __forceinline__ void prime_ring(int iters, Weights issue_weights, Rows issue_rows,
                                           Wait wait = {}) {
  if constexpr (FOLLOWS) {
#pragma unroll
    for (int s = 0; s < AHEAD; ++s)
      if (s < iters) issue_weights(s);
    wait();
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

}  // namespace moegen
