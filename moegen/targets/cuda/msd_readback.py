"""Read the synchronisation sequence back out of an emitted CUDA MSD kernel (for checks)."""
from __future__ import annotations

import re

from ...schedule_model import CUBE, FLAGS, VEC, Action, Program

_KERNEL = re.compile(r"msd_matmul_(\w+)\(const half\* __restrict__ x")
_SIGNAL = re.compile(r"\bsignal\(sh, (\w+), sent\[\1\]\+\+\)")
_WAIT = re.compile(r"\bwait\(sh, (\w+), waited\[\1\]\+\+\)")
_STAGE = re.compile(r"\b(unfold|matmul|merge)\(sh,")
_RUNS = re.compile(r"moegen_runs\(step, (\d+), STEPS\)")
IDS = {f.name: f.id for f in FLAGS.values()}


def _action(line: str, offset: int) -> Action | None:
    """The action a statement of the kernel's line is, if any."""
    if (m := _SIGNAL.search(line)):
        return Action("signal", IDS[m.group(1)], offset=offset)
    if (m := _WAIT.search(line)):
        return Action("wait", IDS[m.group(1)], offset=offset)
    if (m := _STAGE.search(line)) and "__device__" not in line:
        return Action("stage", stage=m.group(1), offset=offset)
    return None


def read_kernels(source: str) -> dict[str, dict[str, Program]]:
    """Each kernel's action lists. In the step loop an action is `if (moegen_runs(step, OFFSET,
    STEPS))` and its statement (on the same line or the next), or a block of statements in
    braces (a stage); before and after the loop, its statement alone (offset 0)."""
    out: dict[str, dict[str, Program]] = {}
    mode, prog, section = None, None, None
    offset, in_block = None, False          # the step loop's action being read
    for raw in source.splitlines():
        line = raw.strip()
        if (m := _KERNEL.search(line)):
            mode = m.group(1)
            out[mode] = {}
            continue
        if mode is None:
            continue
        if in_block and line == "}":          # the end of a stage's block, not of the loop
            offset, in_block = None, False
        elif line.startswith("if (warp < VEC_WARPS) {"):
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
            if (r := _RUNS.search(line)):
                offset, in_block = int(r.group(1)), line.endswith("{")
                line = line[r.end():]             # a statement may follow on the same line
            action = _action(line, offset if offset is not None else 0)
            if action is not None:
                getattr(prog, section).append(action)
                if not in_block:
                    offset = None
        if line.startswith("(void)waited;"):
            mode, prog, section = None, None, None
    return out
