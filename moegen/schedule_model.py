"""The MSD pipeline schedule as data: the two kinds of unit, the flags they signal and wait
on (the CANN sample's ids and names), the stages and their buffers, each unit's action lists
and their unrolled steps. The schedule pass builds it (passes/schedule.py); the simulator
(sim/), the emitters and the read-backs consume it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

VEC, CUBE = "vec", "cube"
MODES = {"basic": 0, "preload": 1}          # schedule name -> lag of the merge stage
MAX_FLAG_ID = 10


class ScheduleError(ValueError):
    pass


@dataclass(frozen=True)
class Flag:
    id: int
    name: str
    mode: int          # 0: among all units of one kind; 2: a cube unit <-> its two vec units
    pipe: str          # the pipe the signal is issued on (what it certifies)
    setter: str        # unit kind that signals
    waiter: str        # unit kind that waits


# role -> flag (the sample's ids and names)
FLAGS = {
    "vec_barrier": Flag(3, "SYNC_AIV_ONLY_A_UNFOLD_FLAG", 0, "MTE3", VEC, VEC),
    "vec_credit": Flag(6, "SYNC_AIV_ONLY_AMAX_FLAG", 0, "MTE2", VEC, VEC),
    "cube_release": Flag(7, "SYNC_AIC_ONLY_AUNFOLD_FLAG", 0, "MTE2", CUBE, CUBE),
    "vec_to_cube": Flag(8, "SYNC_AIV_AIC_FLAG", 2, "MTE3", VEC, CUBE),
    "cube_to_vec": Flag(9, "SYNC_AIC_AIV_FLAG", 2, "FIX", CUBE, VEC),
}
READ_PIPE = {VEC: "MTE2", CUBE: "MTE2"}     # GM -> local memory
WRITE_PIPE = {VEC: "MTE3", CUBE: "FIX"}     # local memory -> GM


@dataclass(frozen=True)
class Access:
    buffer: str
    write: bool
    pipe: str


@dataclass(frozen=True)
class Stage:
    name: str          # unfold | matmul | merge
    op: str            # the IR op it runs
    unit: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]

    def accesses(self) -> tuple[Access, ...]:
        return tuple([Access(b, False, READ_PIPE[self.unit]) for b in self.reads]
                     + [Access(b, True, WRITE_PIPE[self.unit]) for b in self.writes])


@dataclass(frozen=True)
class Action:
    """One entry of a unit's program: signal/wait a flag, or run a stage.

    In the loop body, `offset` says which iteration it serves: at step t it runs for iteration
    t - offset, and only when 0 <= t - offset < iterations.
    """
    op: str                       # signal | wait | stage
    flag: int | None = None
    stage: str | None = None
    offset: int = 0

    def __str__(self) -> str:
        if self.op == "stage":
            return f"{self.stage}(i{'-' + str(self.offset) if self.offset else ''})"
        return f"{self.op}({self.flag})"


@dataclass
class Program:
    kind: str
    init: list[Action] = field(default_factory=list)
    step: list[Action] = field(default_factory=list)
    drain: list[Action] = field(default_factory=list)


@dataclass(frozen=True)
class Step:
    """One action of the unrolled program, with its iteration and buffer slots."""
    section: str                  # prologue | steady | epilogue
    op: str
    flag: int | None = None
    stage: str | None = None
    iteration: int | None = None
    slots: tuple[tuple[str, int], ...] = ()   # (buffer, slot index) of the stage's accesses


@dataclass
class BufferInfo:
    name: str
    scope: str          # global | core
    writer: str         # stage
    readers: tuple[str, ...]
    slots: int = 1


@dataclass
class Schedule:
    mode: str
    lag: int
    iterations: int
    stages: dict[str, Stage]
    buffers: dict[str, BufferInfo]
    programs: dict[str, Program]
    flags: dict[int, Flag] = field(default_factory=lambda: {f.id: f for f in FLAGS.values()})

    @property
    def steps(self) -> int:
        return self.iterations + self.lag

    @property
    def slots(self) -> dict[str, int]:
        return {name: b.slots for name, b in self.buffers.items()}

    def with_slots(self, **slots: int) -> "Schedule":
        buffers = {n: replace(b, slots=slots.get(n, b.slots)) for n, b in self.buffers.items()}
        return replace(self, buffers=buffers)

    def unroll(self, kind: str, iterations: int | None = None) -> list[Step]:
        """The program of one unit of `kind` for every iteration, with slot indices."""
        n = self.iterations if iterations is None else iterations
        prog = self.programs[kind]
        out = [Step("prologue", a.op, a.flag, a.stage) for a in prog.init]
        for t in range(n + self.lag):
            section = "prologue" if t < self.lag else ("steady" if t < n else "epilogue")
            for a in prog.step:
                it = t - a.offset
                if not 0 <= it < n:
                    continue
                slots = ()
                if a.op == "stage":
                    st = self.stages[a.stage]
                    slots = tuple((b, it % self.buffers[b].slots) for b in st.reads + st.writes
                                  if b in self.buffers)
                out.append(Step(section, a.op, a.flag, a.stage, it, slots))
        out += [Step("epilogue", a.op, a.flag, a.stage) for a in prog.drain]
        return out

    def listing(self) -> str:
        """The action lists as text (what `moegen inspect --schedule` prints first)."""
        lines = [f"schedule {self.mode} (lag {self.lag}), {self.iterations} iterations; slots: "
                 + ", ".join(f"{n} {b.slots}" for n, b in self.buffers.items())]
        for kind, prog in self.programs.items():
            lines.append(f"  {kind}:")
            lines.append("    init:  " + " ".join(map(str, prog.init)))
            lines.append("    step:  " + " ".join(map(str, prog.step)))
            lines.append("    drain: " + " ".join(map(str, prog.drain)))
        for f in self.flags.values():
            lines.append(f"  flag {f.id:2d} {f.name:28s} mode {f.mode} pipe {f.pipe:4s} "
                         f"{f.setter} -> {f.waiter}")
        return "\n".join(lines)
