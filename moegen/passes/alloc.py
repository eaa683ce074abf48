"""`alloc`: liveness of every intermediate, and offsets in one workspace arena.

Every value an op produces gets a buffer, except views (`tensor.group_slice`) and the values
the caller provides (function arguments, the returned result). A loop's accumulator is one
buffer updated in place (the init value, the body's accumulator and the loop result alias it).
Values produced inside a loop body are live for the whole loop and take `slots` copies (the
rotating buffers the `schedule` pass derived). Sizes are taken at tokens.max.

Buffers are placed largest first at the lowest 256-byte aligned offset that does not overlap a
placed buffer live at the same time; a final check proves no two simultaneously live buffers
overlap. The op attribute `offsets` records each result's offset (-1: not in the workspace);
the module attribute `workspace` the arena size, the naive sum and the peak of live bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Module, TensorType, Value
from .base import Context, Option, Pass

VIEW_OPS = ("tensor.group_slice",)


class AllocError(AssertionError):
    pass


@dataclass
class Buffer:
    name: str
    size: int            # bytes, all slots, before alignment
    start: int           # index of the defining top-level op
    end: int             # index of the last top-level op that reads it
    slots: int = 1
    offset: int = -1

    def live_with(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end

    def overlaps(self, other: "Buffer", align: int) -> bool:
        a_end = self.offset + _aligned(self.size, align)
        b_end = other.offset + _aligned(other.size, align)
        return self.offset < b_end and other.offset < a_end


@dataclass
class Plan:
    buffers: list[Buffer]
    alignment: int
    tokens: int
    dynamic: bool = True  # some buffer's size depends on the token count (MSD's do not)

    @property
    def size(self) -> int:
        return max((b.offset + _aligned(b.size, self.alignment) for b in self.buffers), default=0)

    @property
    def naive(self) -> int:
        return sum(_aligned(b.size, self.alignment) for b in self.buffers)

    @property
    def peak_live(self) -> int:
        """The most bytes live at one op: no placement can use less."""
        points = {b.start for b in self.buffers}
        return max((sum(_aligned(b.size, self.alignment) for b in self.buffers
                        if b.start <= p <= b.end) for p in points), default=0)

    def table(self) -> str:
        w = max([len(b.name) for b in self.buffers] + [6])
        at = f" at tokens = {self.tokens}" if self.dynamic else ""
        lines = [f"workspace plan{at} (alignment {self.alignment} bytes)",
                 f"  {'buffer':<{w}}  {'bytes':>12}  {'slots':>5}  {'live ops':>9}  {'offset':>12}"]
        for b in sorted(self.buffers, key=lambda b: (b.start, b.name)):
            lines.append(f"  {b.name:<{w}}  {b.size:>12,}  {b.slots:>5}  "
                         f"{f'{b.start}..{b.end}':>9}  {b.offset:>12,}")
        lines.append(f"  arena {self.size:,} bytes; naive sum {self.naive:,} bytes "
                     f"({100 * self.size / max(self.naive, 1):.0f}%); peak live "
                     f"{self.peak_live:,} bytes")
        return "\n".join(lines)


def _aligned(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def assign_offsets(buffers: list[Buffer], align: int) -> None:
    """Largest first, lowest aligned offset clear of every placed buffer live at the same time."""
    placed: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (-b.size, b.start, b.name)):
        busy = sorted((p.offset, p.offset + _aligned(p.size, align))
                      for p in placed if p.live_with(b))
        offset = 0
        for lo, hi in busy:
            if offset + _aligned(b.size, align) <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
    check_no_overlap(buffers, align)


def check_no_overlap(buffers: list[Buffer], align: int) -> None:
    for i, a in enumerate(buffers):
        if a.offset < 0 or a.offset % align:
            raise AllocError(f"buffer {a.name} has offset {a.offset}, not {align}-aligned")
        for b in buffers[i + 1:]:
            if a.live_with(b) and a.overlaps(b, align):
                raise AllocError(f"buffers {a.name} [{a.offset}, +{a.size}) and {b.name} "
                                 f"[{b.offset}, +{b.size}) are live together and overlap")


def liveness(module: Module, tokens: int) -> tuple[list[Buffer], dict[int, Buffer]]:
    """Buffers of a function's intermediates; also value id -> buffer (aliases included)."""
    fn = module.function()
    env = {"?": tokens}
    provided = {id(v) for v in fn.args}
    ret = fn.ops[-1]
    provided |= {id(v) for v in ret.operands}
    of: dict[int, Buffer] = {}
    buffers: list[Buffer] = []

    def new(v: Value, index: int, slots: int = 1) -> Buffer:
        b = Buffer(v.name, v.type.num_bytes(env) * slots, index, index, slots)
        buffers.append(b)
        return b

    for i, op in enumerate(fn.ops):
        if op.NAME in VIEW_OPS:
            continue
        if op.NAME == "msd.group_loop":
            acc = of.get(id(op.operands[0]))
            slots = op.attrs.get("slots") or {}
            if acc is not None:
                of[id(op.results[0])] = of[id(op.region.args[1])] = acc
                acc.end = max(acc.end, i)
            yielded = op.region.ops[-1].operands[0]
            for inner in op.region.ops:
                if inner.NAME in VIEW_OPS:
                    continue
                for r in inner.results:
                    if r is yielded and acc is not None:
                        of[id(r)] = acc
                    elif isinstance(r.type, TensorType):
                        of[id(r)] = new(r, i, int(slots.get(r.name, 1)))
                        of[id(r)].end = i
            continue
        for r in op.results:
            if id(r) not in provided and isinstance(r.type, TensorType):
                of[id(r)] = new(r, i)
    for i, op in enumerate(fn.ops):  # a buffer lives until its last reader (regions included)
        used = list(op.operands) + ([v for inner in op.region.ops for v in inner.operands]
                                    if op.region is not None else [])
        for v in used:
            if id(v) in of:
                of[id(v)].end = max(of[id(v)].end, i)
    return buffers, of


def plan_of(module: Module, tokens: int, align: int = 256) -> Plan:
    buffers, _ = liveness(module, tokens)
    assign_offsets(buffers, align)
    return Plan(buffers, align, tokens, _dynamic(module))


def _dynamic(module: Module) -> bool:
    """Whether a value of the function (its regions' included) has the token count in a dim."""
    fn = module.function()
    values = list(fn.args) + [r for op in fn.walk() for r in op.results]
    return any("?" in d.symbols for v in values if isinstance(v.type, TensorType)
               for d in v.type.shape)


class AllocPass(Pass):
    name = "alloc"
    OPTIONS = {"alignment": Option(int, 256, "byte alignment of every buffer")}

    def apply(self, module: Module, ctx: Context) -> None:
        align = self.option("alignment")
        buffers, of = liveness(module, ctx.spec.tokens.max)
        assign_offsets(buffers, align)
        plan = Plan(buffers, align, ctx.spec.tokens.max, _dynamic(module))
        for op in module.function().walk():
            if op.results and op.NAME not in VIEW_OPS:
                op.attrs["offsets"] = [of[id(r)].offset if id(r) in of else -1
                                       for r in op.results]
        module.attrs["workspace"] = {"bytes": plan.size, "naive_bytes": plan.naive,
                                     "peak_live_bytes": plan.peak_live, "alignment": align,
                                     "tokens": plan.tokens}
        ctx.results["alloc"] = plan
