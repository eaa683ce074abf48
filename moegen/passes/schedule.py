"""`schedule`: the MSD K loop as explicit per-unit action lists, with derived buffer slots.

The loop body has three stages bound to two kinds of unit (Ascend: AIV vector cores and AIC
cube cores, 2 AIV per AIC; CUDA: producer/epilogue warps and MMA warps):

    unfold  (vec)  reads x          writes a_max, a_unfold   (global: every vec unit a part)
    matmul  (cube) reads a_unfold   writes y_int             (per core: its own columns)
    merge   (vec)  reads a_max, y_int

The synchronisation follows from where data lives and from one number, the *lag* of the merge
stage behind the unfold: `basic` has lag 0 (stages strictly in order, a sync after each),
`preload` lag 1 (at step t the vector units unfold iteration t and merge iteration t-1 while the
cube units multiply iteration t). Rules:

- a stage that writes a global buffer ends with a barrier among its unit kind (flag 3);
- data crossing unit kinds is handed over pair-wise: vec -> its cube (flag 8), cube -> its two
  vec units (flag 9);
- the vector units may run lag+1 iterations ahead of their merges: a credit flag among the vec
  units (flag 6) starts with lag+1 signals and is signalled after each merge;
- the cube units tell each other they finished reading the unfolded A (flag 7); with lag 0 as a
  barrier right after the matmul, with lag L as a split barrier L iterations deep.

The number of slots of each rotating buffer is then DERIVED (modulo variable expansion): start
from one slot each and run the happens-before analysis of `moegen.sim` on the unrolled
programs; while a write of iteration i+s can happen before a read of iteration i is known to be
complete, give that buffer another slot. A signal certifies only the accesses of the pipe it is
issued on (and what its unit learnt from earlier waits), as on the hardware; this is why the
unfolded A needs 3 slots under preload but A_max and Y only 2.

Flag ids and names are the sample's (notes/ascend-msd-sample.md); all stay within 0..10.
"""
from __future__ import annotations

from ..ir import Module
from ..schedule_model import (CUBE, FLAGS, MAX_FLAG_ID, MODES, VEC, Action, BufferInfo, Program,
                              Schedule, ScheduleError, Stage)
from .base import Context, Option, Pass

STAGE_OF_OP = {"msd.unfold": ("unfold", VEC), "msd.int_matmul": ("matmul", CUBE),
               "msd.merge": ("merge", VEC)}


def loop_stages(loop) -> dict[str, Stage]:
    """The stages of an msd.group_loop body, with the buffers they read and write."""
    produced: dict[int, str] = {}
    stages: dict[str, Stage] = {}
    for op in loop.region.ops:
        if op.NAME not in STAGE_OF_OP:
            continue
        name, unit = STAGE_OF_OP[op.NAME]
        reads = tuple(produced[id(v)] for v in op.operands if id(v) in produced)
        writes = tuple(r.name for r in op.results if r is not loop.region.ops[-1].operands[0])
        for r in op.results:
            produced[id(r)] = r.name
        stages[name] = Stage(name, op.NAME, unit, reads, writes)
    if set(stages) != {"unfold", "matmul", "merge"}:
        raise ScheduleError(f"the K loop must hold unfold, matmul and merge; found "
                            f"{', '.join(stages) or 'none'}")
    return stages


