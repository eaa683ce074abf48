"""The tuning database and the config space (CPU); a short sweep on the GPU (-m gpu)."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

import moegen
from moegen import autotune as at
from moegen import tuning as tdb
from moegen.passes.pipelines import lower
from moegen.target import gpu_target
from moegen.targets.compile import emit
from moegen.targets.cuda.emitter import emit_moe
from conftest import ROOT

QWEN = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
H200 = tdb.Device("NVIDIA H200", "nvrtc 13.0")
SM90A = gpu_target("sm_90a")
RESULTS = [{"tokens": t, "config": {"moe_block": b, "split_k": s}, "time_us": 1.0,
            "default_us": 2.0, "checked": True}
           for t, b, s in ((1, 16, 2), (16, 8, 1), (64, 16, 1), (256, 32, 1), (2048, 64, 1))]


def test_round_trip(tmp_path):
    db = tdb.TuningDB(tmp_path / "t.json")
    key = db.record(QWEN, H200, RESULTS)
    again = tdb.TuningDB(tmp_path / "t.json")
    assert again.entry(QWEN, H200)["results"] == RESULTS
    assert key in json.loads((tmp_path / "t.json").read_text())["entries"]


@pytest.mark.parametrize("text,says", [
    ('{"format": 0, "entries": {}}', "has format 0, this moegen reads format 1; ignored"),
    ("[1, 2]", "is not a JSON object; ignored"),
    ("{not json", "is unreadable"),
])
def test_a_database_it_cannot_read_is_ignored_with_a_warning(tmp_path, text, says):
    path = tmp_path / "t.json"
    path.write_text(text)
    warnings = []
    db = tdb.TuningDB(path, warn=warnings.append)
    assert db.entries == {} and len(warnings) == 1 and says in warnings[0], warnings
    # recording into it replaces the file with one of this format
    db.record(QWEN, H200, RESULTS)
    assert tdb.TuningDB(path, warn=warnings.append).entry(QWEN, H200)["results"] == RESULTS
    assert len(warnings) == 1


def test_key_is_stable_across_processes_and_tracks_what_matters():
    code = ("import moegen; from moegen import tuning as tdb; "
            "print(tdb.entry_key(moegen.load_spec('examples/qwen3-30b-a3b.yaml'), "
            "tdb.Device('NVIDIA H200', 'nvrtc 13.0')))")
    keys = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.strip() for _ in range(2)}
    assert keys == {tdb.entry_key(QWEN, H200)}
    other_gpu = tdb.entry_key(QWEN, tdb.Device("NVIDIA H100", "nvrtc 13.0"))
    other_cuda = tdb.entry_key(QWEN, tdb.Device("NVIDIA H200", "nvrtc 12.8"))
    other_spec = tdb.entry_key(moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml"), H200)
    assert len({tdb.entry_key(QWEN, H200), other_gpu, other_cuda, other_spec}) == 4


def test_key_tracks_the_kernel_templates(monkeypatch):
    before = tdb.entry_key(QWEN, H200)
    monkeypatch.setattr(tdb, "kernel_sources", lambda: "another grouped_gemm")
    assert tdb.entry_key(QWEN, H200) != before


def test_kernel_sources_cover_the_header_tree(tmp_path, monkeypatch):
    """An edit to any file of the device headers' include tree changes the templates' hash."""
    import shutil

    import moegen.resources
    shutil.copytree(ROOT / "templates", tmp_path / "templates")
    monkeypatch.setattr(moegen.resources, "data_dir", lambda name: tmp_path / name)
    before = tdb.kernel_sources()
    sync = tmp_path / "templates" / "cuda" / "moegen" / "sync.cuh"
    sync.write_text(sync.read_text() + "\n// one more line\n")
    assert tdb.kernel_sources() != before


def test_atomic_write_survives_a_crash(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    db = tdb.TuningDB(path)
    db.record(QWEN, H200, RESULTS)
    before = path.read_text()

    def crash(*a, **k):
        raise KeyboardInterrupt("killed while writing")
    monkeypatch.setattr(tdb.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        db.record(QWEN, H200, RESULTS[:1])
    assert path.read_text() == before                       # the old database is whole
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]   # no temp file left


def test_stale_entries_are_ignored_with_one_warning(tmp_path):
    path = tmp_path / "t.json"
    db = tdb.TuningDB(path)
    db.record(QWEN, H200, RESULTS)
    data = json.loads(path.read_text())
    (key, entry), = data["entries"].items()
    entry["meta"]["moegen"] = "0.0.1"                 # made by another version: other key
    data["entries"] = {"0" * 24: entry}
    path.write_text(json.dumps(data))
    warnings = []
    stale = tdb.TuningDB(path, warn=warnings.append)
    assert stale.lookup(QWEN, H200) is None and stale.lookup(QWEN, H200) is None
    assert len(warnings) == 1 and "no longer matches" in warnings[0] and "0.0.1" in warnings[0]


def test_config_space_is_pruned():
    decode = at.config_space(QWEN, 1)
    prefill = at.config_space(QWEN, 512)
    assert {c.split_k for c in prefill} == {1} and {c.split_k for c in decode} >= {1, 2, 4}
    assert {c.moe_block for c in decode} == {8}             # one slot per expert: no bigger block
    assert {c.moe_block for c in prefill} == {8, 16, 32, 64}
    # prefill: the wide CTA first (the default config leads), in the blocks it takes
    assert prefill[0] == at.default_config(QWEN, 512) and {c.col_tiles for c in decode} == {1}
    assert {(c.moe_block, c.col_tiles) for c in prefill if c.col_tiles > 1} == {
        (32, 8), (32, 4), (32, 2), (64, 4), (64, 2)}     # 8 tiles of 64 rows: no room to write
    assert {c.moe_block for c in at.config_space(moegen.load_spec(
        ROOT / "examples" / "mixtral-8x7b.yaml"), 64)} == {8, 16, 32}   # 16 slots per expert
    assert {c.stages for c in decode if (c.block_k, c.warps) == (16, 4)} == {2, 4, 8}
    # two k16 steps per stage: 8 stages of block 8 pass 48 KB; 7 fit, which the tile pass
    # rounds to 4 (a power of two), a duplicate
    assert {c.stages for c in decode if c.block_k == 32} == {2, 4}
    odd = moegen.load_spec({"name": "odd", "pipeline": "moe_w4a16", "quant": {"group_size": 32},
                            "moe": {"hidden_size": 96, "intermediate_size": 160, "num_experts": 8,
                                    "top_k": 2, "block_size": 4}, "targets": {"cuda": {}}})
    space = at.config_space(odd, 1)
    assert {c.moe_block for c in space} == {4}
    for c in space:   # K/16 = 6 and 10: only splits dividing each over its warps survive
        assert 6 % c.split_k == 0 and 10 % c.split_k_down == 0


def test_bucket_edges_pick_the_nearest_measured_count(tmp_path):
    assert tdb.bucket_edges([1, 16, 64, 256, 2048], 8192) == [4, 32, 128, 724, 8192]
    # where the plans give T = 1 a bucket of its own, a measured T = 1 keeps it
    assert tdb.bucket_edges([1, 16, 64], 8192, single_token=True) == [1, 32, 8192]
    assert tdb.bucket_edges([2, 16], 8192, single_token=True) == [5, 8192]
    # T = 1 measured alone still serves T = 1 alone; its config serves the rest too
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    db = tdb.TuningDB(tmp_path / "t.json")
    db.record(mixtral, H200, [{"tokens": 1, "config": {"moe_block": 8, "split_k": 4},
                               "time_us": 1.0, "default_us": 1.0, "checked": True}])
    assert [(b.edge, b.config.moe_block, b.config.split_k)
            for b in db.lookup(mixtral, H200)["buckets"]] == [(1, 8, 4), (8192, 8, 4)]
    db.record(QWEN, H200, RESULTS[:1])                # no single-token bucket: one bucket
    assert [(b.edge, b.config.moe_block, b.config.split_k)
            for b in db.lookup(QWEN, H200)["buckets"]] == [(8192, 16, 2)]


def test_compile_uses_the_tuned_config(tmp_path):
    path = tmp_path / "t.json"
    tdb.TuningDB(path).record(QWEN, H200, RESULTS)
    tuning = tdb.Tuning(tdb.TuningDB(path), H200)
    module, _, _ = lower(QWEN, "cuda", tuning=tuning)
    text = str(module)
    assert "block_buckets = [[4, 16], [32, 8], [128, 16], [724, 32], [8192, 64]]" in text
    assert "split_k = [2, 1, 1, 1, 1]" in text
    files = emit(QWEN, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), None))   # no GPU: any entry
    plan = json.loads(files["qwen3-30b-a3b.launch.json"])
    assert plan["buckets"] == [[4, 16], [32, 8], [128, 16], [724, 32], [8192, 64]]
    assert "moe_gemm_gate_up_b16_s2" in files["qwen3-30b-a3b.cu"]
    # the CLI: --tuning-db and the environment variable
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "moegen", "compile", "examples/qwen3-30b-a3b.yaml",
                           "-o", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "MOEGEN_TUNING_DB": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert [724, 32] in json.loads((out / "qwen3-30b-a3b.launch.json").read_text())["buckets"]
    # without a database the defaults stand
    assert "[[16, 8], [64, 8], [128, 8], [1023, 32], [8192, 128]]" in str(lower(QWEN, "cuda")[0])


def test_tuned_ring_depth_reaches_the_kernels(tmp_path):
    path = tmp_path / "t.json"
    staged = [dict(r, config={**r["config"], "stages": 2}) for r in RESULTS]
    tdb.TuningDB(path).record(QWEN, H200, staged)
    text = str(lower(QWEN, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0])
    assert "stages = [2, 2, 2, 2, 2]" in text
    default = str(lower(QWEN, "cuda")[0])
    assert "stages = [8, 8, 8, 4, 4]" in default and "col_tiles = [1, 1, 1, 4, 4]" in default
    assert "tall = [false, false, false, false, true]" in default
    # an entry measured before the wide CTA (no col_tiles) keeps the K-split CTA it measured
    assert "col_tiles = [1, 1, 1, 1, 1]" in text


def test_tuned_warpgroup_mma_flag(tmp_path):
    """A prefill entry's wgmma reaches the tile (the warpgroup MMA kernel, or the wide CTA on
    mma.sync); an entry without it was measured on mma.sync and keeps it; the default takes
    warpgroup MMA."""
    wide = {"moe_block": 32, "split_k": 1, "stages": 4, "block_k": 32, "warps": 4,
            "col_tiles": 4, "warp_rows": 32}
    for flag, want in ((1, "true"), (0, "false"), (None, "false")):
        path = tmp_path / f"t{flag}.json"
        config = wide if flag is None else {**wide, "wgmma": flag}
        tdb.TuningDB(path).record(QWEN, H200, [{"tokens": 2048, "config": config, "time_us": 600.0,
                                                  "default_us": 600.0, "checked": True}])
        text = str(lower(QWEN, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0])
        assert f"col_tiles = [4], warp_rows = [32], wgmma = [{want}]" in text, flag
    assert "wgmma = [false, false, false, true, true]" in str(lower(QWEN, "cuda")[0])
    assert at.default_config(QWEN, 2048).wgmma == 1
    # wgmma only where the tile allows: 2 column tiles are the same kernel either way
    a, b = (at.MoeConfig(32, 1, 4, 1, 32, 4, 2, 32, wg) for wg in (0, 1))
    assert at.same_tile(QWEN, 512, a, b) and not at.same_tile(
        QWEN, 512, at.MoeConfig(32, 1, 4, 1, 32, 4, 4, 32, 0),
        at.MoeConfig(32, 1, 4, 1, 32, 4, 4, 32, 1))


def test_tuned_split_per_gemm(tmp_path):
    path = tmp_path / "t.json"
    per_gemm = [dict(r, config={**r["config"], "split_k": 1, "split_k_down": 4}) for r in RESULTS]
    tdb.TuningDB(path).record(QWEN, H200, per_gemm)
    module = lower(QWEN, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0]
    splits = {op.attr("mul_topk_weights"): op.attrs["tile"]["split_k"]
              for op in module.function().ops if op.NAME == "moe.grouped_gemm_w4a16"}
    assert splits == {False: [1] * 5, True: [4] * 5}
    # the sweep holds the tile pass's own choice (Qwen3 at T = 1: no split for either GEMM)
    assert at.MoeConfig(8, 1, 8, 1) in at.config_space(QWEN, 1)
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    assert at.MoeConfig(8, 1, 8, 4) in at.config_space(mixtral, 1)   # down GEMM split 4


def test_default_config_is_recognised_in_the_sweep():
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    # T = 1 is a bucket of its own (2 warps, the down GEMM split 8), T = 2..16 the next one
    assert at.default_config(mixtral, 1) == at.MoeConfig(8, 1, 8, 8, warps=2)
    assert at.default_config(mixtral, 1) in at.config_space(mixtral, 1)
    assert at.default_config(mixtral, 4) == at.MoeConfig(8, 1, 8, 4)
    # T = 65..159: the wide CTA, its down GEMM split 4 as at decode (10 blocks x 16 tiles leave
    # the SMs short); Qwen3's prefill bucket of block 32 fills them unsplit
    assert at.default_config(mixtral, 128) == at.MoeConfig(32, 1, 4, 4, 32, 4, col_tiles=4,
                                                           wide_decode=1)
    assert at.default_config(QWEN, 512) == at.MoeConfig(32, 1, 4, 1, 32, 4, col_tiles=4)
    wide = at.default_config(QWEN, 512)
    # from T = 160 (40 slots an expert, of 8 experts) the tall tile: block 128, 128 k a stage
    assert at.default_config(mixtral, 2048) == at.MoeConfig(128, 1, 4, 1, 128, 4, col_tiles=4)
    assert not at.same_tile(mixtral, 2048, wide, at.default_config(mixtral, 2048))
    # T = 53..64: the wide CTA at decode, the down GEMM split 4; another split builds other kernels
    assert at.default_config(mixtral, 64) == at.MoeConfig(32, 1, 4, 4, 32, 4, col_tiles=4,
                                                          wide_decode=1)
    assert at.same_tile(mixtral, 64, at.default_config(mixtral, 64),
                        at.default_config(mixtral, 64))
    assert not at.same_tile(mixtral, 64, at.MoeConfig(32, 1, 4, 8, 32, 4, col_tiles=4,
                                                      wide_decode=1),
                            at.default_config(mixtral, 64))
    assert not at.same_tile(mixtral, 64, at.MoeConfig(32, 1, 4, 4, 32, 4, col_tiles=4),
                            at.default_config(mixtral, 64))
    # block 32 holds 5 ring stages at most, cut to 4 (a power of two): asking for 8 builds the
    # same kernels, 2 others
    assert at.same_tile(QWEN, 64, at.MoeConfig(32, 1, 8, 1), at.MoeConfig(32, 1, 5, 1))
    assert not at.same_tile(QWEN, 64, at.MoeConfig(32, 1, 2, 1), at.MoeConfig(32, 1, 4, 1))
    # the wide CTA's warps follow from its shape; its ring holds 7 stages of 32 k at most
    assert at.same_tile(QWEN, 512, at.MoeConfig(32, 1, 4, 1, 32, 2, 4), wide)
    assert at.same_tile(QWEN, 512, at.MoeConfig(32, 1, 9, 1, 32, 4, 4),
                        at.MoeConfig(32, 1, 7, 1, 32, 4, 4))
    assert not at.same_tile(QWEN, 512, at.MoeConfig(32, 1, 4, 1, 32, 4, 2), wide)
    assert not at.same_tile(QWEN, 512, at.MoeConfig(32, 1, 4, 1, 32, 4), wide)
    assert not at.same_tile(mixtral, 128, wide, at.default_config(mixtral, 128))
    one = at.default_config(mixtral, 1)
    assert at.same_tile(mixtral, 1, at.MoeConfig(8, 1, 8, 8, warps=2), one)
    assert not at.same_tile(mixtral, 1, at.MoeConfig(8, 1, 8, 2), one)
    assert not at.same_tile(mixtral, 1, at.MoeConfig(8, 1, 8, 4, block_k=32), one)
    assert not at.same_tile(mixtral, 1, at.MoeConfig(8, 1, 8, 4, warps=2), one)
    assert not at.same_tile(mixtral, 1, at.MoeConfig(8, 1, 8, 8), one)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"])
def test_a_kept_tall_default_is_the_tall_tile_again(tmp_path, name):
    """Autotune records the default where no candidate beats it; at prefill sizes from 64
    slots an expert that is the tall tile (block 128), which the recorded entry gives back,
    also where K over the K-split CTA's 4 warps is no whole number of 128-k stages (Qwen3's
    I = 768, DeepSeek's 1408: the tall tile runs the whole K in one CTA)."""
    spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
    results = [{"tokens": t, "config": at.default_config(spec, t).as_dict(), "time_us": 1.0,
                "default_us": 1.0, "checked": True} for t in (64, 4096)]
    assert results[1]["config"]["moe_block"] == 128
    path = tmp_path / "t.json"
    tdb.TuningDB(path).record(spec, H200, results)
    module = lower(spec, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0]
    for op in module.function().ops:
        if op.NAME == "moe.grouped_gemm_w4a16":
            tile = op.attrs["tile"]
            assert op.attrs["block_buckets"][-1] == [8192, 128]
            assert (tile["tall"][-1], tile["block_k"][-1], tile["stages"][-1]) == (True, 128, 4)
            assert not tile["tall"][0]
    plan = emit_moe(spec, module, "tuned").plan
    assert plan["gemms"][0]["variants"][-1]["kernel"].endswith("_tall_p4_k128")


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"])
def test_recorded_defaults_build_the_default_kernels(tmp_path, name):
    """Where the sweep keeps the default at every measured count, the entry it records builds,
    at each of those counts, the kernels the default plan runs there (the wide decode bucket's
    register cap and its split doubled for calls to pick from included), though the entry's
    buckets end elsewhere; at T = 1 launched as the default launches them (Mixtral's
    single-token bucket: the down GEMM under PDL after gate/up's K loop)."""
    spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
    tokens = (1, 16, 53, 64, 256, 2048)
    path = tmp_path / "t.json"
    tdb.TuningDB(path).record(spec, H200, [
        {"tokens": t, "config": at.default_config(spec, t).as_dict(), "time_us": 1.0,
         "default_us": 1.0, "checked": True} for t in tokens])

    def serving(tuning) -> dict:
        module, _, pm = lower(spec, "cuda", tuning=tuning, arch="sm_90a")
        plan = emit_moe(spec, module, pm.pipeline, "sm_90a").plan
        # (where a bucket ends and the launch after the kernel before are the buckets', not
        # the kernels')
        return {(g["name"], t): {k: x for k, x in v.items()
                                 if k != "max_tokens" and (t == 1 or k not in (
                                     "follows_from", "release_after_loop"))}
                for g in plan["gemms"] for t in tokens
                for v in [next(v for v in g["variants"] if t <= v["max_tokens"])]}
    assert serving(tdb.Tuning(tdb.TuningDB(path), H200)) == serving(None)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_a_recorded_candidate_builds_what_was_measured(tmp_path, arch):
    """Each candidate is timed as its pipeline builds it; the entry autotune records for it
    must build, at the measured count, the same kernels launched the same way (T = 1 measured
    alone included: there the plans' single-token bucket)."""
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")

    def serving(t: int, pipeline: str | None, tuning) -> list:
        module, _, pm = lower(spec, "cuda", pipeline, tuning=tuning, arch=arch)
        plan = emit_moe(spec, module, pm.pipeline, arch).plan
        return [{k: x for k, x in next(v for v in g["variants"] if t <= v["max_tokens"]).items()
                 if k != "max_tokens"} for g in plan["gemms"]]
    checked = 0
    for t in (1, 53, 200, 2048):
        for i, cfg in enumerate(at.config_space(spec, t, arch)):
            path = tmp_path / f"{t}-{i}.json"
            tdb.TuningDB(path).record(spec, H200, [{"tokens": t, "config": cfg.as_dict(),
                                                   "time_us": 1.0, "default_us": 1.0,
                                                   "checked": True}])
            recorded = serving(t, None, tdb.Tuning(tdb.TuningDB(path), H200))
            assert recorded == serving(t, cfg.pipeline(), None), (t, cfg)
            checked += 1
    assert checked > 100


