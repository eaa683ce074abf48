// moegen device code: warp reductions, SiLU, the router's order-preserving keys, and the top-k sum
// of a token's rows.
#pragma once

namespace moegen {

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

// sum_out[t, col .. col + 7] = sum over k of rows[t * TOPK + k, same columns] where keep(k), in
// fp32 in k order, rounded once (a slot not kept adds +0.0, which changes no sum: the sum starts
// at +0.0 and so never is -0.0). Each load written next to its adds, in one loop: with the loads
// in a loop of their own the compiler held two of the eight back until the first adds, a second
// trip to memory (measured: the T = 1 sum 15% slower); in one loop all eight go out first.
template <int TOPK, int NOUT, bool FROM_L2, typename Keep>
__device__ __forceinline__ void sum_rows(const act_t* __restrict__ rows, size_t t, size_t col,
                                         act_t* __restrict__ sum_out, Keep keep) {
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < TOPK; ++k) {
    const uint4* p = reinterpret_cast<const uint4*>(rows + ((t * TOPK + k) * NOUT) + col);
    const uint4 v = keep(k) ? (FROM_L2 ? __ldcg(p) : *p) : make_uint4(0, 0, 0, 0);
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

// The top-k sum of a token's rows (sum_rows): of moe_aggregate and of the topk_sum epilogue, so
// the two agree bit for bit. A slot that `routed` skips (no GEMM wrote its row) adds nothing and
// is not read. FROM_L2: read through L2 only (__ldcg), for rows that other CTAs of the same
// kernel wrote. Without ids (a null pointer, at run time in the topk_sum epilogue) the loads
// carry no check; with them every check is read before the first row, so the row loads can go
// out together.
template <int TOPK, int NOUT, bool FROM_L2>
__device__ __forceinline__ void topk_sum_chunk(const act_t* __restrict__ rows, size_t t, size_t col,
                                               act_t* __restrict__ sum_out, Routed routed) {
  if (routed.ids == nullptr) {
    sum_rows<TOPK, NOUT, FROM_L2>(rows, t, col, sum_out, [](int) { return true; });
    return;
  }
  bool kept[TOPK];
#pragma unroll
  for (int k = 0; k < TOPK; ++k) kept[k] = routed(t * TOPK + k);
  sum_rows<TOPK, NOUT, FROM_L2>(rows, t, col, sum_out, [&](int k) { return kept[k]; });
}

}  // namespace moegen
