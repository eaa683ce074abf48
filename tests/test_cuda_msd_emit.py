"""The CUDA MSD kernels render the schedule pass's action lists (CPU checks)."""
import dataclasses
import json
import re

import numpy as np
import pytest

import moegen
from moegen.passes.schedule import derive_slots, generate, loop_stages
from moegen.schedule_model import CUBE, VEC, Schedule
from moegen.target import gpu_target
from moegen.sim.engine import Machine, simulate
from moegen.targets.compile import emit
from moegen.targets.cuda.msd_readback import read_kernels
from conftest import ROOT

SEED = moegen.load_spec(ROOT / "examples" / "msd-seed.yaml")


def schedules():
    loop = moegen.build(SEED).function().op("msd.group_loop")
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
    # the default MMA on widened int4: the weights as signed bytes 16 q x s8 rows (M = 1: the rows
    # as the B operand), with no slice sums to subtract: the kernel's s8 form, chosen by
    # `if constexpr (MMA_S8)` (the s4 form's slice sums compiled out)
    assert "moegen::mma_s8s8_16832(" in source and "constexpr bool MMA_S8 = true;" in source
    assert "if constexpr (!MMA_S8) y -= WEIGHT_BIAS * sh.rowsum" in source
    s4 = emit(SEED, "cuda", "tile{mma=s4},schedule,alloc")["msd-seed.cu"]
    assert "moegen::mma_s4u4_16864(" in s4 and "constexpr bool MMA_S8 = false;" in s4


def test_s8_divisors_carry_the_sixteen_exactly():
    """The s8 MMA's Y is 16 x the s4 one's (after its bias): its fp32 divisors must be the s4
    kernel's over 16, exactly, for the two to merge bit for bit."""
    import re

    def divisors(source):
        body = re.search(r"INV_DIVISORS\[\d+\] = \{([^}]*)\}", source).group(1)
        return np.array([float(v.strip().rstrip("f")) for v in body.split(",")], np.float32)

    s8 = divisors(emit(SEED, "cuda")["msd-seed.cu"])
    s4 = divisors(emit(SEED, "cuda", "tile{mma=s4},schedule,alloc")["msd-seed.cu"])
    assert len(s8) == 3 and np.all(s8 > 0)
    assert np.array_equal(s8 * np.float32(16), s4)


@pytest.mark.parametrize("old,new", [
    ("      if (moegen_runs(step, 1, STEPS)) wait(sh, SYNC_AIC_AIV_FLAG, waited[SYNC_AIC_AIV_FLAG]++);\n",
     ""),
    ("      if (moegen_runs(step, 0, STEPS)) signal(sh, SYNC_AIV_AIC_FLAG, sent[SYNC_AIV_AIC_FLAG]++);\n",
     ""),
    ("      if (moegen_runs(step, 1, STEPS)) {\n        const int it = step - 1;\n",
     "      if (moegen_runs(step, 0, STEPS)) {\n        const int it = step - 0;\n"),
    ("SLOTS_A_UNFOLD = 3", "SLOTS_A_UNFOLD = 2"),
])
def test_check_fails_on_corrupted_kernels(old, new):
    source = emit(SEED, "cuda")["msd-seed.cu"]
    assert old in source
    assert check(source.replace(old, new), schedules())


