// Stub of the CANN platform query API, for syntax checks only.
#pragma once
#include <cstdint>

namespace platform_ascendc {
class PlatformAscendC {
 public:
  explicit PlatformAscendC(const void* platformInfo);
  uint32_t GetCoreNumAic(void) const;
  uint32_t GetLibApiWorkSpaceSize(void) const;
};
}  // namespace platform_ascendc
