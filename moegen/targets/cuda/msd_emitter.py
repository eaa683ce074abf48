"""Lowered MSD module -> CUDA source with one kernel per schedule (basic, preload).

The kernel body of each schedule is its action lists rendered as they are: flags become counting
flags in shared memory (scoped to the CTA, whose two vector warps and two MMA warps play the
units of one core), stages become calls with their iteration offset, rotating buffers take the
derived slot counts.
"""
from __future__ import annotations

from ...ir import Module
from ...ir.interp import merge_divisors
from ...ir.ops.msd import DEFAULT_FACTORS
from ...passes.schedule import CUBE, MODES, VEC, Action, Schedule, derived_schedule
from ...render import render
from ...resources import data_dir
from ...spec import Spec, SpecError
from ..header import file_header
from .emitter import HEADER_FILE, CudaProgram

BLOCK_N = 32
STAGE_CALL = {
    "unfold": "unfold(sh, x, unit, it, it % SLOTS_A_MAX, it % SLOTS_A_UNFOLD);",
    "matmul": "matmul(sh, w, it, it % SLOTS_A_UNFOLD, it % SLOTS_Y);",
    "merge": "merge(sh, scale, unit, it, it % SLOTS_A_MAX, it % SLOTS_Y, acc);",
}
SCOPE = {VEC: "0, 2", CUBE: "2, 1"}     # (first unit, count) of the units that signal a flag


def statement(sched: Schedule, a: Action) -> str:
    if a.op == "stage":
        return f"const int it = step - {a.offset}; {STAGE_CALL[a.stage]}"
    f = sched.flags[a.flag]
    if a.op == "signal":
        return f"signal(sh, {f.name}, unit);"
    return f"wait(sh, {f.name}, unit, ++waits[{f.name}], {SCOPE[f.setter]});"


def _program(sched: Schedule, kind: str) -> dict:
    p = sched.programs[kind]
    return {"init": [statement(sched, a) for a in p.init],
            "step": [{"offset": a.offset, "stmt": statement(sched, a)} for a in p.step],
            "drain": [statement(sched, a) for a in p.drain]}


def emit_msd(spec: Spec, module: Module, pipeline: str, arch: str | None = None) -> CudaProgram:
    s = spec.msd
    g = spec.quant.group_size
    if g % 64:
        raise SpecError(f"quant.group_size: {g} is not served by the CUDA MSD kernel (int4 MMA "
                         "steps are 64 deep: use 64 or 128)")
    if spec.lowering != "msd":
        raise SpecError(f"lowering: {spec.lowering!r} is not implemented on CUDA yet (msd is)")
    if not 1 <= s.m <= 64:
        raise SpecError(f"msd.m: {s.m} must be in 1..64 for the CUDA MSD kernel")
    loop = next(op for op in module.function().ops if op.NAME == "msd.group_loop")
    schedules = [derived_schedule(loop, mode) for mode in MODES]
    flags = sorted(schedules[0].flags.values(), key=lambda f: f.id)
    factors = DEFAULT_FACTORS[:s.steps]
    source = render(
        "cuda/msd_matmul.cu.j2", header=file_header(spec, pipeline), M=s.m, N=s.n, K=s.k, G=g,
        S=s.steps, BLOCK_N=BLOCK_N, factors=factors,
        divisors=[repr(float(d)) for d in merge_divisors(factors, s.steps)], flags=flags,
        schedules=[{"mode": x.mode, "lag": x.lag, "slots": x.slots,
                    "vec": _program(x, VEC), "cube": _program(x, CUBE)} for x in schedules])
    rows = s.steps * s.m
    mt = -(-rows // 16)

    def smem(x: Schedule) -> int:
        sl = x.slots
        return 4 * (sl["a_unfold"] * mt * 16 * (g // 8) + sl["y_int"] * rows * BLOCK_N
                    + sl["a_max"] * s.m + len(flags) * 3)

    plan = {
        "spec": spec.name, "spec_hash": spec.hash, "passes": pipeline,
        "arch": arch or (spec.targets.cuda.arch if spec.targets.cuda else "sm_90"),
        "default": spec.schedule,
        "kernels": [{"name": f"msd_matmul_{x.mode}", "grid": [-(-s.n // BLOCK_N), 1, 1],
                     "block": 128, "shared_bytes": smem(x), "slots": x.slots,
                     "actions": {kind: {"init": [str(a) for a in p.init],
                                        "step": [[a.offset, str(a)] for a in p.step],
                                        "drain": [str(a) for a in p.drain]}
                                 for kind, p in x.programs.items()}}
                    for x in schedules],
        "weights": {"layout": "uint32 [ceil(N/8), K/64, 32, 2] (mma.sync m16n8k64 s4 B)"},
    }
    header = (data_dir("templates") / "cuda" / HEADER_FILE).read_text()
    return CudaProgram(source=source, header=header, plan=plan, ir=str(module))
