// moegen device code for the W4A16 and MSD kernels: int4 -> fp16 or bf16 dequantization in
// registers, tensor-core MMA, asynchronous copies, warp reductions, and the grouped W4A16 GEMM.
// Included by the generated .cu files (hand-written, not generated).
// The include tree, by job, in the order the parts build on each other.
#pragma once
#include "moegen/types.cuh"
#include "moegen/copy.cuh"
#include "moegen/sync.cuh"
#include "moegen/ring.cuh"
#include "moegen/mma.cuh"
#include "moegen/dequant.cuh"
#include "moegen/reduce.cuh"
#include "moegen/gemm_ksplit.cuh"
#include "moegen/gemm_wide.cuh"
#include "moegen/gemm_wgmma.cuh"
#include "moegen/msd.cuh"