def test_sweep_has_the_tall_tile_at_prefill_sizes(tmp_path):
    """At prefill sizes whose average expert passes 32 slots the sweep times the tall tile at
    its two ring depths (first where the tile pass picks it), in plans for an arch with
    warpgroup MMA only; a candidate's pipeline builds the tall tile, and a recorded one gives
    its depth back."""
    from moegen.passes.tiling.moe_buckets import tall_edge
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    for spec in (mixtral, QWEN):
        edge = tall_edge(spec)
        for t in (edge, 4096):
            space = at.config_space(spec, t)
            assert [c.stages for c in space[:2]] == [4, 3] and space[0].moe_block == 128
            assert at.same_tile(spec, t, space[0], at.default_config(spec, t))
            assert not at.same_tile(spec, t, space[1], at.default_config(spec, t))
            assert sum(c.moe_block == 128 for c in space) == 2
            assert not any(c.moe_block == 128 for c in at.config_space(spec, t, "sm_90"))
    # below the tall edge, after the wide CTA's candidates, from 33 slots an expert
    space = at.config_space(mixtral, 150)                  # 37 slots: the wide CTA's default
    tall = [i for i, c in enumerate(space) if c.moe_block == 128]
    wide = [i for i, c in enumerate(space) if c.col_tiles > 1 and c.moe_block != 128]
    assert space[0].moe_block == 32 and [space[i].stages for i in tall] == [4, 3]
    assert tall == [max(wide) + 1, max(wide) + 2]
    for t in (64, 128):                                    # 16 and 32 slots
        assert not any(c.moe_block == 128 for c in at.config_space(mixtral, t))
    tall3 = at.config_space(mixtral, 2048)[1]
    module, _, pm = lower(mixtral, "cuda", tall3.pipeline(), tuning=None, arch="sm_90a")
    plan = emit_moe(mixtral, module, pm.pipeline, "sm_90a").plan
    assert all(v["kernel"].endswith("_b128_c4_tall_p3_k128")
               for g in plan["gemms"] for v in g["variants"])
    # the tall tile's depth: 3 at least, 4 at most (5 stages of 128 k pass 227 KB)
    assert at.same_tile(mixtral, 2048, dataclasses.replace(tall3, stages=2), tall3)
    assert at.same_tile(mixtral, 2048, dataclasses.replace(tall3, stages=8),
                        at.config_space(mixtral, 2048)[0])
    path = tmp_path / "t.json"
    tdb.TuningDB(path).record(mixtral, H200, [
        {"tokens": t, "config": c.as_dict(), "time_us": 1.0, "default_us": 1.0, "checked": True}
        for t, c in ((64, at.default_config(mixtral, 64)), (2048, tall3))])
    module = lower(mixtral, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0]
    tiles = [op.attrs["tile"] for op in module.function().ops
             if op.NAME == "moe.grouped_gemm_w4a16"]
    assert all((t["tall"][-1], t["stages"][-1]) == (True, 3) for t in tiles)


