// Stub of the CANN tiling-template key API, for syntax checks only.
#pragma once
#include <cstdint>
#include <vector>

namespace AscendC {
struct TilingDeclareParams {};
struct TilingSelectParams {};
uint64_t EncodeTilingKey(TilingDeclareParams declareParams, TilingSelectParams selectParamsVec,
                         std::vector<uint64_t> tilingParams);
}  // namespace AscendC
extern AscendC::TilingDeclareParams g_tilingDeclareParams;
extern AscendC::TilingSelectParams g_tilingSelectParams;
#define GET_TPL_TILING_KEY(...) \
  AscendC::EncodeTilingKey(g_tilingDeclareParams, g_tilingSelectParams, {__VA_ARGS__})
