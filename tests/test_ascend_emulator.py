"""The emitted Ascend op, run: the emulator translates the op_kernel sources moegen wrote and runs
them with each AscendC call's documented semantics (moegen/targets/ascend/emulator). Its output
must pass the CANN sample's verification and moegen's, and match reference.msd_matmul; with any
of the review's findings 4-7 put back, or any pipe flag taken out, it must not."""
import importlib.util
import re

import numpy as np
import pytest

import moegen
from moegen import reference as R
from moegen.passes.ascend_tiling import msd_tiling, workspace_bytes
from moegen.quant import pack_int4
from moegen.targets.ascend.emulator import CxxError, EmulationError, HazardError, emulate
from moegen.targets.ascend.emulator.cxx import translate
from moegen.targets.compile import emit

SLOTS = {0: {"a_max": 1, "a_unfold": 1, "y_int": 1}, 1: {"a_max": 2, "a_unfold": 3, "y_int": 2}}


def msd_spec(m, n, k, steps=3, group=128):
    return moegen.load_spec({
        "name": "msd-emu", "pipeline": "msd_matmul", "msd": {"m": m, "n": n, "k": k,
                                                             "steps": steps},
        "quant": {"bits": 4, "group_size": group, "symmetric": True}, "schedule": "preload",
        "targets": {"ascend": {"soc": "ascend910b", "aic_cores": 24, "aiv_cores": 48}}})