def test_sweep_splits_the_wide_cta_where_a_prefill_call_leaves_the_sms_short():
    """At prefill sizes the sweep also times the wide CTA's default tile split over K, for a
    GEMM whose call leaves the SMs short: Mixtral's down GEMM (16 CTAs a block) at 2, 4 and 8
    up to T = 128 (8 blocks), 2 and 4 at T = 200 (13), 2 at T = 512, none at T = 1024, gate/up
    (112 a block) never; Qwen3's and DeepSeek's calls fill the SMs unsplit. A candidate's
    pipeline builds its split: registers capped, not doubled per call."""
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")

    def splits(spec, t):
        return [(c.split_k, c.split_k_down) for c in at.config_space(spec, t)
                if c.col_tiles > 1 and (c.split_k, c.split_k_down) != (1, 1)]
    assert splits(mixtral, 65) == splits(mixtral, 128) == [(1, 2), (1, 4), (1, 8)]
    assert splits(mixtral, 200) == [(1, 2), (1, 4)]
    assert splits(mixtral, 512) == [(1, 2)]
    assert splits(mixtral, 1024) == []
    deepseek = moegen.load_spec(ROOT / "examples" / "deepseek-v2-lite.yaml")
    assert all(not splits(s, t) for s in (QWEN, deepseek) for t in (65, 128, 256, 2048))
    cfg = next(c for c in at.config_space(mixtral, 128) if c.split_k_down == 4)
    assert not at.same_tile(mixtral, 128, cfg, at.default_config(mixtral, 128))   # it doubles
    module, _, pm = lower(mixtral, "cuda", cfg.pipeline(), tuning=None, arch="sm_90a")
    down = emit_moe(mixtral, module, pm.pipeline, "sm_90a").plan["gemms"][1]["variants"][-1]
    assert (down["split"], down["split_many"], down["ctas_per_sm"]) == (4, 4, 4)
    assert down["kernel"].endswith("_s4_wg_o4")


