"""Read the action lists back out of an emitted controller header.

Used to check an emission: the flag and stage sequence the code really performs, per template and
unit, as `Program`s the simulator can run. Expects the form the controller template writes: a
statement a line; in the step loop each action's `if (Runs(step, OFFSET, groups))` and its
statement, on the same line or the next (a stage's, in a block of braces).
"""
from __future__ import annotations

import re

from ...schedule_model import CUBE, VEC, Action, Program

_PROCESS = re.compile(r"__aicore__ inline void Process(\w+)\(\) \{")
_GUARD = re.compile(r"if ASCEND_IS_(AIC|AIV) \{")
_SET = re.compile(r"CrossCoreSetFlag<(\d+), PIPE_(\w+)>\((\w+)\)")
_WAIT = re.compile(r"CrossCoreWaitFlag<(\d+)>\((\w+)\)")
_STAGE = re.compile(r"\b(vec_\.UnfoldA|cube_\.LaunchMatmul|vec_\.MergeY)\(")
_RUNS = re.compile(r"Runs\(step, (\d+), groups\)")
STAGES = {"vec_.UnfoldA": "unfold", "cube_.LaunchMatmul": "matmul", "vec_.MergeY": "merge"}


def flag_ids(tool_header: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"constexpr uint16_t (\w+) = (\d+);", tool_header)}


def _action(line: str, ids: dict[str, int], offset: int) -> Action | None:
    if (m := _SET.search(line)):
        return Action("signal", ids[m.group(3)], offset=offset)
    if (m := _WAIT.search(line)):
        return Action("wait", ids[m.group(2)], offset=offset)
    if (m := _STAGE.search(line)):
        return Action("stage", stage=STAGES[m.group(1)], offset=offset)
    return None


def read_controller(controller: str, tool_header: str) -> dict[str, dict[str, Program]]:
    """{template name (lower case): {unit kind: Program}} as emitted."""
    ids = flag_ids(tool_header)
    out: dict[str, dict[str, Program]] = {}
    lines = controller.splitlines()
    i = 0
    while i < len(lines):
        m = _PROCESS.search(lines[i])
        i += 1
        if not m or m.group(1) in ("",):
            continue
        mode = m.group(1).lower()
        programs: dict[str, Program] = {}
        depth = 1
        prog, section = None, None
        offset, in_block = None, False      # the step loop's action being read
        while i < len(lines) and depth > 0:
            line = lines[i].strip()
            i += 1
            g = _GUARD.search(line)
            if g and depth == 1:
                prog = Program(CUBE if g.group(1) == "AIC" else VEC)
                programs[prog.kind] = prog
                section = "init"
            elif line.startswith("for (uint32_t step") and prog is not None:
                section = "step"
            elif prog is not None and line != "}" and section is not None:
                if (r := _RUNS.search(line)):
                    offset, in_block = int(r.group(1)), line.endswith("{")
                    line = line[r.end():]         # a statement may follow on the same line
                act = _action(line, ids, offset if offset is not None else 0)
                if act is not None:
                    getattr(prog, section).append(act)
                    if not in_block:
                        offset = None
            depth += line.count("{") - line.count("}")
            if line == "}" and in_block:       # the end of a stage's block, not of the loop
                offset, in_block = None, False
            elif line == "}" and prog is not None:
                if section == "step":
                    section = "drain"
                elif section in ("init", "drain") and depth == 1:
                    prog, section = None, None
        if programs:
            out[mode] = programs
    return out