def test_launch_plan_lists_both_templates():
    plan = json.loads(emit(SEED, "cuda")["msd-seed.launch.json"])
    names = [k["name"] for k in plan["kernels"]]
    assert names == ["msd_matmul_basic", "msd_matmul_preload"]
    pre = plan["kernels"][1]
    assert pre["slots"] == {"a_max": 2, "a_unfold": 3, "y_int": 2}
    assert pre["actions"]["vec"]["step"][6] == [1, "merge(i-1)"]
    assert pre["grid"][:2] == [12288 // 128, 8]         # 128 columns, 8 of the 64 groups each
    assert plan["tile"]["occupancy"] == 6               # M = 1: 6 CTAs an SM, in one wave
    source = emit(SEED, "cuda")["msd-seed.cu"]
    assert "__launch_bounds__(msd::VEC_THREADS + msd::CUBE_THREADS, 6)" in source
    # 3 unfolded rows: the s8 MMA takes them as its B operand (both forms are templates, and
    # matmul calls this one by if constexpr: only it is instantiated)
    assert "constexpr bool ROWS_AS_B = true;" in source
    assert "if constexpr (ROWS_AS_B)\n    multiply_rows_as_b(sh" in source
    assert pre["block"] == 32 * (2 + 2)                 # M = 1: two vector and two matrix warps


def test_unsupported_msd_specs_fail_clearly():
    bad = {"name": "t", "pipeline": "msd_matmul", "msd": {"m": 1, "n": 64, "k": 256},
           "quant": {"group_size": 32}, "targets": {"cuda": {}}}
    with pytest.raises(moegen.SpecError, match="quant.group_size: 32"):
        emit(moegen.load_spec(bad), "cuda")
    bad["quant"]["group_size"] = 128
    bad["msd"]["m"] = 65
    with pytest.raises(moegen.SpecError, match="msd.m: 65"):
        emit(moegen.load_spec(bad), "cuda")
    bad["msd"].update(m=4, n=60)
    bad["lowering"] = "dequant"
    with pytest.raises(moegen.SpecError, match="msd.n: 60"):
        emit(moegen.load_spec(bad), "cuda")


def test_dequant_lowering_emits_the_dense_gemm():
    spec = dataclasses.replace(SEED, lowering="dequant")
    files = emit(spec, "cuda")
    source = files["msd-seed.cu"]
    assert "msd_matmul_dequant" in source and re.search(
        r"moegen::grouped_gemm<\s*/\*BLOCK=\*/8, /\*SPLIT=\*/2, /\*KDIM=\*/8192, /\*NTILES=\*/192, "
        r"/\*NOUT=\*/12288,", source)
    plan = json.loads(files["msd-seed.launch.json"])
    assert plan["lowering"] == "dequant"
    assert plan["kernels"][0]["grid"] == [1, 192, 2]          # 384 CTAs: under 4 per SM
    assert plan["workspace"]["counters"] == 192


def max_leads(sched, iterations=12):
    """Every interleaving of two vector units and one matrix unit running the schedule's
    programs (flags as counters: a wait passes once each signaller has signalled more times
    than the waiter has waited), searched exhaustively: per flag, the most signals any
    signaller is ahead of any waiter's completed waits. Fails on a deadlock."""
    from collections import deque
    units = [VEC, VEC, CUBE]
    progs = [sched.unroll(kind, iterations) for kind in units]
    flags = list(sched.flags)
    # tally[u][pc][f]: (signals, waits) of flag f among unit u's first pc actions
    tally = []
    for prog in progs:
        rows = [{f: (0, 0) for f in flags}]
        for st in prog:
            row = dict(rows[-1])
            if st.op in ("signal", "wait"):
                sig, wt = row[st.flag]
                row[st.flag] = (sig + 1, wt) if st.op == "signal" else (sig, wt + 1)
            rows.append(row)
        tally.append(rows)
    setters = {f: [i for i, k in enumerate(units) if k == sched.flags[f].setter] for f in flags}
    waiters = {f: [i for i, k in enumerate(units) if k == sched.flags[f].waiter] for f in flags}
    worst = {f: 0 for f in flags}
    start = (0,) * len(units)
    seen, todo = {start}, deque([start])
    while todo:
        pcs = todo.popleft()
        for f in flags:
            for v in setters[f]:
                for w in waiters[f]:
                    worst[f] = max(worst[f], tally[v][pcs[v]][f][0] - tally[w][pcs[w]][f][1])
        moved = False
        for i, pc in enumerate(pcs):
            if pc == len(progs[i]):
                continue
            st = progs[i][pc]
            if st.op == "wait" and any(tally[v][pcs[v]][st.flag][0] <= tally[i][pc][st.flag][1]
                                       for v in setters[st.flag]):
                continue
            moved = True
            nxt = pcs[:i] + (pc + 1,) + pcs[i + 1:]
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
        assert moved or all(pc == len(p) for pc, p in zip(pcs, progs)), f"deadlock at {pcs}"
    return worst


def test_mbarrier_rings_are_deep_enough():
    """The k-th wait of a flag watches barrier k mod depth for its phase k / depth: no
    signaller may run more than depth signals ahead of a waiter, in any interleaving. The
    preload schedule reaches the bound on some flag, so a ring one shallower would fail. Every
    flag but the meetings (named barriers) has a ring."""
    from moegen.targets.cuda.msd_emitter import flag_depths, meeting_flags
    scheds = schedules()
    depth = flag_depths(list(scheds.values()))
    assert set(depth) == set(scheds["basic"].flags) - meeting_flags(list(scheds.values()))
    for mode, sched in scheds.items():
        leads = {f: lead for f, lead in max_leads(sched).items() if f in depth}
        for f, lead in leads.items():
            assert lead <= depth[f], (mode, sched.flags[f].name, lead, depth[f])
        if mode == "preload":
            assert any(lead == depth[f] for f, lead in leads.items()), leads


def test_rings_start_on_a_128_byte_line():
    """The dynamic shared memory is declared 128-byte aligned and the mbarriers fill whole
    128-byte lines, so the rings start on a line whatever the flags (16 bytes off a 32-byte
    boundary measured 10-20% slower at M = 1). The plan's bytes count the lines."""
    from moegen.passes.tiling.msd import msd_shared_bytes
    files = emit(SEED, "cuda")
    source = files["msd-seed.cu"]
    assert "constexpr int LINE_BYTES = 128;" in source
    assert source.count("extern __shared__ __align__(LINE_BYTES) unsigned char smem[];") == 2
    assert "sh.bars = reinterpret_cast<unsigned long long*>(smem);" in source
    words = int(re.search(r"constexpr int BARRIER_WORDS = (\d+);", source).group(1))
    assert "static_assert(BARRIER_WORDS >= BARRIERS && BARRIER_WORDS * 8 % LINE_BYTES == 0," \
        in source
    assert "sh.wring = reinterpret_cast<uint2*>(sh.bars + BARRIER_WORDS);" in source
    plan = json.loads(files["msd-seed.launch.json"])
    barriers = int(re.search(r"constexpr int BARRIERS = (\d+);", source).group(1))
    for k in plan["kernels"]:
        rings = msd_shared_bytes(1, 128, 3, plan["tile"], k["slots"], 0)
        assert k["shared_bytes"] - rings == -(-8 * barriers // 128) * 128 == 8 * words == 128


def test_meetings_are_named_barriers_of_their_unit():
    """A flag its unit waits for right after each signal, in every schedule, is a meeting of
    that unit's warps: the barrier after unfold (flag 3) in the seed's schedules. The matrix
    unit's flag 7 is one in basic only (preload signals it ahead and waits before the signal),
    so it stays a ring. The kernel keeps the meeting on the unit's named barrier, with no
    mbarriers for it, and the read-back action lists are still the schedule's."""
    from moegen.targets.cuda.msd_emitter import meeting_flags
    scheds = schedules()
    assert meeting_flags(list(scheds.values())) == {3}
    assert meeting_flags([scheds["basic"]]) == {3, 7}
    files = emit(SEED, "cuda")
    source = files["msd-seed.cu"]
    signal = source[source.index("void signal(const Shared& sh"):]
    signal = signal[:signal.index("\n}\n")]
    assert signal.count("return;") == 1
    assert "if (flag == SYNC_AIV_ONLY_A_UNFOLD_FLAG) return;" in signal
    wait = source[source.index("void wait(const Shared& sh"):]
    wait = wait[:wait.index("\n}\n")]
    assert ("if (flag == SYNC_AIV_ONLY_A_UNFOLD_FLAG) {\n"
            "    moegen::named_barrier_sync<1, VEC_THREADS>();") in wait
    assert wait.count("named_barrier_sync") == 1
    assert "constexpr int BARRIERS = 11;" in source       # 13 with flag 3's ring of 2
    plan = json.loads(files["msd-seed.launch.json"])
    for k in plan["kernels"]:
        assert k["flag_meetings"] == {"SYNC_AIV_ONLY_A_UNFOLD_FLAG": {"unit": "vec",
                                                                      "named_barrier": 1}}
        assert "SYNC_AIV_ONLY_A_UNFOLD_FLAG" not in k["flag_depths"]
    assert check(source, scheds) == []


def test_columns_per_cta_halve_where_shared_memory_would_overflow():
    """M = 64 with 3 slices at 256 columns would pass the 227 KB a CTA gets on sm_90: the tile
    pass halves the columns (and the matrix warps with them), at 64 columns cuts the weight ring
    to 2 stages first; asking for 64 columns with 4 stages by hand is refused with the bytes it
    would need."""
    from moegen.passes.manager import PipelineError
    SHARED_OPT_IN = gpu_target("sm_90a").shared_per_cta
    big = dataclasses.replace(SEED, msd=dataclasses.replace(SEED.msd, m=64, n=4096, k=4096))
    plan = json.loads(emit(big, "cuda")[f"{big.name}.launch.json"])
    assert (plan["tile"]["block_n"], plan["tile"]["cube_warps"], plan["tile"]["w_stages"]) == (64, 1, 2)
    assert max(k["shared_bytes"] for k in plan["kernels"]) <= SHARED_OPT_IN
    small = json.loads(emit(SEED, "cuda")[f"{SEED.name}.launch.json"])
    assert (small["tile"]["block_n"], small["tile"]["cube_warps"]) == (128, 2)
    with pytest.raises(PipelineError, match=r"tile\{block-n=64\}: .* would need \d+ bytes of "
                                            r"shared memory \(at most 232448 on sm_90a\)"):
        emit(big, "cuda", "tile{block-n=64,stages=4},schedule,alloc")


@pytest.mark.parametrize("m,pipeline,merging", [
    (1, None, "128 columns per warp on warp 1"),
    (2, None, "64 columns per warp)"),
    (5, None, "32 columns per warp)"),
    (2, "tile{vec-warps=4},schedule,alloc", "64 columns per warp on warps 2 .. 3"),
    (3, "tile{vec-warps=8},schedule,alloc", "32 columns per warp on warps 4 .. 7"),
    (1, "tile{block-n=64,vec-warps=8,cube-warps=8},schedule,alloc", "16 columns per warp on warps 4 .. 7")])
def test_merging_warps_are_the_other_half_where_rows_take_at_most_half(m, pipeline, merging):
    """Where the rows take at most half the vector warps (2 M <= vec_warps), the other half
    merges all the columns (the kernel's header says which warps); otherwise every vector warp
    merges its share."""
    spec = dataclasses.replace(SEED, msd=dataclasses.replace(SEED.msd, m=m))
    source = emit(spec, "cuda", pipeline)[f"{spec.name}.cu"] if pipeline else \
        emit(spec, "cuda")[f"{spec.name}.cu"]
    comments = " ".join(line[3:] for line in source.splitlines() if line.startswith("// "))
    assert f"merge: int32 Y -> fp32 accumulators, {merging}" in comments
    assert "constexpr int MERGE_FIRST = 2 * M <= VEC_WARPS ? VEC_WARPS / 2 : 0;" in source