def test_sweep_covers_k_per_stage_and_warps_default_first():
    space = at.config_space(QWEN, 1)
    tiles = [(c.block_k, c.warps) for c in space]
    assert set(tiles) == {(16, 4), (32, 4), (16, 2)}
    assert tiles[:tiles.index((32, 4))] == [(16, 4)] * tiles.index((32, 4))   # default first
    # a group of 16 cannot hold two k16 steps per stage: no block-k=32 candidates
    g16 = dataclasses.replace(QWEN, quant=dataclasses.replace(QWEN.quant, group_size=16))
    assert {c.block_k for c in at.config_space(g16, 1)} == {16}
    # every candidate's pipeline builds and emits, with the tile it asks for
    for cfg in space:
        module, _, pm = lower(QWEN, "cuda", cfg.pipeline())
        program = emit_moe(QWEN, module, pm.pipeline, "sm_90")
        up = program.plan["gemms"][0]["variants"][0]
        assert (16 * up["ks"], up["warps"], up["block"]) == (cfg.block_k, cfg.warps, cfg.moe_block)


def test_tuned_k_per_stage_and_warps_per_bucket(tmp_path):
    path = tmp_path / "t.json"
    mixed = [dict(r, config={**r["config"], "block_k": 32 if r["tokens"] == 1 else 16,
                             "warps": 2 if r["tokens"] == 2048 else 4}) for r in RESULTS]
    tdb.TuningDB(path).record(QWEN, H200, mixed)
    tuning = tdb.Tuning(tdb.TuningDB(path), H200)
    module, _, pm = lower(QWEN, "cuda", tuning=tuning)
    assert "block_k = [32, 16, 16, 16, 16], warps = [4, 4, 4, 4, 2]" in str(module)
    program = emit_moe(QWEN, module, pm.pipeline, "sm_90")
    names = [v["kernel"] for v in program.plan["gemms"][0]["variants"]]
    assert names[0].endswith("_k32") and names[-1].endswith("_w2")
    assert [k["block"] for k in program.plan["kernels"] if k["name"] == names[-1]] == [64]
    # an entry written before these two keys existed keeps the defaults
    old = [dict(r, config={k: v for k, v in r["config"].items() if k not in ("block_k", "warps")})
           for r in mixed]
    tdb.TuningDB(path).record(QWEN, H200, old)
    text = str(lower(QWEN, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0])
    assert "block_k = [16, 16, 16, 16, 16], warps = [4, 4, 4, 4, 4]" in text



