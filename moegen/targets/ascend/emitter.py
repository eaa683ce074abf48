"""Lowered MSD module -> a complete CANN custom-op project (templates/ascend).

Op and file names derive from the spec name. The controller renders the schedule pass's action
lists for both templates (basic, preload) as they are: flag ids, modes and pipes from the
schedule's flags, stage calls with iteration offsets, rotating slots from the derived slot counts.
The same action lists are written beside it as JSON; `readback.py` parses the emitted code back.
"""
from __future__ import annotations

import json
import re

import numpy as np

from ...ir import Module
from ...ir.interp import merge_divisors
from ...ir.ops.msd import DEFAULT_FACTORS
from ...passes import ascend_tiling
from ...passes.ascend_tiling import msd_tiling
from ...passes.schedule import derived_schedule
from ...schedule_model import CUBE, MODES, Action, Schedule
from ...render import render
from ...spec import Spec, SpecError
from ..header import file_header

GUARD = {CUBE: "ASCEND_IS_AIC", "vec": "ASCEND_IS_AIV"}
STAGE_CALL = {"unfold": "vec_.UnfoldA", "matmul": "cube_.LaunchMatmul", "merge": "vec_.MergeY"}
SLOT_NAME = {"a_max": "A_MAX_SLOTS", "a_unfold": "A_UNFOLD_SLOTS", "y_int": "Y_INT_SLOTS"}
# the slot arguments of each stage call, in the order the compute classes take them
STAGE_SLOTS = {"unfold": ("a_max", "a_unfold"), "matmul": ("a_unfold", "y_int"),
               "merge": ("a_max", "y_int")}
MODE_MACRO = {"basic": "BASIC_MSD", "preload": "PRELOAD_MSD"}
# project path (OP: the op's snake_case name) -> template under templates/ascend
TEMPLATES = {
    "CMakeLists.txt": "ascend/CMakeLists.txt.j2",
    "op_host/CMakeLists.txt": "ascend/op_host/CMakeLists.txt.j2",
    "op_host/OP_def.cpp": "ascend/op_host/def.cpp.j2",
    "op_host/OP_tiling.h": "ascend/op_host/tiling.h.j2",
    "op_host/OP_tiling.cpp": "ascend/op_host/tiling.cpp.j2",
    "op_host/OP_infershape.cpp": "ascend/op_host/infershape.cpp.j2",
    "op_kernel/OP.cpp": "ascend/op_kernel/kernel.cpp.j2",
    "op_kernel/OP_tiling_data.h": "ascend/op_kernel/tiling_data.h.j2",
    "op_kernel/OP_tiling_key.h": "ascend/op_kernel/tiling_key.h.j2",
    "op_kernel/msd/OP_msd_controller.h": "ascend/op_kernel/msd/controller.h.j2",
    "op_kernel/msd/OP_cube_compute.h": "ascend/op_kernel/msd/cube_compute.h.j2",
    "op_kernel/msd/OP_vec_compute.h": "ascend/op_kernel/msd/vec_compute.h.j2",
    "op_kernel/msd/OP_tool.h": "ascend/op_kernel/msd/tool.h.j2",
    "examples/scripts/gen_data.py": "ascend/examples/scripts/gen_data.py.j2",
    "examples/scripts/verify_result.py": "ascend/examples/scripts/verify_result.py.j2",
    "examples/src/main.cpp": "ascend/examples/src/main.cpp.j2",
    "examples/src/CMakeLists.txt": "ascend/examples/src/CMakeLists.txt.j2",
    "examples/run.sh": "ascend/examples/run.sh.j2",
    "README.md": "ascend/README.md.j2",
}


def op_names(spec: Spec) -> tuple[str, str]:
    """(snake_case op name for files and the kernel, CamelCase op type)."""
    snake = re.sub(r"[^0-9a-zA-Z]+", "_", spec.name).strip("_").lower() or "msd"
    if snake[0].isdigit():
        snake = "op_" + snake
    return snake, "".join(p.capitalize() for p in snake.split("_"))


