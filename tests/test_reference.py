import numpy as np
import pytest

import moegen
from moegen import reference as R
from moegen.ir import interp
from conftest import ROOT


# --- the seed's worked example (seeds/000, sections 1-6) ---------------------------------------

def test_seed_worked_example():
    ids = np.array([1, 0, 1, 1, 0, 2], dtype=np.int32).reshape(3, 2)
    w = np.array([0.11, 0.22, 0.33, 0.44, 0.55, 0.66], dtype=np.float32).reshape(3, 2)
    a = R.align_block_size(ids, num_experts=3, block_size=4, topk_weights=w)
    assert a.counts.tolist() == [2, 3, 1]
    assert a.padded_counts.tolist() == [4, 4, 4]
    assert a.padded_offsets.tolist() == [0, 4, 8]
    assert a.num_tokens_post_padded == 12
    assert a.sorted_token_ids.tolist() == [1, 4, 6, 6, 0, 2, 3, 6, 5, 6, 6, 6]
    assert a.expert_ids.tolist() == [0, 1, 2]
    w0, w1, w2, w3, w4, w5 = w.ravel()
    assert a.topk_weights_flat.tolist() == [w1, w4, 0, 0, w0, w2, w3, 0, w5, 0, 0, 0]
    assert a.sorted_token_ids.dtype == np.int32 and a.expert_ids.dtype == np.int32
    assert a.topk_weights_flat.dtype == np.float32
    assert R.align_block_size(ids, 3, 4).topk_weights_flat is None


