"""`fuse-swiglu`: a gate/up GEMM whose only reader is `moe.swiglu` computes the SwiGLU itself.

The GEMM gets ``epilogue = "swiglu"`` and produces the activation directly (half the columns);
the gate/up output never goes to memory. Leave the pass out of the pipeline to keep the seed's
separate SwiGLU kernel.
"""
from __future__ import annotations

from ..ir import Module, TensorType
from .base import Context, Pass


class FuseSwigluPass(Pass):
    name = "fuse-swiglu"
    PIPELINES = ("moe_w4a16",)

    def apply(self, module: Module, ctx: Context) -> None:
        fn = module.function()
        for swiglu in [op for op in fn.ops if op.NAME == "moe.swiglu"]:
            src = swiglu.operands[0]
            gemm = src.owner
            readers = [op for op in fn.walk() if any(v is src for v in op.operands)]
            if (getattr(gemm, "NAME", None) != "moe.grouped_gemm_w4a16" or readers != [swiglu]
                    or gemm.attr("mul_topk_weights") or gemm.attr("epilogue") != "none"):
                continue
            act = swiglu.results[0]
            gemm.attrs["epilogue"] = "swiglu"
            gemm.results[0].type = TensorType(act.type.shape, act.type.dtype)
            gemm.results[0].name = act.name
            for op in fn.walk():
                op.operands = [gemm.results[0] if v is act else v for v in op.operands]
            fn.body.ops.remove(swiglu)
