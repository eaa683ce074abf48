"""Ops that are not specific to a pipeline: return, zeros, cast, group slices."""
from __future__ import annotations

from ..core import Attr, Op
from ..types import IndexType


class ReturnOp(Op):
    NAME = "return"
    OPERANDS = ("values*",)
    TERMINATOR = True


class ZerosOp(Op):
    """A tensor filled with zeros (the accumulator of a loop)."""
    NAME = "tensor.zeros"
    RESULTS = ("out",)

    def verify(self):
        self.tensor(self.results[0], "result")


class CastOp(Op):
    """Element type conversion; float -> f16 rounds to nearest even."""
    NAME = "tensor.cast"
    OPERANDS = ("src",)
    RESULTS = ("out",)

    def verify(self):
        src = self.tensor(self.operands[0], "operand")
        out = self.tensor(self.results[0], "result")
        self.check(out.shape == src.shape, f"result shape {out} must equal operand shape {src}")


class GroupSliceOp(Op):
    """Slice number %g (an index) of `size` elements along `axis`."""
    NAME = "tensor.group_slice"
    OPERANDS = ("src", "index")
    RESULTS = ("out",)
    ATTRS = {"axis": Attr("int"), "size": Attr("dim")}

    def verify(self):
        src = self.tensor(self.operands[0], "source")
        self.check(isinstance(self.operands[1].type, IndexType),
                   f"index %{self.operands[1].name} must have type index")
        axis = self.attr("axis")
        self.check(0 <= axis < src.rank, f"attribute axis = {axis} must be in [0, {src.rank})")
        shape = list(src.shape)
        shape[axis] = self.attr("size")
        self.expect_result(0, tuple(shape), src.dtype)