def generate(stages: dict[str, Stage], mode: str, iterations: int) -> Schedule:
    """Action lists for `mode` by the rules in this module's docstring (slots all 1)."""
    lag = MODES[mode]
    f = {role: flag.id for role, flag in FLAGS.items()}
    buffers: dict[str, BufferInfo] = {}
    for st in stages.values():
        for b in st.writes:
            readers = tuple(s.name for s in stages.values() if b in s.reads)
            # the vec units each write a part of what they produce (read by all units of the
            # reader kind); a cube unit writes its own columns, read by its own vec units
            scope = "core" if st.unit == CUBE else "global"
            buffers[b] = BufferInfo(b, scope, st.name, readers)
    S = lambda name, off=0: Action("stage", stage=name, offset=off)  # noqa: E731
    sig = lambda role, off=0: Action("signal", f[role], offset=off)  # noqa: E731
    wait = lambda role, off=0: Action("wait", f[role], offset=off)   # noqa: E731

    vec = Program(VEC)
    vec.init = [sig("vec_credit")] * (lag + 1)
    vec.step = [wait("vec_credit"), S("unfold"),
                sig("vec_barrier"), wait("vec_barrier"),     # global writes: barrier
                sig("vec_to_cube"),                          # hand the unfolded A to the cube
                wait("cube_to_vec", lag), S("merge", lag), sig("vec_credit", lag)]
    vec.drain = [wait("vec_credit")] * (lag + 1)

    cube = Program(CUBE)
    cube.init = [sig("cube_release")] * lag
    release = ([sig("cube_release"), wait("cube_release")] if lag == 0 else
               [wait("cube_release")])
    cube.step = [wait("vec_to_cube"), S("matmul"), *release, sig("cube_to_vec")]
    if lag:
        cube.step.append(sig("cube_release"))
    cube.drain = [wait("cube_release")] * lag
    return Schedule(mode, lag, iterations, stages, buffers, {VEC: vec, CUBE: cube})


def derive_slots(schedule: Schedule, max_slots: int = 8) -> Schedule:
    """Modulo variable expansion: the fewest slots per buffer with no overwrite hazard."""
    from ..sim.engine import Machine, simulate
    probe_iterations = min(schedule.iterations, 4 * (schedule.lag + 2))
    machine = Machine(cores=2)
    current = schedule
    while True:
        result = simulate(current, machine, iterations=probe_iterations)
        if result.deadlock:
            raise ScheduleError(f"{schedule.mode}: the generated schedule deadlocks: "
                                f"{result.deadlock}")
        grow = {h.buffer for h in result.hazards if h.kind == "overwrite"}
        if not grow:
            if result.hazards:  # reads not ordered after their writes: slots cannot fix that
                raise ScheduleError(f"{schedule.mode}: {result.hazards[0]}")
            return current
        slots = {b: current.buffers[b].slots + 1 for b in grow}
        if max(slots.values()) > max_slots:
            raise ScheduleError(f"{schedule.mode}: buffers {sorted(grow)} need more than "
                                f"{max_slots} slots")
        current = current.with_slots(**slots)


def derived_schedule(loop, mode: str, iterations: int | None = None) -> Schedule:
    """The action lists of an msd.group_loop under `mode`, with their slots derived."""
    n = int(loop.attr("groups")) if iterations is None else iterations
    return derive_slots(generate(loop_stages(loop), mode, n))


def schedule_of(module: Module) -> Schedule:
    """The schedule of a module's K loop, re-derived from its `schedule` attribute."""
    loop = module.function().op("msd.group_loop")
    mode = loop.attrs.get("schedule")
    if mode is None:
        raise ScheduleError("the K loop has no schedule: run the schedule pass first")
    sched = derived_schedule(loop, mode)
    recorded = loop.attrs.get("slots")
    if recorded is not None and recorded != sched.slots:
        raise ScheduleError(f"the K loop records slots {recorded} but the schedule derives "
                            f"{sched.slots}")
    return sched


class SchedulePass(Pass):
    name = "schedule"
    PIPELINES = ("msd_matmul",)
    OPTIONS = {"mode": Option(str, None, "basic or preload (default: the spec's schedule)",
                              choices=tuple(MODES))}

    def apply(self, module: Module, ctx: Context) -> None:
        mode = self.option("mode", ctx.spec.schedule)
        loop = module.function().op("msd.group_loop")
        sched = derived_schedule(loop, mode)
        for fl in sched.flags.values():
            if not 0 <= fl.id <= MAX_FLAG_ID:
                raise ScheduleError(f"flag {fl.name} has id {fl.id}, outside 0..{MAX_FLAG_ID}")
        loop.attrs["schedule"] = mode
        loop.attrs["slots"] = sched.slots
        ctx.results["schedule"] = sched
