"""Lowered MSD module -> CUDA source.

`lowering: msd`: one kernel per schedule (basic, preload). The kernel body of each schedule is its
action lists rendered as they are: each flag becomes a ring of mbarriers in shared memory (scoped
to the CTA, whose vector warps and MMA warps play the units of one core), or, where the flag is
a meeting of one unit's warps, a named barrier of them; stages become calls with their
iteration offset, rotating buffers take the derived slot counts.
`lowering: dequant`: the MoE layer's W4A16 GEMM (int4 -> fp16 in registers, fp16 MMA) on the
dense matrix, for comparison on the same GPU.
"""
from __future__ import annotations

import numpy as np

from ...ir import Module
from ...ir.interp import merge_divisors
from ...ir.ops.msd import DEFAULT_FACTORS
from ...passes.pipelines import require_passes
from ...passes.schedule import derived_schedule
from ...schedule_model import CUBE, MODES, VEC, Action, Schedule
from ...passes.tiling.msd import (MSD_MAX_BARRIERS, MSD_MAX_SLOTS, MSD_SHARED_LINE,
                                  msd_barrier_bytes, msd_shared_bytes)
from ...render import render
from ...spec import Spec, SpecError
from ..header import file_header
from .emitter import CudaProgram, device_headers
from .template_args import template_args

STAGE_CALL = {
    "unfold": "unfold(sh, x, scale, unit, it, it % SLOTS_A_MAX, it % SLOTS_A_UNFOLD);",
    "matmul": "matmul(sh, w, it, it % SLOTS_A_UNFOLD, it % SLOTS_Y);",
    "merge": "merge(sh, unit, it, it % SLOTS_A_MAX, it % SLOTS_Y, acc);",
}


def statement(sched: Schedule, a: Action) -> list[str]:
    """One action as the kernel's lines: a stage at iteration `step - offset` on the slots the
    schedule derived, or the unit's next signal or wait of a flag."""
    if a.op == "stage":
        return [f"const int it = step - {a.offset};", STAGE_CALL[a.stage]]
    f = sched.flags[a.flag]
    if a.op == "signal":
        return [f"signal(sh, {f.name}, sent[{f.name}]++);"]
    return [f"wait(sh, {f.name}, waited[{f.name}]++);"]


def _program(sched: Schedule, kind: str) -> dict:
    p = sched.programs[kind]
    return {"init": [line for a in p.init for line in statement(sched, a)],
            "step": [{"offset": a.offset, "lines": statement(sched, a)} for a in p.step],
            "drain": [line for a in p.drain for line in statement(sched, a)]}


# named barrier of a unit's warps, for the flags that are meetings of that unit (0 is
# __syncthreads'; the vector warps' 1 is also where they meet in the K split's sum)
MEETING_BARRIER = {VEC: 1, CUBE: 2}


def meeting_flags(schedules: list[Schedule]) -> set[int]:
    """Flags that are, in every schedule, a meeting of one unit's warps: set and waited for by
    the same unit, never before or after the step loop, each signal followed at once by its
    wait. Every thread of the unit signals and then waits for all the others: a barrier of the
    unit's warps, which the kernel keeps as a named barrier instead of a ring of mbarriers."""
    meetings = set(schedules[0].flags)
    for sched in schedules:
        for fid, f in sched.flags.items():
            p = sched.programs[f.setter]
            uses = [i for i, a in enumerate(p.step) if a.op != "stage" and a.flag == fid]
            pairs = uses and len(uses) % 2 == 0 and all(
                p.step[i].op == "signal" and j == i + 1 and p.step[j].op == "wait"
                and p.step[j].offset == p.step[i].offset for i, j in zip(uses[::2], uses[1::2]))
            elsewhere = any(a.op != "stage" and a.flag == fid
                            for kind, q in sched.programs.items()
                            for a in q.init + q.drain + (q.step if kind != f.setter else []))
            if f.setter != f.waiter or not pairs or elsewhere:
                meetings.discard(fid)
    return meetings


