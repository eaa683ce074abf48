"""Compiling a sweep's next candidates in worker processes while it times the current one.

`moegen autotune` builds one layer per candidate config, and NVRTC spends most of a
candidate's time (seconds per module at Mixtral's sizes). The workers compile the modules of
the candidates ahead of the sweep with exactly the code and options the layer will use, so
CuPy's disk cache has them by the time the sweep builds the layer. Whatever fails here (a
config that does not lower, a module NVRTC rejects, a worker that cannot start) is left to the
sweep, which builds, and scores failures, itself.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Callable, Iterable, Iterator


def compile_in_worker(code: str, options: tuple) -> None:
    """In a worker process: compile into CuPy's disk cache."""
    import cupy as cp
    cp.RawModule(code=code, options=options).compile()


def worker_count() -> int:
    """Half the CPU cores, at most 8 (each worker holds a CUDA context)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def compile_pool(workers: int) -> ProcessPoolExecutor:
    """Spawned worker processes (not forked: the parent holds a CUDA context), for one sweep."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


class AheadCompiler:
    """Keeps the compiles of the next `window` candidates running on `executor` (the caller's,
    shared by the sweeps of all token counts); `next()` waits for the one the sweep is about to
    build. inputs: (code, options) per candidate in sweep order, or None where there is nothing
    to compile ahead."""

    def __init__(self, inputs: Iterable[tuple[str, tuple] | None], executor: Executor,
                 window: int, compile_fn: Callable[[str, tuple], None] = compile_in_worker,
                 timeout_s: float = 300.0):
        self.executor = executor
        self.inputs: Iterator = iter(inputs)
        self.compile_fn = compile_fn
        self.timeout_s = timeout_s
        self.window = window
        self.pending: collections.deque = collections.deque()
        self.failed = 0
        self.broken = False
        self._top_up()

    def _top_up(self) -> None:
        while len(self.pending) < self.window:
            try:
                item = next(self.inputs)
            except StopIteration:
                return
            future = None
            if item is not None and not self.broken:
                try:
                    future = self.executor.submit(self.compile_fn, *item)
                except Exception:          # noqa: BLE001 - e.g. a pool whose workers died
                    self.broken = True
            self.pending.append(future)

    def next(self) -> None:
        """Wait for the next candidate's compile (its failure is the sweep's to find)."""
        if self.pending:
            future = self.pending.popleft()
            if future is not None:
                try:
                    future.result(timeout=self.timeout_s)
                except Exception:          # noqa: BLE001 - the sweep builds it and reports
                    self.failed += 1       # (a compile past the timeout too: never a hang)
        self._top_up()

    def close(self) -> None:
        """Drop the compiles not started (the sweep stopped before their candidates)."""
        for future in self.pending:
            if future is not None:
                future.cancel()
        self.pending.clear()

    def __enter__(self) -> "AheadCompiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
