// Stub of the AscendC kernel API for syntax checks (g++ -fsyntax-only): declares exactly the
// subset moegen's templates use, with the signatures of the AscendC API documentation
// (shared/notes/ascendc-api-signatures.txt). Nothing here runs.
#pragma once
#include <cstdint>
#include <cstring>

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*

enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_FIX, PIPE_ALL };

namespace AscendC {
enum CoreType { AIC, AIV };
extern CoreType g_coreType;

struct half { uint16_t bits; half() = default; half(float) {} operator float() const { return 0; } };
struct int4b_t { uint8_t bits; };

enum class TPosition { GM, A1, A2, B1, B2, C1, CO1, CO2, VECIN, VECOUT, VECCALC };
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };

template <typename T>
class GlobalTensor {
 public:
  __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize);
  __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer);
  __aicore__ inline GlobalTensor operator[](uint64_t offset) const;
  __aicore__ inline T GetValue(uint64_t offset) const;
  __aicore__ inline void SetValue(uint64_t offset, T value);
};

template <typename T>
class LocalTensor {
 public:
  __aicore__ inline LocalTensor operator[](uint32_t offset) const;
  __aicore__ inline T GetValue(uint32_t offset) const;
  __aicore__ inline void SetValue(uint32_t offset, T value);
};

template <TPosition pos>
class TBuf {
 public:
  template <typename T> __aicore__ inline LocalTensor<T> Get();
  template <typename T> __aicore__ inline LocalTensor<T> Get(uint32_t len);
};

class TPipe {
 public:
  template <TPosition bufPos> __aicore__ inline bool InitBuffer(TBuf<bufPos>& buf, uint32_t len);
};
template <uint8_t modeId, pipe_t pipe> __aicore__ inline void CrossCoreSetFlag(uint16_t flagId);
template <uint8_t modeId = 0, pipe_t pipe = PIPE_S> __aicore__ inline void CrossCoreWaitFlag(uint16_t flagId);

__aicore__ inline int64_t GetBlockIdx();
__aicore__ inline int64_t GetSubBlockIdx();
__aicore__ inline GM_ADDR GetUserWorkspace(GM_ADDR workspace);

struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;
  uint32_t srcStride = 0;
  uint32_t dstStride = 0;
  uint32_t rsv = 0;
};
template <typename T> struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  T paddingValue{};
};
struct Nd2NzParams {
  uint16_t ndNum = 1, nValue = 0, dValue = 0, srcNdMatrixStride = 0, srcDValue = 0,
           dstNzC0Stride = 0, dstNzNStride = 0, dstNzMatrixStride = 0;
};

template <typename T>
__aicore__ inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                                   const DataCopyExtParams& dataCopyParams,
                                   const DataCopyPadExtParams<T>& padParams);
template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                                   const DataCopyExtParams& dataCopyParams);
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                                const Nd2NzParams& intriParams);

template <typename T, typename U>
__aicore__ inline void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src,
                            const RoundMode& roundMode, const uint32_t count);
template <typename T>
__aicore__ inline void Abs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count);
template <typename T>
__aicore__ inline void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0,
                           const LocalTensor<T>& src1, const int32_t& count);
template <typename T>
__aicore__ inline void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0,
                           const LocalTensor<T>& src1, const int32_t& count);
template <typename T>
__aicore__ inline void Div(const LocalTensor<T>& dst, const LocalTensor<T>& src0,
                           const LocalTensor<T>& src1, const int32_t& count);
template <typename T, bool isSetMask = true>
__aicore__ inline void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                            const int32_t& count);
template <typename T, typename U>
__aicore__ inline void Axpy(const LocalTensor<T>& dst, const LocalTensor<U>& src, const U& scalarValue,
                            const int32_t& count);
template <typename T>
__aicore__ inline void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count);
template <typename T, bool isSetMask = true>
__aicore__ inline void BlockReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                      const int32_t repeatTime, const int32_t mask,
                                      const int32_t dstRepStride, const int32_t srcBlkStride,
                                      const int32_t srcRepStride);
}  // namespace AscendC

using AscendC::half;
using AscendC::int4b_t;

#define ASCEND_IS_AIC (AscendC::g_coreType == AscendC::AIC)
#define ASCEND_IS_AIV (AscendC::g_coreType == AscendC::AIV)
#define REGISTER_TILING_DEFAULT(TILING_STRUCT) static_assert(sizeof(TILING_STRUCT) > 0, "tiling")
#define GET_TILING_DATA_WITH_STRUCT(struct_name, tiling_data, tiling_arg) \
  struct_name tiling_data;                                                \
  std::memcpy(&tiling_data, tiling_arg, sizeof(struct_name))
