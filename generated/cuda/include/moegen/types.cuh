// moegen device code: the activations' type (fp16 or bf16 by MOEGEN_BF16), the routed-slot test,
// constants.
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

}  // namespace moegen
