import pytest

import moegen
from moegen.passes.schedule import derive_slots, generate, loop_stages, schedule_of
from moegen.schedule_model import FLAGS, Action, ScheduleError
from moegen.passes.pipelines import lower
from moegen.sim.engine import Machine, simulate
from moegen.sim.timeline import Panel, ascii_gantt, svg, window
from conftest import ROOT

MSD = moegen.load_spec(ROOT / "examples" / "msd-seed.yaml")
LOOP = moegen.build(MSD).function().op("msd.group_loop")
SEED_SHAPE = (1, 12288, 128, 3)


def derived(mode, iterations=64):
    return derive_slots(generate(loop_stages(LOOP), mode, iterations))


def test_slots_are_derived():
    assert derived("preload").slots == {"a_max": 2, "a_unfold": 3, "y_int": 2}
    assert derived("basic").slots == {"a_max": 1, "a_unfold": 1, "y_int": 1}
    # generation alone writes no slot count down: everything starts at one
    assert generate(loop_stages(LOOP), "preload", 64).slots == {"a_max": 1, "a_unfold": 1,
                                                                 "y_int": 1}


def test_flags_within_range_and_documented_modes():
    for f in FLAGS.values():
        assert 0 <= f.id <= 10 and f.mode in (0, 1, 2)


def test_action_lists_match_the_sample():
    pre = derived("preload")
    vec, cube = pre.programs["vec"], pre.programs["cube"]
    assert [str(a) for a in vec.init] == ["signal(6)", "signal(6)"]
    assert [str(a) for a in vec.step] == ["wait(6)", "unfold(i)", "signal(3)", "wait(3)",
                                          "signal(8)", "wait(9)", "merge(i-1)", "signal(6)"]
    assert [str(a) for a in cube.step] == ["wait(8)", "matmul(i)", "wait(7)", "signal(9)",
                                           "signal(7)"]
    assert [str(a) for a in cube.init] == ["signal(7)"] and len(vec.drain) == 2
    basic = derived("basic")
    assert [str(a) for a in basic.programs["cube"].step] == ["wait(8)", "matmul(i)", "signal(7)",
                                                             "wait(7)", "signal(9)"]


def test_unrolled_sections_and_slot_indices():
    steps = derived("preload", 5).unroll("vec")
    assert steps[0].section == "prologue" and steps[-1].section == "epilogue"
    unfolds = [s for s in steps if s.stage == "unfold"]
    merges = [s for s in steps if s.stage == "merge"]
    assert [dict(s.slots)["a_unfold"] for s in unfolds] == [0, 1, 2, 0, 1]
    assert [dict(s.slots)["y_int"] for s in merges] == [0, 1, 0, 1, 0]
    assert [s.iteration for s in merges] == [0, 1, 2, 3, 4]
    assert any(s.section == "steady" for s in steps)


@pytest.mark.parametrize("mode", ["basic", "preload"])
@pytest.mark.parametrize("cores", [1, 2, 3])
def test_simulator_accepts_derived_schedules(mode, cores):
    result = simulate(derived(mode, 12), Machine(cores=cores))
    assert result.ok, result.report()


def remove(program, index):
    del program[index]


def test_removed_wait_is_a_hazard():
    for mode in ("basic", "preload"):
        s = derived(mode, 10)
        step = s.programs["vec"].step
        remove(step, [str(a) for a in step].index("wait(9)"))   # merge no longer waits for Y
        result = simulate(s, Machine(cores=2))
        assert any(h.kind == "read-before-write" and h.buffer == "y_int" for h in result.hazards), \
            result.report()


def test_removed_credit_wait_is_an_overwrite_hazard():
    s = derived("preload", 10)
    step = s.programs["vec"].step
    remove(step, [str(a) for a in step].index("wait(6)"))
    result = simulate(s, Machine(cores=2))
    assert any(h.kind == "overwrite" for h in result.hazards), result.report()


def test_unfolded_a_with_two_slots_under_preload_is_a_hazard():
    s = derived("preload", 10).with_slots(a_unfold=2)
    result = simulate(s, Machine(cores=2))
    hazards = [h for h in result.hazards if h.buffer == "a_unfold"]
    assert hazards and hazards[0].kind == "overwrite"
    assert "cube" in hazards[0].detail
    assert simulate(derived("preload", 10), Machine(cores=2)).ok


def test_removed_signal_is_a_deadlock():
    s = derived("preload", 10)
    step = s.programs["vec"].step
    remove(step, [str(a) for a in step].index("signal(8)"))
    result = simulate(s, Machine(cores=2))
    assert "blocked at wait(8)" in result.deadlock and "SYNC_AIV_AIC_FLAG" in result.deadlock
    assert "lacking a signal from vec0.0, vec0.1" in result.deadlock


def test_unbalanced_counts_are_reported():
    s = derived("basic", 6)
    s.programs["vec"].init.append(Action("signal", 6))   # one credit too many, never consumed
    result = simulate(s, Machine(cores=2))
    assert any("flag 6" in u for u in result.unbalanced), result.report()


def test_derivation_refuses_unsyncable_schedules():
    s = generate(loop_stages(LOOP), "basic", 8)
    step = s.programs["cube"].step
    remove(step, [str(a) for a in step].index("wait(8)"))
    remove(s.programs["vec"].step, [str(a) for a in s.programs["vec"].step].index("signal(8)"))
    with pytest.raises(ScheduleError, match="read-before-write"):
        derive_slots(s)


def test_preload_is_faster_than_basic_at_the_seed_shape():
    times = {}
    for mode in ("basic", "preload"):
        r = simulate(derived(mode), Machine(cores=24), shape=SEED_SHAPE, check=False)
        assert not r.deadlock
        times[mode] = r.time_us
    assert times["preload"] < times["basic"]
    # the model's scale: a few hundred microseconds, as the sample measured
    assert 100 < times["preload"] < times["basic"] < 1000


def test_schedule_of_rederives_from_the_ir():
    module, ctx, _ = lower(MSD, "ascend")
    assert schedule_of(module).slots == ctx.results["schedule"].slots
    loop = module.function().op("msd.group_loop")
    loop.attrs["slots"] = {"a_max": 2, "a_unfold": 2, "y_int": 2}
    with pytest.raises(ScheduleError, match="derives"):
        schedule_of(module)


def test_timelines():
    panels = []
    for mode in ("basic", "preload"):
        r = simulate(derived(mode), Machine(cores=24), shape=SEED_SHAPE, check=False)
        panels.append(Panel(mode, r, window(r, 4)))
    text = ascii_gantt(panels[1])
    lines = text.splitlines()
    assert "AIV unfold" in lines[1] and "AIC matmul" in lines[2] and "AIV merge" in lines[3]
    assert "0" in lines[1] and "3" in lines[3]
    # preload overlaps: the cube multiplies iteration 1 while the vector units merge iteration 0
    matmul1 = next(s for s in panels[1].result.spans if s.unit == "cube0" and s.iteration == 1)
    merge0 = next(s for s in panels[1].result.spans if s.unit == "vec0.0" and s.what == "merge"
                  and s.iteration == 0)
    assert matmul1.start < merge0.end and merge0.start < matmul1.end
    doc = svg(panels, "ascend", "t")
    assert doc.startswith("<svg") and doc.count("<rect") > 20 and "AIC matmul" in doc
    import xml.dom.minidom
    xml.dom.minidom.parseString(doc)
