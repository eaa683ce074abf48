// Stub of the CANN op registration and tiling/infershape context APIs, for syntax checks only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ge {
enum DataType { DT_FLOAT16, DT_FLOAT, DT_INT4, DT_INT8, DT_INT32 };
enum Format { FORMAT_ND };
using graphStatus = uint32_t;
constexpr graphStatus GRAPH_SUCCESS = 0;
constexpr graphStatus GRAPH_FAILED = 1;
}  // namespace ge

namespace gert {
class Shape {
 public:
  size_t GetDimNum() const;
  int64_t GetDim(size_t idx) const;
  void SetDimNum(size_t num);
  void SetDim(size_t idx, int64_t value);
};
class StorageShape {
 public:
  const Shape& GetStorageShape() const;
};
class CompileTimeTensorDesc {
 public:
  ge::DataType GetDataType() const;
};
class TilingData {
 public:
  void* GetData();
  size_t GetCapacity() const;
  void SetDataSize(size_t size);
};
class TilingContext {
 public:
  const StorageShape* GetInputShape(size_t index) const;
  const CompileTimeTensorDesc* GetInputDesc(size_t index) const;
  const CompileTimeTensorDesc* GetOutputDesc(size_t index) const;
  const void* GetPlatformInfo() const;
  const char* GetNodeName() const;
  ge::graphStatus SetBlockDim(uint32_t blockDim);
  ge::graphStatus SetTilingKey(uint64_t tilingKey);
  ge::graphStatus SetScheduleMode(uint32_t mode);
  size_t* GetWorkspaceSizes(size_t num);
  TilingData* GetRawTilingData();
};
class InferShapeContext {
 public:
  const Shape* GetInputShape(size_t index) const;
  Shape* GetOutputShape(size_t index);
};
class OpImplRegister {
 public:
  explicit OpImplRegister(const char* opType);
  OpImplRegister& Tiling(ge::graphStatus (*fn)(TilingContext*));
  OpImplRegister& InferShape(ge::graphStatus (*fn)(InferShapeContext*));
};
}  // namespace gert

namespace ops {
enum class Option { REQUIRED, OPTIONAL, DYNAMIC };
class OpParamDef {
 public:
  OpParamDef& ParamType(Option param_type);
  OpParamDef& DataType(std::vector<ge::DataType> types);
  OpParamDef& Format(std::vector<ge::Format> formats);
};
class OpAICoreConfig {};
class OpAICoreDef {
 public:
  void AddConfig(const char* soc);
  void AddConfig(const char* soc, OpAICoreConfig& aicore_config);
};
class OpDef {
 public:
  explicit OpDef(const char* name);
  OpParamDef& Input(const char* name);
  OpParamDef& Output(const char* name);
  OpAICoreDef& AICore(void);
};
}  // namespace ops

#define OP_ADD(opType) static ops::opType g_op_##opType##_registered(#opType)
#define IMPL_OP_OPTILING(opType) \
  static gert::OpImplRegister g_tiling_##opType = gert::OpImplRegister(#opType)
#define IMPL_OP_INFERSHAPE(opType) \
  static gert::OpImplRegister g_infershape_##opType = gert::OpImplRegister(#opType)
