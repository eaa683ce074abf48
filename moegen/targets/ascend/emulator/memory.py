"""The memories and pipes of the emulated cores, with the checks the hardware does not make.

- GM is shared. A core's writes to it wait, per pipe, until a cross-core flag issued on that
  pipe (or the kernel's end) releases them: a reader on another core that is not ordered after
  that flag reads the old bytes, as on the hardware.
- Scalar GM accesses (GlobalTensor::GetValue / SetValue) go through the core's data cache of
  64-byte lines: a store stays in the writer's cache until DataCacheCleanAndInvalid or the end of
  the kernel writes its whole line back; a load of a line the core holds sees the cached bytes.
- UB (vector cores) and L1 (cube cores) start with random bytes. Every access is checked at
  32-byte-block granularity against the accesses of the core's other pipes: a read of data
  another pipe wrote, a write over data another pipe wrote or still reads, is a hazard unless a
  SetFlag/WaitFlag pair (or a PipeBarrier<PIPE_ALL>) orders the two. One pipe runs in order
  (the compiler orders V after V and the scalar unit issues in program order).
"""
from __future__ import annotations

from collections import deque

import numpy as np

PIPES = ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX")
PIPE = {name: i for i, name in enumerate(PIPES)}
S_PIPE = PIPE["S"]
LATEST = np.iinfo(np.int64).max
BLOCK = 32
CACHE_LINE = 64
NEVER = -1


class EmulationError(RuntimeError):
    """The emitted program did something the hardware would get wrong or refuse."""


class HazardError(EmulationError):
    """Two pipes of one core touch the same local memory without a flag between them."""


class Context:
    """The machine being run and the core whose code runs now (set by the scheduler)."""
    machine = None
    core = None


CONTEXT = Context()


class GlobalMemory:
    """Named allocations, each at its own 2^40-aligned address, so a GM_ADDR is a plain int."""
    SPACING = 1 << 40

    def __init__(self):
        self.arrays: list[np.ndarray] = []
        self.names: list[str] = []

    def allocate(self, name: str, data: np.ndarray) -> int:
        self.arrays.append(np.ascontiguousarray(data).view(np.uint8).reshape(-1).copy())
        self.names.append(name)
        return len(self.arrays) * self.SPACING

    def array(self, name: str) -> np.ndarray:
        return self.arrays[self.names.index(name)]

    def locate(self, addr: int, nbytes: int, what: str) -> tuple[np.ndarray, int]:
        index, offset = divmod(int(addr), self.SPACING)
        if not 1 <= index <= len(self.arrays) or offset < 0:
            raise EmulationError(f"{what}: GM address {addr:#x} is in no allocation")
        array = self.arrays[index - 1]
        if offset + nbytes > array.size:
            raise EmulationError(f"{what}: bytes {offset}..{offset + nbytes} of GM "
                                 f"{self.names[index - 1]} ({array.size} bytes) are out of "
                                 "bounds")
        return array, offset

    def read(self, addr: int, nbytes: int, what: str) -> np.ndarray:
        array, offset = self.locate(addr, nbytes, what)
        return array[offset:offset + nbytes].copy()

    def write(self, addr: int, data: np.ndarray, what: str) -> None:
        array, offset = self.locate(addr, data.size, what)
        array[offset:offset + data.size] = data


