// moegen device code: tensor-core MMAs on registers (mma.sync): f16/bf16, s4 x u4, s8 x s8.
#pragma once

namespace moegen {

// D = A (16x16 act_t, row) x B (16x8 act_t, col) + C, fp32 accumulate.
__device__ __forceinline__ void mma_16816(float c[4], const unsigned a[4], unsigned b0,
                                          unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MOEGEN_MMA_TYPE "." MOEGEN_MMA_TYPE
               ".f32 "
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

// D = A (16x32 int8, row) x B (32x8 int8, col) + C, int32 accumulate.
__device__ __forceinline__ void mma_s8s8_16832(int c[4], const unsigned a[4], unsigned b0,
                                               unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace moegen
