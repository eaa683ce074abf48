import dataclasses
import re

import networkx as nx
import pytest
import yaml

import gpu_cases
import moegen
from moegen.ir import parse
from moegen.passes.alloc import Buffer, assign_offsets, check_no_overlap, AllocError, plan_of
from moegen.passes.manager import Context, PassManager, PipelineError, parse_pipeline, print_pipeline
from moegen.passes.pipelines import DEFAULT_PIPELINES, lower
from moegen.passes.tiling.moe_buckets import single_token_bucket
from moegen.passes.tiling.msd import MSD_CTAS_PER_SM
from moegen.target import CUDA_ARCHS, gpu_target
from moegen.tile_model import MoeConfig, TunedBucket
from moegen import tuning as tdb
from moegen.targets.cuda.emitter import device_headers, emit_moe
from gpu_cases import moe_spec
from conftest import EXAMPLES, ROOT

H200 = gpu_target("sm_90a")

MOE = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
MSD = moegen.load_spec(ROOT / "examples" / "msd-seed.yaml")


# --- pipeline strings --------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["tile", "tile{moe-block=8},alloc,schedule{mode=preload}",
                                  "fuse-align,tile{block-n=64,stages=3},alloc{alignment=512}",
                                  "fuse-align,fuse-swiglu,tile{warps=2,split-k=2}",
                                  "schedule{mode=basic}"])
def test_pipeline_round_trip(text):
    assert print_pipeline(parse_pipeline(text)) == text


def test_pipeline_spaces_normalise():
    assert print_pipeline(parse_pipeline(" tile { moe-block = 8 } , alloc ")) == \
        "tile{moe-block=8},alloc"


@pytest.mark.parametrize("text,message", [
    ("tile,bogus", "unknown pass 'bogus'"),
    ("tile{moe-blok=8}", "tile: unknown option 'moe-blok'"),
    ("tile{moe-block=7}", "tile{moe-block=7}: must be one of"),
    ("tile{moe-block=x}", "tile{moe-block=x}: must be an integer"),
    ("schedule{mode=fast}", "schedule{mode=fast}: must be one of basic, preload"),
    ("tile{moe-block}", "must be written key=value"),
    ("tile{{", "bad pipeline"),
    ("alloc{alignment=0}", "must be >= 1"),
])
def test_bad_pipelines_fail_clearly(text, message):
    with pytest.raises(PipelineError, match=re.escape(message)):
        parse_pipeline(text)


def test_default_pipelines_are_flat_lists_of_known_passes():
    for key, names in DEFAULT_PIPELINES.items():
        assert [p.name for p in parse_pipeline(",".join(names))] == names


def test_pass_must_fit_the_pipeline():
    with pytest.raises(PipelineError, match="does not apply to pipeline moe_w4a16"):
        lower(MOE, "cuda", "schedule")
    with pytest.raises(PipelineError, match="serves pipeline"):
        lower(MOE, "ascend")


def test_manager_verifies_after_every_pass():
    from moegen.passes.manager import Pass

    class Breaker(Pass):
        name = "test-breaker"

        def apply(self, module, ctx):
            module.function().ops[0].attrs["k"] = 0

    with pytest.raises(moegen.ir.VerifyError, match="after pass 'test-breaker'.*k = 0"):
        PassManager([Breaker()]).run(moegen.build(MOE), Context(MOE))


def test_print_ir_after():
    seen = []
    PassManager("fuse-align,tile,alloc", print_after={"tile"},
                on_print=lambda name, m: seen.append((name, str(m)))).run(moegen.build(MOE),
                                                                         Context(MOE))
    assert [n for n, _ in seen] == ["tile"]
    assert "block_buckets" in seen[0][1] and "offsets" not in seen[0][1]
    with pytest.raises(PipelineError, match="not in the pipeline"):
        PassManager("tile", print_after={"alloc"})


# --- each pass's printed output (FileCheck style: lines in order) --------------------------------

