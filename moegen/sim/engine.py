"""Discrete-event execution of a schedule's action lists, with a happens-before race check.

The machine has `cores` cube units and two vec units per core. Every unit runs its kind's
unrolled program. Flags count: the k-th wait of a unit completes once the k-th signal of every
unit in its scope is in (mode 0: all units of the setter kind; mode 2: a cube unit's two vec
units, or a vec unit's cube unit). Stages take the time of the cost model.

Happens-before, as the hardware gives it: a signal issued on pipe P certifies the unit's own
accesses on P before it, plus everything the unit learnt from its earlier waits; a wait
learns what the matched signals certify. With that knowledge every access is checked:
- overwrite: a write to a buffer slot while a reader of the slot's previous contents has not
  read it yet, or its read is not known to be complete;
- read-before-write: a read of iteration i whose writes are not all known to be complete.
The run also reports a deadlock (every blocked wait, with the signals it lacks) and flags
whose signal and wait counts differ.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..passes.schedule import CUBE, VEC, Schedule, Step
from .cost import Costs, stage_costs


@dataclass(frozen=True)
class Machine:
    cores: int = 2
    vec_per_core: int = 2

    def units(self) -> list[tuple[str, int, int]]:
        """(kind, core, index within the core), cube first."""
        out = [(CUBE, c, 0) for c in range(self.cores)]
        out += [(VEC, c, j) for c in range(self.cores) for j in range(self.vec_per_core)]
        return out


@dataclass(frozen=True)
class Hazard:
    kind: str           # overwrite | read-before-write
    buffer: str
    slot: int
    iteration: int
    unit: str
    detail: str

    def __str__(self) -> str:
        return (f"{self.kind} hazard on {self.buffer}[slot {self.slot}] at iteration "
                f"{self.iteration} by {self.unit}: {self.detail}")


@dataclass
class Span:
    unit: str
    kind: str
    core: int
    what: str           # a stage name, or "wait F"
    iteration: int | None
    start: float
    end: float


@dataclass
class Result:
    time_us: float = 0.0
    spans: list[Span] = field(default_factory=list)
    hazards: list[Hazard] = field(default_factory=list)
    deadlock: str = ""
    unbalanced: list[str] = field(default_factory=list)
    timed: bool = False   # durations came from the cost model (else one unit per stage)

    @property
    def ok(self) -> bool:
        return not (self.hazards or self.deadlock or self.unbalanced)

    def report(self) -> str:
        if self.ok:
            when = f"simulated {self.time_us:.1f} us: " if self.timed else ""
            return f"{when}no hazard, no deadlock, flags balanced"
        lines = []
        if self.deadlock:
            lines.append(f"deadlock: {self.deadlock}")
        lines += [str(h) for h in self.hazards[:10]]
        if len(self.hazards) > 10:
            lines.append(f"... {len(self.hazards) - 10} more hazards")
        lines += [f"unbalanced: {u}" for u in self.unbalanced]
        return "\n".join(lines)


def unit_name(kind: str, core: int, j: int) -> str:
    return f"cube{core}" if kind == CUBE else f"vec{core}.{j}"


@dataclass
class _Unit:
    name: str
    kind: str
    core: int
    program: list[Step]
    pc: int = 0
    time: float = 0.0
    own: dict = field(default_factory=lambda: defaultdict(int))     # pipe -> accesses issued
    know: dict = field(default_factory=dict)                        # (unit, pipe) -> count
    waits: dict = field(default_factory=lambda: defaultdict(int))   # flag -> waits done

    def knows(self, unit: str, pipe: str, seq: int) -> bool:
        return unit == self.name or self.know.get((unit, pipe), 0) >= seq


def simulate(schedule: Schedule, machine: Machine = Machine(), iterations: int | None = None,
             shape: tuple[int, int, int, int] | None = None, costs: Costs = Costs(),
             check: bool = True) -> Result:
    """Run `schedule` on `machine`. shape = (M, N, group, steps) feeds the cost model."""
    n = schedule.iterations if iterations is None else iterations
    if shape is None:
        durations = {name: 1.0 for name in schedule.stages}
        sync, barrier = 0.1, 0.1
    else:
        durations = stage_costs(*shape, cores=machine.cores, costs=costs)
        sync, barrier = costs.sync_us, costs.barrier_us
    programs = {kind: schedule.unroll(kind, n) for kind in schedule.programs}
    units = [_Unit(unit_name(k, c, j), k, c, programs[k]) for k, c, j in machine.units()]
    signals: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    result = Result(timed=shape is not None)

    scopes: dict[tuple[str, int], list[_Unit]] = {}

    def scope(u: _Unit, flag_id: int) -> list[_Unit]:
        key = (u.name, flag_id)
        if key not in scopes:
            fl = schedule.flags[flag_id]
            scopes[key] = [v for v in units if v.kind == fl.setter
                           and (fl.mode == 0 or v.core == u.core)]
        return scopes[key]

    # buffer slot state: (buffer, core or -1, slot) -> [iteration, writes, reads]
    slots: dict[tuple, list] = {}

    def readers_of(buf: str, core: int) -> list[_Unit]:
        info = schedule.buffers[buf]
        kinds = {schedule.stages[r].unit for r in info.readers}
        return [v for v in units if v.kind in kinds and (info.scope == "global" or v.core == core)]

    def writers_of(buf: str, core: int) -> list[_Unit]:
        info = schedule.buffers[buf]
        kind = schedule.stages[info.writer].unit
        return [v for v in units if v.kind == kind and (info.scope == "global" or v.core == core)]

    def access(u: _Unit, step: Step) -> None:
        stage = schedule.stages[step.stage]
        slot_of = dict(step.slots)
        for acc in stage.accesses():
            if acc.buffer not in schedule.buffers:
                continue
            u.own[acc.pipe] += 1
            seq = u.own[acc.pipe]
            info = schedule.buffers[acc.buffer]
            core = u.core if info.scope == "core" else -1
            key = (acc.buffer, core, slot_of[acc.buffer])
            state = slots.get(key)
            if acc.write:
                if state is None or state[0] != step.iteration:
                    if check and state is not None:
                        _check_overwrite(u, step, key, state, readers_of(acc.buffer, u.core))
                    state = slots[key] = [step.iteration, {}, {}]
                state[1][u.name] = (acc.pipe, seq)
            elif check:
                _check_read(u, step, key, state, writers_of(acc.buffer, u.core))
                if state is not None and state[0] == step.iteration:
                    state[2][u.name] = (acc.pipe, seq)

    def _check_overwrite(u, step, key, state, readers):
        buf, _, slot = key
        for r in readers:
            done = state[2].get(r.name)
            if done is None:
                why = f"{r.name} has not read iteration {state[0]} yet"
            elif not u.knows(r.name, *done):
                why = f"{r.name}'s read of iteration {state[0]} is not known to be complete"
            else:
                continue
            result.hazards.append(Hazard("overwrite", buf, slot, step.iteration, u.name, why))
            return

    def _check_read(u, step, key, state, writers):
        buf, _, slot = key
        if state is None or state[0] != step.iteration:
            held = "nothing" if state is None else f"iteration {state[0]}"
            result.hazards.append(Hazard("read-before-write", buf, slot, step.iteration, u.name,
                                         f"the slot holds {held}"))
            return
        for w in writers:
            done = state[1].get(w.name)
            if done is None or not u.knows(w.name, *done):
                result.hazards.append(Hazard("read-before-write", buf, slot, step.iteration,
                                             u.name, f"{w.name}'s write is not known complete"))
                return

    def ready(u: _Unit, step: Step):
        """For a wait: the time it can complete, or None while a signal is missing."""
        k = u.waits[step.flag]
        t = u.time
        sent_by = signals[step.flag]
        for v in scope(u, step.flag):
            sent = sent_by[v.name]
            if len(sent) <= k:
                return None
            if sent[k][0] > t:
                t = sent[k][0]
        return t

    def learn(u: _Unit, step: Step) -> None:
        """A completed wait: the unit learns what the matched signals certify."""
        k = u.waits[step.flag]
        for v in scope(u, step.flag):
            for key, val in signals[step.flag][v.name][k][1].items():
                if u.know.get(key, 0) < val:
                    u.know[key] = val

    while True:
        runnable = []
        for u in units:
            if u.pc >= len(u.program):
                continue
            step = u.program[u.pc]
            if step.op == "wait":
                r = ready(u, step)
                if r is None:
                    continue
                runnable.append((r, u.name, u, r))
            else:
                runnable.append((u.time, u.name, u, None))
        if not runnable:
            break
        _, _, u, r = min(runnable, key=lambda x: (x[0], x[1]))
        step = u.program[u.pc]
        if step.op == "wait":
            start = r
            fl = schedule.flags[step.flag]
            cost = barrier if fl.mode == 0 else sync
            if check:
                learn(u, step)
            u.waits[step.flag] += 1
            result.spans.append(Span(u.name, u.kind, u.core, f"wait {step.flag}", None, u.time,
                                     start + cost))
            u.time = start + cost
        elif step.op == "signal":
            msg = None
            if check:
                pipe = schedule.flags[step.flag].pipe
                msg = dict(u.know)
                msg[(u.name, pipe)] = u.own[pipe]
            signals[step.flag][u.name].append((u.time, msg))
        else:
            if check:
                access(u, step)
            end = u.time + durations[step.stage]
            result.spans.append(Span(u.name, u.kind, u.core, step.stage, step.iteration, u.time,
                                     end))
            u.time = end
        u.pc += 1

    stuck = [u for u in units if u.pc < len(u.program)]
    if stuck:
        parts = []
        for u in stuck:
            step = u.program[u.pc]
            k = u.waits[step.flag] + 1
            lacking = [v.name for v in scope(u, step.flag)
                       if len(signals[step.flag][v.name]) < k]
            parts.append(f"{u.name} blocked at wait({step.flag}) #{k} "
                         f"({schedule.flags[step.flag].name}), lacking a signal from "
                         f"{', '.join(lacking)}")
        result.deadlock = "; ".join(parts)
    for fid, fl in schedule.flags.items():
        for u in units:
            if u.kind != fl.waiter:
                continue
            for v in scope(u, fid):
                sent, got = len(signals[fid][v.name]), u.waits[fid]
                if sent != got and not stuck:
                    result.unbalanced.append(f"flag {fid} ({fl.name}): {v.name} signalled "
                                             f"{sent} times, {u.name} waited {got} times")
    result.time_us = max((u.time for u in units), default=0.0)
    return result
