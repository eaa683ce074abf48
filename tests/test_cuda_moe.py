"""The CUDA MoE layer against the numpy reference (run with -m gpu on a GPU machine)."""
import json
import re

import numpy as np
import pytest

import moegen
from moegen import reference as R
from moegen.ir import interp
from conftest import ROOT
from gpu_cases import layer_for, moe_spec, moe_weights

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

POISON = np.float16(np.nan)


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    assert not np.isnan(a).any(), "NaN in the output (unwritten or poisoned)"
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def run_case(rng, layer, t, use_router=True, weights=None):
    m, g = layer.spec.moe, layer.spec.quant.group_size
    if weights is None:
        weights = moe_weights(rng, m.num_experts, m.hidden_size, m.intermediate_size, g)
        weights = weights, layer.pack(*weights)
    weights, packed = weights
    x = (rng.standard_normal((t, m.hidden_size))).astype(np.float16)
    logits = rng.standard_normal((t, m.num_experts)).astype(np.float32)
    ids, w = R.topk_softmax(logits, m.top_k, m.renormalize)
    layer.out.fill(POISON)
    if use_router:
        y = layer(cp.asarray(x), cp.asarray(logits), packed)
    else:
        y = layer(cp.asarray(x), packed, topk_ids=cp.asarray(ids), topk_weights=cp.asarray(w))
    want = R.moe_w4a16(x, ids, w, *weights, group_size=g)
    return cp.asnumpy(y), want


def assert_matches_reference(rng, layer, tokens):
    """One draw of weights, packed once; each T in `tokens` (the router on odd T, the given
    routing on even T) against the reference, relative error <= 2e-3."""
    m, g = layer.spec.moe, layer.spec.quant.group_size
    host = moe_weights(rng, m.num_experts, m.hidden_size, m.intermediate_size, g)
    packed = layer.pack(*host)
    for t in tokens:
        got, want = run_case(rng, layer, t, use_router=t % 2 == 1, weights=(host, packed))
        err = rel_err(got, want)
        assert err <= 2e-3, f"T={t}: relative error {err:.2e}"


def assert_two_runs_bitwise_equal(layer, x, logits, packed, what=""):
    """Two calls on the same inputs, the output poisoned between them, give the same bits."""
    a = cp.asnumpy(layer(x, logits, packed)).view(np.uint16)
    layer.out.fill(POISON)
    b = cp.asnumpy(layer(x, logits, packed)).view(np.uint16)
    assert np.array_equal(a, b), f"{what}: two runs differ"