def flag_depths(schedules: list[Schedule]) -> dict[int, int]:
    """mbarriers per flag that is not a meeting (`meeting_flags`): the signals a unit gives
    before its first wait, plus two.

    A unit's k-th wait watches barrier k mod depth for its phase k / depth; that is unambiguous
    while no signaller runs more than `depth` signals ahead of a waiter's completed waits (one
    more completes the barrier's next phase too, and the wait sees its own parity again). In
    these schedules a signaller runs ahead by its initial signals plus at most one more step
    (each step signals a flag once and every unit meets the others once per step), the merge
    being at most one step behind the unfold; a test checks the bound over every interleaving
    of the units' programs."""
    depth: dict[int, int] = {}
    meetings = meeting_flags(schedules)
    for sched in schedules:
        for fid in sched.flags:
            if fid in meetings:
                continue
            early = max(sum(1 for a in p.init if a.op == "signal" and a.flag == fid)
                        for p in sched.programs.values())
            depth[fid] = max(depth.get(fid, 0), early + 2)
    return depth


def check_shape(spec: Spec) -> None:
    s, g = spec.msd, spec.quant.group_size
    if not 1 <= s.m <= 64:
        raise SpecError(f"msd.m: {s.m} must be in 1..64 for the CUDA MSD kernels")
    if spec.lowering == "msd" and g % 64:
        raise SpecError(f"quant.group_size: {g} is not served by the CUDA MSD kernel (int4 MMA "
                        "steps are 64 deep: use 64 or 128)")
    if spec.lowering == "dequant" and (g % 16 or s.n % 8):
        raise SpecError(f"msd.n: {s.n} (group {g}): the dequant lowering reads the scales 8 "
                        "columns at a time and K 16 at a time: n must be a multiple of 8 and "
                        "the group of 16")


def emit_msd(spec: Spec, module: Module, pipeline: str, arch: str | None = None) -> CudaProgram:
    check_shape(spec)
    loop = module.function().op("msd.group_loop")
    require_passes(spec.pipeline, "cuda", pipeline, [] if "tile" in loop.attrs else ["tile"])
    tile = loop.attrs["tile"]
    arch = arch or spec.cuda_arch
    if spec.lowering == "dequant":
        source, plan = _dequant(spec, tile, pipeline, arch)
    else:
        source, plan = _msd(spec, loop, tile, pipeline, arch)
    return CudaProgram(source=source, headers=device_headers(), plan=plan, ir=str(module))


