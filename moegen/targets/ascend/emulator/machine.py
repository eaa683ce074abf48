"""The emulated Atlas A2 machine for one launch of a mixed kernel: `blocks` AIC cores with two AIV
cores each, GM, the cross-core flags, and a scheduler that runs every core's code until it waits
on a flag, in a random order each round, so that a missing flag shows as wrong data or a
deadlock instead of passing by luck.

Cross-core flags (CrossCoreSetFlag<mode, pipe> / CrossCoreWaitFlag<mode>), as documented:
mode 0 synchronises all cores of one kind (a wait passes once every one of them has set the
flag once more), mode 1 the two AIVs of a pair, mode 2 an AIC and its two AIVs (an AIC's set lets
each of its AIVs pass one wait; the AIC passes once both AIVs have set). A set first makes the
core's writes on its pipe visible in GM. At most 15 sets may be outstanding on a flag.
"""
from __future__ import annotations

import numpy as np

from .api import FLAG_COUNTER_MAX
from .memory import CONTEXT, Core, EmulationError, GlobalMemory

UB_CAPACITY = 184 * 1024          # what TPipe allocates in a vector core's UB
L1_CAPACITY = 512 * 1024 - 1024   # and in a cube core's L1


class Runtime:
    """`_rt` in the translated code: the core's kind and the tiling data."""

    @staticmethod
    def ascend_is_aic() -> bool:
        return CONTEXT.core.kind == "aic"

    @staticmethod
    def ascend_is_aiv() -> bool:
        return CONTEXT.core.kind == "aiv"

    @staticmethod
    def tiling_data(struct, address):
        """GET_TILING_DATA_WITH_STRUCT: the launch's tiling, field by field into `struct`."""
        data = struct()
        values = CONTEXT.machine.tiling
        declared = set(vars(data))
        unknown = set(values) - declared
        missing = declared - set(values)
        if unknown or missing:
            raise EmulationError(f"tiling data: the emitted struct lacks {sorted(unknown)} and "
                                 f"the tiling lacks {sorted(missing)}")
        for name, value in values.items():
            if isinstance(value, dict):
                inner = getattr(data, name)
                for field, v in value.items():
                    setattr(inner, field, v)
            else:
                setattr(data, name, type(getattr(data, name))(value))
        return data


class Machine:
    def __init__(self, blocks: int, tiling: dict, seed=None, ub: int = UB_CAPACITY,
                 l1: int = L1_CAPACITY):
        if blocks < 1:
            raise EmulationError(f"a launch of {blocks} blocks")
        self.rng = np.random.default_rng(seed)
        self.gm = GlobalMemory()
        self.tiling = tiling
        self.aic = [Core("aic", i, 0, ub, l1, self.rng) for i in range(blocks)]
        self.aiv = [Core("aiv", 2 * i + s, s, ub, l1, self.rng)
                    for i in range(blocks) for s in (0, 1)]
        self.epoch = 0                  # moves whenever a flag is set or a wait passes

    # --- cross-core flags ----------------------------------------------------------------------
    def _group(self, core: Core, mode: int) -> list[Core]:
        """The cores whose sets a wait of `core` in `mode` counts."""
        if mode == 0:
            return self.aiv if core.kind == "aiv" else self.aic
        if mode == 1:
            if core.kind != "aiv":
                raise EmulationError(f"{core.name}: a mode-1 flag on a cube core")
            return self.aiv[core.index // 2 * 2: core.index // 2 * 2 + 2]
        if mode == 2:
            if core.kind == "aiv":
                return [self.aic[core.index // 2]]
            return self.aiv[2 * core.index: 2 * core.index + 2]
        raise EmulationError(f"{core.name}: cross-core flag mode {mode}")

    def _waiters(self, core: Core, mode: int) -> list[Core]:
        if mode == 2:
            return self._group(core, 2)
        return self._group(core, mode)

    def cross_set(self, core: Core, mode: int, flag: int, pipe: str) -> None:
        if pipe == "ALL":
            core.release_all()
        else:
            core.release(pipe)
        key = (mode, flag)
        core.sets[key] = core.sets.get(key, 0) + 1
        for waiter in self._waiters(core, mode):
            if core.sets[key] - waiter.waits.get(key, 0) > FLAG_COUNTER_MAX:
                raise EmulationError(f"{core.name}: flag {flag} (mode {mode}) set more than "
                                     f"{FLAG_COUNTER_MAX} times ahead of {waiter.name}'s waits")
        self.epoch += 1

    def cross_try_wait(self, core: Core, mode: int, flag: int) -> bool:
        key = (mode, flag)
        passed = core.waits.get(key, 0)
        if all(c.sets.get(key, 0) > passed for c in self._group(core, mode)):
            core.waits[key] = passed + 1
            core.blocked = None
            self.epoch += 1
            return True
        core.blocked = (mode, flag)
        return False

    # --- a launch ------------------------------------------------------------------------------
    def run(self, kernel, args: tuple, template: int) -> None:
        with np.errstate(all="ignore"):          # float faults are the kernel's values, as on the
            self._run(kernel, args, template)    # hardware (inf, nan), not Python errors

    def _run(self, kernel, args: tuple, template: int) -> None:
        CONTEXT.machine = self
        running = {}
        for core in self.aic + self.aiv:
            CONTEXT.core = core
            core.blocked = None
            running[core] = kernel(*args, _t=(template,))
        while running:
            epoch, finished = self.epoch, False
            order = list(running)
            self.rng.shuffle(order)
            for core in order:
                CONTEXT.core = core
                try:
                    next(running[core])
                except StopIteration:
                    del running[core]
                    finished = True
            if not finished and self.epoch == epoch:
                stuck = ", ".join(f"{c.name} waits flag {c.blocked[1]} (mode {c.blocked[0]})"
                                  for c in running if c.blocked)
                raise EmulationError(f"deadlock: {stuck}")
        CONTEXT.core = None
        self._finish()

    def _finish(self) -> None:
        cores = self.aic + self.aiv
        for core in cores:
            core.release_all()
        for core in cores:
            core.write_back_cache()
        for core in cores:
            for (event, event_id), queue in core.events.items():
                if queue:
                    raise EmulationError(f"{core.name}: SetFlag<{event}>({event_id}) never "
                                         "waited: the next kernel would inherit it")
            for event, ids in core.allocated.items():
                if ids:
                    raise EmulationError(f"{core.name}: {event} event ids {sorted(ids)} never "
                                         "released")
        for core in cores:
            for (mode, flag), sets in core.sets.items():
                for waiter in self._waiters(core, mode):
                    if waiter.waits.get((mode, flag), 0) != sets:
                        raise EmulationError(
                            f"flag {flag} (mode {mode}): {core.name} set it {sets} times, "
                            f"{waiter.name} waited {waiter.waits.get((mode, flag), 0)}")
