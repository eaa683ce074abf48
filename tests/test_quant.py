import numpy as np
import pytest

from moegen import reference as R
from moegen.quant import (AWQ_ORDER, QuantFormatError, QuantizedWeight, dequantize, from_awq,
                          from_compressed_tensors, from_gptq, pack_int4, quantize, quantize_int4,
                          to_awq, to_compressed_tensors, to_gptq, unpack_int4)


def test_quantize_int4(rng):
    w = rng.standard_normal((3, 256, 40)).astype(np.float32)
    q, s = quantize_int4(w, 64)
    assert q.dtype == np.int8 and s.dtype == np.float16 and s.shape == (3, 4, 40)
    assert q.min() >= -8 and q.max() <= 7
    deq = q.astype(np.float32) * np.repeat(s.astype(np.float32), 64, axis=1)
    # each element is within half a step of its group's scale
    step = np.repeat(s.astype(np.float32), 64, axis=1)
    assert np.all(np.abs(deq - w) <= 0.5 * step * 1.01 + 1e-6)
    with pytest.raises(QuantFormatError, match="multiple of group_size"):
        quantize_int4(w[:, :100], 64)


def test_quantize_zero_group():
    w = np.zeros((128, 4), np.float32)
    w[:, 1] = 1.0
    q, s = quantize_int4(w, 128)
    assert np.all(q[:, 0] == 0) and s[0, 0] == 0 and np.all(np.isfinite(s))


def test_pack_unpack_round_trip(rng):
    q = rng.integers(-8, 8, (5, 7, 64), dtype=np.int8)
    p = pack_int4(q)
    assert p.dtype == np.uint8 and p.shape == (5, 7, 32)
    assert np.array_equal(unpack_int4(p), q)
    # even index in the low nibble
    assert pack_int4(np.array([1, -2], np.int8)).tolist() == [0xE1]
    with pytest.raises(QuantFormatError, match="even"):
        pack_int4(q[..., :3])
    with pytest.raises(QuantFormatError, match=r"\[-8, 7\]"):
        pack_int4(np.array([9, 0], np.int8))


