// Stub of the ACL runtime API (the subset the generated example calls), for syntax checks only.
#pragma once
#include <cstddef>
#include <cstdint>

typedef int aclError;
typedef void* aclrtStream;
typedef struct aclTensor aclTensor;
typedef struct aclOpExecutor aclOpExecutor;
typedef int aclnnStatus;
enum aclDataType { ACL_FLOAT16, ACL_FLOAT, ACL_INT4, ACL_INT8, ACL_INT32 };
enum aclFormat { ACL_FORMAT_ND };
enum aclrtMemMallocPolicy { ACL_MEM_MALLOC_HUGE_FIRST };
enum aclrtMemcpyKind { ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST };
enum aclrtRunMode { ACL_DEVICE, ACL_HOST };
constexpr aclError ACL_SUCCESS = 0;

aclError aclInit(const char* configPath);
aclError aclFinalize();
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtGetRunMode(aclrtRunMode* runMode);
aclError aclrtCreateStream(aclrtStream* stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void* devPtr);
aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind);
aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType,
                           const int64_t* stride, int64_t offset, aclFormat format,
                           const int64_t* storageDims, uint64_t storageDimsNum, void* tensorData);
aclError aclDestroyTensor(const aclTensor* tensor);