def check_lines(text, patterns):
    pos = 0
    for pat in patterns:
        m = re.compile(pat).search(text, pos)
        assert m, f"{pat!r} not found after offset {pos} in:\n{text[pos:pos + 2000]}"
        pos = m.end()


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "msd" not in p.name], ids=lambda p: p.stem)
def test_moe_passes_printed(path):
    spec = moegen.load_spec(path)
    module, ctx, pm = lower(spec, "cuda")
    text = str(module)
    assert parse(text).verify() is None and str(parse(text)) == text
    fixed = spec.moe.block_size
    mid = 16 if spec.moe.top_k * 64 > 8 * spec.moe.num_experts else 8   # Mixtral: 16 slots/expert
    # above T = 64, block 8 while an average expert gets at most 8 slots (Qwen3: up to 128)
    tail = 8 * spec.moe.num_experts // spec.moe.top_k
    tail = tail if 64 < tail < spec.tokens.max else None
    # a bucket for T = 1 alone where the down GEMM of one token has fewer tiles than SMs
    one = spec.tokens.max > 1 and single_token_bucket(spec.moe.top_k, spec.moe.hidden_size,
                                                         H200)
    # above 13 slots an average expert (Mixtral: T = 53..64) the wide CTA of block 32
    wd = 13 * spec.moe.num_experts // spec.moe.top_k
    wd = wd if not fixed and 16 < wd < min(64, spec.tokens.max) else None
    # from 64 slots an average expert (40 with 8 experts or fewer; Mixtral: T = 160) the tall
    # tile of block 128
    tall = -(-(40 if spec.moe.num_experts <= 8 else 64) * spec.moe.num_experts // spec.moe.top_k)
    tall = tall if not fixed and 64 < tall <= spec.tokens.max else None
    buckets = (f"[[1, {fixed or 8}], " if one else "[") + (
        f"[16, {fixed}], [64, {fixed}]]" if spec.tokens.max <= 64 else
        f"[16, {fixed or 8}], " + (f"[{wd}, {mid}], [64, 32], " if wd else
                                   f"[64, {fixed or mid}], ")
        + (f"[{tail}, {fixed or 8}], " if tail else "")
        + (f"[{tall - 1}, 32], [{spec.tokens.max}, 128]]" if tall else
           f"[{spec.tokens.max}, {fixed or 32}]]"))
    # decode buckets: the K-split CTA (16 k a stage, 4 warps, 2 for T = 1 alone, 8 stages where
    # shared memory holds them), the wide one split over K (32 k a stage, 4 stages); the
    # prefill bucket: the wide CTA of 4 column tiles, 32 k a stage, 4 stages
    wide = spec.tokens.max > 64

    def per_bucket(one_token, k_split, decode_wide, prefill, tall_tile):
        return ((f"{one_token}, " if one else "") + k_split + (f", {decode_wide}" if wd else "")
                + (f", {k_split.split(', ')[-1]}" if tail else "")
                + (f", {prefill}" if wide else "") + (f", {tall_tile}" if tall else ""))
    # the tall tile: 128 k a stage, 16 warps (4 column tiles x 4 row groups of 32 where it runs
    # as the wide CTA), 4 stages
    tile = (r"block_k = \[" + per_bucket(16, "16, 16", 32, 32, 128)
            + r"\], warps = \[" + ("2, " if one else "") + r"4(, 4)*" + (", 16" if tall else "")
            + r"\], stages = \[" + per_bucket(8, "8, [358]", 4, 4, 4)
            + r"\], split_k = \[.*\], "
            r"col_tiles = \[" + per_bucket(1, "1, 1", 4, 4, 4) + r"\], "
            r"warp_rows = \[" + per_bucket(0, "0, 0", 32, 32, 32) + r"\]")
    check_lines(text, [
        r"workspace = \{bytes = \d+",
        r"moe\.topk_softmax\(%router_logits\)",
        r"moe\.align\(%topk_ids, %topk_weights\) \{num_experts = " + str(spec.moe.num_experts)
        + ".*block_buckets = " + re.escape(buckets),
        r"%activation = moe\.grouped_gemm_w4a16\(.*epilogue = \"swiglu\".*tile = \{block_n = 64, "
        + tile,
        r"%down = moe\.grouped_gemm_w4a16\(.*mul_topk_weights = true.*" + tile,
        r"moe\.aggregate\(%down\) \{topk = " + str(spec.moe.top_k) + r", offsets = \[-1\]\}",
    ])
    assert "moe.count" not in text and "moe.slot_lists" not in text and "moe.swiglu" not in text


FUSED_SUM = "fuse-align,fuse-swiglu,fuse-topk-sum,tile,alloc"


def test_fuse_topk_sum():
    module, _, _ = lower(MOE, "cuda", FUSED_SUM)
    text = str(module)
    assert parse(text).verify() is None and str(parse(text)) == text
    assert "moe.aggregate" not in text
    check_lines(text, [
        r"%down, %out = moe\.grouped_gemm_w4a16\(%activation, .*mul_topk_weights = true, "
        r"group_size = 128, epilogue = \"topk_sum\", sum_topk = 8, .*offsets = \[0, -1\]\}"
        r" : .* -> \(tensor<8\*\?x2048xf16>, tensor<\?x2048xf16>\)",
        r"return\(%out\)",
    ])
    # the per-slot rows stay a workspace buffer, live only in their GEMM
    plain = lower(MOE, "cuda", tuning=None)[0]
    assert module.attrs["workspace"]["bytes"] <= plain.attrs["workspace"]["bytes"]
    # without moe.aggregate (or with another reader of the rows) the pass changes nothing
    unfused = lower(MOE, "cuda", "fuse-align,tile,alloc")[0]
    assert str(lower(MOE, "cuda", "fuse-align,fuse-topk-sum,tile,alloc")[0]).count(
        "moe.aggregate") == 0 and "moe.aggregate" in str(unfused)


def test_topk_sum_epilogue_rules():
    from moegen.ir import VerifyError

    def down_gemm():
        module = lower(MOE, "cuda", "fuse-align,fuse-swiglu,fuse-topk-sum")[0]
        return [op for op in module.function().ops if op.NAME == "moe.grouped_gemm_w4a16"][1]

    gemm = down_gemm()
    gemm.verify()
    gemm.results.pop()
    with pytest.raises(VerifyError, match="epilogue = topk_sum gives two results"):
        gemm.verify()
    gemm = down_gemm()
    gemm.attrs["mul_topk_weights"] = False
    with pytest.raises(VerifyError, match="mul_topk_weights must be true"):
        gemm.verify()
    gemm = down_gemm()
    gemm.attrs["sum_topk"] = 4
    with pytest.raises(VerifyError, match="rows of out must equal rows of sum x sum_topk"):
        gemm.verify()
    gemm = down_gemm()
    gemm.attrs["epilogue"] = "none"
    with pytest.raises(VerifyError, match="other epilogues one"):
        gemm.verify()


def test_router_choices_recorded_by_tile():
    text = str(lower(MOE, "cuda")[0])
    assert 'moe.topk_softmax(%router_logits) {k = 8, renormalize = true, router = "redux", ' \
           'align_tokens = 16' in text
    text = str(lower(MOE, "cuda", "fuse-align,tile{router=shuffle,route-align-tokens=64},alloc")[0])
    assert 'router = "shuffle", align_tokens = 64' in text
    assert "align_tokens = 0" in str(lower(MOE, "cuda", "fuse-align,tile{route-align-tokens=0}")[0])
    with pytest.raises(PipelineError, match=r"tile\{route-align-tokens=65\}: must be 0..64"):
        lower(MOE, "cuda", "fuse-align,tile{route-align-tokens=65}")
    with pytest.raises(PipelineError, match=r"tile\{router=fast\}: must be one of redux, shuffle"):
        lower(MOE, "cuda", "tile{router=fast}")
    # top-k 16: the align CTA's 512 shared slots hold 32 tokens
    k16 = moegen.load_spec({"name": "k16", "pipeline": "moe_w4a16", "moe": {
        "hidden_size": 256, "intermediate_size": 128, "num_experts": 64, "top_k": 16},
        "targets": {"cuda": {}}})
    with pytest.raises(PipelineError, match=r"must be 0..32 \(at most 64 tokens and 512 slots"):
        lower(k16, "cuda", "fuse-align,tile{route-align-tokens=33}")


def test_tile_options_override_defaults():
    module, _, _ = lower(MOE, "cuda", "tile{moe-block=16,warps=2,split-k=4,stages=3}")
    text = str(module)
    assert "block_buckets = [[16, 16], [64, 16], [128, 16], [8192, 16]]" in text
    # block 16 rows: two warps' rings of 3 stages fit, the option is the most a ring gets
    assert ("tile = {block_n = 64, block_k = [16, 16, 16, 16], warps = [2, 2, 2, 2], "
            "stages = [3, 3, 3, 3], split_k = [4, 4, 1, 1], col_tiles = [1, 1, 1, 1], "
            "warp_rows = [0, 0, 0, 0], wgmma = [false, false, false, false], "
            "ctas_per_sm = [0, 0, 0, 0], split_many = [4, 4, 1, 1], "
            "tall = [false, false, false, false]}") in text
    with pytest.raises(PipelineError, match="does not split"):
        lower(MOE, "cuda", "tile{split-k=64}")


def gemm_tiles(spec, pipeline=None) -> list[dict]:
    module = lower(spec, "cuda", pipeline, tuning=None)[0]
    return [op.attrs["tile"] for op in module.function().ops
            if op.NAME == "moe.grouped_gemm_w4a16"]


def test_tall_tile_only_where_the_arch_has_warpgroup_mma():
    """Compiled without warpgroup MMA the tall bucket's kernel is the wide CTA of block 128,
    slower than block 32 there: plans for other archs than sm_90a keep the wide CTA of block 32
    up to tokens.max, unless tall=1 asks for the tall bucket. The plan's arch is lower's `arch`
    (a runtime's GPU) over the spec's targets.cuda.arch."""
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    assert spec.cuda_arch == "sm_90a"

    def plan(arch=None, pipeline=None, s=spec):
        module = lower(s, "cuda", pipeline, tuning=None, arch=arch)[0]
        tiles = [op.attrs["tile"] for op in module.function().ops
                 if op.NAME == "moe.grouped_gemm_w4a16"]
        return module.function().op("moe.align").attrs["block_buckets"], tiles

    tall_buckets, tall_tiles = plan()
    assert tall_buckets[-2:] == [[159, 32], [8192, 128]] and all(t["tall"][-1] for t in tall_tiles)
    assert plan("sm_90a") == (tall_buckets, tall_tiles)
    wide = plan("sm_90a", "fuse-align,fuse-swiglu,tile{tall=0},alloc")
    assert wide[0][-1] == [8192, 32] and not any(any(t["tall"]) for t in wide[1])
    # sm_90: the H200's numbers without warpgroup MMA; the others their own numbers too
    assert plan("sm_90") == wide
    assert plan("sm_90", "fuse-align,fuse-swiglu,tile{tall=1},alloc") == (tall_buckets, tall_tiles)
    for arch in CUDA_ARCHS:
        if gpu_target(arch).wgmma:
            continue
        buckets, tiles = plan(arch)
        assert buckets[-1] == [8192, 32] and not any(any(t["tall"]) for t in tiles), arch
        buckets, tiles = plan(arch, "fuse-align,fuse-swiglu,tile{tall=1},alloc")
        assert buckets[-1] == [8192, 128] and all(t["tall"][-1] for t in tiles), arch
    # the spec's arch where lower is given none
    data = yaml.safe_load((ROOT / "examples" / "mixtral-8x7b.yaml").read_text())
    on_sm90 = moegen.load_spec({**data, "targets": {"cuda": {"arch": "sm_90"}}})
    assert plan(s=on_sm90) == wide and plan("sm_90a", s=on_sm90) == (tall_buckets, tall_tiles)


def test_plans_use_their_gpus_numbers():
    """The tile pass reads the plan's GPU (moegen.target): the SMs decide where T = 1 gets a
    bucket of its own and how far decode GEMMs split over K; a runtime's own SM count (lower's
    `gpu`) over the arch's table entry; the CTA's shared memory caps the MSD tile."""
    qwen = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    # Qwen3's down GEMM of one token: 8 x 2048 / 64 = 256 column tiles
    assert not single_token_bucket(8, 2048, H200)
    assert single_token_bucket(8, 2048, H200.with_sms(300))

    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")

    def plan(spec, **kw):
        """(buckets, the down GEMM's K splits per bucket)"""
        module = lower(spec, "cuda", tuning=None, **kw)[0]
        down = next(op for op in module.function().ops
                    if op.NAME == "moe.grouped_gemm_w4a16" and op.attr("mul_topk_weights"))
        return module.function().op("moe.align").attrs["block_buckets"], \
            down.attrs["tile"]["split_k"]
    # Mixtral's down GEMM of one token: 2 x 4096 / 64 = 128 column tiles, split where the
    # SMs outnumber them
    h200, few = plan(mixtral), plan(mixtral, gpu=H200.with_sms(16))
    assert few[1][0] < h200[1][0], (few, h200)
    assert plan(qwen, gpu=H200.with_sms(300))[0][0] == [1, 8] and plan(qwen)[0][0] != [1, 8]
    assert plan(mixtral, arch="sm_87") == plan(mixtral, gpu=gpu_target("sm_87"))
    assert plan(mixtral, arch="sm_87") != plan(mixtral, arch="sm_90")     # 16 SMs, not 132
    # an MSD layout that fits the H200's 227 KB does not fit an L40S's 99 KB
    msd = yaml.safe_load((ROOT / "examples" / "msd-seed.yaml").read_text())
    msd["msd"]["m"] = 16
    big = moegen.load_spec(msd)
    tile_h200 = lower(big, "cuda", tuning=None, arch="sm_90a")[0].function().op(
        "msd.group_loop").attrs["tile"]
    tile_l40s = lower(big, "cuda", tuning=None, arch="sm_89")[0].function().op(
        "msd.group_loop").attrs["tile"]
    assert tile_l40s["block_n"] < tile_h200["block_n"], (tile_l40s, tile_h200)
    with pytest.raises(ValueError, match="arch 'sm_75': not a known CUDA target"):
        gpu_target("sm_75")


def test_ring_stages_are_whole_turns_of_the_unrolled_loop():
    """The K-split CTA's ring stages: as many as asked and 48 KB allow, from 4 up a power of
    two (the unrolled K loop then keeps every ring offset a constant); 3 stays 3."""
    from moegen.passes.tiling.cta import gemm_stages
    assert [gemm_stages(8, 4, most) for most in (2, 3, 4, 5, 6, 7, 8, 12, 16)] == \
        [2, 3, 4, 4, 4, 4, 8, 8, 8]                 # (13 stages of block 8 fit 48 KB)
    assert gemm_stages(8, 2, 16) == 16
    assert gemm_stages(32, 4, 8) == 4 and gemm_stages(64, 4, 8) == 3   # 5 and 3 fit 48 KB
    for t in gemm_tiles(MOE, "fuse-align,fuse-swiglu,tile{stages=6,wide-cols=0},alloc"):
        assert t["stages"] == [4, 4, 4, 4]


def test_wide_cta_in_prefill_buckets():
    """The prefill bucket takes the wide CTA: 4 column tiles (fewer where the weight's tile
    count is not a multiple), warps = column tiles x row halves of 32, 32 k a stage, the ring
    as deep as 48 KB allows; wide-cols=0 keeps the K-split CTA; blocks other than 32, 64 and
    decode buckets never take it."""
    # (Qwen3: buckets up to 16, 64, 128 with block 8, then prefill with block 32)
    for t in gemm_tiles(MOE, "fuse-align,fuse-swiglu,tile{tall=0},alloc"):
        assert (t["col_tiles"], t["warps"][-1], t["block_k"][-1], t["stages"][-1]) == (
            [1, 1, 1, 4], 4, 32, 4)
    for t in gemm_tiles(MOE, "fuse-align,fuse-swiglu,tile{moe-block=64,wide-cols=2,stages=9},alloc"):
        # block 64 in every bucket: those above T = 64 take the wide CTA, two row groups; a
        # stage of 2 tiles x 1 KB and 64 rows x 80 B: 6 fit 48 KB
        assert (t["col_tiles"], t["warps"], t["stages"][2:]) == ([1, 1, 2, 2], [4] * 4, [6, 6])
    for t in gemm_tiles(MOE, "fuse-align,fuse-swiglu,tile{moe-block=64,warp-rows=64},alloc"):
        assert (t["col_tiles"], t["warp_rows"], t["warps"]) == ([1, 1, 4, 4], [0, 0, 64, 64],
                                                                [4] * 4)
    for t in gemm_tiles(MOE, "fuse-align,fuse-swiglu,tile{warp-rows=64},alloc"):
        assert t["warp_rows"] == [0, 0, 0, 32]       # a block of 32 rows: 32 a warp (no tall tile)
    for t in gemm_tiles(MOE, "fuse-align,fuse-swiglu,tile{wide-cols=0},alloc"):
        # block 32: 5 stages fit 48 KB, rounded down to 4 (a power of two)
        assert t["col_tiles"] == [1, 1, 1, 1] and t["stages"] == [8, 8, 8, 4]
    odd = moegen.load_spec({"name": "odd", "pipeline": "moe_w4a16", "quant": {"group_size": 32},
                            "moe": {"hidden_size": 96, "intermediate_size": 160, "num_experts": 8,
                                    "top_k": 2}, "targets": {"cuda": {}}})
    up, down = gemm_tiles(odd)          # 2 I = 320 columns: 5 tiles; H = 96: 2 tiles
    assert up["col_tiles"][-1] == 1 and down["col_tiles"][-1] == 2


def test_tall_tile_in_large_prefill_buckets():
    """Prefill calls whose average expert gets 64 slots or more (40 with 8 experts or fewer:
    Mixtral from T = 160) take the tall tile: a bucket
    of block 128 (4 column tiles, 16 warps where it runs as the wide CTA, 64 k a stage, 4
    stages, dynamic shared memory); an option that pins the prefill tile, tall=0, or weights
    whose tiles do not make whole CTAs of 4 keep the wide CTA."""
    from moegen.passes.tiling.cta import tall_shared_bytes
    edges = {"mixtral-8x7b": 160, "qwen3-30b-a3b": 1024, "deepseek-v2-lite": 683}
    for name, edge in edges.items():
        spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
        for t in gemm_tiles(spec):
            assert (t["tall"][-1], t["col_tiles"][-1], t["warps"][-1], t["block_k"][-1],
                    t["stages"][-1], t["warp_rows"][-1]) == (True, 4, 16, 128, 4, 32)
            assert not any(t["tall"][:-1])
        module = lower(spec, "cuda", tuning=None)[0]
        buckets = module.function().op("moe.align").attrs["block_buckets"]
        assert buckets[-2:] == [[edge - 1, 32], [8192, 128]], name
    # the default: the tall tile's ring of 128 k a stage (the wide CTA in its place where the
    # GPU has no warpgroup MMA takes 64 k a stage, rows padded by 16 bytes; the tall ring's chunk
    # columns are padded by 16 bytes)
    assert tall_shared_bytes(128, 4, 128) == 4 * (4 * (8 * 512 + 128) + 2 * 8 * (128 + 1) * 16)
    # with 64 k a stage the fp32 outputs of 4 column tiles x 128 rows (rows and tiles padded by
    # 4 words)
    assert tall_shared_bytes(128, 4, 64) == 4 * (128 * 68 + 4) * 4
    for opts in ("tall=0", "block-k=32", "wide-cols=4", "warp-rows=32", "wgmma=0"):
        for t in gemm_tiles(MOE, f"fuse-align,fuse-swiglu,tile{{{opts}}},alloc"):
            assert not any(t["tall"]) and t["col_tiles"][-1] in (1, 4), opts
    # the ring and the static shared memory beside it (mbarriers, the block's slot ids and
    # weights) together within the CTA's limit
    from moegen.passes.tiling.cta import tall_stages, tall_static_bytes
    from moegen.target import gpu_target
    ring4 = tall_shared_bytes(128, 4, 128)
    for limit, got in ((ring4, 3), (ring4 + tall_static_bytes(128, 4), 4)):
        gpu = dataclasses.replace(gpu_target("sm_90a"), shared_per_cta=limit)
        assert tall_stages(4, 128, gpu) == got
    # stages=N is the most a ring gets: 5 stages of 128 k would pass 227 KB
    for most, got in ((8, 4), (5, 4), (3, 3), (2, 3)):
        for t in gemm_tiles(MOE, f"fuse-align,fuse-swiglu,tile{{stages={most}}},alloc"):
            assert t["stages"][-1] == got
    # 2 I = 320 columns: 5 tiles, not whole CTAs of 4
    odd = moegen.load_spec(gpu_cases.moe_spec(256, 160, 8, 2, tokens_max=4096, group=32))
    assert not any(any(t["tall"]) for t in gemm_tiles(odd))
    with pytest.raises(PipelineError, match=r"tile\{moe-block=128\} \(the tall tile\) needs the "
                                            r"weight's 320 columns"):
        lower(odd, "cuda", "fuse-align,fuse-swiglu,tile{moe-block=128},alloc")
    # a tuning entry may give block 128 only where the tall tile fits
    ctx_tuning = _Entries([[64, 8, 1, 8, 1, 16, 4], [4096, 128, 1, 4, 1, 16, 4]])
    with pytest.raises(PipelineError, match=r"tuning entry: a bucket of block 128 \(the tall "
                                            r"tile\) needs the weight's 320 columns in whole CTAs"):
        lower(odd, "cuda", tuning=ctx_tuning)
    # groups of 64 or 32 k: a stage holds one group
    for group in (64, 32):
        tiles = gemm_tiles(moegen.load_spec(gpu_cases.moe_spec(256, 128, 8, 2, tokens_max=4096,
                                                               group=group)))
        assert all(t["tall"][-1] and t["block_k"][-1] == group for t in tiles), group


def test_moe_block_128_is_the_tall_tile_for_every_call():
    """tile{moe-block=128}: every bucket, decode ones too, takes the tall tile (the whole K, no
    split, launched plainly), with stages=N as its only other option; options that pin another
    tile, and a tuning entry that splits a tall bucket, are errors."""
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"):
        spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
        for stages, want in ((None, 4), (3, 3), (8, 4)):
            opts = "moe-block=128" + (f",stages={stages}" if stages else "")
            module, _, pm = lower(spec, "cuda", f"fuse-align,fuse-swiglu,tile{{{opts}}},alloc",
                                  tuning=None)
            buckets = module.function().op("moe.align").attrs["block_buckets"]
            assert {b for _, b in buckets} == {128}
            for t in gemm_tiles(spec, f"fuse-align,fuse-swiglu,tile{{{opts}}},alloc"):
                assert all(t["tall"]) and set(t["split_k"]) == {1} and set(t["stages"]) == {want}
            plan = emit_moe(spec, module, pm.pipeline, "sm_90a").plan
            for g in plan["gemms"]:
                assert all(v["tall"] and v["follows_from"] is None for v in g["variants"]), name
    for opts in ("block-k=32", "wide-cols=4", "warp-rows=32", "wgmma=1", "warps=4", "split-k=2",
                 "split-k-down=2", "prefill-split-k=2", "prefill-split-k-down=2", "tall=1"):
        with pytest.raises(PipelineError, match=r"tile\{moe-block=128\} is the tall tile.*drop "
                                                + opts.split("=")[0]):
            lower(MOE, "cuda", f"fuse-align,fuse-swiglu,tile{{moe-block=128,{opts}}},alloc")
    with pytest.raises(PipelineError, match=r"tile\{moe-block=256\}: must be one of"):
        lower(MOE, "cuda", "tile{moe-block=256}")
    split_tall = _Entries([[64, 8, 1, 8, 1, 16, 4], [8192, 128, 2, 4, 1, 128, 4, 4, 32, 1]])
    with pytest.raises(PipelineError, match=r"tuning entry: split-k 2 in a bucket of block 128"):
        lower(MOE, "cuda", tuning=split_tall)


def msd_tile(m: int, pipeline: str | None = None) -> dict:
    spec = dataclasses.replace(MSD, msd=dataclasses.replace(MSD.msd, m=m))
    module = lower(spec, "cuda", pipeline, tuning=None)[0]
    return module.function().op("msd.group_loop").attrs["tile"]


def test_msd_warp_layout_follows_the_rows():
    """A vector warp for every row or two (up to 8), 8 n8 tiles per matrix warp, about three
    CTAs per SM along K (M = 1: six, in one wave, registers capped for them); the CTA's threads
    are what the launch plan says."""
    for m, want in ((1, (128, 2, 2, 8, 6, 3)), (4, (128, 4, 2, 4, 0, 4)),
                    (16, (256, 8, 4, 8, 0, 4))):
        t = msd_tile(m)
        assert (t["block_n"], t["vec_warps"], t["cube_warps"], t["split_k"], t["occupancy"],
                t["w_stages"]) == want
        ctas = 12288 // t["block_n"] * t["split_k"]
        assert ctas <= max(MSD_CTAS_PER_SM, t["occupancy"]) * 132 < 2 * ctas
    t = msd_tile(16, "tile{block-n=64,vec-warps=1,cube-warps=8},schedule,alloc")
    assert (t["block_n"], t["vec_warps"], t["cube_warps"]) == (64, 1, 8)
    # the occupancy as an option, and bounded by shared memory and by 80 registers a thread
    t = msd_tile(1, "tile{occupancy=0,stages=4},schedule,alloc")
    assert (t["split_k"], t["occupancy"], t["w_stages"]) == (4, 0, 4)
    # 45.6 KB each, 46.8 KB with the reserved 1 KB and the static line: 4 in 228 KB, not 5
    assert msd_tile(1, "tile{stages=4},schedule,alloc")["occupancy"] == 4
    assert msd_tile(1, "tile{block-n=256},schedule,alloc")["occupancy"] == 3  # 66 KB each
    t = msd_tile(4, "tile{block-n=64,cube-warps=1,occupancy=8},schedule,alloc")
    assert t["occupancy"] == 5                                      # 160 threads x 80 registers


@pytest.mark.parametrize("pipeline,message", [
    ("tile{block-n=32,cube-warps=8},schedule,alloc",
     "tile{cube-warps=8}: 32 columns per CTA (block-n) give each matrix warp less than one n8 "
     "tile: at most 4 matrix warps"),
    ("tile{vec-warps=3},schedule,alloc", "tile{vec-warps=3}: must be one of 1, 2, 4, 8"),
])
def test_msd_warp_options_fail_clearly(pipeline, message):
    with pytest.raises(PipelineError, match=re.escape(message)):
        msd_tile(1, pipeline)


def test_msd_rows_past_shared_memory_fail_naming_what_was_set():
    """Rows whose unfolded slices pass shared memory even at 16 columns a CTA: the error names
    msd.m (no option set), or the block-n option that fixed the columns, and says whether 2
    weight ring stages would fit; with them the kernel builds."""
    with pytest.raises(PipelineError, match=r"msd\.m = 100: .* at 16 columns a CTA and 4 weight "
                                            r"ring stages .*: 2 weight ring stages fit "
                                            r"\(tile\{stages=2\}\)"):
        msd_tile(100)
    assert msd_tile(100, "tile{stages=2},schedule,alloc")["w_stages"] == 2
    with pytest.raises(PipelineError, match=r"msd\.m = 1000: .*: fewer rows a call"):
        msd_tile(1000)
    with pytest.raises(PipelineError, match=r"tile\{block-n=32\}: .* at 32 columns a CTA and 2 "
                                            r"weight ring stages .*: fewer columns per CTA"):
        msd_tile(100, "tile{block-n=32,stages=2},schedule,alloc")


def test_msd_warp_options_are_refused_on_moe():
    for opt in ("vec-warps=2", "cube-warps=2"):
        with pytest.raises(PipelineError, match=re.escape(f"tile{{{opt.split('=')[0]}=...}}: an "
                                                          "MSD option; this is an MoE spec")):
            lower(MOE, "cuda", f"fuse-align,fuse-swiglu,tile{{{opt}}},alloc")


def test_split_k_divides_k_and_fills_the_gpu():
    module, _, _ = lower(moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml"), "cuda")
    gemms = [op for op in module.function().ops if op.NAME == "moe.grouped_gemm_w4a16"]
    for op in gemms:
        tile = op.attrs["tile"]
        k = op.operands[0].type.shape[1].value
        assert (k // 16) % (tile["split_k"][0] * tile["warps"][0]) == 0
    # Mixtral at T=1: 2 experts x 28672/64 tiles already fill the GPU; down has 2 x 64 tiles,
    # split to about 16 warps an SM: 8 ways in the single-token bucket (2 warps a CTA), 4 in
    # the T = 2..16 bucket (4 warps, the split it had before T = 1 had a bucket of its own); in
    # the T = 17..64 bucket its tiles fill the GPU, but K = 14336 (896 k16 steps) splits until a
    # CTA takes at most DECODE_CTA_STEPS (256): 4 ways; gate/up's K (256 steps) stays whole.
    # Above T = 52 (13 slots an average expert) the wide CTA of block 32 takes decode calls:
    # gate/up's 8 experts x 112 CTA tiles fill 4 CTAs an SM whole (not split), down's 8 x 16
    # split 4 ways, its grid split 8 for calls whose blocks fill less of the SMs (split_many 4:
    # call_split). So does the prefill bucket up to T = 159, whose largest call's 10 blocks x 16
    # down tiles still leave the SMs short (its gate/up fills them whole: not split). On
    # warpgroup MMA every wide CTA, split or whole, has its registers capped for 4 CTAs an SM.
    # From T = 160 (40 slots an average expert, of 8 experts) the tall tile of block 128 (16
    # warps).
    assert gemms[0].attrs["block_buckets"] == [[1, 8], [16, 8], [52, 16], [64, 32], [159, 32],
                                              [8192, 128]]
    assert gemms[0].attrs["tile"]["split_k"] == gemms[0].attrs["tile"]["split_many"] == [1] * 6
    assert gemms[1].attrs["tile"]["split_many"] == [8, 4, 4, 4, 4, 1]
    assert gemms[1].attrs["tile"]["split_k"] == [8, 4, 4, 8, 8, 1]
    assert gemms[0].attrs["tile"]["warps"] == gemms[1].attrs["tile"]["warps"] == [2, 4, 4, 4, 4,
                                                                                  16]
    for op in gemms:
        tile = op.attrs["tile"]
        assert tile["col_tiles"] == [1, 1, 1, 4, 4, 4] and tile["wgmma"] == [False] * 3 + [True] * 3
        assert tile["stages"][3:] == [4, 4, 4]
        assert tile["ctas_per_sm"] == [0, 0, 0, 4, 4, 0]
        assert tile["tall"] == [False] * 5 + [True] and tile["block_k"][-1] == 128
    # Qwen3 (8 x 32 tiles) and DeepSeek (6 x 32) have no single-token bucket
    for name in ("qwen3-30b-a3b", "deepseek-v2-lite"):
        module, _, _ = lower(moegen.load_spec(ROOT / "examples" / f"{name}.yaml"), "cuda")
        op = next(op for op in module.function().ops if op.NAME == "moe.grouped_gemm_w4a16")
        assert op.attrs["block_buckets"][0] == [16, 8] and op.attrs["tile"]["warps"][0] == 4
    # a spec of one token at most has one bucket, an ordinary one (4 warps), even where the
    # down GEMM of a token splits
    module, _, _ = lower(moegen.load_spec(moe_spec(4096, 1408, 8, 2, tokens_max=1)), "cuda")
    for op in (op for op in module.function().ops if op.NAME == "moe.grouped_gemm_w4a16"):
        assert op.attrs["block_buckets"] == [[1, 8]] and op.attrs["tile"]["warps"] == [4]


def test_msd_passes_printed():
    module, ctx, _ = lower(MSD, "ascend")
    check_lines(str(module), [
        r"%acc = msd\.group_loop\(%zero\) \{groups = 64, group_size = 128, tile = \{matmulTiling "
        r"= \{usedCoreNum = 24, M = 3, N = 12288, .*singleCoreN = 512, .*\}, m = 1, n = 12288, "
        r"k = 8192, .*mergeChunk = 256\}",
        r"schedule = \"preload\", slots = \{a_max = 2, a_unfold = 3, y_int = 2\}",
        r"msd\.unfold", r"msd\.int_matmul", r"msd\.merge", r"msd\.yield", r"tensor\.cast",
    ])
    module, _, _ = lower(MSD, "cuda", "tile,schedule{mode=basic},alloc")
    assert 'schedule = "basic", slots = {a_max = 1, a_unfold = 1, y_int = 1}' in str(module)


# --- alloc -------------------------------------------------------------------------------------

def random_dag_buffers(rng, n_ops):
    """Buffers of a random DAG in topological order: each op reads 1-3 earlier values."""
    g = nx.gnp_random_graph(n_ops, 0.2, seed=int(rng.integers(1 << 30)), directed=True)
    dag = nx.DiGraph([(u, v) for u, v in g.edges if u < v])
    dag.add_nodes_from(range(n_ops))
    bufs = []
    for v in range(n_ops):
        last = max([w for w in dag.successors(v)], default=v)
        bufs.append(Buffer(f"v{v}", int(rng.integers(1, 5000)), v, last))
    return bufs


def test_alloc_never_overlaps_live_buffers(rng):
    for _ in range(200):
        bufs = random_dag_buffers(rng, int(rng.integers(2, 40)))
        align = int(rng.choice([1, 64, 256]))
        assign_offsets(bufs, align)
        for i, a in enumerate(bufs):
            assert a.offset % align == 0
            for b in bufs[i + 1:]:
                if a.live_with(b):
                    assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
        peak = max(sum(b.size for b in bufs if b.start <= t <= b.end)
                   for t in range(max(b.end for b in bufs) + 1))
        assert max(b.offset + b.size for b in bufs) >= peak


def test_alloc_check_catches_overlap():
    a, b = Buffer("a", 512, 0, 2, offset=0), Buffer("b", 512, 1, 3, offset=256)
    with pytest.raises(AllocError, match="live together and overlap"):
        check_no_overlap([a, b], 256)


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "msd" not in p.name], ids=lambda p: p.stem)
def test_alloc_moe_shares_memory(path):
    spec = moegen.load_spec(path)
    module, ctx, _ = lower(spec, "cuda")
    plan = ctx.results["alloc"]
    assert plan.size < plan.naive
    by = {b.name: b for b in plan.buffers}
    # gate/up output dies in the SwiGLU: the down output reuses its memory
    assert by["activation"].size == spec.tokens.max * spec.moe.top_k * spec.moe.intermediate_size * 2
    # with the seed's separate SwiGLU, gate/up output dies in the SwiGLU: down reuses its memory
    _, ctx2, _ = lower(spec, "cuda", "fuse-align,tile,alloc")
    by2 = {b.name: b for b in ctx2.results["alloc"].buffers}
    assert by2["down"].offset < by2["gate_up"].offset + by2["gate_up"].size
    assert ctx2.results["alloc"].size < ctx2.results["alloc"].naive
    assert module.attrs["workspace"]["bytes"] == plan.size
    for op in module.function().ops:
        for r, off in zip(op.results, op.attrs.get("offsets", [])):
            if off >= 0:
                assert by[r.name].offset == off


def test_alloc_msd_rotating_buffers_take_their_slots():
    module, ctx, _ = lower(MSD, "ascend")
    by = {b.name: b for b in ctx.results["alloc"].buffers}
    assert by["a_unfold"].slots == 3 and by["a_unfold"].size == 3 * (3 * 1 * 128 // 2)
    assert by["y_int"].slots == 2 and by["y_int"].size == 2 * 3 * 12288 * 4
    assert by["a_max"].slots == 2
    assert "x_g" not in by and "acc_out" not in by  # views and the in-place accumulator
    plan = plan_of(module, MSD.tokens.max)
    assert plan.size == ctx.results["alloc"].size


class _Entries:
    """A tuning database lookup answering fixed buckets, each (edge, MoeConfig's fields in
    order: moe_block, split_k, stages, split_k_down, block_k, warps, col_tiles, warp_rows,
    wgmma, wide_decode)."""
    def __init__(self, buckets):
        self.buckets = [TunedBucket(edge, MoeConfig(*fields)) for edge, *fields in buckets]

    def lookup(self, spec, target, gpu=None):
        return {"buckets": self.buckets}


def test_wide_decode_split_sized_for_the_ctas_an_sm_it_is_capped_for():
    """The decode bucket's wide CTA (Mixtral T = 53..64) is split over K for as many CTAs an SM
    as its registers are capped for: 4 of one warpgroup, 2 of two (wide-cols=8), so the down
    GEMM's 64 CTAs of two warpgroups split 4 ways (256 CTAs on 132 SMs), not 8."""
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    for tile_opts, cols, ctas, down_split in (("", 4, 4, 4), ("wide-cols=8", 8, 2, 4)):
        module = lower(mixtral, "cuda", f"fuse-align,fuse-swiglu,tile{{{tile_opts}}},alloc")[0]
        up, down = [op.attrs["tile"] for op in module.function().ops
                    if op.NAME == "moe.grouped_gemm_w4a16"]
        for tile, n in ((up, 14336 * 2), (down, 4096)):
            grid = 8 * n // 64 // cols             # CTAs per K range, every expert routed
            split = tile["split_many"][3]
            # doubled while the CTAs fit, or 1 where one split fills the SMs already; a split
            # above 1 doubled again in the grid, for calls of fewer blocks (call_split); the
            # registers capped for those CTAs an SM (on warpgroup MMA also where K is whole)
            assert grid * split <= max(grid, ctas * 132) < grid * split * 2
            assert tile["split_k"][3] == (2 * split if split > 1 else 1)
            assert (tile["col_tiles"][3], tile["ctas_per_sm"][3]) == (cols, ctas)
        assert down["split_many"][3] == down_split


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("h,i,e,k,group", [(128, 96, 4, 2, 32), (64, 512, 16, 8, 32),
                                           (1024, 32, 16, 8, 32), (1792, 96, 4, 1, 32)])
def test_a_gemm_no_wide_cta_divides_keeps_the_k_split_cta(arch, h, i, e, k, group):
    """Where a decode bucket would take the wide CTA split over K but no wide CTA divides the
    GEMM's column tiles (gate/up of I = 96: 3 tiles of 64), the bucket runs the K-split CTA
    with the split the tile pass chose and checked for its warps: never the wide CTA's doubled
    split (which left 4 x 4 warps over K = 128's 8 steps and failed the kernel's static_assert),
    and no split per call, which the K-split kernel does not take."""
    spec = moe_spec(h, i, e, k, group=group)
    spec["targets"]["cuda"]["arch"] = arch
    module = lower(moegen.load_spec(spec), "cuda", None, tuning=None, arch=arch)[0]
    checked = 0
    for op in module.function().ops:
        if op.NAME != "moe.grouped_gemm_w4a16":
            continue
        kdim = op.operands[1].type.shape[1].value
        tile = op.attrs["tile"]
        for b, ((edge, block), cols) in enumerate(zip(op.attrs["block_buckets"],
                                                     tile["col_tiles"])):
            if cols > 1 or tile["tall"][b]:
                continue
            split, warps = tile["split_k"][b], tile["warps"][b]
            assert kdim // 16 % (split * warps * tile["block_k"][b] // 16) == 0, (edge, block)
            assert tile["split_many"][b] == split
            checked += 1
    assert checked


def test_random_shapes_lower_and_verify(rng):
    """200 specs of random shape, quantization, activation type, token limit and arch
    (gpu_cases.random_moe_spec) lower through the default pipeline, the verifier holding after
    every pass: each bucket's K split is one its kernel runs (the IR verifier's rule)."""
    for i in range(200):
        data = gpu_cases.random_moe_spec(rng, f"r{i}")
        try:
            lower(moegen.load_spec(data), "cuda", None, tuning=None,
                  arch=data["targets"]["cuda"]["arch"])
        except Exception as exc:
            raise AssertionError(f"{data}: {exc}") from exc


def test_prefill_bucket_splits_only_where_its_largest_call_leaves_the_sms_short():
    """A prefill bucket of the wide CTA splits a GEMM over K only where even its largest call's
    CTA tiles stay under 4 CTAs an SM on every SM: Mixtral's down GEMM up to T = 255 in plans
    for sm_90a (16 blocks x 16 tiles = 256 < 528), not its gate/up (448 tiles a block), not
    Qwen3's or DeepSeek's, and not Mixtral's where the bucket reaches T = 8192 (sm_80 plans,
    tall=0); prefill-split-k=1 keeps it whole, split-k (the decode buckets') does not."""
    from moegen.passes.tiling.moe_buckets import prefill_short
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    # the down GEMM (64 tiles, 16 CTA tiles a block): short up to 32 blocks (T = 512), not from
    # 33 (T = 528); gate/up (448 tiles) never; block 128 (the tall tile) is not the wide CTA's
    assert prefill_short(mixtral, H200, 255, 32, 64, 4, 32) and prefill_short(mixtral, H200, 512, 32, 64, 4, 32)
    assert not prefill_short(mixtral, H200, 528, 32, 64, 4, 32)
    assert not prefill_short(mixtral, H200, 65, 32, 448, 4, 32)
    assert not prefill_short(mixtral, H200, 255, 128, 64, 4, 32)

    def prefill_splits(spec, arch="sm_90a", pipeline=None):
        module = lower(spec, "cuda", pipeline, tuning=None, arch=arch)[0]
        gemms = [op for op in module.function().ops if op.NAME == "moe.grouped_gemm_w4a16"]
        buckets = gemms[0].attrs["block_buckets"]
        return [[sp for (edge, block), sp in zip(buckets, g.attrs["tile"]["split_many"])
                 if edge > 64 and block == 32] for g in gemms]
    assert prefill_splits(mixtral) == [[1], [4]]
    assert prefill_splits(mixtral, "sm_80") == [[1], [1]]
    assert prefill_splits(mixtral, pipeline="fuse-align,fuse-swiglu,tile{tall=0},alloc") == \
        [[1], [1]]
    assert prefill_splits(mixtral, pipeline="fuse-align,fuse-swiglu,tile{split-k=1},alloc") == \
        [[1], [4]]
    assert prefill_splits(
        mixtral, pipeline="fuse-align,fuse-swiglu,tile{tall=0,prefill-split-k=1},alloc") == \
        [[1], [1]]
    for name in ("qwen3-30b-a3b", "deepseek-v2-lite"):
        spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
        assert all(set(s) == {1} for s in prefill_splits(spec)), name


def test_prefill_split_options():
    """prefill-split-k / prefill-split-k-down split the prefill buckets' GEMMs over K: the wide
    CTA as a split decode bucket's (registers capped, the split as given, not doubled), the
    K-split CTA under wide-cols=0; they pin the prefill tile (no tall bucket) and set a tuning
    entry aside; a split that does not fit names its option."""
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")

    def prefill(opts: str, spec=mixtral, tuning=None) -> list[tuple]:
        module = lower(spec, "cuda", f"fuse-align,fuse-swiglu,tile{{{opts}}},alloc",
                       tuning=tuning, arch="sm_90a")[0]
        gemms = [op for op in module.function().ops if op.NAME == "moe.grouped_gemm_w4a16"]
        buckets = gemms[0].attrs["block_buckets"]
        return [(edge, block, t["col_tiles"][i], t["split_k"][i], t["split_many"][i],
                 t["ctas_per_sm"][i])
                for g in gemms for t in [g.attrs["tile"]]
                for i, (edge, block) in enumerate(buckets) if edge > 64]
    assert prefill("prefill-split-k-down=4") == [(8192, 32, 4, 1, 1, 4), (8192, 32, 4, 4, 4, 4)]
    assert prefill("prefill-split-k=2") == [(8192, 32, 4, 2, 2, 4), (8192, 32, 4, 2, 2, 4)]
    assert prefill("prefill-split-k=2,prefill-split-k-down=8") == [
        (8192, 32, 4, 2, 2, 4), (8192, 32, 4, 8, 8, 4)]
    assert prefill("prefill-split-k-down=4,wide-cols=0") == [
        (8192, 32, 1, 1, 1, 0), (8192, 32, 1, 4, 4, 0)]
    # the decode buckets keep their own splits
    default = gemm_tiles(mixtral)
    split = gemm_tiles(mixtral, "fuse-align,fuse-swiglu,tile{prefill-split-k=2},alloc")
    assert [t["split_k"][:4] for t in split] == [t["split_k"][:4] for t in default]
    # a tuning entry is set aside
    entry = _Entries([[64, 8, 1, 8, 1, 16, 4], [8192, 32, 1, 4, 1, 32, 4, 4, 32, 1]])
    assert prefill("prefill-split-k-down=2", tuning=entry)[-1] == (8192, 32, 4, 2, 2, 4)
    with pytest.raises(PipelineError, match=r"tile\{prefill-split-k-down=3\}: K = 14336 does "
                                            r"not split into 3"):
        prefill("prefill-split-k-down=3")
    # K = 384 (3 groups of 128): its 24 k16 steps split in 2 over 4 warps, its groups do not
    odd = moegen.load_spec(moe_spec(1024, 384, 8, 2, tokens_max=1024))
    with pytest.raises(PipelineError, match=r"tile\{prefill-split-k=2\}: the wide CTA splits "
                                            r"K = 384 into whole groups of 128"):
        prefill("prefill-split-k=2", odd)


@pytest.mark.parametrize("config,message", [
    ({"moe_block": 3, "split_k": 1}, "the bucket up to T = 8192 has moe-block 3: must be one of "
                                     "1, 2, 4, 8, 16, 32, 64, 128"),
    ({"moe_block": 8, "split_k": 0}, "has split-k 0: must be an integer >= 1"),
    ({"moe_block": 8, "split_k": True}, "has split-k True: must be an integer >= 1"),
    ({"moe_block": 8, "split_k": 1, "split_k_down": "2"},
     "has split-k-down '2': must be an integer >= 1"),
    ({"moe_block": 8, "split_k": 1, "stages": 0}, "has stages 0: must be an integer >= 1"),
    ({"moe_block": 8, "split_k": 1, "block_k": 48}, "has block-k 48: must be one of 16, 32"),
    ({"moe_block": 8, "split_k": 1, "warps": 3}, "has warps 3: must be one of 1, 2, 4, 8"),
    ({"moe_block": 32, "split_k": 1, "col_tiles": 3},
     "has wide-cols 3: must be one of 0, 1, 2, 4, 8"),
    ({"moe_block": 32, "split_k": 1, "col_tiles": 4, "warp_rows": 48},
     "has warp-rows 48: must be one of 32, 64"),
    ({"moe_block": 32, "split_k": 1, "col_tiles": 4, "wide_decode": 2},
     "has wide_decode 2: must be one of 0, 1"),
    ({"moe_block": 8}, "a recorded MoE config lacks split_k (its keys: moe_block, split_k, "
                       "stages, split_k_down, block_k, warps, col_tiles, warp_rows, wgmma, "
                       "wide_decode)"),
    ({"moe_block": 8, "split_k": 1, "colour": 2}, "a recorded MoE config has unknown key "
                                                  "'colour'"),
])
def test_a_hand_edited_tuning_entry_fails_naming_the_field(tmp_path, config, message):
    """A tuning database is a file people may edit: each field of a recorded config must take
    a value its option takes and be one of MoeConfig's, a block must fit the routing buffers
    (the spec's moe.block_size where it sets one); the error names the bucket, the field and
    the rule."""
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    device = tdb.Device("NVIDIA H200", "nvrtc 13.0")
    db = tdb.TuningDB(tmp_path / "t.json")
    db.record(spec, device, [{"tokens": 64, "config": config, "time_us": 1.0,
                              "default_us": 1.0, "checked": True}])
    with pytest.raises(PipelineError, match=re.escape(f"tuning entry: {message}") if
                       message.startswith(("the bucket", "a recorded")) else re.escape(message)):
        lower(spec, "cuda", tuning=tdb.Tuning(tdb.TuningDB(tmp_path / "t.json"), device))


def test_tuning_entry_buckets_must_ascend():
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    with pytest.raises(PipelineError, match=re.escape(
            "tuning entry: the bucket up to T = 32: bucket ends must be integers that ascend")):
        lower(spec, "cuda", tuning=_Entries([[64, 8, 1], [32, 8, 1], [8192, 8, 1]]))


def test_a_tuning_entry_keeps_the_spec_block_and_the_msd_option_values():
    seed = moegen.load_spec(ROOT / "examples" / "moe-seed.yaml")          # moe.block_size 4
    with pytest.raises(PipelineError, match=r"the bucket up to T = 64 has moe-block 32: must be "
                                            r"the spec's moe\.block_size, 4"):
        lower(seed, "cuda", tuning=_Entries([[64, 32, 1]]))
    entry = type("Entry", (), {"lookup": lambda self, spec, target, gpu=None: {"block_n": 100}})()
    with pytest.raises(PipelineError, match=r"tuning entry has block-n 100: must be one of 16, "
                                            r"32, 64, 128, 256"):
        lower(MSD, "cuda", tuning=entry)


def test_tuning_entry_puts_the_wide_cta_in_a_decode_bucket():
    """An entry's column tiles (col_tiles) in a decode bucket build the wide CTA split over K as
    the entry says, registers capped for 4 CTAs an SM (2 of two warpgroups); a split that cuts a
    scale group fails."""
    mixtral = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    head = [[1, 8, 1, 8, 8, 16, 2], [16, 8, 1, 8, 4, 16, 4]]
    prefill = [8192, 32, 1, 4, 1, 32, 4, 4, 32, 1]
    module = lower(mixtral, "cuda", tuning=_Entries(
        head + [[64, 32, 2, 4, 8, 32, 4, 4, 32, 1], prefill]))[0]
    up, down = [op.attrs["tile"] for op in module.function().ops
                if op.NAME == "moe.grouped_gemm_w4a16"]
    for tile, split in ((up, 2), (down, 8)):
        assert (tile["col_tiles"][2], tile["split_k"][2], tile["ctas_per_sm"][2],
                tile["wgmma"][2], tile["stages"][2]) == (4, split, 4, True, 4)
        assert tile["ctas_per_sm"][3] == 4 and tile["split_k"][3] == 1   # (warpgroup MMA)
    # two warpgroups a CTA (8 column tiles): capped for 2 CTAs an SM, the same 16 warps
    module = lower(mixtral, "cuda", tuning=_Entries(
        head + [[64, 32, 2, 4, 8, 32, 8, 8, 32, 1], prefill]))[0]
    for op in module.function().ops:
        if op.NAME == "moe.grouped_gemm_w4a16":
            tile = op.attrs["tile"]
            assert (tile["col_tiles"][2], tile["warps"][2], tile["ctas_per_sm"][2]) == (8, 8, 2)
    # down's K = 14336 has 112 scale groups: a split of 64 (896 k16 steps, whole for 1 warp of
    # 16 k a stage) would leave CTAs parts of groups
    with pytest.raises(PipelineError, match="whole groups of 128"):
        lower(mixtral, "cuda", tuning=_Entries(head + [[64, 32, 1, 4, 64, 16, 1, 4, 32, 1],
                                                       prefill]))


def test_ring_sizes_follow_the_kernels_stage_layout():
    """The tile pass sizes the GEMM rings (gemm_stages, wide_stages) with the stage layout of
    the device headers: a group's staged scales (SCALE_STAGE_BYTES) and the 16 bytes
    after each staged activation row. A change to either side alone would size shared memory
    for another kernel."""
    from moegen.passes.tiling.cta import RING_ROW_PAD, SCALE_BYTES
    header = "".join(device_headers().values())
    assert int(re.search(r"constexpr int SCALE_STAGE_BYTES = (\d+);", header).group(1)) == SCALE_BYTES
    pads = re.findall(r"A_ROW = 32 \* KS \+ (\d+);", header)
    assert len(pads) == 2 and {int(p) for p in pads} == {RING_ROW_PAD}