def _msd(spec: Spec, loop, tile: dict, pipeline: str, arch: str) -> tuple[str, dict]:
    s, g = spec.msd, spec.quant.group_size
    schedules = [derived_schedule(loop, mode) for mode in MODES]
    depth = flag_depths(schedules)
    flags, first = [], 0
    for f in sorted(schedules[0].flags.values(), key=lambda f: f.id):
        ring = f.id in depth
        flags.append({"name": f.name, "id": f.id, "mode": f.mode, "setter": f.setter,
                      "waiter": f.waiter, "depth": depth.get(f.id, 0), "first": first,
                      "meeting": 0 if ring else MEETING_BARRIER[f.setter]})
        first += depth.get(f.id, 0)
    factors = DEFAULT_FACTORS[:s.steps]
    block_n = tile["block_n"]
    source = render(
        "cuda/msd_matmul.cu.j2", header=file_header(spec, pipeline), M=s.m, N=s.n, K=s.k, G=g,
        S=s.steps, BLOCK_N=block_n, W_STAGES=tile["w_stages"], X_STAGES=tile["x_stages"],
        MMA=tile["mma"], VEC_WARPS=tile["vec_warps"], CUBE_WARPS=tile["cube_warps"],
        factors=factors,
        # the s8 MMA sums 16 q a (the weights widened to 16 q): its divisors carry the 1/16, an
        # exact scaling of the fp32 reciprocal, so merge rounds as it would on the plain sums
        inv_divisors=[repr(float(np.float32(1.0 / float(d))) / (16 if tile["mma"] == "s8" else 1))
                      for d in merge_divisors(factors, s.steps)],
        SPLIT=tile["split_k"], OCCUPANCY=tile["occupancy"], flags=flags,
        # s8 with at most 8 unfolded rows: the weights as the MMA's A operand, where a matrix
        # warp's n8 tiles pair up (measured: M = 1, 2 faster; above 8 rows slower)
        ROWS_AS_B=(tile["mma"] == "s8" and s.steps * s.m <= 8
                   and block_n // 8 // tile["cube_warps"] % 2 == 0),
        barriers=first, BARRIER_WORDS=msd_barrier_bytes(first) // 8, LINE_BYTES=MSD_SHARED_LINE,
        schedules=[{"mode": x.mode, "lag": x.lag, "slots": x.slots,
                    "vec": _program(x, VEC), "cube": _program(x, CUBE)} for x in schedules])
    assert first <= MSD_MAX_BARRIERS and all(
        x.slots[b] <= n for x in schedules for b, n in MSD_MAX_SLOTS.items()), \
        "the tile pass sized shared memory for fewer barriers or slots"

    def smem(x: Schedule) -> int:
        return msd_shared_bytes(s.m, g, s.steps, tile, x.slots, first)

    plan = {
        "spec": spec.name, "spec_hash": spec.hash, "passes": pipeline, "arch": arch,
        "lowering": "msd", "default": spec.schedule, "tile": tile,
        "kernels": [{"name": f"msd_matmul_{x.mode}",
                     "grid": [-(-s.n // block_n), tile["split_k"], 1],
                     "block": 32 * (tile["vec_warps"] + tile["cube_warps"]),
                     "shared_bytes": smem(x), "slots": x.slots,
                     "flag_depths": {f["name"]: f["depth"] for f in flags if not f["meeting"]},
                     "flag_meetings": {f["name"]: {"unit": f["setter"],
                                                   "named_barrier": f["meeting"]}
                                       for f in flags if f["meeting"]},
                     "actions": {kind: {"init": [str(a) for a in p.init],
                                        "step": [[a.offset, str(a)] for a in p.step],
                                        "drain": [str(a) for a in p.drain]}
                                 for kind, p in x.programs.items()}}
                    for x in schedules],
        "workspace": {"partials_floats": tile["split_k"] * s.m * s.n if tile["split_k"] > 1 else 0,
                      "counters": -(-s.n // block_n) if tile["split_k"] > 1 else 0},
        "weights": {"layout": "uint32 [ceil(N/8), K/64, 32, 2] (the B fragments of mma.sync "
                               "m16n8k64 u4: nibbles q + 8; the s8 kernels widen them to the "
                               "signed bytes 16 q in registers)"},
    }
    return source, plan


def _dequant(spec: Spec, tile: dict, pipeline: str, arch: str) -> tuple[str, dict]:
    s, g = spec.msd, spec.quant.group_size
    block, split = tile["block"], tile["split_k"]
    ntiles = -(-s.n // 64)
    blocks = -(-s.m // block)
    source = render("cuda/msd_dequant.cu.j2", header=file_header(spec, pipeline),
                    targs=template_args, M=s.m, N=s.n,
                    K=s.k, G=g, NTILES=ntiles, tile=tile)
    rows = -(-block // 16) * 16
    plan = {
        "spec": spec.name, "spec_hash": spec.hash, "passes": pipeline, "arch": arch,
        "lowering": "dequant", "default": "dequant", "tile": tile,
        "kernels": [{"name": "msd_matmul_dequant", "grid": [blocks, ntiles, split],
                     "block": 32 * tile["warps"], "shared_bytes": 0}],
        "workspace": {"partials_floats": blocks * ntiles * split * rows * 64 if split > 1 else 0,
                      "counters": blocks * ntiles if split > 1 else 0},
        "weights": {"layout": "uint32 [K/16, ceil(N/64), 32, 4] (the MoE GEMM's, one expert)"},
    }
    return source, plan