def test_a_candidate_must_beat_the_default_by_more_than_the_noise():
    default, other = at.MoeConfig(8, 1, 8, 1), at.MoeConfig(8, 2, 8, 1)
    # measured once on the H200 (Qwen3 T = 1): the sweep's best 28.6 us, the default 26.8 us
    assert at.keep_default_unless_faster((28.6, other), default, 26.8) == (26.8, default)
    assert at.keep_default_unless_faster((26.0, other), default, 26.8) == (26.8, default)  # 3%: noise
    assert at.keep_default_unless_faster((20.0, other), default, 26.8) == (20.0, other)

def test_results_table():
    results = [{"tokens": 1, "config": at.MoeConfig(8, 2, 8, 1).as_dict(), "time_us": 20.0,
                "default_us": 26.8, "checked": True},
               {"tokens": 64, "config": at.MoeConfig(16, 1, 8, 1).as_dict(), "time_us": 382.0,
                "default_us": 382.0, "checked": True}]
    lines = at.results_table(results).splitlines()
    assert lines[0].split() == ["T", "recorded", "config", "us", "default", "us", "speed-up"]
    assert lines[2].split()[0] == "1" and "moe_block=8, split_k=2," in lines[2]
    assert lines[2].split()[-3:] == ["20.0", "26.8", "1.34x"]
    assert lines[3].split()[-3:] == ["382.0", "382.0", "1.00x"] and len(lines) == 4
    assert at.results_table([], "M").split()[0] == "M"


def test_ranked_lines_list_the_fastest_first():
    """`autotune --top N`: the N fastest candidates, fastest first, each with its speed-up
    over the default's time, however the sweep met them."""
    timed = [(30.0, "tile{a}"), (20.0, "tile{b}"), (40.0, "tile{c}"), (25.0, "tile{d}")]
    lines = at.ranked_lines(timed, 30.0, 3)
    assert [line.split()[-1] for line in lines] == ["tile{b}", "tile{d}", "tile{a}"]
    assert lines[0].split()[:3] == ["20.0", "us", "1.50x"]
    assert lines[2].split()[:3] == ["30.0", "us", "1.00x"]
    assert len(at.ranked_lines(timed, 30.0, 10)) == 4 and at.ranked_lines(timed, 30.0, 0) == []


def test_sweep_line_says_what_was_kept_and_why():
    default, other = at.MoeConfig(8, 1, 8, 1), at.MoeConfig(8, 2, 8, 1)
    kept = at.keep_default_unless_faster((26.0, other), default, 26.8)
    line = at.sweep_line(QWEN, 1, kept, (26.0, other), default, 26.8, 49, 416, "sm_90a")
    assert line.startswith("  T=1: kept the default config {'moe_block': 8, 'split_k': 1,")
    assert "(26.8 us): the fastest of 49 candidates timed (of 416)" in line
    assert f"{other.as_dict()}, took 26.0 us; a candidate must beat the default by 5%" in line
    won = at.keep_default_unless_faster((20.0, other), default, 26.8)
    line = at.sweep_line(QWEN, 64, won, (20.0, other), default, 26.8, 416, 416, "sm_90a")
    assert line == f"  T=64: best {other.as_dict()} 20.0 us, default 26.8 us (1.34x)"


MSD = moegen.load_spec(ROOT / "examples" / "msd-seed.yaml")


