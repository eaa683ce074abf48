// Stub of the AscendC tiling-template declarations, for syntax checks only.
#pragma once
#define ASCENDC_TPL_4_BW 4
#define ASCENDC_TPL_UI_LIST 0
#define ASCENDC_TPL_MIX_AIC_1_2 2
#define ASCENDC_TPL_UINT_DECL(name, bw, kind, ...)
#define ASCENDC_TPL_ARGS_DECL(op, ...)
#define ASCENDC_TPL_UINT_SEL(name, kind, ...)
#define ASCENDC_TPL_KERNEL_TYPE_SEL(kind)
#define ASCENDC_TPL_SEL(...)
#define ASCENDC_TPL_ARGS_SEL(...)
