"""Read the synchronisation sequence back out of an emitted CUDA MSD kernel (for checks)."""
from __future__ import annotations

import re

from ...passes.schedule import CUBE, FLAGS, VEC, Action, Program

_KERNEL = re.compile(r"msd_matmul_(\w+)\(const half\* __restrict__ x")
_SIGNAL = re.compile(r"\bsignal\(sh, (\w+), sent\[\1\]\+\+\)")
_WAIT = re.compile(r"\bwait\(sh, (\w+), waited\[\1\]\+\+\)")
_STAGE = re.compile(r"\b(unfold|matmul|merge)\(sh,")
_RUNS = re.compile(r"moegen_runs\(step, (\d+), STEPS\)")
IDS = {f.name: f.id for f in FLAGS.values()}


def read_kernels(source: str) -> dict[str, dict[str, Program]]:
    out: dict[str, dict[str, Program]] = {}
    mode, prog, section = None, None, None
    for raw in source.splitlines():
        line = raw.strip()
        if (m := _KERNEL.search(line)):
            mode = m.group(1)
            out[mode] = {}
            continue
        if mode is None:
            continue
        if line.startswith("if (warp < VEC_WARPS) {"):
            prog, section = Program(VEC), "init"
            out[mode][VEC] = prog
        elif line.startswith("} else {") and prog is not None and prog.kind == VEC:
            prog, section = Program(CUBE), "init"
            out[mode][CUBE] = prog
        elif line.startswith("for (int step") and prog is not None:
            section = "step"
        elif line == "}" and section == "step":
            section = "drain"
        elif prog is not None and section is not None:
            off = int(r.group(1)) if (r := _RUNS.search(line)) else 0
            if (m := _SIGNAL.search(line)):
                getattr(prog, section).append(Action("signal", IDS[m.group(1)], offset=off))
            elif (m := _WAIT.search(line)):
                getattr(prog, section).append(Action("wait", IDS[m.group(1)], offset=off))
            elif (m := _STAGE.search(line)) and "__device__" not in line:
                getattr(prog, section).append(Action("stage", stage=m.group(1), offset=off))
        if line.startswith("(void)waited;"):
            mode, prog, section = None, None, None
    return out