def captured_call(rng, layer, packed, t):
    """One call on random inputs captured in a CUDA graph: (x, logits, y, graph, stream); a
    replay reads what is set into x and logits and writes y."""
    m = layer.spec.moe
    x = cp.asarray(rng.standard_normal((t, m.hidden_size)).astype(np.float16))
    logits = cp.asarray(rng.standard_normal((t, m.num_experts)).astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    # (x, logits and the packed weights were made on the default stream, which a non-blocking
    # stream does not wait for)
    cp.cuda.Stream.null.synchronize()
    with stream:
        layer(x, logits, packed)           # warm up (module load) outside the capture
        stream.synchronize()
        stream.begin_capture()
        y = layer(x, logits, packed)
        graph = stream.end_capture()
    return x, logits, y, graph, stream


def assert_graph_replays(rng, layer, host_w, packed, t, pushes=(0.0, 0.0, 0.0)):
    """Capture one call in a CUDA graph, replay it with new inputs set into the captured
    buffers, each replay against the reference. A replay's push is added to the logits of
    experts 0 .. top_k - 1 (a large one routes every token to them)."""
    m = layer.spec.moe
    x, logits, y, graph, stream = captured_call(rng, layer, packed, t)
    for push in pushes:
        xn = rng.standard_normal((t, m.hidden_size)).astype(np.float16)
        ln = rng.standard_normal((t, m.num_experts)).astype(np.float32)
        ln[:, :m.top_k] += push
        with stream:
            x.set(xn)
            logits.set(ln)
            layer.out.fill(POISON)
        graph.launch(stream)
        stream.synchronize()
        ids, w = R.topk_softmax(ln, m.top_k, m.renormalize)
        if push >= 20:
            assert np.array_equal(np.unique(ids), np.arange(m.top_k))
        want = R.moe_w4a16(xn, ids, w, *host_w, group_size=layer.spec.quant.group_size)
        assert rel_err(cp.asnumpy(y), want) <= 2e-3, f"replay with logits pushed by {push}"


def test_seed_worked_example(rng):
    spec = moegen.load_spec(ROOT / "examples" / "moe-seed.yaml")
    layer = layer_for(spec)
    m = spec.moe
    weights = moe_weights(rng, m.num_experts, m.hidden_size, m.intermediate_size, 128)
    packed = layer.pack(*weights)
    x = rng.standard_normal((3, m.hidden_size)).astype(np.float16)
    ids = np.array([1, 0, 1, 1, 0, 2], np.int32).reshape(3, 2)
    w = rng.random((3, 2), dtype=np.float32)
    layer.out.fill(POISON)
    y = layer(cp.asarray(x), packed, topk_ids=cp.asarray(ids), topk_weights=cp.asarray(w))
    ws = layer.plan["workspace"]["buffers"]
    buf = layer.workspace
    sorted_ids = cp.asnumpy(layer._view(cp, buf, "sorted_token_ids", cp.int32, 12))
    expert_ids = cp.asnumpy(layer._view(cp, buf, "expert_ids", cp.int32, 3))
    wflat = cp.asnumpy(layer._view(cp, buf, "topk_weights_flat", cp.float32, 12))
    total = int(cp.asnumpy(layer._view(cp, buf, "num_tokens_post_padded", cp.int32, 1))[0])
    assert total == 12 and "sorted_token_ids" in ws
    assert sorted_ids.tolist() == [1, 4, 6, 6, 0, 2, 3, 6, 5, 6, 6, 6]
    assert expert_ids.tolist() == [0, 1, 2]
    wf = w.ravel()
    assert wflat.tolist() == [wf[1], wf[4], 0, 0, wf[0], wf[2], wf[3], 0, wf[5], 0, 0, 0]
    want = R.moe_w4a16(x, ids, w, *weights, group_size=128)
    assert rel_err(cp.asnumpy(y), want) <= 2e-3


SHAPES = [(256, 128, 8, 2), (1024, 512, 60, 6), (2048, 768, 128, 8), (4096, 1408, 64, 1),
          (256, 128, 128, 8), (1024, 512, 8, 1), (2048, 768, 64, 2)]
TOKENS = [1, 3, 16, 33, 64, 123, 222, 1024, 4096]


@pytest.mark.parametrize("h,i,e,k", SHAPES, ids=[f"h{s[0]}-i{s[1]}-e{s[2]}-k{s[3]}" for s in SHAPES])
def test_against_reference(rng, h, i, e, k):
    layer = layer_for(moe_spec(h, i, e, k))
    assert_matches_reference(rng, layer, TOKENS)


def test_group_sizes_and_odd_columns(rng):
    for g, h, i in ((32, 96, 160), (64, 320, 192)):
        layer = layer_for(moe_spec(h, i, 8, 2, tokens_max=256, group=g))
        for t in (1, 7, 100):
            got, want = run_case(rng, layer, t)
            assert rel_err(got, want) <= 2e-3, (g, h, i, t)


def test_a_gemm_no_wide_cta_divides(rng):
    """I = 96 with groups of 32 and zero points: gate/up's 3 column tiles divide into no wide
    CTA, so the decode bucket that would split the wide CTA over K runs the K-split CTA there
    (with a split its 4 warps divide, K = 128) beside the down GEMM's wide CTA; each T against
    the reference."""
    spec = moegen.load_spec(moe_spec(128, 96, 4, 2, group=32, symmetric=False))
    layer = layer_for(spec)
    kinds = {(v["col_tiles"], v["split"]) for g in layer.plan["gemms"] if g["name"] == "gate_up"
             for v in g["variants"]}
    assert (1, 2) in kinds, kinds
    w13, w2 = R.random_moe_weights(rng, spec)          # with zero points, as the spec asks
    packed = layer.pack(w13, w2)
    for t in (1, 16, 27, 40, 64, 65, 300):
        x = rng.standard_normal((t, 128)).astype(np.float16)
        logits = rng.standard_normal((t, 4)).astype(np.float32)
        ids, w = R.topk_softmax(logits, 2, spec.moe.renormalize)
        layer.out.fill(POISON)
        got = cp.asnumpy(layer(cp.asarray(x), cp.asarray(logits), packed) if t % 2 else
                         layer(cp.asarray(x), packed, topk_ids=cp.asarray(ids),
                               topk_weights=cp.asarray(w)))
        want = R.moe_w4a16_weights(x, ids, w, w13, w2, spec.quant.group_size)
        assert rel_err(got, want) <= 2e-3, f"T={t}: relative error {rel_err(got, want):.2e}"


def test_a_spec_of_one_token(rng):
    """tokens.max = 1: one ordinary bucket (4 warps), also where a larger spec of the same
    model would give T = 1 its single-token bucket (the first shape)."""
    for h, i, e, k in ((256, 128, 8, 2), (1024, 512, 64, 6)):
        layer = layer_for(moe_spec(h, i, e, k, tokens_max=1))
        assert all(len(kern["buckets"]) == 1 for kern in layer.plan["kernels"]
                   if "buckets" in kern), layer.plan["kernels"]
        for use_router in (True, False):
            got, want = run_case(rng, layer, 1, use_router=use_router)
            assert rel_err(got, want) <= 2e-3, (h, i, e, k, use_router)


MANY = [(256, 128, 512, 8), (512, 256, 256, 6)]


@pytest.mark.parametrize("h,i,e,k", MANY, ids=[f"e{s[2]}-k{s[3]}" for s in MANY])
def test_hundreds_of_experts(rng, h, i, e, k):
    """Up to the spec's limit of 512 experts: the router's top-k over every logit (ties and
    -inf included, both routers), align's counts and offsets over every expert where most get
    no slot (decode) or a few (prefill), and a graph replay that routes every token to the
    same k experts; each against the reference."""
    spec = moe_spec(h, i, e, k, tokens_max=2048)
    layer = layer_for(spec)
    assert_matches_reference(rng, layer, (1, 3, 16, 17, 64, 333, 2048))
    logits = rng.standard_normal((40, e)).astype(np.float32)
    logits[3, :] = 0.0                     # ties everywhere: the lowest expert ids
    logits[4, e - k:] = 50.0               # the last k experts
    logits[5, k + 1:] = -np.inf            # all but k + 1 experts ruled out
    want_ids, want_w = R.topk_softmax(logits, k, layer.spec.moe.renormalize)
    for router in ("redux", "shuffle"):
        by = layer_for(spec, pipeline=f"fuse-align,fuse-swiglu,tile{{router={router}}},alloc")
        ids, w = (cp.asnumpy(a) for a in by.route(cp.asarray(logits)))
        assert np.array_equal(ids, want_ids), router
        assert np.allclose(w, want_w, rtol=1e-5, atol=1e-6), router
    host_w = moe_weights(rng, e, h, i, 128)
    assert_graph_replays(rng, layer, host_w, layer.pack(*host_w), t=64, pushes=(0.0, 30.0))


BLOCK_K32 = "fuse-align,fuse-swiglu,tile{block-k=32},alloc"


@pytest.mark.parametrize("h,i,e,k,g", [(1024, 512, 8, 2, 128), (2048, 768, 128, 8, 128),
                                       (4096, 1408, 64, 1, 128), (256, 128, 8, 2, 64)])
def test_two_k16_steps_per_ring_stage(rng, h, i, e, k, g):
    """tile{block-k=32}: the same layer with two k16 steps in each cp.async ring stage."""
    layer = layer_for(moe_spec(h, i, e, k, tokens_max=1024, group=g), pipeline=BLOCK_K32)
    assert re.search(r"block_k = \[32(, 32){2,}\]", layer.program.ir)    # in every bucket
    assert_matches_reference(rng, layer, (1, 16, 33, 222, 1024))


@pytest.mark.parametrize("g,tile", [(64, ""), (64, ",block-k=32"), (128, ",moe-block=32"),
                                    (128, ",stages=6")])
def test_k_loop_unrolled_over_whole_ring_turns(rng, g, tile):
    """The K-split CTA's loop unrolled over whole ring turns that span several scale groups
    (group 64 at 8 stages, 2 k16 steps a stage at 4), block 32 at 4 stages (5 fit), and a ring
    asked for 6 stages (4 built), each warp's K range a whole number of turns (no K split)."""
    layer = layer_for(moe_spec(1024, 512, 8, 2, tokens_max=64, group=g),
                      pipeline=f"fuse-align,fuse-swiglu,tile{{split-k=1{tile}}},alloc")
    stages = {v["stages"] for gemm in layer.plan["gemms"] for v in gemm["variants"]
              if v["col_tiles"] == 1}
    assert stages <= {4, 8}
    assert_matches_reference(rng, layer, (1, 5, 40, 64))


def test_long_k_split_in_the_block16_bucket(rng):
    """A down GEMM whose K (5120: 320 k16 steps) passes DECODE_CTA_STEPS splits in the T <= 52
    bucket although its calls have a tile for every SM (launched with PDL)."""
    layer = layer_for(moe_spec(2048, 5120, 8, 2, tokens_max=64))
    down = layer.plan["gemms"][1]["variants"]
    assert [(v["max_tokens"], v["block"], v["split"]) for v in down][-2] == (52, 16, 2)
    assert_matches_reference(rng, layer, (17, 40, 52))


@pytest.mark.parametrize("h,i,tile", [(1024, 512, ""), (2048, 5120, ""),
                                      (1024, 512, "wgmma=0"), (2048, 1024, "wide-cols=8")])
def test_decode_wide_cta_split_over_k(rng, h, i, tile):
    """Calls whose average expert passes 13 slots (8 experts, top-2: T = 53..64) take the wide
    CTA of block 32 split over K (warpgroup MMA, one or two warpgroups, or mma.sync with
    wgmma=0): against the reference, bitwise the same on a second run, and replayed from a CUDA
    graph."""
    layer = layer_for(moe_spec(h, i, 8, 2, tokens_max=64), pipeline=WIDE % tile)
    last = [g["variants"][-1] for g in layer.plan["gemms"]]
    cols = 8 if "wide-cols=8" in tile else 4
    # registers capped for 16 warps an SM where split, and on warpgroup MMA also where whole
    # (a GEMM left whole on mma.sync: the prefill kernel, uncapped)
    assert [(v["max_tokens"], v["block"], v["col_tiles"], v["wgmma"]) for v in last] == \
        [(64, 32, cols, "wgmma=0" not in tile)] * 2
    assert all(v["ctas_per_sm"] == (16 // cols if v["split"] > 1 or v["wgmma"] else 0)
               for v in last)
    assert max(v["split"] for v in last) > 1
    assert_matches_reference(rng, layer, (53, 57, 64))
    m = layer.spec.moe
    host = moe_weights(rng, m.num_experts, h, i, 128)
    packed = layer.pack(*host)
    x = cp.asarray(rng.standard_normal((64, h)).astype(np.float16))
    logits = cp.asarray(rng.standard_normal((64, m.num_experts)).astype(np.float32))
    assert_two_runs_bitwise_equal(layer, x, logits, packed, "T=64")
    assert_graph_replays(rng, layer, host, packed, 60)


@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_decode_wide_cta_of_a_small_model(rng, arch):
    """A small model (H = 1024, I = 512, 32 experts, top-8: T = 53..64 in the wide decode
    bucket) splits both GEMMs over K, gate/up 4 or 8 ways per call and down 4 (a CTA's share of
    K: 8 k16 steps), its kernels capped at 128 registers; compiled without warpgroup MMA
    (sm_90), the mma.sync wide CTA's short K loop (not unrolled: unrolled whole it spilled).
    Against the reference and bitwise the same on a second run."""
    kw = {"arch": arch} if arch else {}
    layer = layer_for(moe_spec(1024, 512, 32, 8, tokens_max=64), **kw)
    last = [g["variants"][-1] for g in layer.plan["gemms"]]
    assert [(v["max_tokens"], v["block"], v["col_tiles"], v["ctas_per_sm"], v["split_many"],
             v["split"]) for v in last] == [(64, 32, 4, 4, 4, 8), (64, 32, 4, 4, 4, 4)]
    assert_matches_reference(rng, layer, (53, 64))
    host = moe_weights(rng, 32, 1024, 512, 128)
    packed = layer.pack(*host)
    x = cp.asarray(rng.standard_normal((64, 1024)).astype(np.float16))
    logits = cp.asarray(rng.standard_normal((64, 32)).astype(np.float32))
    assert_two_runs_bitwise_equal(layer, x, logits, packed, "T=64")


WIDE = "fuse-align,fuse-swiglu,tile{%s},alloc"


def pick_experts(rng, t, experts):
    """Routing of t tokens, top-2, over the first `experts` experts only (token j: experts
    j % experts and (j + 1) % experts), random weights that sum to 1."""
    ids = np.stack([np.arange(t) % experts, (np.arange(t) + 1) % experts], 1).astype(np.int32)
    w = rng.random((t, 2)).astype(np.float32) + 0.1
    return ids, w / w.sum(1, keepdims=True)


def test_bench_routes_among_the_first_experts():
    """`moegen bench --experts N` routes every token among experts 0 .. N - 1: its rows count
    the 2 experts of one token, then N experts at T = 32 and 64 (all 8 without it), each row
    with a time and a floor."""
    from moegen.targets.cuda.bench import bench_moe
    spec = moe_spec(256, 128, 8, 2, tokens_max=64)
    lines = []
    for experts, want in ((3, [2, 3, 3]), (None, [2, 8, 8])):
        rows = bench_moe(spec, [1, 32, 64], reps=3, baseline=False, log=lines.append,
                         experts=experts)
        assert [r["experts"] for r in rows] == want
        assert all(r["moegen_us"] > 0 and r["floor_us"] > 0 and r["read_us"] > 0 for r in rows)
    assert "routing among the first 3 experts" in lines[0]
    assert "read us" in lines[1]


@pytest.mark.parametrize("tile", ["", "wgmma=0"])
def test_decode_wide_split_chosen_per_call(rng, tile):
    """The wide decode bucket's down GEMM (H = 4096: 16 CTA column tiles) runs its own split, 4,
    where the routing picks every expert, and twice that where it picks few (its moe blocks
    then fill fewer than fill_ctas CTAs split 4: call_split): both against the reference, each
    bitwise the same on a second run, and a CUDA graph captured on one routing replayed on the
    other."""
    h, i, t = 4096, 2048, 64
    layer = layer_for(moe_spec(h, i, 8, 2, tokens_max=64), pipeline=WIDE % tile)
    v = layer.plan["gemms"][1]["variants"][-1]
    assert (v["max_tokens"], v["col_tiles"], v["split_many"], v["split"]) == (64, 4, 4, 8)
    host = moe_weights(rng, 8, h, i, 128)
    packed = layer.pack(*host)
    m = layer.spec.moe
    for experts in (2, 3, 8):
        x = rng.standard_normal((t, h)).astype(np.float16)
        if experts == 8:
            ids, w = R.topk_softmax(rng.standard_normal((t, 8)).astype(np.float32), 2,
                                    m.renormalize)
        else:
            ids, w = pick_experts(rng, t, experts)
        counts = np.bincount(ids.ravel(), minlength=8)
        blocks = int(np.sum(-(-counts // 32)))
        assert (blocks * 16 * 4 < v["fill_ctas"]) == (experts < 8)   # the split it takes
        args = (cp.asarray(x), packed)
        kw = {"topk_ids": cp.asarray(ids), "topk_weights": cp.asarray(w)}
        layer.out.fill(POISON)
        got = cp.asnumpy(layer(*args, **kw))
        want = R.moe_w4a16(x, ids, w, *host, group_size=128)
        assert rel_err(got, want) <= 2e-3, f"{experts} experts"
        layer.out.fill(POISON)
        again = cp.asnumpy(layer(*args, **kw))
        assert np.array_equal(got.view(np.uint16), again.view(np.uint16)), f"{experts} experts"
    # a graph captured with every expert routed, replayed with the router's picks pushed onto
    # experts 0 and 1 (4 blocks): the device takes the other split inside the same graph
    assert_graph_replays(rng, layer, host, packed, t, pushes=(0.0, 20.0, 0.0))


@pytest.mark.parametrize("h,i,e,k,tile,wgmma", [
    (1024, 512, 8, 2, "", True), (1024, 512, 8, 2, "wgmma=0", False),
    (1024, 512, 8, 2, "wide-cols=0", False), (2048, 768, 64, 2, "moe-block=64", False),
    (4096, 1408, 64, 1, "wide-cols=2,stages=2", False),
    (1024, 512, 60, 6, "moe-block=64,block-k=16", False), (320, 192, 8, 2, "", False),
    (2048, 768, 64, 2, "moe-block=64,warp-rows=64", True),
    (2048, 768, 64, 2, "moe-block=64,warp-rows=64,wgmma=0", False),
    (4096, 1408, 64, 1, "stages=6", True), (4096, 1408, 60, 6, "stages=3", True),
    (2048, 1024, 64, 2, "wide-cols=8", True), (1024, 512, 8, 2, "wide-cols=8,wgmma=0", False),
    (4096, 1408, 64, 1, "moe-block=64,warp-rows=64,wide-cols=2,block-k=16", False)])
def test_prefill_wide_cta(rng, h, i, e, k, tile, wgmma):
    """Prefill buckets: the wide CTA (warps over column tiles and row groups, one ring per
    CTA) with 1 and 2 row groups, 32 and 64 rows a warp, 2, 4 and 8 column tiles, 16 or 32 k
    per stage, on mma.sync and (4 or 8 column tiles of 32 or 64 rows, sm_90a) on warpgroup MMA
    with 3 to 6 ring stages, against the reference; and the K-split CTA where wide-cols=0. The
    decode bucket that takes the wide CTA split over K takes the same column tiles and MMA."""
    g = 128 if h % 128 == 0 and i % 128 == 0 else 64
    layer = layer_for(moe_spec(h, i, e, k, tokens_max=2048, group=g), pipeline=WIDE % tile)
    up = layer.plan["gemms"][0]["variants"]
    assert (up[-1]["col_tiles"] == 1) == ("wide-cols=0" in tile)
    assert up[-1]["wgmma"] == wgmma
    if cp.cuda.Device().compute_capability == "90":
        assert layer.arch == "sm_90a"          # compiled with warpgroup MMA available
    # decode buckets: the K-split CTA, but where an average expert passes 13 slots (T > 13 E / k,
    # so 8 experts of top-2 from T = 53; not with moe-block) the wide CTA of block 32 split
    # over K in the tile's column tiles, run at T = 60, its registers capped for 16 warps an SM
    # where split or on warpgroup MMA (whole on mma.sync: the prefill kernel, uncapped)
    wide_decode = 13 * e // k < 64 and "moe-block" not in tile and "wide-cols=0" not in tile
    for v in up:
        if v["max_tokens"] <= 64:
            decode_wide = v["max_tokens"] == 64 and wide_decode
            assert (v["col_tiles"] > 1, v["ctas_per_sm"]) == (
                decode_wide, 16 // v["warps"] if decode_wide and (v["split"] > 1 or v["wgmma"])
                else 0), v
    assert_matches_reference(rng, layer, (60, 65, 222, 1024, 2048) if wide_decode else
                             (65, 222, 1024, 2048))


def tall_routing(rng, t, k, counts):
    """topk_ids [t, k] routing counts[e] slots to expert e (sum t k, none above t: each token's
    k experts differ) and normalized weights."""
    slots = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    assert slots.size == t * k and max(counts) <= t
    ids = slots.reshape(k, t).T[rng.permutation(t)]      # token j: slots j, j + t, ... sorted
    w = rng.random((t, k)).astype(np.float32) + 0.1
    return np.ascontiguousarray(ids), w / w.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_prefill_tall_tile(rng, arch):
    """From 40 slots an average expert (8 experts of top-2: T >= 160) prefill calls take the
    tall tile: blocks of 128 rows x 4 column tiles, a warpgroup each, in dynamic shared memory.
    The routing ends experts' blocks at 1..128 rows, so every cut of the wgmma to the rows a
    block holds (32, 64, 96 or 128) runs, and one expert has a single slot. Against the
    reference, bitwise on a second run and bitwise the wide CTA's output
    (tile{tall=0,prefill-split-k=1}: each output is the same chain of k16 MMAs;
    prefill-split-k=1 keeps its prefill bucket whole, which at this size the tile pass would
    split over K); a graph replayed with new inputs, one of them routed
    to two experts. arch sm_90: compiled without warpgroup MMA, where the plan has no tall
    bucket unless tile{tall=1} asks for it, and its kernel is the wide CTA of block 128 (16
    warps) in dynamic shared memory."""
    spec = moe_spec(1024, 512, 8, 2, tokens_max=2048)
    kw = {"arch": arch} if arch else {}
    layer = layer_for(spec, pipeline="fuse-align,fuse-swiglu,tile{tall=1},alloc" if arch else None,
                      **kw)
    wide = layer_for(spec, pipeline="fuse-align,fuse-swiglu,tile{tall=0,prefill-split-k=1},alloc",
                     **kw)
    if arch:                                   # sm_90's default plan is tile{tall=0}'s
        from moegen.passes.pipelines import lower
        from moegen.targets.cuda.emitter import emit_moe

        def gemms(pipeline):
            module, _, pm = lower(moegen.load_spec(spec), "cuda", pipeline, tuning=None,
                                  arch=arch)
            return emit_moe(moegen.load_spec(spec), module, pm.pipeline, arch).plan["gemms"]
        assert gemms(None) == gemms("fuse-align,fuse-swiglu,tile{tall=0},alloc")
    for g in layer.plan["gemms"]:
        v = g["variants"][-1]
        assert (v["tall"], v["block"], v["warps"], v["max_tokens"]) == (True, 128, 16, 2048)
        assert v["shared_bytes"] > 48 * 1024 and g["variants"][-2]["max_tokens"] == 159
    assert not any(v["tall"] for g in wide.plan["gemms"] for v in g["variants"])
    m = layer.spec.moe
    host = moe_weights(rng, m.num_experts, m.hidden_size, m.intermediate_size, 128)
    packed = layer.pack(*host)
    t = 1024
    # last blocks of 2, 62, 80, 128, 1, 97, 88 and 54 rows
    ids, w = tall_routing(rng, t, m.top_k, [130, 190, 208, 256, 1, 97, 600, 566])
    x = rng.standard_normal((t, m.hidden_size)).astype(np.float16)
    args = (cp.asarray(x), packed)
    routing = {"topk_ids": cp.asarray(ids), "topk_weights": cp.asarray(w)}
    layer.out.fill(POISON)
    got = cp.asnumpy(layer(*args, **routing)).copy()
    want = R.moe_w4a16(x, ids, w, *host, group_size=128)
    assert rel_err(got, want) <= 2e-3
    layer.out.fill(POISON)
    assert np.array_equal(cp.asnumpy(layer(*args, **routing)).view(np.uint16), got.view(np.uint16))
    wide.out.fill(POISON)
    assert np.array_equal(cp.asnumpy(wide(*args, **routing)).view(np.uint16), got.view(np.uint16))
    assert_matches_reference(rng, layer, (160, 256, 1531, 2048))
    if arch is None:
        assert_graph_replays(rng, layer, host, packed, 1200, pushes=(0.0, 30.0))


@pytest.mark.parametrize("stages", [4, 3])
def test_tall_tile_at_every_size(rng, stages):
    """tile{moe-block=128} (what autotune's tall candidates build): the tall tile in every
    bucket, the decode ones too, where a block holds from one slot up. Against the reference
    from T = 1 (the single-token bucket of its own) over the decode buckets to prefill, two runs
    bitwise equal, and a graph replayed at a decode size."""
    spec = moe_spec(4096, 1024, 8, 2, tokens_max=1024)
    layer = layer_for(spec, pipeline=f"fuse-align,fuse-swiglu,tile{{moe-block=128,stages={stages}}},"
                                     "alloc")
    for g in layer.plan["gemms"]:
        assert [v["max_tokens"] for v in g["variants"]][0] == 1
        assert all(v["tall"] and v["stages"] == stages and v["split"] == 1 for v in g["variants"])
    m = layer.spec.moe
    host = moe_weights(rng, m.num_experts, m.hidden_size, m.intermediate_size, 128)
    packed = layer.pack(*host)
    assert_matches_reference(rng, layer, (1, 2, 5, 16, 33, 64, 300))
    x = cp.asarray(rng.standard_normal((7, m.hidden_size)).astype(np.float16))
    logits = cp.asarray(rng.standard_normal((7, m.num_experts)).astype(np.float32))
    assert_two_runs_bitwise_equal(layer, x, logits, packed, "moe-block=128, T = 7")
    assert_graph_replays(rng, layer, host, packed, 3)


def test_unfused_swiglu(rng):
    layer = layer_for(moe_spec(1024, 512, 60, 6), fuse_swiglu=False)
    assert "moe_swiglu" in [k["name"] for k in layer.plan["kernels"]]
    for t in (1, 64, 222):
        got, want = run_case(rng, layer, t)
        assert rel_err(got, want) <= 2e-3


@pytest.mark.parametrize("router", ["shuffle", "redux"])
def test_router_matches_reference(rng, router):
    layer = layer_for(moe_spec(2048, 768, 128, 8),
                      pipeline=f"fuse-align,fuse-swiglu,tile{{router={router}}},alloc")
    t = 300
    logits = rng.standard_normal((t, 128)).astype(np.float32)
    logits[7, :] = 0.0                     # ties: the lower expert id first
    logits[8, :] = 0.0
    logits[8, ::2] = -0.0                  # -0 ties +0: still the lower expert id first
    logits[9, 5:] = -np.inf
    ids, w = (cp.asnumpy(a) for a in layer.route(cp.asarray(logits)))
    want_ids, want_w = R.topk_softmax(logits, 8, True)
    assert np.array_equal(ids, want_ids)
    assert np.allclose(w, want_w, rtol=1e-5, atol=1e-6)


def test_redux_router_is_bitwise_the_shuffle_router(rng):
    spec = moe_spec(1024, 512, 60, 6)
    shuffle = layer_for(spec, pipeline="fuse-align,fuse-swiglu,tile{router=shuffle},alloc")
    redux = layer_for(spec)                             # the default
    for t in (1, 7, 300):
        logits = cp.asarray(rng.standard_normal((t, 60)).astype(np.float32))
        a = [cp.asnumpy(x) for x in shuffle.route(logits)]
        b = [cp.asnumpy(x) for x in redux.route(logits)]
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1].view(np.uint32),
                                                              b[1].view(np.uint32))


@pytest.mark.parametrize("e,k,renormalize", [(64, 40, False), (64, 40, True), (64, 6, False)])
def test_router_weights_a_lane_each(rng, e, k, renormalize):
    """Lane l works out the weights of its own picks (l, l + 32, ...): past one warp's lanes
    (top-k 40) and unnormalized, with either router, ties and -inf included, against the
    reference; and T = 1 routed inside the GEMMs (top-k 6) bitwise the align kernel's path."""
    spec = moe_spec(256, 128, e, k, renormalize=renormalize,
                    name=f"t-router-e{e}-k{k}-{'renorm' if renormalize else 'plain'}")
    logits = rng.standard_normal((40, e)).astype(np.float32)
    logits[3, :] = 0.0
    logits[5, k + 1:] = -np.inf
    want_ids, want_w = R.topk_softmax(logits, k, renormalize)
    for router in ("redux", "shuffle"):
        layer = layer_for(spec, pipeline=f"fuse-align,fuse-swiglu,tile{{router={router}}},alloc")
        ids, w = (cp.asnumpy(a) for a in layer.route(cp.asarray(logits)))
        assert np.array_equal(ids, want_ids), router
        assert np.allclose(w, want_w, rtol=1e-5, atol=1e-6), router
    layer = layer_for(spec)
    assert layer.gemm_route == (k <= 32)
    assert_matches_reference(rng, layer, (1, 3, 16, 17))
    if layer.gemm_route:
        apart = layer_for(spec, pipeline="fuse-align,fuse-swiglu,tile{route-in-gemm=0},alloc")
        packed = layer.pack(*moe_weights(rng, e, 256, 128, 128))
        x = cp.asarray(rng.standard_normal((1, 256)).astype(np.float16))
        lg = cp.asarray(rng.standard_normal((1, e)).astype(np.float32))
        outs = []
        for lay in (layer, apart):
            lay.out.fill(POISON)
            outs.append(cp.asnumpy(lay(x, lg, packed)).view(np.uint16))
        assert np.array_equal(outs[0], outs[1])


ALIGNED = ("sorted_token_ids", "topk_weights_flat", "expert_ids", "num_tokens_post_padded")


def aligned_outputs(layer, t):
    """What the last call's align wrote: padded total, then sorted slots, block experts and
    flat weights up to it, and the call's moe block."""
    ws = layer.workspace
    total = int(cp.asnumpy(layer._view(cp, ws, "num_tokens_post_padded", cp.int32, 1))[0])
    block = next(b for edge, b in layer.plan["buckets"] if t <= edge)
    return total, block, {name: cp.asnumpy(layer._view(cp, ws, name, dtype, n)) for name, dtype, n
                          in (("sorted_token_ids", cp.int32, total),
                              ("topk_weights_flat", cp.float32, total),
                              ("expert_ids", cp.int32, total // block))}


def poison_aligned(layer):
    for name in ALIGNED:
        b = layer.plan["workspace"]["buffers"][name]
        layer.workspace[b["offset"]:b["offset"] + b["bytes"]].fill(0xFF)


ONE_CTA_ALIGN = "fuse-align,fuse-swiglu,tile{align-chunked-from=0},alloc"


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("e,k", [(8, 2), (128, 8), (512, 6)])
def test_align_matches_reference(rng, e, k, chunked):
    """Align from decode to prefill sizes: one CTA (one round of slots written from the
    lanes; staged passes: a part one, whole ones, several and a part one after them), as
    tile{align-chunked-from=0} asks, or, by default, from 2049 slots a CTA a chunk (one chunk
    and a part one, whole chunks and a part one last), over a uniform router and one that
    sends most slots to a few experts, with some slots another rank's (ids -1 and E): the
    padded total, sorted slots, block experts and weights of the reference, bit for bit."""
    h, i = 256, 128
    layer = layer_for(moe_spec(h, i, e, k, tokens_max=8192),
                      **({} if chunked else {"pipeline": ONE_CTA_ALIGN}))
    assert layer.align_chunked_from == (2049 if chunked else 0)
    packed = layer.pack(*moe_weights(rng, e, h, i, 128))
    for t in (17, 333, 1024, 2500, 8192):
        for skew in (False, True):
            p = None
            if skew:
                p = np.full(e, 0.1 / e)
                p[:max(k + 1, e // 8)] += 0.9 / max(k + 1, e // 8)
                p /= p.sum()
            ids = np.stack([rng.choice(e, k, replace=False, p=p) for _ in range(t)]).astype(np.int32)
            other = rng.random(ids.shape) < 0.05
            ids[other] = rng.choice(np.array([-1, e], np.int32), int(other.sum()))
            w = rng.random((t, k), dtype=np.float32) + 0.5
            x = rng.standard_normal((t, h)).astype(np.float16)
            poison_aligned(layer)
            layer(cp.asarray(x), packed, topk_ids=cp.asarray(ids), topk_weights=cp.asarray(w))
            total, block, got = aligned_outputs(layer, t)
            want_ids, want_experts, want_w, want_total = interp.align(ids, w, e, block)
            case = f"T={t} skew={skew} block={block}"
            assert total == int(want_total[0]), case
            assert np.array_equal(got["sorted_token_ids"], want_ids[:total]), case
            assert np.array_equal(got["expert_ids"], want_experts[:total // block]), case
            assert np.array_equal(got["topk_weights_flat"].view(np.uint32),
                                  want_w[:total].view(np.uint32)), case


def test_chunked_align_layer_matches_reference(rng):
    """The layer with the chunked align, its default from 2049 slots (router, count, chunks
    with PDL, gate/up with PDL), called plainly (router on odd T, given routing on even T) and
    replayed from a CUDA graph, with a replay that routes every token to the same k experts:
    against the reference."""
    layer = layer_for(moe_spec(1024, 512, 64, 6, tokens_max=2048))
    assert layer.align_chunked_from == 2049
    # 1998 slots (one CTA), 2052 (a chunk of 4 last), 6150 (routed), 12288
    assert_matches_reference(rng, layer, (333, 342, 1025, 2048))
    m = layer.spec.moe
    host = moe_weights(rng, m.num_experts, m.hidden_size, m.intermediate_size, 128)
    assert_graph_replays(rng, layer, host, layer.pack(*host), 1500, pushes=(0.0, 40.0))


@pytest.mark.parametrize("shape,tokens,tile", [
    ((256, 128, 128, 8), (1, 5, 16), ""), ((256, 128, 64, 16), (1, 15, 16), ""),
    ((256, 128, 128, 8), (1, 17, 63, 64), "{router=shuffle,route-align-tokens=64}"),
    ((256, 128, 60, 6), (1, 33, 64), "{route-align-tokens=64}")])
def test_fused_route_align_matches_router_then_align(rng, shape, tokens, tile):
    """Up to route_align_max_tokens one CTA routes and aligns: the same top-k, sorted slots,
    block experts, weights and padded total as the router and align kernels, bit for bit."""
    h, i, e, k = shape
    layer = layer_for(moe_spec(h, i, e, k), pipeline=f"fuse-align,fuse-swiglu,tile{tile},alloc")
    most = layer.route_align_max_tokens
    assert most == (64 if tile else min(16, 512 // k)) and max(tokens) == most
    packed = layer.pack(*moe_weights(rng, e, h, i, 128))

    def call(x, logits, limit):
        layer.route_align_max_tokens = limit
        layer.gemm_route = False                      # T = 1 through the align buffers too
        try:
            poison_aligned(layer)                     # what align writes
            layer.out.fill(POISON)
            y = cp.asnumpy(layer(x, logits, packed)).view(np.uint16)
        finally:
            layer.route_align_max_tokens = most
            layer.gemm_route = layer.plan["gemm_route"]
        total, _, got = aligned_outputs(layer, x.shape[0])   # (the top-k buffers are reused)
        return y, total, got

    for t in tokens:
        x = cp.asarray(rng.standard_normal((t, h)).astype(np.float16))
        logits_h = rng.standard_normal((t, e)).astype(np.float32)
        logits = cp.asarray(logits_h)
        fused = call(x, logits, most)
        split = call(x, logits, 0)                    # the router and align kernels
        assert fused[1] == split[1] and fused[1] >= t * k
        assert np.array_equal(fused[0], split[0]), f"T={t}: outputs differ"
        for name in fused[2]:
            assert np.array_equal(fused[2][name].view(np.uint32), split[2][name].view(np.uint32)), \
                f"T={t}: {name} differs"
        # the sorted slots against the reference router: slot s = token * k + j of expert e
        want_ids, want_w = R.topk_softmax(logits_h, k, True)
        slots = fused[2]["sorted_token_ids"]
        real = slots < t * k
        assert sorted(slots[real].tolist()) == list(range(t * k))
        experts = np.repeat(fused[2]["expert_ids"], fused[1] // len(fused[2]["expert_ids"]))
        assert np.array_equal(experts[real], want_ids.ravel()[slots[real]])
        assert np.allclose(fused[2]["topk_weights_flat"][real], want_w.ravel()[slots[real]],
                           rtol=1e-5, atol=1e-6)
        assert (fused[2]["topk_weights_flat"][~real] == 0).all() and (slots[~real] == t * k).all()


FUSED_SUM = "fuse-align,fuse-swiglu,fuse-topk-sum,tile{split},alloc"


@pytest.mark.parametrize("shape,split", [((1024, 512, 60, 6), ""), ((2048, 768, 128, 8), ""),
                                         ((4096, 1408, 64, 1), ""),
                                         ((1024, 512, 60, 6), "{split-k-down=2}")])
def test_fused_topk_sum_matches_the_aggregate_kernel(rng, shape, split):
    """fuse-topk-sum: the down GEMM's last CTA per column tile sums the top-k rows; bitwise the
    separate moe_aggregate kernel's output, with and without split-K in the down GEMM, call
    after call (the arrival counters reset themselves)."""
    h, i, e, k = shape
    spec = moe_spec(h, i, e, k)
    plain = layer_for(spec, pipeline=f"fuse-align,fuse-swiglu,tile{split},alloc")   # same GEMMs
    fused = layer_for(spec, pipeline=FUSED_SUM.format(split=split))
    assert not {"moe_aggregate", "moe_aggregate_checked"} & {kk["name"] for kk in
                                                            fused.plan["kernels"]}
    host_w = moe_weights(rng, e, h, i, 128)
    packed = plain.pack(*host_w)
    for t in (1, 3, 16, 64, 123, 300, 1):
        x = rng.standard_normal((t, h)).astype(np.float16)
        logits = rng.standard_normal((t, e)).astype(np.float32)
        outs = []
        for layer in (plain, fused, fused):
            layer.out.fill(POISON)
            outs.append(cp.asnumpy(layer(cp.asarray(x), cp.asarray(logits), packed)))
        ids, w = R.topk_softmax(logits, k, True)
        assert rel_err(outs[1], R.moe_w4a16(x, ids, w, *host_w, group_size=128)) <= 2e-3
        for o in outs[1:]:
            assert np.array_equal(o.view(np.uint16), outs[0].view(np.uint16)), f"T={t}"


def test_fused_topk_sum_in_a_graph(rng):
    layer = layer_for(moe_spec(1024, 512, 60, 6), pipeline=FUSED_SUM.format(split=""))
    host_w = moe_weights(rng, 60, 1024, 512, 128)
    assert_graph_replays(rng, layer, host_w, layer.pack(*host_w), t=9)


DEFAULT_TILE = "fuse-align,fuse-swiglu,tile{split},alloc"


@pytest.mark.parametrize("shape,pipeline", [
    ((1024, 512, 8, 2), DEFAULT_TILE), ((2048, 768, 128, 8), DEFAULT_TILE),
    ((4096, 1408, 64, 1), DEFAULT_TILE), ((1024, 512, 60, 6), FUSED_SUM)])
def test_one_token_routed_in_the_gemms(rng, shape, pipeline):
    """T = 1 with router logits: no router or align launch, every CTA of both GEMMs routes the
    token into shared memory: the GEMMs' routed kernels, or (one-launch=1) the whole layer in
    one launch (moe_one_token). The align buffers are poisoned first, so a GEMM that read its
    routing from them would go wrong. The output is bit for bit the routed kernels' (with and
    without programmatic dependent launch), the one launch's and the align kernel's path (the
    single-token bucket of the first shape, the first decode bucket of the others, the fused
    top-k sum), the reference's, and replays in a graph; with the routing given, the same
    kernels take it from align. Calls one after another: the one-launch kernel leaves its
    state ready for the next, and its persistent CTAs give the same bits in any number (1, 3,
    about half of what the SMs hold)."""
    h, i, e, k = shape
    spec = moe_spec(h, i, e, k)
    layer = layer_for(spec, pipeline=pipeline.format(split=""))
    one = layer_for(spec, pipeline=pipeline.format(split="{one-launch=1}"))
    plain = layer_for(spec, pipeline=pipeline.format(split=""), pdl=False)
    apart = layer_for(spec, pipeline=pipeline.format(split="{route-in-gemm=0}"))
    assert layer.gemm_route and not apart.gemm_route
    assert one.one_launch is not None and layer.one_launch is None
    assert all(g["variants"][0]["route_kernel"] for g in layer.gemms)
    host_w = moe_weights(rng, e, h, i, 128)
    packed = layer.pack(*host_w)
    for _ in range(3):
        x = rng.standard_normal((1, h)).astype(np.float16)
        logits = rng.standard_normal((1, e)).astype(np.float32)
        outs = []
        for lay in (layer, one, plain, apart, one):
            for name in ALIGNED:
                b = lay.plan["workspace"]["buffers"][name]
                lay.workspace[b["offset"]:b["offset"] + b["bytes"]].fill(0xFF)
            lay.out.fill(POISON)
            outs.append(cp.asnumpy(lay(cp.asarray(x), cp.asarray(logits), packed)))
        ids, w = R.topk_softmax(logits, k, True)
        want = R.moe_w4a16(x, ids, w, *host_w, group_size=128)
        assert rel_err(outs[0], want) <= 2e-3
        bits = [o.view(np.uint16) for o in outs]
        assert all(np.array_equal(bits[0], b) for b in bits[1:])
        layer.out.fill(POISON)
        given = layer(cp.asarray(x), packed, topk_ids=cp.asarray(ids), topk_weights=cp.asarray(w))
        assert rel_err(cp.asnumpy(given), want) <= 2e-3
        # the one launch's CTAs are persistent: fewer of them take every work item between them
        resident = one.one_launch_grid   # (the grid the runtime picked)
        for grid in (1, 3, resident // 2 + 1):
            one.one_launch_grid = grid
            one.out.fill(POISON)
            got = cp.asnumpy(one(cp.asarray(x), cp.asarray(logits), packed)).view(np.uint16)
            assert np.array_equal(got, bits[0]), grid
        one.one_launch_grid = resident
    for lay in (layer, one):
        assert_graph_replays(rng, lay, host_w, packed, t=1, pushes=(0.0, 30.0))


def edge_logits(rng, e, k):
    """Rows of router logits where the order is hard: ties everywhere, -0 against +0, a tie
    across the k-th pick, all but k + 1 experts at -inf, the last k experts far ahead, and
    one plain draw."""
    rows = rng.standard_normal((6, e)).astype(np.float32)
    rows[0, :] = 0.0
    rows[1, ::2] = -0.0
    rows[1, 1::2] = 0.0
    rows[2, rng.permutation(e)[:k + 3]] = 4.0          # k + 3 experts tied at the top
    rows[3, k + 1:] = -np.inf
    rows[4, e - k:] = 50.0
    return rows


@pytest.mark.parametrize("e,k", [(20, 4), (61, 6), (126, 8), (300, 8)])
def test_one_token_search_in_the_cta(rng, e, k):
    """The GEMM CTAs' own search for one token's experts: from 33 experts up to two a thread
    every thread ranks its experts (61 experts on 64 threads, keys padded to 64; 126, two a
    thread); up to 32 and past two a thread warp 0 picks them as the router does (20, 300).
    On logits whose order is hard (ties, -0 and +0, -inf), the routed kernels and the one
    launch give the align path's bits, and the reference's numbers."""
    spec = moe_spec(256, 128, e, k, name=f"t-search-e{e}-k{k}")
    layer = layer_for(spec)
    one = layer_for(spec, pipeline="fuse-align,fuse-swiglu,tile{one-launch=1},alloc")
    apart = layer_for(spec, pipeline="fuse-align,fuse-swiglu,tile{route-in-gemm=0},alloc")
    threads = 32 * layer.gemms[0]["variants"][0]["warps"]
    assert threads == 64 and layer.gemm_route and not apart.gemm_route
    host_w = moe_weights(rng, e, 256, 128, 128)
    packed = layer.pack(*host_w)
    for row in edge_logits(rng, e, k):
        logits = row[None, :]
        x = rng.standard_normal((1, 256)).astype(np.float16)
        outs = []
        for lay in (layer, one, apart):
            lay.out.fill(POISON)
            outs.append(cp.asnumpy(lay(cp.asarray(x), cp.asarray(logits), packed)))
        ids, w = R.topk_softmax(logits, k, layer.spec.moe.renormalize)
        want = R.moe_w4a16(x, ids, w, *host_w, group_size=128)
        assert rel_err(outs[0], want) <= 2e-3
        assert all(np.array_equal(outs[0].view(np.uint16), o.view(np.uint16)) for o in outs[1:])


def test_bench_versus_times_two_builds(tmp_path):
    """`moegen bench --versus`: the default build and one that routes a call of one token in
    the align kernel (route-in-gemm=0) in turns, per token count a time of each per round,
    their ratio, and the same bits (the two routings are bit for bit one another's); the
    SwiGLU kernel apart (its inputs rounded to fp16 first) gives different bits; the JSON holds
    the rows."""
    from moegen.targets.cuda.bench import bench_versus
    spec = moe_spec(2048, 768, 128, 8, tokens_max=64)
    lines = []
    out = tmp_path / "versus.json"
    rows = bench_versus(spec, [1, 3, 100], "fuse-align,fuse-swiglu,tile{route-in-gemm=0},alloc",
                        json_path=str(out), reps=3, rounds=2, log=lines.append)
    assert [r["tokens"] for r in rows] == [1, 3]
    assert all(len(r["a_us"]) == len(r["b_us"]) == 2 and r["same_bits"] for r in rows)
    assert all(0 < v for r in rows for v in r["a_us"] + r["b_us"])
    assert any("skipped: above tokens.max" in line for line in lines)
    assert json.loads(out.read_text())["rows"] == rows
    apart = bench_versus(spec, [3], "fuse-align,tile,alloc", reps=2, rounds=1,
                         log=lines.append)
    assert not apart[0]["same_bits"]


def test_bitwise_deterministic(rng):
    layer = layer_for(moe_spec(2048, 768, 128, 8))
    m = layer.spec.moe
    weights = layer.pack(*moe_weights(rng, 128, 2048, 768, 128))
    for t in (1, 64, 1024):
        x = cp.asarray(rng.standard_normal((t, 2048)).astype(np.float16))
        logits = cp.asarray(rng.standard_normal((t, m.num_experts)).astype(np.float32))
        assert_two_runs_bitwise_equal(layer, x, logits, weights, f"T={t}")


@pytest.mark.parametrize("h,i,e,k,tokens", [(1024, 512, 8, 2, (1, 2, 3, 4, 16, 33, 64)),
                                             (2048, 768, 128, 8, (1, 2, 3))])
def test_programmatic_dependent_launch_is_bitwise_the_plain_launch(rng, h, i, e, k, tokens):
    """On sm_90 the down GEMM's K-split kernel follows gate/up with programmatic dependent launch
    (where the plan's follows_from says: from one token), and gate/up's follows the align kernel
    (from two tokens, and in the single-token bucket): the output is the plain launches' bit for
    bit, and the reference's. Mixtral's shape of experts and top-k: the single-token bucket
    (gate/up releasing the down GEMM after its K loop), the 8-row and 16-row decode buckets; the
    wide decode bucket (T = 64) launches plainly either way. Qwen3's: T = 1..3 in its first
    decode bucket (gate/up releasing it at its start; gate/up plain at T = 1)."""
    spec = moe_spec(h, i, e, k)
    pdl, plain = layer_for(spec), layer_for(spec, pdl=False)
    if not pdl.pdl:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    up, down = pdl.gemms
    single = e == 8
    assert not plain.pdl and up["variants"][0]["release_after_loop"] == single
    assert [v.get("follows_from") for v in down["variants"][:3]] == [1, 1, 1]
    assert [v.get("follows_from") for v in up["variants"][:3]] == ([1, 2, 2] if single else
                                                                    [2, 2, 2])
    if single:
        assert down["variants"][3]["ctas_per_sm"] and down["variants"][3]["follows_from"] is None
    host_w = moe_weights(rng, e, h, i, 128)
    packed = pdl.pack(*host_w)
    for t in tokens:
        y, want = run_case(rng, pdl, t, weights=(host_w, packed))
        assert rel_err(y, want) <= 2e-3, f"T={t}"
        x = cp.asarray(rng.standard_normal((t, h)).astype(np.float16))
        logits = cp.asarray(rng.standard_normal((t, e)).astype(np.float32))
        outs = []
        for layer in (pdl, plain, pdl):
            layer.out.fill(POISON)
            outs.append(cp.asnumpy(layer(x, logits, packed)).view(np.uint16))
        assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2]), f"T={t}"


def test_cuda_graph_capture_and_replay(rng):
    layer = layer_for(moe_spec(2048, 768, 128, 8))
    host_w = moe_weights(rng, 128, 2048, 768, 128)
    assert_graph_replays(rng, layer, host_w, layer.pack(*host_w), t=5)


def test_pytorch_tensors_via_dlpack(rng):
    torch = pytest.importorskip("torch")
    layer = layer_for(moe_spec(1024, 512, 60, 6))
    host_w = moe_weights(rng, 60, 1024, 512, 128)
    weights = layer.pack(*host_w)
    xn = rng.standard_normal((33, 1024)).astype(np.float16)
    ln = rng.standard_normal((33, 60)).astype(np.float32)
    x = torch.from_numpy(xn).cuda()
    logits = torch.from_numpy(ln).cuda()
    out = torch.full((33, 1024), float("nan"), dtype=torch.float16, device="cuda")
    y = layer(x, logits, weights, out=out)
    assert y is out
    torch.cuda.synchronize()
    ids, w = R.topk_softmax(ln, 6, True)
    want = R.moe_w4a16(xn, ids, w, *host_w, group_size=128)
    assert rel_err(out.cpu().numpy(), want) <= 2e-3
    y2 = layer(x, logits, weights)
    assert isinstance(y2, torch.Tensor) and y2.dtype == torch.float16


def test_bad_inputs_fail_clearly(rng):
    layer = layer_for(moe_spec(256, 128, 8, 2, tokens_max=64))
    weights = layer.pack(*moe_weights(rng, 8, 256, 128, 128))
    with pytest.raises(TypeError, match="x: dtype float32"):
        layer(cp.zeros((2, 256), cp.float32), cp.zeros((2, 8), cp.float32), weights)
    with pytest.raises(ValueError, match="exceed the spec's tokens.max"):
        layer(cp.ones((65, 256), cp.float16), cp.ones((65, 8), cp.float32), weights)
    with pytest.raises(ValueError, match=r"w13.q: shape"):
        layer.pack(np.zeros((8, 256, 100), np.int8), *moe_weights(rng, 8, 256, 128, 128)[1:])
