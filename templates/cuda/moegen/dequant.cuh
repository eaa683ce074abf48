// moegen device code: int4 -> fp16/bf16 in registers (the magic-number trick), group scales and
// zero points on a fragment, and offset-binary nibbles widened to signed bytes (the MSD matmul).
#pragma once

namespace moegen {

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
  const unsigned LO = 0x000f000f, EXP = 0x43004300, SUB = 0x43084308;  // 136.0 in both halves
  const unsigned q[4] = {lop3_or(w, LO, EXP), lop3_or(w >> 4, LO, EXP), lop3_or(w >> 8, LO, EXP),
                         lop3_or(w >> 12, LO, EXP)};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    out[i] =
        __hsub2(*reinterpret_cast<const act2_t*>(&q[i]), *reinterpret_cast<const act2_t*>(&SUB));
}
#else
__device__ __forceinline__ void dequant8(unsigned w, act2_t out[4]) {
  const unsigned LO = 0x000f000f, HI = 0x00f000f0, EXP = 0x64006400;
  const unsigned SUB = 0x64086408;  // 1032.0 in both halves
  const unsigned MUL = 0x2c002c00;  // 1/16
  const unsigned ADD = 0xd480d480;  // -72.0 = -(1024 / 16 + 8)
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
  if constexpr (N == 1)
    *p = static_cast<unsigned char>(v);
  else if constexpr (N == 2)
    *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(v);
  else
    *reinterpret_cast<unsigned*>(p) = v;
}

}  // namespace moegen
