"""`fuse-topk-sum`: a down GEMM whose only reader is `moe.aggregate` also computes the sum.

The GEMM gets ``epilogue = "topk_sum"`` and ``sum_topk = K`` and gives the aggregate's result as
its second result: it still writes the weighted rows of every slot, and the last CTA to finish
each 64-column tile adds every token's K rows of that tile, in k order (the arithmetic of
moe.aggregate, so the output is bitwise the same). One launch fewer per layer call. Not in the
default pipeline; add it to measure (`moegen bench SPEC --pass-pipeline
fuse-align,fuse-swiglu,fuse-topk-sum,tile,alloc`).
"""
from __future__ import annotations

from ..ir import Module
from .base import Context, Pass


class FuseTopkSumPass(Pass):
    name = "fuse-topk-sum"
    PIPELINES = ("moe_w4a16",)

    def apply(self, module: Module, ctx: Context) -> None:
        fn = module.function()
        for agg in [op for op in fn.ops if op.NAME == "moe.aggregate"]:
            rows = agg.operands[0]
            gemm = rows.owner
            readers = [op for op in fn.walk() if any(v is rows for v in op.operands)]
            if (getattr(gemm, "NAME", None) != "moe.grouped_gemm_w4a16" or readers != [agg]
                    or not gemm.attr("mul_topk_weights") or gemm.attr("epilogue") != "none"):
                continue
            total = agg.results[0]
            gemm.attrs["epilogue"] = "topk_sum"
            gemm.attrs["sum_topk"] = agg.attr("topk")
            total.owner = gemm
            gemm.results.append(total)
            fn.body.ops.remove(agg)
