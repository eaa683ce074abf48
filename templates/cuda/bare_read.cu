// moegen: a bare read of device memory, timed by `moegen bench` beside the generated kernels.
//
// It streams the bytes a kernel call must read (the routed experts' int4 weights and scales,
// or an MSD matmul's) and does nothing with them, under the bench's own harness (graph replay,
// L2 flushed): what those bytes cost with no work on them, launch and ramp included, against
// which the memory floor (bytes over copy bandwidth) leaves both out.
//
// The bytes come as chunks of at most THREADS x LOADS x 16 bytes (start address and length,
// both multiples of 16), one a CTA; each thread has LOADS 16-byte loads in flight at once,
// evict-first (`ld.global.cs`: a call reads its weights once). Of the 19 shapes measured (128 to
// 1024 threads, 2 to 16 loads a thread, a CTA a chunk or a grid of the CTAs that fit the GPU at
// once looping over them), this one was within 0.2 us of the fastest on the MSD seed's 52 MB
// (18.2 us) and on 19 MB, and read Mixtral's 8 experts at the copy bandwidth (docs/DESIGN.md).
// The CTA leaves the XOR of every 32-bit word it read in xor_out[blockIdx.x], so the loads are
// used and a test can check that every byte was read once.

#define MOEGEN_READ_THREADS 512
#define MOEGEN_READ_LOADS 4

__device__ __forceinline__ uint4 moegen_load_evict_first(const void* p) {
  uint4 v;
  asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

extern "C" __global__ void __launch_bounds__(MOEGEN_READ_THREADS)
    moegen_bare_read(const unsigned long long* __restrict__ starts, const int* __restrict__ lengths,
                     unsigned* __restrict__ xor_out) {
  const char* chunk = reinterpret_cast<const char*>(starts[blockIdx.x]);
  const int length = lengths[blockIdx.x];
  uint4 v[MOEGEN_READ_LOADS];
  // every load issued before any is used
#pragma unroll
  for (int i = 0; i < MOEGEN_READ_LOADS; ++i) {
    const int at = (i * MOEGEN_READ_THREADS + threadIdx.x) * 16;
    v[i] = at < length ? moegen_load_evict_first(chunk + at) : make_uint4(0, 0, 0, 0);
  }
  unsigned x = 0;
#pragma unroll
  for (int i = 0; i < MOEGEN_READ_LOADS; ++i) x ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  x = __reduce_xor_sync(0xffffffffu, x);
  __shared__ unsigned warp_xor[MOEGEN_READ_THREADS / 32];
  if (threadIdx.x % 32 == 0) warp_xor[threadIdx.x / 32] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned all = 0;
#pragma unroll
    for (int w = 0; w < MOEGEN_READ_THREADS / 32; ++w) all ^= warp_xor[w];
    xor_out[blockIdx.x] = all;
  }
}
