// Stub of the CANN platform query API, for syntax checks only.
#pragma once
#include <cstdint>

namespace platform_ascendc {
enum class CoreMemType { L0_A, L0_B, L0_C, L1, L2, UB, HBM };
class PlatformAscendC {
 public:
  explicit PlatformAscendC(const void* platformInfo);
  uint32_t GetCoreNumAic(void) const;
  uint32_t GetCoreNumAiv(void) const;
  void GetCoreMemSize(const CoreMemType& memType, uint64_t& size) const;
  uint32_t GetLibApiWorkSpaceSize(void) const;
};
}  // namespace platform_ascendc
