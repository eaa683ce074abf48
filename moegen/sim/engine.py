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

from ..schedule_model import CUBE, VEC, Schedule, Step
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
    run = _Run(schedule, machine, schedule.iterations if iterations is None else iterations,
               shape, costs, check)
    while run.step():
        pass
    return run.finish()


class _Run:
    """One simulation: the units, the signals sent so far, the buffer slots' state, the result."""

    def __init__(self, schedule: Schedule, machine: Machine, iterations: int,
                 shape: tuple[int, int, int, int] | None, costs: Costs, check: bool):
        self.schedule, self.check = schedule, check
        if shape is None:
            self.durations = {name: 1.0 for name in schedule.stages}
            self.sync, self.barrier = 0.1, 0.1
        else:
            self.durations = stage_costs(*shape, cores=machine.cores, costs=costs)
            self.sync, self.barrier = costs.sync_us, costs.barrier_us
        programs = {kind: schedule.unroll(kind, iterations) for kind in schedule.programs}
        self.units = [_Unit(unit_name(k, c, j), k, c, programs[k]) for k, c, j in machine.units()]
        # flag -> signalling unit -> [(time, what the signal certifies)]
        self.signals: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        self.result = Result(timed=shape is not None)
        self.scopes: dict[tuple[str, int], list[_Unit]] = {}
        # buffer slot state: (buffer, core or -1, slot) -> [iteration, writes, reads]
        self.slots: dict[tuple, list] = {}

    def scope(self, u: _Unit, flag_id: int) -> list[_Unit]:
        """The units whose signals of the flag a wait of `u` counts."""
        key = (u.name, flag_id)
        if key not in self.scopes:
            fl = self.schedule.flags[flag_id]
            self.scopes[key] = [v for v in self.units if v.kind == fl.setter
                                and (fl.mode == 0 or v.core == u.core)]
        return self.scopes[key]

    def _users(self, buf: str, core: int, kinds: set[str]) -> list[_Unit]:
        info = self.schedule.buffers[buf]
        return [v for v in self.units
                if v.kind in kinds and (info.scope == "global" or v.core == core)]

    def readers_of(self, buf: str, core: int) -> list[_Unit]:
        stages = self.schedule.stages
        return self._users(buf, core, {stages[r].unit for r in self.schedule.buffers[buf].readers})

    def writers_of(self, buf: str, core: int) -> list[_Unit]:
        return self._users(buf, core,
                           {self.schedule.stages[self.schedule.buffers[buf].writer].unit})

    def access(self, u: _Unit, step: Step) -> None:
        """A stage's buffer accesses: counted on their pipes and, with `check`, checked."""
        schedule = self.schedule
        slot_of = dict(step.slots)
        for acc in schedule.stages[step.stage].accesses():
            if acc.buffer not in schedule.buffers:
                continue
            u.own[acc.pipe] += 1
            seq = u.own[acc.pipe]
            core = u.core if schedule.buffers[acc.buffer].scope == "core" else -1
            key = (acc.buffer, core, slot_of[acc.buffer])
            state = self.slots.get(key)
            if acc.write:
                if state is None or state[0] != step.iteration:
                    if self.check and state is not None:
                        self.check_overwrite(u, step, key, state,
                                             self.readers_of(acc.buffer, u.core))
                    state = self.slots[key] = [step.iteration, {}, {}]
                state[1][u.name] = (acc.pipe, seq)
            elif self.check:
                self.check_read(u, step, key, state, self.writers_of(acc.buffer, u.core))
                if state is not None and state[0] == step.iteration:
                    state[2][u.name] = (acc.pipe, seq)

    def check_overwrite(self, u: _Unit, step: Step, key: tuple, state: list,
                        readers: list[_Unit]) -> None:
        buf, _, slot = key
        for r in readers:
            done = state[2].get(r.name)
            if done is None:
                why = f"{r.name} has not read iteration {state[0]} yet"
            elif not u.knows(r.name, *done):
                why = f"{r.name}'s read of iteration {state[0]} is not known to be complete"
            else:
                continue
            self.result.hazards.append(Hazard("overwrite", buf, slot, step.iteration, u.name,
                                              why))
            return

    def check_read(self, u: _Unit, step: Step, key: tuple, state: list | None,
                   writers: list[_Unit]) -> None:
        buf, _, slot = key
        if state is None or state[0] != step.iteration:
            held = "nothing" if state is None else f"iteration {state[0]}"
            self.result.hazards.append(Hazard("read-before-write", buf, slot, step.iteration,
                                              u.name, f"the slot holds {held}"))
            return
        for w in writers:
            done = state[1].get(w.name)
            if done is None or not u.knows(w.name, *done):
                self.result.hazards.append(Hazard("read-before-write", buf, slot,
                                                  step.iteration, u.name,
                                                  f"{w.name}'s write is not known complete"))
                return

    def ready(self, u: _Unit, step: Step) -> float | None:
        """For a wait: the time it can complete, or None while a signal is missing."""
        k = u.waits[step.flag]
        t = u.time
        sent_by = self.signals[step.flag]
        for v in self.scope(u, step.flag):
            sent = sent_by[v.name]
            if len(sent) <= k:
                return None
            if sent[k][0] > t:
                t = sent[k][0]
        return t

    def learn(self, u: _Unit, step: Step) -> None:
        """A completed wait: the unit learns what the matched signals certify."""
        k = u.waits[step.flag]
        for v in self.scope(u, step.flag):
            for key, val in self.signals[step.flag][v.name][k][1].items():
                if u.know.get(key, 0) < val:
                    u.know[key] = val

    def step(self) -> bool:
        """Run the next action of the unit that can act earliest (ties by name); False once
        none can."""
        runnable = []
        for u in self.units:
            if u.pc >= len(u.program):
                continue
            step = u.program[u.pc]
            if step.op == "wait":
                r = self.ready(u, step)
                if r is None:
                    continue
                runnable.append((r, u.name, u, r))
            else:
                runnable.append((u.time, u.name, u, None))
        if not runnable:
            return False
        _, _, u, r = min(runnable, key=lambda x: (x[0], x[1]))
        step = u.program[u.pc]
        if step.op == "wait":
            cost = self.barrier if self.schedule.flags[step.flag].mode == 0 else self.sync
            if self.check:
                self.learn(u, step)
            u.waits[step.flag] += 1
            self.result.spans.append(Span(u.name, u.kind, u.core, f"wait {step.flag}", None,
                                          u.time, r + cost))
            u.time = r + cost
        elif step.op == "signal":
            msg = None
            if self.check:
                pipe = self.schedule.flags[step.flag].pipe
                msg = dict(u.know)
                msg[(u.name, pipe)] = u.own[pipe]
            self.signals[step.flag][u.name].append((u.time, msg))
        else:
            if self.check:
                self.access(u, step)
            end = u.time + self.durations[step.stage]
            self.result.spans.append(Span(u.name, u.kind, u.core, step.stage, step.iteration,
                                          u.time, end))
            u.time = end
        u.pc += 1
        return True

    def finish(self) -> Result:
        """The result once no unit can act: a deadlock (each blocked wait and the signals it
        lacks), unbalanced flags, the time of the last unit."""
        schedule, result = self.schedule, self.result
        stuck = [u for u in self.units if u.pc < len(u.program)]
        if stuck:
            parts = []
            for u in stuck:
                step = u.program[u.pc]
                k = u.waits[step.flag] + 1
                lacking = [v.name for v in self.scope(u, step.flag)
                           if len(self.signals[step.flag][v.name]) < k]
                parts.append(f"{u.name} blocked at wait({step.flag}) #{k} "
                             f"({schedule.flags[step.flag].name}), lacking a signal from "
                             f"{', '.join(lacking)}")
            result.deadlock = "; ".join(parts)
        for fid, fl in schedule.flags.items():
            for u in self.units:
                if u.kind != fl.waiter:
                    continue
                for v in self.scope(u, fid):
                    sent, got = len(self.signals[fid][v.name]), u.waits[fid]
                    if sent != got and not stuck:
                        result.unbalanced.append(f"flag {fid} ({fl.name}): {v.name} signalled "
                                                 f"{sent} times, {u.name} waited {got} times")
        result.time_us = max((u.time for u in self.units), default=0.0)
        return result