def test_msd_config_space_and_tuned_tile(tmp_path):
    space = at.msd_config_space(MSD)
    assert {c.lowering for c in space} == {"msd", "dequant"}
    assert {c.mma for c in space if c.lowering == "msd"} == {"s4", "s8"}
    assert {c.split_k for c in space if c.lowering == "msd"} == {1, 2, 4, 8, 16}
    assert {(c.block_n, c.vec_warps, c.cube_warps) for c in space if c.mma == "s8"} == {
        (bn, vec, bn // 64) for bn in (64, 128, 256) for vec in (2, 4, 8)}
    # the default layout (M = 1: 128 columns, 2 + 2 warps) first, then dequant, then the rest
    lowerings = [c.lowering for c in space]
    first_dequant = lowerings.index("dequant")
    assert all((c.block_n, c.vec_warps, c.cube_warps) == (128, 2, 2)
               for c in space[:first_dequant])
    n = lowerings.count("dequant")
    assert lowerings[first_dequant:first_dequant + n] == ["dequant"] * n
    results = [{"tokens": 1, "config": {"lowering": "dequant", "split_k": 8}, "time_us": 30.0,
                "default_us": 60.0, "checked": True},
               {"tokens": 1, "config": {"lowering": "msd", "schedule": "basic", "mma": "s4",
                                        "block_n": 64, "vec_warps": 4, "cube_warps": 1,
                                        "split_k": 2},
                "time_us": 50.0, "default_us": 60.0, "checked": True}]
    path = tmp_path / "t.json"
    tdb.TuningDB(path).record(MSD, H200, results)
    tuning = tdb.Tuning(tdb.TuningDB(path), H200)
    text = str(lower(MSD, "cuda", tuning=tuning)[0])
    # an entry recorded before stages and occupancy were: the 4 stages, no register cap it had
    assert ('tile = {block_n = 64, w_stages = 4, x_stages = 4, mma = "s4", vec_warps = 4, '
            'cube_warps = 1, split_k = 2, occupancy = 0}') in text
    # the sweep's candidates carry the default layout's stages and occupancy (M = 1: 3 and 6);
    # the tile pass bounds the occupancy by the candidate's threads (160: 5 CTAs an SM)
    assert {(c.stages, c.occupancy) for c in space if c.lowering == "msd"} == {(3, 6)}
    results[1]["config"].update(stages=3, occupancy=6)
    tdb.TuningDB(path).record(MSD, H200, results)
    text = str(lower(MSD, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0])
    assert ('tile = {block_n = 64, w_stages = 3, x_stages = 4, mma = "s4", vec_warps = 4, '
            'cube_warps = 1, split_k = 2, occupancy = 5}') in text
    import dataclasses
    dq = dataclasses.replace(MSD, lowering="dequant")
    assert "split_k = 8}" in str(lower(dq, "cuda", tuning=tuning)[0])
    # an option still beats the database
    assert "split_k = 1, occupancy" in str(lower(MSD, "cuda", "tile{split-k=1},schedule,alloc",
                                                 tuning=tuning)[0])


@pytest.mark.parametrize("m", [1, 64])
def test_msd_candidates_build_and_their_entries_build_them_again(tmp_path, m):
    """Every MSD candidate lowers (at M = 64 the rows take most of the shared memory: the
    default layout as the tile pass builds it, 64 columns at 2 stages, comes first, and layouts
    that would not fit even at 2 stages are left out), and its recorded entry builds its
    kernels again."""
    from moegen.targets.cuda.msd_emitter import emit_msd
    spec = dataclasses.replace(MSD, msd=dataclasses.replace(MSD.msd, m=m))
    space = at.msd_config_space(spec)
    default = at.msd_default_config(spec)
    first = space[0]
    assert (first.block_n, first.vec_warps, first.cube_warps, first.stages, first.occupancy) == (
        default["block_n"], default["vec_warps"], default["cube_warps"], default["stages"],
        default["occupancy"])
    if m == 64:
        assert (first.block_n, first.stages) == (64, 2)
        assert {c.block_n for c in space if c.lowering == "msd"} == {64}
    for i, cfg in enumerate(space):
        lowered = dataclasses.replace(spec, lowering=cfg.lowering)
        module, _, pm = lower(lowered, "cuda", cfg.pipeline(), tuning=None)
        timed = emit_msd(lowered, module, pm.pipeline).plan
        path = tmp_path / f"{i}.json"
        tdb.TuningDB(path).record(lowered, H200, [{"tokens": m, "time_us": 1.0, "default_us": 1.0,
                                                  "config": cfg.as_dict(spec.schedule),
                                                  "checked": True}])
        module, _, pm = lower(lowered, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))
        recorded = emit_msd(lowered, module, pm.pipeline).plan
        assert {k: v for k, v in recorded.items() if k != "passes"} == {
            k: v for k, v in timed.items() if k != "passes"}, cfg


def test_msd_default_config_records_the_default_tile(tmp_path):
    """When no candidate beats the defaults the sweep records them: read back, the same tile."""
    for spec in (MSD, dataclasses.replace(MSD, lowering="dequant")):
        cfg = at.msd_default_config(spec)
        assert cfg["lowering"] == spec.lowering
        untuned = str(lower(spec, "cuda", tuning=None)[0])
        path = tmp_path / f"{spec.lowering}.json"
        tdb.TuningDB(path).record(spec, H200, [{"tokens": spec.msd.m, "config": cfg,
                                               "time_us": 40.0, "default_us": 40.0,
                                               "checked": True}])
        assert str(lower(spec, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))[0]) == untuned
    assert at.msd_default_config(MSD)["schedule"] == MSD.schedule


def test_hand_edited_bad_split_fails_clearly(tmp_path):
    path = tmp_path / "t.json"
    bad = [dict(r, config={"moe_block": 8, "split_k": 7}) for r in RESULTS[:1]]
    tdb.TuningDB(path).record(QWEN, H200, bad)
    with pytest.raises(moegen.passes.manager.PipelineError, match="split-k 7 does not divide"):
        lower(QWEN, "cuda", tuning=tdb.Tuning(tdb.TuningDB(path), H200))


def fake_gpu(monkeypatch):
    """What every sweep asks of the GPU, faked: a call "takes" the time it returns, outputs are
    not checked, the device is an H200. Returns a database whose `recorded` lists what the
    sweep hands it."""
    import types
    import moegen.targets.cuda.bench as bench
    import moegen.targets.cuda.device as device
    monkeypatch.setattr(device, "get_cupy", lambda: types.SimpleNamespace(asarray=lambda a: a))
    monkeypatch.setattr(bench, "time_call", lambda cp, fn, reps: fn())
    monkeypatch.setattr(at, "_check", lambda *args, **kw: None)
    monkeypatch.setattr(at.Device, "current", staticmethod(lambda: H200))
    recorded = []
    return types.SimpleNamespace(record=lambda spec, dev, results: recorded.append(results),
                                 recorded=recorded)


def fake_gpu_sweep(monkeypatch, times: dict, default_us: float):
    """autotune_moe with the GPU faked: a layer of pass pipeline P "takes" times[P] us (the
    default layer, built without one, default_us); outputs are not checked, nothing compiles
    ahead (fake_gpu). Returns the database it records into."""
    from concurrent.futures import ThreadPoolExecutor
    import moegen.targets.cuda.compile_ahead as ahead
    import moegen.targets.cuda.runtime as runtime

    class Layer:
        arch, out = "sm_90a", None

        def __init__(self, spec, pipeline=None, tuning=None):
            self.us = default_us if pipeline is None else times[pipeline]

        def pack(self, *weights):
            return "packed"

        def __call__(self, *args):
            return self.us

    monkeypatch.setattr(runtime, "MoeW4A16", Layer)
    monkeypatch.setattr(ahead, "compile_pool", lambda workers: ThreadPoolExecutor(1))
    monkeypatch.setattr(at, "_nvrtc_inputs", lambda spec, space, *rest: (None for _ in space))
    return fake_gpu(monkeypatch)


