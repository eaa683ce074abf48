"""A numpy emulator of the emitted Ascend MSD op: it translates the op_kernel sources moegen wrote
(cxx.py) and runs them on an emulated Atlas A2 (machine.py) with each AscendC call's documented
semantics (api.py) and the checks of memory.py: pipe hazards, GM visibility through cross-core
flags, the data cache, buffer bounds, balanced flags, deadlocks.

    y, machine = emulate(files, tiling, x, weight_packed, scale, template=1)

`files` is the project as `moegen compile --target ascend` writes it (relative path -> text),
`tiling` the tiling data (moegen.passes.ascend_tiling.msd_tiling, which a test pins to the
emitted host tiling field by field), `template` the tiling key (0 basic, 1 preload).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import api
from .cxx import CxxError, translate
from .machine import Machine, Runtime
from .memory import EmulationError, HazardError
from .scalars import conv, div, f32, mod, sizeof

__all__ = ["CxxError", "EmulationError", "HazardError", "emulate", "kernel_module"]


@lru_cache(maxsize=16)
def _load(source: str) -> dict:
    namespace = {"_conv": conv, "_sizeof": sizeof, "_div": div, "_mod": mod, "_f32": f32,
                 "_copy": api.copy_value, "_rt": Runtime, **api.namespace()}
    exec(compile(source, "<emitted AscendC kernel>", "exec"), namespace)
    return namespace


def kernel_module(files: dict[str, str]) -> tuple[str, dict]:
    """The kernel's entry name and the namespace of its translation."""
    entries = [p for p in files if p.startswith("op_kernel/") and p.count("/") == 1
               and p.endswith(".cpp")]
    if len(entries) != 1:
        raise CxxError(f"expected one op_kernel/*.cpp entry, found {entries}")
    sources = {p: t for p, t in files.items() if p.endswith((".h", ".cpp"))
               and p.startswith("op_kernel/")}
    return entries[0][len("op_kernel/"):-len(".cpp")], _load(translate(sources, entries[0]))


def emulate(files: dict[str, str], tiling: dict, x: np.ndarray, weight_packed: np.ndarray,
            scale: np.ndarray, template: int, workspace_bytes: int,
            seed=None) -> tuple[np.ndarray, Machine]:
    """Runs the op: y fp16 [M, N] = x fp16 [M, K] x int4 weight [K, N] (packed two a byte, even
    column in the low nibble) with fp16 scales [K/group, N]; `workspace_bytes` is the user
    workspace the host tiling asks for."""
    name, namespace = kernel_module(files)
    m, n = tiling["m"], tiling["n"]
    machine = Machine(tiling["matmulTiling"]["usedCoreNum"], tiling, seed)
    rng = machine.rng
    gm = machine.gm
    args = (gm.allocate("x", np.ascontiguousarray(x, dtype=np.float16)),
            gm.allocate("weight", np.ascontiguousarray(weight_packed, dtype=np.uint8)),
            gm.allocate("antiquant_scale", np.ascontiguousarray(scale, dtype=np.float16)),
            gm.allocate("y", np.full((m, n), np.nan, dtype=np.float16)),
            gm.allocate("workspace", rng.integers(0, 256, api.SYS_WORKSPACE + workspace_bytes,
                                                  dtype=np.uint8)),
            gm.allocate("tiling", np.zeros(8, dtype=np.uint8)))
    machine.run(namespace[name], args, template)
    return gm.array("y").view(np.float16).reshape(m, n).copy(), machine

