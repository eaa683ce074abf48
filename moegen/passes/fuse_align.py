"""`fuse-align`: count + pad_scan + slot_lists + marlin_indices -> one `moe.align`.

The four routing ops of the seed become one op, so the CUDA target can emit one kernel launch
for the whole routing step. Applies when the intermediate results of the four ops are used only
among themselves (the padded counts and slot lists are internal); the fused op keeps the
block attributes.
"""
from __future__ import annotations

from ..ir import Module
from ..ir.ops.moe import AlignOp
from .base import Context, Pass

CHAIN = ("moe.count", "moe.pad_scan", "moe.slot_lists", "moe.marlin_indices")


class FuseAlignPass(Pass):
    name = "fuse-align"
    PIPELINES = ("moe_w4a16",)

    def apply(self, module: Module, ctx: Context) -> None:
        fn = module.function()
        ops = fn.ops
        found = {op.NAME: op for op in ops if op.NAME in CHAIN}
        if len(found) != len(CHAIN):
            return  # already fused, or not the seed's chain
        count, scan, lists, indices = (found[n] for n in CHAIN)
        ids = count.operands[0]
        weights = indices.operands[3]
        internal = {id(v) for op in (count, scan, lists, indices) for v in op.results}
        kept = {id(v) for v in indices.results} | {id(scan.results[2])}
        for op in ops:
            if op.NAME in CHAIN:
                continue
            for v in op.operands:
                if id(v) in internal and id(v) not in kept:
                    return  # someone else reads an intermediate: leave the chain alone
        attrs = {"num_experts": count.attr("num_experts"), "block": indices.attr("block"),
                 "capacity_block": indices.attr("capacity_block")}
        if "block_buckets" in indices.attrs:
            attrs["block_buckets"] = indices.attrs["block_buckets"]
        fused = AlignOp([ids, weights], [v.type for v in indices.results] + [scan.results[2].type],
                        attrs, result_names=[v.name for v in indices.results]
                        + [scan.results[2].name], line=count.line)
        # uses of the old results now read the fused op's results
        remap = {id(old): new for old, new in zip(list(indices.results) + [scan.results[2]],
                                                  fused.results)}
        for op in fn.walk():
            op.operands = [remap.get(id(v), v) for v in op.operands]
        first = ops.index(count)
        fn.body.ops = [op for op in ops if op.NAME not in CHAIN]
        fn.body.ops.insert(first, fused)