@pytest.mark.parametrize("beaten", [True, False], ids=["a-candidate-wins", "default-kept"])
def test_sweep_ranks_and_records_without_a_gpu(rng, monkeypatch, beaten):
    """The sweep's own logic, the GPU faked (random times per candidate): `top` logs each
    count's fastest candidates, fastest first, with their speed-up over the default; the config
    recorded is the fastest candidate where it beats the default by more than 5%, else the
    default's."""
    spec = moegen.load_spec(ROOT / "examples" / "moe-seed.yaml")
    pipelines = {c.pipeline(): c for t in (1, 33) for c in at.config_space(spec, t, "sm_90a")}
    times = {p: float(rng.uniform(40.0, 90.0)) for p in pipelines}
    fastest = min(times.values())
    default_us = 100.0 if beaten else fastest * 1.02
    db = fake_gpu_sweep(monkeypatch, times, default_us)
    lines = []
    results = at.autotune_moe(spec, [1, 33], db, reps=1, log=lines.append, top=3)
    assert [r["tokens"] for r in results] == [1, 33]
    for r in results:
        space = [c.pipeline() for c in at.config_space(spec, r["tokens"], "sm_90a")]
        ranked = sorted(space, key=times.get)[:3]
        head = lines.index(f"  T={r['tokens']}: the 3 fastest of {len(space)} candidates "
                           f"(default {default_us:.1f} us)")
        shown = lines[head + 1:head + 4]
        assert [line.split()[3] for line in shown] == ranked, shown
        assert [float(line.split()[0]) for line in shown] == [round(times[p], 1) for p in ranked]
        assert shown[0].split()[2] == f"{default_us / times[ranked[0]]:.2f}x"
        if beaten:
            assert r["time_us"] == times[ranked[0]]
            assert r["config"] == pipelines[ranked[0]].as_dict()
        else:
            assert r["time_us"] == default_us
            assert r["config"] == at.default_config(spec, r["tokens"], "sm_90a").as_dict()
    assert db.recorded == [results]               # one record, of every count


def test_top_marks_the_default_kernels_without_a_gpu(rng, monkeypatch):
    """A candidate that builds the default's kernels (the default timed again) is marked so in
    the `top` lines, as in --list; no other is."""
    spec = moegen.load_spec(ROOT / "examples" / "moe-seed.yaml")
    space = at.config_space(spec, 1, "sm_90a")
    default = at.default_config(spec, 1, "sm_90a")
    same = {c.pipeline() for c in space if at.same_tile(spec, 1, c, default, "sm_90a")}
    assert 0 < len(same) < len(space)
    # the default's kernels the fastest here, the rest at random behind them
    times = {c.pipeline(): 30.0 if c.pipeline() in same else float(rng.uniform(40.0, 90.0))
             for c in space}
    db = fake_gpu_sweep(monkeypatch, times, 100.0)
    lines = []
    at.autotune_moe(spec, [1], db, reps=1, log=lines.append, top=len(same) + 2)
    head = next(i for i, line in enumerate(lines) if line.startswith("  T=1: the "))
    shown = lines[head + 1:head + 3 + len(same)]
    assert [line.endswith(at.DEFAULT_MARK) for line in shown] == [True] * len(same) + [False] * 2
    assert all(line.split()[3] in same for line in shown[:len(same)]), shown


def test_progress_bar_only_on_a_terminal(monkeypatch, capsys):
    """The sweep's progress bar is redrawn in place on a terminal; into a log it writes
    nothing (a line a candidate otherwise)."""
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    assert list(at._candidates(["a", "b", "c"], "T=1", 0.0, None, print)) == ["a", "b", "c"]
    assert capsys.readouterr().err == ""
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    assert list(at._candidates(["a", "b", "c"], "T=1", 0.0, None, print)) == ["a", "b", "c"]
    assert tty.getvalue().count("\r") == 3 and tty.getvalue().endswith("3/3\n")


def test_msd_sweep_ranks_every_schedule_without_a_gpu(rng, monkeypatch):
    """The MSD sweep, the GPU faked (a random time per candidate and schedule): `top` logs the
    fastest timings first, each with its lowering, schedule and pass pipeline; each lowering's
    best is recorded, the spec's own only where it beats the default by more than 5%."""
    import moegen.targets.cuda.runtime as runtime
    spec = moegen.load_spec({"name": "msd-small", "pipeline": "msd_matmul",
                             "msd": {"m": 2, "n": 1000, "k": 1024}, "targets": {"cuda": {}}})
    space = at.msd_config_space(spec)
    times = {(c, sch): float(rng.uniform(40.0, 90.0)) for c in space
             for sch in (("basic", "preload") if c.lowering == "msd" else ("dequant",))}
    default_us = 100.0

    class Op:
        out = None

        def __init__(self, spec, pipeline=None, tuning=None):
            self.config = next((c for c in space if c.pipeline() == pipeline
                                and c.lowering == spec.lowering), None)
            self.schedules = ["basic", "preload"] if spec.lowering == "msd" else ["dequant"]

        def pack(self, w):
            return "packed"

        def __call__(self, x, w, scale, schedule=None):
            return default_us if self.config is None else times[self.config, schedule]

    monkeypatch.setattr(runtime, "MsdMatmul", Op)
    db, lines = fake_gpu(monkeypatch), []
    results = at.autotune_msd(spec, db, reps=1, log=lines.append, top=4)
    ranked = sorted(times, key=times.get)[:4]
    head = lines.index(f"  M=2: the 4 fastest of {len(times)} timings (every candidate in each "
                       f"of its schedules; default {default_us:.1f} us)")
    for line, (c, sch) in zip(lines[head + 1:head + 5], ranked, strict=True):
        us, unit, speedup, lowering, *rest = line.split()
        assert (float(us), speedup) == (round(times[c, sch], 1),
                                        f"{default_us / times[c, sch]:.2f}x"), line
        assert lowering == f"lowering={c.lowering}" and rest[-1] == c.pipeline(), line
        assert rest[:-1] == ([f"schedule={sch}"] if c.lowering == "msd" else []), line
    for r in results:      # each lowering's fastest (the spec's, msd, beats the default here)
        lowering = r["config"]["lowering"]
        (c, sch) = min((k for k in times if k[0].lowering == lowering), key=times.get)
        assert r["time_us"] == times[c, sch]
        assert r["config"] == c.as_dict(sch if lowering == "msd" else None)
    assert sorted(r["config"]["lowering"] for r in results) == ["dequant", "msd"]
    assert db.recorded == [results]