class LocalMemory:
    """A core's UB or L1: bytes plus, per 32-byte block, the last write and the reads since."""

    def __init__(self, name: str, capacity: int, rng: np.random.Generator):
        self.name, self.capacity = name, capacity
        self.data = rng.integers(0, 256, capacity, dtype=np.uint8)
        blocks = -(-capacity // BLOCK)
        self.w_pipe = np.full(blocks, NEVER, dtype=np.int8)
        self.w_seq = np.zeros(blocks, dtype=np.int64)
        self.r_seq = np.full((len(PIPES), blocks), NEVER, dtype=np.int64)
        self.used = 0                                   # TPipe's allocation mark


class Core:
    def __init__(self, kind: str, index: int, sub: int, ub: int, l1: int,
                 rng: np.random.Generator):
        self.kind, self.index, self.sub = kind, index, sub     # kind: "aic" | "aiv"
        self.name = f"{kind.upper()} {index}"
        self.issued = [0] * len(PIPES)
        # synced[p][q]: instructions of pipe q known complete before pipe p's next one; a pipe
        # knows its own (it runs in order) and the extra last column stands for "no access"
        self.synced = np.zeros((len(PIPES), len(PIPES) + 1), dtype=np.int64)
        self.synced[:, -1] = LATEST
        np.fill_diagonal(self.synced, LATEST)
        self.events: dict[tuple[str, int], deque] = {}
        self.allocated: dict[str, set[int]] = {}
        self.memory = LocalMemory("UB" if kind == "aiv" else "L1", ub if kind == "aiv" else l1,
                                  rng)
        self.pipe = None                      # the TPipe the kernel constructed
        self.pending: dict[int, list[tuple[int, np.ndarray, str]]] = {}
        self.cache: dict[int, list] = {}      # line address -> [bytes, dirty]
        self.waits: dict[tuple[int, int], int] = {}    # (mode, flag) -> waits passed
        self.sets: dict[tuple[int, int], int] = {}

    # --- pipes -----------------------------------------------------------------------------
    def issue(self, pipe: str) -> int:
        p = PIPE[pipe]
        self.issued[p] += 1
        return self.issued[p]

    def access(self, offset: int, nbytes: int, pipe: str, seq: int, write: bool,
               what: str, limit: tuple[int, int] | None = None) -> np.ndarray:
        """Checks an access of `nbytes` at `offset` of this core's local memory by `pipe` and
        records it; returns the bytes (a view). `limit`: the TBuf it must stay inside."""
        mem = self.memory
        if nbytes <= 0:
            raise EmulationError(f"{self.name}: {what}: an access of {nbytes} bytes")
        lo, hi = limit if limit is not None else (0, mem.capacity)
        if offset < lo or offset + nbytes > hi:
            raise EmulationError(
                f"{self.name}: {what}: {mem.name} bytes {offset}..{offset + nbytes} pass the "
                f"buffer's {lo}..{hi}")
        p = PIPE[pipe]
        b0, b1 = offset // BLOCK, -(-(offset + nbytes) // BLOCK)
        known = self.synced[p]                 # indexed by pipe; [-1] (no writer) is LATEST
        wp = mem.w_pipe[b0:b1]
        if (mem.w_seq[b0:b1] > known[wp]).any():
            late = wp[mem.w_seq[b0:b1] > known[wp]][0]
            raise HazardError(
                f"{self.name}: {what} ({pipe}) {'overwrites' if write else 'reads'} "
                f"{mem.name} bytes {offset}..{offset + nbytes} that {PIPES[late]} wrote, "
                f"with no {PIPES[late]}_{pipe} flag between")
        if write:
            reads = mem.r_seq[:, b0:b1].max(axis=1)
            if (reads > known[:-1]).any():
                late = int(np.argmax(reads > known[:-1]))
                raise HazardError(
                    f"{self.name}: {what} ({pipe}) overwrites {mem.name} bytes "
                    f"{offset}..{offset + nbytes} that {PIPES[late]} still reads, with no "
                    f"{PIPES[late]}_{pipe} flag between")
            mem.w_pipe[b0:b1] = p
            mem.w_seq[b0:b1] = seq
            mem.r_seq[:, b0:b1] = NEVER
        elif p != S_PIPE:
            mem.r_seq[p, b0:b1] = seq
        return mem.data[offset:offset + nbytes]

    def set_flag(self, src: str, dst: str, event_id: int) -> None:
        s = PIPE[src]
        self.issued[s] += 1            # the flag itself runs on the source pipe, in order
        known = self.synced[s].copy()  # what the source pipe knew, and itself up to the flag
        known[s] = self.issued[s]
        self.events.setdefault((f"{src}_{dst}", event_id), deque()).append(known)

    def wait_flag(self, src: str, dst: str, event_id: int) -> None:
        queue = self.events.get((f"{src}_{dst}", event_id))
        if not queue:
            raise EmulationError(f"{self.name}: WaitFlag<{src}_{dst}>({event_id}) with no "
                                 "SetFlag before it: the pipe would wait forever")
        d = PIPE[dst]
        np.maximum(self.synced[d], queue.popleft(), out=self.synced[d])

    def barrier_all(self) -> None:
        issued = np.array(self.issued)
        for p in range(len(PIPES)):
            self.synced[p, :-1] = np.maximum(self.synced[p, :-1], issued)

    # --- GM ----------------------------------------------------------------------------------
    def gm_write(self, pipe: str, addr: int, data: np.ndarray, what: str) -> None:
        CONTEXT.machine.gm.locate(addr, data.size, what)          # bounds now, bytes later
        self.pending.setdefault(PIPE[pipe], []).append((addr, data.copy(), what))

    def release(self, pipe: str) -> None:
        """A cross-core flag on `pipe`: this core's writes on it reach GM."""
        for addr, data, what in self.pending.pop(PIPE[pipe], []):
            CONTEXT.machine.gm.write(addr, data, what)

    def release_all(self) -> None:
        for p in list(self.pending):
            self.release(PIPES[p])

    def cached_line(self, line: int) -> list:
        if line not in self.cache:
            gm = CONTEXT.machine.gm
            array, offset = gm.locate(line, 1, "data cache fill")
            size = min(CACHE_LINE, array.size - offset)
            self.cache[line] = [gm.read(line, size, "data cache fill"), False]
        return self.cache[line]

    def clean_invalidate(self, line: int) -> None:
        entry = self.cache.pop(line, None)
        if entry is not None and entry[1]:
            CONTEXT.machine.gm.write(line, entry[0], "data cache write-back")

    def write_back_cache(self) -> None:
        for line in sorted(self.cache):
            self.clean_invalidate(line)