def awq_pack(u4):
    """Write uint4 values [..., R, N] in AutoAWQ's int32 layout, by its documented rule."""
    *lead, r, n = u4.shape
    out = np.zeros((*lead, r, n // 8), np.int64)
    for c in range(n // 8):
        for i, col in enumerate(AWQ_ORDER):
            out[..., c] |= u4[..., 8 * c + col].astype(np.int64) << (4 * i)
    return out.astype(np.uint32).view(np.int32)


def test_from_awq(rng):
    e, k, n, g = 2, 256, 32, 128
    q = rng.integers(-8, 8, (e, k, n), dtype=np.int8)
    scales = rng.random((e, k // g, n)).astype(np.float16)
    qweight = awq_pack((q + 8).astype(np.uint8))
    qzeros = awq_pack(np.full((e, k // g, n), 8, np.uint8))
    q2, s2, z2, g2 = from_awq(qweight, qzeros, scales, g)
    assert np.array_equal(q2, q) and np.array_equal(s2, scales) and z2 is None and g2 is None
    zeros = rng.integers(0, 16, (e, k // g, n)).astype(np.uint8)   # any zero point
    qw = from_awq(qweight, awq_pack(zeros), scales, g)
    assert np.array_equal(qw.zeros, zeros.astype(np.int8) - 8)
    w = dequantize(qw, g)                                       # (u - z) * s, by the rule
    u = np.repeat(zeros, g, axis=1).astype(np.float32)
    assert np.array_equal(w, (q + 8 - u) * np.repeat(scales.astype(np.float32), g, axis=1))
    with pytest.raises(QuantFormatError, match=r"AWQ: scales has shape \(2, 2, 31\)"):
        from_awq(qweight, qzeros, scales[..., :31], g)


def gptq_pack(u4):
    """uint4 [..., K, N] -> GPTQ int32 [..., K/8, N]: nibble i of row r holds row 8r + i."""
    *lead, k, n = u4.shape
    out = np.zeros((*lead, k // 8, n), np.int64)
    for i in range(8):
        out |= u4[..., i::8, :].astype(np.int64) << (4 * i)
    return out.astype(np.uint32).view(np.int32)


def test_from_gptq(rng):
    k, n, g = 256, 16, 64
    q = rng.integers(-8, 8, (k, n), dtype=np.int8)
    scales = rng.random((k // g, n)).astype(np.float16)
    qweight = gptq_pack((q + 8).astype(np.uint8))
    qzeros = awq_pack(np.full((k // g, n), 7, np.uint8))  # stored minus one
    q2, s2, z2, g2 = from_gptq(qweight, qzeros, scales, g)
    assert np.array_equal(q2, q) and np.array_equal(s2, scales) and z2 is None and g2 is None
    assert from_gptq(qweight, qzeros, scales, g, g_idx=np.arange(k) // g).g_idx is None
    g_idx = rng.permutation(np.arange(k) // g)                 # act-order: kept
    assert np.array_equal(from_gptq(qweight, qzeros, scales, g, g_idx=g_idx).g_idx, g_idx)
    z = rng.integers(0, 15, (k // g, n)).astype(np.uint8)       # asymmetric: stored z - 1
    stored = np.zeros((k // g, n // 8), np.int64)
    for i in range(8):                                         # nibble i = column 8c + i
        stored |= z[:, i::8].astype(np.int64) << (4 * i)
    qw = from_gptq(qweight, stored.astype(np.uint32).view(np.int32), scales, g)
    assert np.array_equal(qw.zeros, z.astype(np.int8) + 1 - 8)
    with pytest.raises(QuantFormatError, match="g_idx values"):
        from_gptq(qweight, qzeros, scales, g, g_idx=np.arange(k) // 8)


@pytest.mark.parametrize("symmetric,act_order", [(True, False), (False, False), (True, True),
                                                 (False, True)])
def test_formats_round_trip(rng, symmetric, act_order):
    """quantize -> each format's writer -> its reader gives the same weight back; dequantize
    matches the float weight to half a step of its group."""
    e, k, n, g = 2, 256, 48, 64
    w = rng.standard_normal((e, k, n)).astype(np.float32) * rng.uniform(0.1, 3)
    g_idx = np.stack([rng.permutation(np.arange(k) // g) for _ in range(e)]) if act_order else None
    qw = quantize(w, g, symmetric, g_idx)
    assert qw.q.dtype == np.int8 and -8 <= qw.q.min() and qw.q.max() <= 7
    assert (qw.zeros is None) == symmetric and (qw.g_idx is None) == (not act_order)
    step = np.take_along_axis(qw.scales.astype(np.float32),
                              (np.arange(k) // g if g_idx is None else g_idx)[..., :, None]
                              if g_idx is not None else
                              np.repeat(np.arange(k // g), g)[None, :, None], axis=1)
    assert np.all(np.abs(dequantize(qw, g) - w) <= 0.5 * step * 1.01 + 1e-6)
    ct = to_compressed_tensors(qw)
    assert ct["weight_packed"].shape == (e, n, k // 8) and ct["weight_scale"].shape == (e, n, k // g)
    back = from_compressed_tensors(ct["weight_packed"], ct["weight_scale"], g, ct["weight_shape"],
                                   ct.get("weight_zero_point"), ct.get("weight_g_idx"))
    assert all(np.array_equal(a, b) for a, b in zip(back, qw) if a is not None)
    back = from_gptq(*to_gptq(qw, g)[:3], g, g_idx=to_gptq(qw, g)[3])
    assert all(np.array_equal(a, b) for a, b in zip(back, qw) if a is not None)
    if not act_order:
        back = from_awq(*to_awq(qw), g)
        assert all(np.array_equal(a, b) for a, b in zip(back, qw) if a is not None)
    else:
        with pytest.raises(QuantFormatError, match="AWQ has no act-order"):
            to_awq(qw)


def test_reference_takes_zero_points_act_order_and_skipped_experts(rng):
    """reference.moe_w4a16 with zeros and g_idx equals the same layer on the dequantized weights
    computed directly, and a slot routed outside [0, E) adds nothing."""
    t, h, i, e, k, g = 5, 128, 64, 4, 2, 32
    x = rng.standard_normal((t, h)).astype(np.float16)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    wts = rng.random((t, k)).astype(np.float32)
    w13 = quantize(rng.standard_normal((e, h, 2 * i)), g, False,
                   np.stack([rng.permutation(np.arange(h) // g) for _ in range(e)]))
    w2 = quantize(rng.standard_normal((e, i, h)), g, False)
    got = R.moe_w4a16(x, ids, wts, w13.q, w13.scales, w2.q, w2.scales, g, w13_zero=w13.zeros,
                      w2_zero=w2.zeros, w13_g_idx=w13.g_idx)
    d13, d2 = dequantize(w13, g), dequantize(w2, g)
    want = np.zeros((t, h))
    for tok in range(t):
        for j in range(k):
            gu = x[tok].astype(np.float64) @ d13[ids[tok, j]]
            a = gu[:i] / (1 + np.exp(-gu[:i])) * gu[i:]
            want[tok] += wts[tok, j] * (a @ d2[ids[tok, j]])
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    skipped = ids.copy()
    skipped[1, 0], skipped[3, 1] = -1, e           # other ranks' experts
    got = R.moe_w4a16(x, skipped, wts, w13.q, w13.scales, w2.q, w2.scales, g, w13_zero=w13.zeros,
                      w2_zero=w2.zeros, w13_g_idx=w13.g_idx)
    only = R.moe_w4a16(x, ids, np.where(skipped == ids, wts, 0), w13.q, w13.scales, w2.q,
                       w2.scales, g, w13_zero=w13.zeros, w2_zero=w2.zeros, w13_g_idx=w13.g_idx)
    assert np.abs(got - only).max() <= 1e-6 * np.abs(only).max()      # (float32 sums' order)


def test_reference_takes_bf16_activations(rng):
    import ml_dtypes
    t, h, i, e, k, g = 3, 128, 64, 4, 2, 64
    x = rng.standard_normal((t, h)).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    wts = rng.random((t, k)).astype(np.float32)
    q13, s13 = quantize_int4(rng.standard_normal((e, h, 2 * i)), g)
    q2, s2 = quantize_int4(rng.standard_normal((e, i, h)), g)
    got = R.moe_w4a16(x, ids, wts, q13, s13.astype(ml_dtypes.bfloat16), q2,
                      s2.astype(ml_dtypes.bfloat16), g)
    want = R.moe_w4a16(x.astype(np.float32), ids, wts, q13,
                       s13.astype(ml_dtypes.bfloat16).astype(np.float32), q2,
                       s2.astype(ml_dtypes.bfloat16).astype(np.float32), g)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert isinstance(QuantizedWeight(q13, s13), tuple)
