// Stub of the AscendC Matmul high-level API (kernel side), for syntax checks only.
#pragma once
#include "kernel_operator.h"

struct TCubeTiling {
  int32_t usedCoreNum, M, N, Ka, Kb, singleCoreM, singleCoreN, singleCoreK, baseM, baseN, baseK,
      depthA1, depthB1, stepM, stepN, stepKa, stepKb, isBias, dbL0C;
};

namespace AscendC {
enum class CubeFormat { ND, NZ };
template <TPosition POSITION, CubeFormat FORMAT, typename TYPE>
struct MatmulType {
  using T = TYPE;
};
template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE = C_TYPE>
class Matmul {
  using SrcAT = typename A_TYPE::T;
  using SrcBT = typename B_TYPE::T;
  using DstT = typename C_TYPE::T;

 public:
  __aicore__ inline void Init(const TCubeTiling* __restrict cubeTiling, TPipe* tpipe = nullptr);
  __aicore__ inline void SetOrgShape(int orgM, int orgN, int orgK);
  __aicore__ inline void SetTail(int tailM = -1, int tailN = -1, int tailK = -1);
  __aicore__ inline void SetTensorA(const GlobalTensor<SrcAT>& gm, bool isTransposeA = false);
  __aicore__ inline void SetTensorA(const LocalTensor<SrcAT>& leftMatrix, bool isTransposeA = false);
  __aicore__ inline void SetTensorB(const GlobalTensor<SrcBT>& gm, bool isTransposeB = false);
  __aicore__ inline void SetTensorB(const LocalTensor<SrcBT>& rightMatrix, bool isTransposeB = false);
  template <bool sync = true>
  __aicore__ inline void IterateAll(const GlobalTensor<DstT>& gm, uint8_t enAtomic = 0,
                                    bool enSequentialWrite = false, bool waitIterateAll = false,
                                    bool fakeMsg = false);
  __aicore__ inline void End();
};
}  // namespace AscendC

#define REGIST_MATMUL_OBJ(tpipe, workspace, ...) ((void)(tpipe), (void)(workspace))