def script(files, rel, tmp_path):
    path = tmp_path / rel.replace("/", "_")
    path.write_text(files[rel])
    spec = importlib.util.spec_from_file_location(path.stem + str(id(path)), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(files, spec, x, w, scale, template, seed=0):
    s = spec.msd
    tiling = msd_tiling(s.m, s.n, s.k, spec.quant.group_size, s.steps, 24)
    ws = workspace_bytes(s.m, s.n, spec.quant.group_size, s.steps, SLOTS[template])
    y, _ = emulate(files, tiling, x, pack_int4(w), scale, template, ws, seed=seed)
    return y


def sample_verify(output16, golden16):
    """The CANN sample's verify_result.py criterion, restated: among the elements that differ from
    the fp16 golden (np.isclose, rtol 1e-6, atol 1e-9), the first 101 are counted when
    (output - golden) / golden passes 1e-3, and the count over all elements must stay <= 1e-3."""
    out = output16.astype(np.float32).reshape(-1)
    gold = golden16.astype(np.float32).reshape(-1)
    differ = np.where(~np.isclose(out, gold, rtol=1e-6, atol=1e-9, equal_nan=True))[0][:101]
    bad = sum(abs(out[i] - gold[i]) / gold[i] > 1e-3 for i in differ)
    return bad / gold.size <= 1e-3


def ulp16(values):
    a = np.abs(values.astype(np.float16))
    return (np.nextafter(a, np.float16(np.inf)) - a).astype(np.float64)


def assert_matches_reference(y, x, w, scale, group, steps):
    """y is the MSD reference (float64) within 1e-4 before the final fp16 rounding: every
    element within half an fp16 ulp of it plus 1e-4 of its magnitude (or of the rms)."""
    ref = R.msd_matmul(x, w, scale, group, steps).astype(np.float64)
    assert not np.isnan(y).any()
    rms = np.sqrt(np.mean(ref ** 2))
    bound = 0.5 * ulp16(ref) + 1e-4 * np.maximum(np.abs(ref), rms)
    bad = np.abs(y.astype(np.float64) - ref) > bound
    assert not bad.any(), f"{bad.sum()} elements off, worst {np.abs(y - ref)[bad].max()}"


@pytest.mark.parametrize("m,template", [(1, 1), (1, 0), (2, 1), (5, 1), (16, 1)])
def test_the_sample_draws_pass_the_samples_check(tmp_path, m, template):
    """At the sample's N = 12288, K = 8192 with its gen_data draws (seed 1): the emulated op
    passes the sample's verify_result and moegen's, and matches the reference."""
    spec = msd_spec(m, 12288, 8192)
    files = emit(spec, "ascend")
    gen = script(files, "examples/scripts/gen_data.py", tmp_path)
    ver = script(files, "examples/scripts/verify_result.py", tmp_path)
    x, w, scale = gen.make_inputs()
    golden = gen.golden(x, w, scale)
    y = run(files, spec, x, w, scale, template)
    assert sample_verify(y, golden.astype(np.float16))
    ok, why = ver.check(y, golden)
    assert ok, why
    assert_matches_reference(y, x, w, scale, 128, 3)


def test_gen_data_draws_as_the_sample(tmp_path):
    """The generated gen_data.py draws what the CANN sample's does: legacy numpy seeded 1;
    x, then the scales, then the weights, uniform, weights truncated to int8."""
    files = emit(msd_spec(2, 256, 512), "ascend")
    x, w, scale = script(files, "examples/scripts/gen_data.py", tmp_path).make_inputs()
    rng = np.random.RandomState(1)
    assert np.array_equal(x, rng.uniform(low=-3, high=3, size=(2, 512)).astype(np.float16))
    assert np.array_equal(scale, rng.uniform(low=-3, high=3, size=(4, 256)).astype(np.float16))
    assert np.array_equal(w, rng.uniform(low=-7, high=7, size=(512, 256)).astype(np.int8))


@pytest.mark.parametrize("m,n,k,steps,group", [(3, 4160, 1024, 3, 128), (7, 1088, 512, 2, 64),
                                               (11, 64, 256, 1, 128)])
def test_fresh_draws_at_odd_shapes_match_the_reference(rng, m, n, k, steps, group):
    """New random data every run (zero rows of x included), tail cores, both group sizes, every
    step count, both templates: the same output bitwise, matching the reference."""
    spec = msd_spec(m, n, k, steps, group)
    files = emit(spec, "ascend")
    x = rng.normal(0, rng.uniform(0.1, 4), (m, k)).astype(np.float16)
    x[m // 2, :group] = 0                                  # a group with A_max = 0
    w = rng.integers(-8, 8, (k, n)).astype(np.int8)
    scale = rng.uniform(-0.2, 0.2, (k // group, n)).astype(np.float16)
    y0 = run(files, spec, x, w, scale, 0, seed=int(rng.integers(1 << 30)))
    y1 = run(files, spec, x, w, scale, 1, seed=int(rng.integers(1 << 30)))
    assert np.array_equal(y0.view(np.uint16), y1.view(np.uint16))
    assert_matches_reference(y1, x, w, scale, group, steps)


# --- the findings put back -------------------------------------------------------------------

CUBE = "op_kernel/msd/msd_emu_cube_compute.h"
VEC = "op_kernel/msd/msd_emu_vec_compute.h"
TOOL = "op_kernel/msd/msd_emu_tool.h"
FINDINGS = {
    "4: both GM -> L1 copies left with ndNum 0 (a no-op)": [
        (TOOL, "  params.ndNum = 1;  // the default 0 copies nothing\n", "")],
    "5: int4 copy counts in elements, not bytes": [
        (CUBE, "Nd2NzBytes(rows_, g / 2, g / 2,", "Nd2NzBytes(rows_, g, g,"),
        (CUBE, "Nd2NzBytes(g, columns_ / 2, n / 2,", "Nd2NzBytes(g, columns_, n,")],
    "6: slices rounded by Cast(half <- float, CAST_RINT)": [
        (VEC, "AscendC::Cast(slice, t, AscendC::RoundMode::CAST_RINT, g);          // an integer\n"
              "        AscendC::Cast(sliceHalf, slice, AscendC::RoundMode::CAST_NONE, g);  // exact",
         "AscendC::Cast(sliceHalf, t, AscendC::RoundMode::CAST_RINT, g);\n"
         "        AscendC::Cast(slice, sliceHalf, AscendC::RoundMode::CAST_NONE, g);")],
    "7: A_max through scalar GM stores and loads": [
        (VEC, "AscendC::DataCopyPad(amax_[amaxBase + row * AMAX_ROW_FLOATS], rowMax,\n"
              "                           CopyParams(1, AMAX_ROW_FLOATS * sizeof(float), 0, 0));",
         "amax_.SetValue(amaxBase + row * AMAX_ROW_FLOATS, amax);"),
        (VEC, "const float amax = amaxRows.GetValue(row * AMAX_ROW_FLOATS);",
         "const float amax = amax_.GetValue(amaxSlot * AmaxSlotBytes(m) / sizeof(float) + "
         "row * AMAX_ROW_FLOATS);")],
    "7: A_max stored by scalar and cleaned from the writer's cache, read through the cache": [
        (VEC, "AscendC::DataCopyPad(amax_[amaxBase + row * AMAX_ROW_FLOATS], rowMax,\n"
              "                           CopyParams(1, AMAX_ROW_FLOATS * sizeof(float), 0, 0));",
         "amax_.SetValue(amaxBase + row * AMAX_ROW_FLOATS, amax);\n"
         "      AscendC::DataCacheCleanAndInvalid<float, AscendC::CacheLine::SINGLE_CACHE_LINE, "
         "AscendC::DcciDst::CACHELINE_OUT>(amax_[amaxBase + row * AMAX_ROW_FLOATS]);"),
        (VEC, "const float amax = amaxRows.GetValue(row * AMAX_ROW_FLOATS);",
         "const float amax = amax_.GetValue(amaxSlot * AmaxSlotBytes(m) / sizeof(float) + "
         "row * AMAX_ROW_FLOATS);")],
}


def apply(files, edits):
    files = dict(files)
    for path, old, new in edits:
        assert old in files[path], (path, old)
        files[path] = files[path].replace(old, new)
    return files


@pytest.mark.parametrize("finding", list(FINDINGS))
def test_each_finding_put_back_fails(tmp_path, finding):
    """The sample draws at M = 2 over 12 groups, basic and preload: the mended code passes; with a
    finding put back the run raises (a buffer overrun, a refused call) or fails the checks."""
    spec = msd_spec(2, 3072, 1536)
    files = emit(spec, "ascend")
    gen = script(files, "examples/scripts/gen_data.py", tmp_path)
    ver = script(files, "examples/scripts/verify_result.py", tmp_path)
    x, w, scale = gen.make_inputs()
    golden = gen.golden(x, w, scale)
    broken = apply(files, FINDINGS[finding])
    for template in (0, 1):
        good = run(files, spec, x, w, scale, template)
        assert ver.check(good, golden)[0] and sample_verify(good, golden.astype(np.float16))
        try:
            y = run(broken, spec, x, w, scale, template)
        except EmulationError:
            continue
        assert not ver.check(y, golden)[0], f"{finding} passed moegen's check"


def flag_lines(files):
    """(path, line number, text) of every pipe hand-over in the vector and cube code."""
    for path in (VEC, CUBE):
        for number, line in enumerate(files[path].splitlines()):
            if re.search(r"SyncPipes<|SetFlag<|WaitFlag<", line):
                yield path, number, line.strip()


def test_every_pipe_flag_is_needed():
    """Each MTE2 -> V, V -> MTE3, V -> S, MTE2 -> S, MTE2 -> MTE1 hand-over and each buffer's
    V -> MTE2 / MTE3 -> V / MTE1 -> MTE2 release in the emitted code: taking any one out makes
    the emulator report the hazard or the unbalanced flag it leaves."""
    spec = msd_spec(2, 1024, 512)
    files = emit(spec, "ascend")
    rng = np.random.default_rng(5)
    x = rng.uniform(-3, 3, (2, 512)).astype(np.float16)
    w = rng.integers(-7, 8, (512, 1024)).astype(np.int8)
    scale = rng.uniform(-3, 3, (4, 1024)).astype(np.float16)
    lines = list(flag_lines(files))
    kinds = {re.search(r"HardEvent::(\w+)", text).group(1) for _, _, text in lines}
    assert kinds == {"MTE2_V", "V_MTE3", "V_S", "MTE2_S", "V_MTE2", "MTE3_V", "MTE1_MTE2",
                     "MTE2_MTE1"}
    for path, number, text in lines:
        cut = dict(files)
        source = files[path].splitlines()
        cut[path] = "\n".join(source[:number] + source[number + 1:]) + "\n"
        for template in (0, 1):
            with pytest.raises(EmulationError) as caught:
                run(cut, spec, x, w, scale, template)
            if "SyncPipes" in text:
                assert isinstance(caught.value, HazardError), (text, caught.value)


def test_a_missing_or_misplaced_cross_core_flag_is_caught():
    spec = msd_spec(1, 512, 512)
    files = emit(spec, "ascend")
    controller = "op_kernel/msd/msd_emu_msd_controller.h"
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 3, (1, 512)).astype(np.float16)
    w = rng.integers(-7, 8, (512, 512)).astype(np.int8)
    scale = rng.uniform(-3, 3, (4, 512)).astype(np.float16)
    for template in (0, 1):
        cut = dict(files)
        cut[controller] = files[controller].replace(
            "AscendC::CrossCoreSetFlag<2, PIPE_FIX>(SYNC_AIC_AIV_FLAG);", ";")
        with pytest.raises(EmulationError, match="deadlock: .*waits flag 9"):
            run(cut, spec, x, w, scale, template)
        # the hand-over signalled on the wrong pipe: Y is not yet in GM when the AIVs read it
        cut[controller] = files[controller].replace("CrossCoreSetFlag<2, PIPE_FIX>",
                                                    "CrossCoreSetFlag<2, PIPE_MTE2>")
        y = run(cut, spec, x, w, scale, template).astype(np.float64)
        ref = R.msd_matmul(x, w, scale, 128, 3)
        assert not np.linalg.norm(y - ref) < 1e-2 * np.linalg.norm(ref)


def test_code_outside_the_subset_is_refused_with_its_line():
    files = {"op_kernel/k.cpp": "#include \"k.h\"\n", "op_kernel/k.h":
             "#pragma once\n__aicore__ inline void F(uint32_t n) {\n  while (n) {\n  }\n}\n"}
    with pytest.raises(CxxError, match=r"op_kernel/k\.h:3: 'while'"):
        translate(files, "op_kernel/k.cpp")
    files["op_kernel/k.h"] = "#pragma once\n#if defined(X)\n#endif\n"
    with pytest.raises(CxxError, match=r"op_kernel/k\.h:2: #if is outside"):
        translate(files, "op_kernel/k.cpp")
