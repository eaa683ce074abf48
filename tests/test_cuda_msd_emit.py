"""The CUDA MSD kernels render the schedule pass's action lists (CPU checks)."""
import pytest

import moegen
from moegen.passes.schedule import Schedule, derive_slots, generate, loop_stages
from moegen.sim.engine import Machine, simulate
from moegen.targets.compile import emit
from moegen.targets.cuda.msd_readback import read_kernels
from conftest import ROOT

SEED = moegen.load_spec(ROOT / "examples" / "msd-seed.yaml")


def schedules():
    loop = next(op for op in moegen.build(SEED).function().ops if op.NAME == "msd.group_loop")
    return {m: derive_slots(generate(loop_stages(loop), m, 8)) for m in ("basic", "preload")}


def check(source, scheds):
    problems = []
    emitted = read_kernels(source)
    for mode, sched in scheds.items():
        got = emitted.get(mode, {})
        for kind, prog in sched.programs.items():
            p = got.get(kind)
            if p is None or (p.init, p.step, p.drain) != (prog.init, prog.step, prog.drain):
                problems.append(f"{mode}/{kind} differs")
        if set(got) == {"vec", "cube"}:
            result = simulate(Schedule(mode, sched.lag, 8, sched.stages, dict(sched.buffers), got)
                              .with_slots(**sched.slots), Machine(cores=1))
            if not result.ok:
                problems.append(result.report())
        for name, n in sched.slots.items():
            const = {"a_max": "SLOTS_A_MAX", "a_unfold": "SLOTS_A_UNFOLD", "y_int": "SLOTS_Y"}[name]
            kernel = source[source.index(f"msd_matmul_{mode}("):]
            if f"{const} = {n}" not in kernel[:kernel.index("extern __shared__")]:
                problems.append(f"{mode}: {const} is not {n}")
    return problems


def test_kernels_render_the_schedule():
    files = emit(SEED, "cuda")
    source = files["msd-seed.cu"]
    assert check(source, schedules()) == []
    assert "mma.sync" not in source or "m16n8k64" in source
    assert "mma_s4_16864" in source


@pytest.mark.parametrize("old,new", [
    ("      if (moegen_runs(step, 1, GROUPS)) { wait(sh, SYNC_AIC_AIV_FLAG, unit, ++waits[SYNC_AIC_AIV_FLAG], 2, 1); }\n", ""),
    ("      if (moegen_runs(step, 0, GROUPS)) { signal(sh, SYNC_AIV_AIC_FLAG, unit); }\n", ""),
    ("SLOTS_A_UNFOLD = 3", "SLOTS_A_UNFOLD = 2"),
])
def test_check_fails_on_corrupted_kernels(old, new):
    source = emit(SEED, "cuda")["msd-seed.cu"]
    assert old in source
    assert check(source.replace(old, new), schedules())


def test_launch_plan_lists_both_templates():
    import json
    plan = json.loads(emit(SEED, "cuda")["msd-seed.launch.json"])
    names = [k["name"] for k in plan["kernels"]]
    assert names == ["msd_matmul_basic", "msd_matmul_preload"]
    pre = plan["kernels"][1]
    assert pre["slots"] == {"a_max": 2, "a_unfold": 3, "y_int": 2}
    assert pre["actions"]["vec"]["step"][6] == [1, "merge(i-1)"]
    assert pre["grid"][0] == 12288 // 32


def test_unsupported_msd_specs_fail_clearly():
    bad = {"name": "t", "pipeline": "msd_matmul", "msd": {"m": 1, "n": 64, "k": 256},
           "quant": {"group_size": 32}, "targets": {"cuda": {}}}
    with pytest.raises(moegen.SpecError, match="quant.group_size: 32"):
        emit(moegen.load_spec(bad), "cuda")
    bad["quant"]["group_size"] = 128
    bad["lowering"] = "dequant"
    with pytest.raises(moegen.SpecError, match="lowering: 'dequant' is not implemented"):
        emit(moegen.load_spec(bad), "cuda")
