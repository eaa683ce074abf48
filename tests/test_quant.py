import numpy as np
import pytest

from moegen.quant import (AWQ_ORDER, QuantFormatError, from_awq, from_gptq, pack_int4,
                          quantize_int4, unpack_int4)


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
    q2, s2 = from_awq(qweight, qzeros, scales, g)
    assert np.array_equal(q2, q) and np.array_equal(s2, scales)
    zeros = np.full((e, k // g, n), 8, np.uint8)
    zeros[1, 0, 3] = 5
    with pytest.raises(QuantFormatError, match="zero points other than 8 are not supported yet"):
        from_awq(qweight, awq_pack(zeros), scales, g)


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
    q2, s2 = from_gptq(qweight, qzeros, scales, g)
    assert np.array_equal(q2, q) and np.array_equal(s2, scales)
    assert np.array_equal(from_gptq(qweight, qzeros, scales, g, g_idx=np.arange(k) // g)[0], q)
    with pytest.raises(QuantFormatError, match="act-order"):
        from_gptq(qweight, qzeros, scales, g, g_idx=rng.permutation(np.arange(k) // g))
    with pytest.raises(QuantFormatError, match="zero points other than 8"):
        from_gptq(qweight, awq_pack(np.full((k // g, n), 3, np.uint8)), scales, g)