@pytest.mark.gpu
def test_short_autotune_on_the_gpu(tmp_path):
    pytest.importorskip("cupy")
    db = tdb.TuningDB(tmp_path / "t.json")
    spec = moegen.load_spec(ROOT / "examples" / "moe-seed.yaml")
    lines = []
    results = at.autotune_moe(spec, [1, 33], db, budget_s=60, reps=3, log=lines.append, top=2)
    assert results and all(r["checked"] for r in results)
    for r in results:         # --top 2: each count's (up to) two fastest, fastest first
        (head,) = [i for i, line in enumerate(lines)
                   if line.startswith(f"  T={r['tokens']}: the ")]
        shown, timed = (int(w) for w in re.findall(r"the (\d+) fastest of (\d+)", lines[head])[0])
        ranked = lines[head + 1:head + 1 + shown]
        assert shown == min(2, timed) and all("tile{" in line for line in ranked), lines
        times = [float(line.split()[0]) for line in ranked]
        assert times == sorted(times), lines
    layer = moegen.cuda.MoeW4A16(spec, tuning=tdb.Tuning(tdb.TuningDB(tmp_path / "t.json"),
                                                        tdb.Device.current()))
    assert [b for _, b in layer.plan["buckets"]] == [r["config"]["moe_block"] for r in results]
    variants = layer.plan["gemms"][0]["variants"]
    assert [(16 * v["ks"], v["warps"]) for v in variants] == [
        (r["config"]["block_k"], r["config"]["warps"]) for r in results]
    # and in the printed IR: the tile attribute lists the tuned k per stage and warps per bucket
    for key in ("block_k", "warps"):
        assert f"{key} = [{', '.join(str(r['config'][key]) for r in results)}]" in layer.program.ir


@pytest.mark.gpu
def test_short_prefill_autotune_on_the_gpu(tmp_path):
    """At a prefill size below the tall tile's edge (37 slots an expert, of 8: the edge is 40)
    the sweep starts with the wide CTA (the default); whichever config wins, its whole tile
    (block, column tiles, rows per warp, k per stage) reaches the plan."""
    pytest.importorskip("cupy")
    db = tdb.TuningDB(tmp_path / "t.json")
    spec = moegen.load_spec({"name": "prefill-small", "pipeline": "moe_w4a16",
                             "moe": {"hidden_size": 256, "intermediate_size": 256,
                                     "num_experts": 8, "top_k": 2},
                             "tokens": {"max": 512}, "targets": {"cuda": {}}})
    assert at.config_space(spec, 150, "sm_90a")[0].col_tiles == 4
    (r,) = at.autotune_moe(spec, [150], db, budget_s=60, reps=3)
    assert r["checked"]
    layer = moegen.cuda.MoeW4A16(spec, tuning=tdb.Tuning(tdb.TuningDB(tmp_path / "t.json"),
                                                        tdb.Device.current()))
    (v,) = layer.plan["gemms"][0]["variants"]          # one measured count: one bucket
    c = r["config"]
    assert (v["block"], v["col_tiles"], 16 * v["ks"]) == (c["moe_block"], c["col_tiles"],
                                                         c["block_k"])
    if c["col_tiles"] > 1:
        assert v["warp_rows"] == min(c["warp_rows"], c["moe_block"])


@pytest.mark.gpu
def test_short_tall_autotune_on_the_gpu(tmp_path):
    """From 64 slots an expert on a GPU with warpgroup MMA the sweep starts with the tall
    tile at both ring depths: each is checked against the reference and timed, and the config
    recorded (the tall tile unless another beats it by 5%) is what the plan runs."""
    pytest.importorskip("cupy")
    from moegen.targets.cuda.runtime import device_arch
    if device_arch() != "sm_90a":
        pytest.skip("the tall tile is swept where the GPU has warpgroup MMA (sm_90a)")
    db = tdb.TuningDB(tmp_path / "t.json")
    spec = moegen.load_spec({"name": "tall-small", "pipeline": "moe_w4a16",
                             "moe": {"hidden_size": 256, "intermediate_size": 256,
                                     "num_experts": 8, "top_k": 2},
                             "tokens": {"max": 512}, "targets": {"cuda": {"arch": "sm_90a"}}})
    space = at.config_space(spec, 256, "sm_90a")
    assert [(c.moe_block, c.stages) for c in space[:2]] == [(128, 4), (128, 3)]
    lines = []
    (r,) = at.autotune_moe(spec, [256], db, budget_s=60, reps=3, log=lines.append)
    assert r["checked"]
    assert not [line for line in lines if "moe_block=128" in line and "infinite" in line], lines
    layer = moegen.cuda.MoeW4A16(spec, tuning=tdb.Tuning(tdb.TuningDB(tmp_path / "t.json"),
                                                        tdb.Device.current()))
    (v,) = layer.plan["gemms"][0]["variants"]
    c = r["config"]
    assert (v["block"], v["tall"]) == (c["moe_block"], c["moe_block"] == 128)
    if v["tall"]:
        assert v["stages"] == c["stages"]


@pytest.mark.gpu
def test_short_msd_autotune_on_the_gpu(tmp_path):
    pytest.importorskip("cupy")
    db = tdb.TuningDB(tmp_path / "t.json")
    spec = moegen.load_spec({"name": "msd-small", "pipeline": "msd_matmul",
                             "msd": {"m": 2, "n": 1000, "k": 1024}, "targets": {"cuda": {}}})
    results = at.autotune_msd(spec, db, budget_s=60, reps=3)
    assert {r["config"]["lowering"] for r in results} == {"msd", "dequant"}
    assert all(r["checked"] for r in results)
    op = moegen.cuda.MsdMatmul(spec, tuning=tdb.Tuning(tdb.TuningDB(tmp_path / "t.json"),
                                                      tdb.Device.current()))
    best = next(r["config"] for r in results if r["config"]["lowering"] == "msd")
    for key in ("split_k", "mma", "block_n", "vec_warps", "cube_warps"):   # the whole tile
        assert op.plan["tile"][key] == best[key], key



def test_kernel_cache_key_covers_the_included_header():
    """CuPy's disk cache keys on the code it is given: the headers' hash must be in that code."""
    import dataclasses

    from moegen.targets.cuda.emitter import emit_moe
    from moegen.targets.cuda.runtime import module_source
    module, _, pm = lower(QWEN, "cuda")
    program = emit_moe(QWEN, module, pm.pipeline, "sm_90")
    code = module_source(program)
    assert code.endswith(program.source) and code.startswith("// moegen_w4a16.cuh sha256 ")
    for name in program.headers:               # the umbrella header and each of its tree
        headers = {**program.headers, name: program.headers[name] + "\n// one more line\n"}
        assert module_source(dataclasses.replace(program, headers=headers)) != code, name
    assert module_source(dataclasses.replace(program)) == code      # same inputs, same key