def statement(sched: Schedule, action: Action) -> list[str]:
    """One action as AscendC code, a statement a line (the form readback.py parses)."""
    if action.op in ("signal", "wait"):
        f = sched.flags[action.flag]
        if action.op == "signal":
            return [f"AscendC::CrossCoreSetFlag<{f.mode}, PIPE_{f.pipe}>({f.name});"]
        return [f"AscendC::CrossCoreWaitFlag<{f.mode}>({f.name});"]
    stage = sched.stages[action.stage]
    used = set(stage.reads + stage.writes)
    slots = ", ".join(f"it % {SLOT_NAME[b]}[MSD_MODE]" for b in STAGE_SLOTS[action.stage])
    assert used == set(STAGE_SLOTS[action.stage]), (action.stage, used)
    return [f"const uint32_t it = step - {action.offset};",
            f"{STAGE_CALL[action.stage]}(it, {slots});"]


def schedule_context(sched: Schedule) -> dict:
    programs = []
    for kind in (CUBE, "vec"):
        prog = sched.programs[kind]
        programs.append({"kind": kind, "guard": GUARD[kind],
                         "init": [line for a in prog.init for line in statement(sched, a)],
                         "step": [{"offset": a.offset, "lines": statement(sched, a)}
                                  for a in prog.step],
                         "drain": [line for a in prog.drain for line in statement(sched, a)]})
    return {"mode": sched.mode, "Name": sched.mode.capitalize(), "macro": MODE_MACRO[sched.mode],
            "key": MODES[sched.mode], "lag": sched.lag, "slots": sched.slots,
            "programs": programs}


def schedule_metadata(schedules: list[Schedule]) -> dict:
    return {s.mode: {"lag": s.lag, "slots": s.slots,
                     "programs": {kind: {"init": [str(a) for a in p.init],
                                         "step": [[a.offset, str(a)] for a in p.step],
                                         "drain": [str(a) for a in p.drain]}
                                  for kind, p in s.programs.items()},
                     "flags": {f.name: {"id": f.id, "mode": f.mode, "pipe": f.pipe}
                               for f in s.flags.values()}}
            for s in schedules}


def emit_msd_project(spec: Spec, module: Module, pipeline: str) -> dict[str, str]:
    """relative path -> text of the whole op project."""
    s = spec.msd
    if spec.targets.ascend is None:
        raise SpecError("targets.ascend: None is required to emit the Ascend project")
    # the spec's own shape must run: the same checks as the host tiling, before anything is emitted
    msd_tiling(s.m, s.n, s.k, spec.quant.group_size, s.steps, spec.targets.ascend.aic_cores)
    op, Op = op_names(spec)
    loop = module.function().op("msd.group_loop")
    schedules = [derived_schedule(loop, mode) for mode in sorted(MODES, key=MODES.get)]
    recorded = loop.attrs.get("slots")
    chosen = next(s for s in schedules if s.mode == loop.attrs.get("schedule", spec.schedule))
    if recorded is not None and recorded != chosen.slots:
        raise ValueError(f"the module's slots {recorded} differ from the schedule {chosen.slots}")
    factors = DEFAULT_FACTORS[:s.steps]
    header = file_header(spec, pipeline)
    ctx = {
        "header": header, "header_py": file_header(spec, pipeline, "#"),
        "header_md": file_header(spec, pipeline, ">"),
        "header_cmake": file_header(spec, pipeline, "#"), "op": op, "Op": Op,
        "m": s.m, "n": s.n, "k": s.k, "group": spec.quant.group_size, "steps": s.steps,
        "soc": spec.targets.ascend.soc, "factors": factors,
        # 9 significant digits name a float32 exactly
        "merge_scales": [f"{np.float32(1.0 / d):.9g}" for d in merge_divisors(factors, s.steps)],
        "schedules": [schedule_context(x) for x in schedules],
        "flags": sorted(chosen.flags.values(), key=lambda f: f.id),
        "default_mode": chosen.mode, "default_macro": MODE_MACRO[chosen.mode],
        "t": ascend_tiling,
    }
    out = {path: render(tpl, **ctx) for path, tpl in TEMPLATES.items()}
    out = {path.replace("OP", op): text for path, text in out.items()}
    out[f"op_kernel/msd/{op}_schedule.json"] = json.dumps(schedule_metadata(schedules),
                                                          indent=2) + "\n"
    return out