def brute_force_align(ids, num_experts, block):
    """An independent, slow transcription of the routing rules."""
    flat = [int(e) for e in np.asarray(ids).ravel()]
    sentinel = len(flat)
    sorted_ids, expert_ids, counts = [], [], []
    for e in range(num_experts):
        mine = [slot for slot, ex in enumerate(flat) if ex == e]
        counts.append(len(mine))
        if not mine:
            continue
        padded = -(-len(mine) // block) * block
        sorted_ids += mine + [sentinel] * (padded - len(mine))
        expert_ids += [e] * (padded // block)
    return counts, sorted_ids, expert_ids


def random_ids(rng, t, e, k):
    return np.stack([rng.choice(e, size=k, replace=False) for _ in range(t)]).astype(np.int32)


def test_align_against_brute_force(rng):
    cases = [(1, 1, 1), (3000, 257, 8), (1000, 60, 4), (777, 160, 6), (5, 8, 8), (64, 128, 8)]
    cases += [(int(rng.integers(1, 3001)), int(rng.integers(1, 258)), 0) for _ in range(40)]
    for t, e, k in cases:
        k = k or int(rng.integers(1, min(8, e) + 1))
        ids = random_ids(rng, t, e, k)
        block = int(rng.choice([8, 16, 32, 64]))
        weights = rng.random((t, k), dtype=np.float32)
        a = R.align_block_size(ids, e, block, topk_weights=weights)
        counts, sorted_ids, expert_ids = brute_force_align(ids, e, block)
        assert a.counts.tolist() == counts
        assert a.sorted_token_ids.tolist() == sorted_ids
        assert a.expert_ids.tolist() == expert_ids
        assert a.num_tokens_post_padded == len(sorted_ids)
        real = a.sorted_token_ids < t * k
        assert np.array_equal(a.topk_weights_flat[real], weights.ravel()[a.sorted_token_ids[real]])
        assert np.all(a.topk_weights_flat[~real] == 0)


def test_align_all_slots_on_one_expert_and_unused_experts(rng):
    t, e, k = 300, 60, 1
    ids = np.full((t, k), 17, dtype=np.int32)
    a = R.align_block_size(ids, e, 16)
    assert a.sorted_token_ids[:t].tolist() == list(range(t))
    assert a.num_tokens_post_padded == 304 and set(a.expert_ids.tolist()) == {17}
    assert a.counts[17] == t and a.counts.sum() == t and np.all(a.padded_counts[:17] == 0)


def test_topk_softmax(rng):
    logits = rng.standard_normal((50, 16)).astype(np.float32)
    logits[0, 3] = logits[0, 9] = 10.0  # a tie: the lower expert id comes first
    ids, w = R.topk_softmax(logits, 4, renormalize=False)
    assert ids[0, :2].tolist() == [3, 9]
    p = np.exp(logits.astype(np.float64))
    p /= p.sum(axis=1, keepdims=True)
    for t in range(50):
        order = sorted(range(16), key=lambda e: (-logits[t, e], e))[:4]
        assert ids[t].tolist() == order
        assert np.allclose(w[t], p[t, order], rtol=1e-5)
    ids2, w2 = R.topk_softmax(logits, 4, renormalize=True)
    assert np.array_equal(ids, ids2) and np.allclose(w2.sum(axis=1), 1, rtol=1e-6)
    assert ids.dtype == np.int32 and w.dtype == np.float32


# --- the MoE layer -----------------------------------------------------------------------------

def moe_case(rng, t, e, k, h, i, g):
    x = rng.standard_normal((t, h)).astype(np.float16)
    ids = random_ids(rng, t, e, k)
    w = rng.random((t, k), dtype=np.float32) + 0.1
    w13_q = rng.integers(-8, 8, (e, h, 2 * i), dtype=np.int8)
    w13_s = (rng.random((e, h // g, 2 * i)) * 0.02 + 0.005).astype(np.float16)
    w2_q = rng.integers(-8, 8, (e, i, h), dtype=np.int8)
    w2_s = (rng.random((e, i // g, h)) * 0.02 + 0.005).astype(np.float16)
    return x, ids, w, w13_q, w13_s, w2_q, w2_s


def per_token_loop(x, ids, w, w13_q, w13_s, w2_q, w2_s, g):
    """Independent float64 transcription of the layer: one token, one expert at a time."""
    t, h = x.shape
    i = w2_q.shape[1]
    out = np.zeros((t, h))
    for tok in range(t):
        for j in range(ids.shape[1]):
            e = ids[tok, j]
            w13 = w13_q[e].astype(np.float64) * np.repeat(w13_s[e].astype(np.float64), g, axis=0)
            w2 = w2_q[e].astype(np.float64) * np.repeat(w2_s[e].astype(np.float64), g, axis=0)
            gu = x[tok].astype(np.float64) @ w13
            gate, up = gu[:i], gu[i:]
            act = gate / (1 + np.exp(-gate)) * up
            out[tok] += w[tok, j] * (act @ w2)
    return out


def rel_err(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)


@pytest.mark.parametrize("t,e,k,h,i,g", [(3, 3, 2, 256, 128, 128), (17, 8, 2, 256, 128, 64),
                                         (9, 60, 6, 128, 64, 32), (1, 16, 8, 512, 256, 128)])
def test_moe_w4a16_against_per_token_loop(rng, t, e, k, h, i, g):
    case = moe_case(rng, t, e, k, h, i, g)
    got = R.moe_w4a16(*case, group_size=g)
    want = per_token_loop(*case, g)
    assert got.dtype == np.float32 and got.shape == (t, h)
    assert rel_err(got, want) < 1e-5
    for block in (1, 4, 32):  # the block size does not change the result
        assert np.allclose(R.moe_w4a16(*case, group_size=g, block_size=block), got, rtol=1e-5,
                           atol=1e-5)


@pytest.mark.parametrize("zeros", [False, True], ids=["symmetric", "zero-points"])
def test_dequant_is_each_rows_group_exactly(rng, zeros):
    """w[e, k, n] = (q - zero) * scale of row k's group in float32, against a row-by-row
    transcription: the same bits with the groups implied (row // G) or given as g_idx, over
    every expert at once or one."""
    e, k, n, g = 3, 256, 48, 64
    q = rng.integers(-8, 8, (e, k, n), dtype=np.int8)
    scale = (rng.random((e, k // g, n)) * 0.02 + 0.002).astype(np.float16)
    zero = rng.integers(-8, 8, (e, k // g, n), dtype=np.int8) if zeros else None
    want = np.empty((e, k, n), np.float32)
    for row in range(k):
        z = zero[:, row // g].astype(np.float32) if zeros else np.float32(0)
        want[:, row] = (q[:, row].astype(np.float32) - z) * scale[:, row // g].astype(np.float32)
    got = interp.dequant(q, scale, g, np.float32, zero)
    assert got.shape == (e, k, n) and np.array_equal(got, want)
    g_idx = (np.arange(k) // g).astype(np.int32)            # every expert's rows in order
    assert np.array_equal(interp.dequant(q, scale, g, np.float32, zero, g_idx), want)
    assert np.array_equal(interp.dequant(q[1], scale[1], g, np.float32,
                                         None if zero is None else zero[1]), want[1])


def test_interpreter_runs_the_built_moe_module(rng):
    spec = moegen.load_spec(ROOT / "examples" / "moe-seed.yaml")
    module = moegen.build(spec)
    m = spec.moe
    x, ids, w, *weights = moe_case(rng, 5, m.num_experts, m.top_k, m.hidden_size,
                                   m.intermediate_size, 128)
    logits = rng.standard_normal((5, m.num_experts)).astype(np.float32)
    out, = interp.run(module.function(), [x, logits, *weights])
    ids, w = R.topk_softmax(logits, m.top_k, m.renormalize)
    want = per_token_loop(x, ids, w, *weights, 128)
    assert out.dtype == np.float16
    assert rel_err(out, want) < 2e-3  # fp16 intermediates, as the kernels store them


def test_interpreter_fused_topk_sum_is_bitwise_the_aggregate(rng):
    """fuse-topk-sum moves moe.aggregate into the down GEMM: the same fp16 result, bit for bit."""
    from moegen.passes.pipelines import lower
    spec = moegen.load_spec(ROOT / "examples" / "moe-seed.yaml")
    m = spec.moe
    x, ids, w, *weights = moe_case(rng, 7, m.num_experts, m.top_k, m.hidden_size,
                                   m.intermediate_size, 128)
    logits = rng.standard_normal((7, m.num_experts)).astype(np.float32)
    outs = []
    for pipeline in ("fuse-align,fuse-swiglu,tile,alloc",
                     "fuse-align,fuse-swiglu,fuse-topk-sum,tile,alloc"):
        module = lower(spec, "cuda", pipeline, tuning=None)[0]
        outs.append(interp.run(module.function(), [x, logits, *weights])[0])
    assert outs[0].dtype == np.float16
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


# --- MSD ---------------------------------------------------------------------------------------

def msd_case(rng, m, n, k, g, seed_style=True):
    if seed_style:  # as the sample's gen_data.py draws
        x = rng.uniform(-3, 3, (m, k)).astype(np.float16)
        w = rng.integers(-6, 7, (k, n), dtype=np.int8)
        s = rng.uniform(-3, 3, (k // g, n)).astype(np.float16)
    else:
        x = rng.standard_normal((m, k)).astype(np.float16)
        w = rng.integers(-8, 8, (k, n), dtype=np.int8)
        s = (rng.random((k // g, n)) * 0.1).astype(np.float16)
    return x, w, s


def exact(x, w, s, g):
    return x.astype(np.float64) @ (w.astype(np.float64) * np.repeat(s.astype(np.float64), g, 0))


@pytest.mark.parametrize("m,n,k,g", [(1, 512, 1024, 128), (5, 300, 512, 64), (16, 64, 256, 32)])
@pytest.mark.parametrize("seed_style", [True, False])
def test_msd_against_exact(rng, m, n, k, g, seed_style):
    x, w, s = msd_case(rng, m, n, k, g, seed_style)
    want = exact(x, w, s, g)
    errs = [rel_err(R.msd_matmul(x, w, s, g, steps), want) for steps in (1, 2, 3)]
    assert errs[2] <= 1.5e-3
    assert errs[0] > errs[1] > errs[2]


def test_msd_zero_group_contributes_zero(rng):
    x, w, s = msd_case(rng, 3, 64, 256, 128)
    x[1, :128] = 0
    got = R.msd_matmul(x, w, s, 128, 3)
    assert np.all(np.isfinite(got))
    amax, slices = R.msd_unfold(x, 128, 3)
    assert amax[1, 0] == 0 and np.all(slices[:, 1, :128] == 0)
    x2 = x.copy()
    x2[1] = 0
    assert np.allclose(R.msd_matmul(x2, w, s, 128, 3)[1], 0)


def test_msd_intermediates(rng):
    x, w, s = msd_case(rng, 4, 64, 512, 128)
    amax, slices = R.msd_unfold(x, 128, 3)
    assert amax.shape == (4, 4) and slices.shape == (3, 4, 512) and slices.dtype == np.int8
    assert slices.min() >= -8 and slices.max() <= 7
    assert np.array_equal(amax, np.abs(x.astype(np.float32)).reshape(4, 4, 128).max(-1))
    # the slices reconstruct x to within the last step's resolution
    d = np.cumprod([7.49, 14.98, 14.98])
    approx = sum(slices[i].astype(np.float64) / d[i] for i in range(3))
    approx *= np.repeat(amax, 128, axis=1)
    assert np.max(np.abs(approx - x.astype(np.float64))) <= np.max(amax) * 0.5 / d[2] * 1.01


def transcription(x, w, s, g=128):
    """The seed's formula written out step by step, per group, for M = 1 (as gen_data.py)."""
    k = x.shape[1]
    y = np.zeros((1, w.shape[1]), np.float64)
    for gi in range(k // g):
        a = x[:, gi * g:(gi + 1) * g].astype(np.float32)
        a_max = np.max(np.abs(a))
        tmp1 = a / a_max * np.float32(7.49)
        a1 = np.round(tmp1)
        tmp2 = (tmp1 - a1) * np.float32(14.98)
        a2 = np.round(tmp2)
        tmp3 = (tmp2 - a2) * np.float32(14.98)
        a3 = np.round(tmp3)
        wg = w[gi * g:(gi + 1) * g].astype(np.float64)
        y1, y2, y3 = (ai.astype(np.float64) @ wg for ai in (a1, a2, a3))
        y += (y1 / 7.49 + y2 / (7.49 * 14.98) + y3 / (7.49 * 14.98 * 14.98)) * a_max \
            * s[gi].astype(np.float64)
    return y


def test_msd_seed_shape_matches_the_formula(rng):
    x, w, s = msd_case(rng, 1, 12288, 8192, 128)
    got = R.msd_matmul(x, w, s, 128, 3, accumulate=np.float64)
    want = transcription(x, w, s)
    assert rel_err(got, want) < 1e-9
    assert rel_err(R.msd_matmul(x, w, s, 128, 3), want) < 1e-5  # float32 accumulation
    assert rel_err(got, exact(x, w, s, 128)) <= 1.5e-3


def test_interpreter_runs_the_built_msd_module(rng):
    spec = {"name": "t", "pipeline": "msd_matmul", "msd": {"m": 3, "n": 96, "k": 512, "steps": 2},
            "targets": {"cuda": {}}}
    module = moegen.build(spec)
    x, w, s = msd_case(rng, 3, 96, 512, 128)
    out, = interp.run(module.function(), [x, w, s])
    ref = R.msd_matmul(x, w, s, 128, 2)
    assert out.dtype == np.float16
    assert np.array_equal(out, ref.astype(np.float16))
