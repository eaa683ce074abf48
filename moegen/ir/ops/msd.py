"""Ops of the A16W4 matmul by multi-step decomposition (MSD), seeds/004.

Inside `msd.group_loop` (one iteration per K group): `msd.unfold` turns a row's group of
activations into A_max and `steps` int4 slices, `msd.int_matmul` multiplies the slices by the
int4 weights into int32, `msd.merge` scales and accumulates into fp32.
"""
from __future__ import annotations

from ..core import Attr, Op
from ..types import Dim, IndexType

# The seed's factors: 7.49 maps |a| <= A_max into [-7.49, 7.49]; 14.98 spreads a residual in
# [-0.5, 0.5] over [-7.49, 7.49] again.
DEFAULT_FACTORS = [7.49, 14.98, 14.98]


def factors_of(op: Op, steps: int) -> list[float]:
    """The op's factors attribute, or the seed's first `steps` factors."""
    factors = op.attr("factors")
    return list(DEFAULT_FACTORS[:steps]) if factors is None else factors


def _factors_ok(op: Op, steps: Dim) -> None:
    factors = op.attr("factors")
    if factors is None:
        return
    if steps.is_static:
        op.check(len(factors) == steps.value,
                 f"attribute factors has {len(factors)} entries but steps = {steps}")
    op.check(all(f > 0 for f in factors), f"attribute factors = {factors} must be positive")


class GroupLoopOp(Op):
    """for g in range(groups): acc = body(g, acc). Body block args: (%g: index, %acc)."""
    NAME = "msd.group_loop"
    OPERANDS = ("init",)
    RESULTS = ("acc",)
    ATTRS = {"groups": Attr("dim"), "group_size": Attr("dim"),
             "tile": Attr("dict", None, choice=True),
             "schedule": Attr("str", None, choice=True), "slots": Attr("dict", None, choice=True)}
    REGION = True

    def verify(self):
        init = self.tensor(self.operands[0], "init")
        self.check(self.results[0].type == init, f"result must have the type of init ({init})")
        args = self.region.args
        self.check(len(args) == 2 and isinstance(args[0].type, IndexType) and args[1].type == init,
                   f"body must take (%g: index, %acc: {init})")
        groups = Dim.of(self.attr("groups"))
        if groups.is_static:
            self.check(groups.value >= 1, f"attribute groups = {groups} must be >= 1")


class YieldOp(Op):
    NAME = "msd.yield"
    OPERANDS = ("values*",)
    TERMINATOR = True


class UnfoldOp(Op):
    """A_max = max|x| per row; t1 = x / A_max * f1, A1 = round(t1); t2 = (t1 - A1) * f2, ..."""
    NAME = "msd.unfold"
    OPERANDS = ("x",)
    RESULTS = ("amax", "slices")
    ATTRS = {"steps": Attr("dim"), "factors": Attr("floats", None)}

    def verify(self):
        m, g = self.tensor(self.operands[0], "x", "f16", 2).shape
        steps = Dim.of(self.attr("steps"))
        if steps.is_static:
            self.check(1 <= steps.value <= 3, f"attribute steps = {steps} must be in 1..3")
        _factors_ok(self, steps)
        self.expect_result(0, (m,), "f32")
        self.expect_result(1, (steps, m, g), "i4")


class IntMatmulOp(Op):
    """int4 slices [S, M, G] x int4 weights [G, N] -> int32 [S, M, N]."""
    NAME = "msd.int_matmul"
    OPERANDS = ("slices", "w")
    RESULTS = ("y",)

    def verify(self):
        s, m, g = self.tensor(self.operands[0], "slices", "i4", 3).shape
        gw, n = self.tensor(self.operands[1], "w", "i4", 2).shape
        self.same_dim(gw, g, "weight rows must equal the slice length")
        self.expect_result(0, (s, m, n), "i32")


class MergeOp(Op):
    """acc + (sum_i y[i] / prod(factors[:i+1])) * A_max * scale."""
    NAME = "msd.merge"
    OPERANDS = ("acc", "y", "amax", "scale")
    RESULTS = ("out",)
    ATTRS = {"factors": Attr("floats", None)}

    def verify(self):
        acc = self.tensor(self.operands[0], "acc", "f32", 2)
        m, n = acc.shape
        s = self.tensor(self.operands[1], "y", "i32", 3).shape[0]
        self.expect_operand(1, (s, m, n), "i32")
        self.expect_operand(2, (m,), "f32")
        self.expect_operand(3, (1, n), "f16")
        _factors_ok(self, s)
        self.expect_result(0, (m, n), "f32")
