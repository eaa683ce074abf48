"""The packed weight layout, on the CPU: round trips, and a numpy emulation of how the kernel
consumes it (dequant8 + mma.sync m16n8k16 A-fragment conventions)."""
import numpy as np
import pytest

from moegen.targets.cuda.layout import gate_up_columns, pack_weights, unpack_weights


def test_pack_round_trip(rng):
    for e, k, n, g in ((2, 256, 96, 128), (3, 64, 200, 32), (1, 128, 64, 64)):
        q = rng.integers(-8, 8, (e, k, n), dtype=np.int8)
        s = rng.random((e, k // g, n)).astype(np.float16)
        words, ps = pack_weights(q, s, g)
        assert words.dtype == np.uint32 and words.shape == (e, k // 16, -(-n // 64), 32, 4)
        q2, s2 = unpack_weights(words, ps, n)
        assert np.array_equal(q2, q) and np.array_equal(s2, s)
        cols = gate_up_columns(n // 2) if n % 64 == 0 else None
        if cols is not None:
            words, ps = pack_weights(q, s, g, cols)
            q2, s2 = unpack_weights(words, ps, n, cols)
            assert np.array_equal(q2, q) and np.array_equal(s2, s)


def emulate_weight_tile(words, packed_scales, kstep, tile, g):
    """The 16 x 64 (k x column) dequantized weight tile a warp builds from one k16 step, as the
    kernel does: word t of lane l is the m16n8k16 A fragment of columns 16 t .. 16 t + 15 (A row
    = output column), dequant8 gives its registers a0..a3 = (n0, n4), (n1, n5), (n2, n6),
    (n3, n7); a0 = row r, k = kq + {0, 1}; a1 = row r + 8; a2 = row r, k + 8; a3 = row r + 8,
    k + 8 (r = l / 4, kq = 2 (l % 4)); the lane's scales are those of columns 8 j + r."""
    b = np.zeros((16, 64), np.float32)
    for lane in range(32):
        sc = packed_scales[kstep * 16 // g, tile, lane // 4]          # columns 8 j + r
        r, kq = lane // 4, 2 * (lane % 4)
        for t in range(4):
            w = int(words[kstep, tile, lane, t])
            nib = [((w >> (4 * i)) & 0xF) - 8 for i in range(8)]        # dequant8: u - 8
            regs = [(nib[0], nib[4]), (nib[1], nib[5]), (nib[2], nib[6]), (nib[3], nib[7])]
            for reg, (lo, hi) in enumerate(regs):
                row = 16 * t + r + 8 * (reg % 2)
                k = kq + 8 * (reg // 2)
                s = float(sc[2 * t + reg % 2])
                b[k, row], b[k + 1, row] = lo * s, hi * s
    return b


def test_kernel_view_of_the_layout(rng):
    e, k, n, g = 1, 256, 128, 128
    q = rng.integers(-8, 8, (e, k, n), dtype=np.int8)
    s = rng.random((e, k // g, n)).astype(np.float16)
    cols = gate_up_columns(n // 2)
    words, ps = pack_weights(q, s, g, cols)
    dense = (q[0].astype(np.float32) * np.repeat(s[0].astype(np.float32), g, 0))[:, cols]
    for kstep in (0, 7, 15):
        for tile in (0, 1):
            got = emulate_weight_tile(words[0], ps[0], kstep, tile, g)
            assert np.array_equal(got, dense[kstep * 16:(kstep + 1) * 16, tile * 64:(tile + 1) * 64])


def test_msd_pack_round_trip_and_fragment_view(rng):
    from moegen.targets.cuda.layout import pack_msd_weights, unpack_msd_weights
    for k, n in ((256, 100), (128, 64), (512, 8)):
        q = rng.integers(-8, 8, (k, n), dtype=np.int8)
        words = pack_msd_weights(q)
        assert words.shape == (-(-n // 8), k // 64, 32, 2)
        assert np.array_equal(unpack_msd_weights(words, n), q)
        # mma.sync m16n8k64 u4 B fragment: lane l's word j, nibble i is q + 8 at
        # k = 64 s + 32 j + 8 (l % 4) + i of column 8 t + l / 4 (padding columns: q = 0)
        for _ in range(20):
            t, s = rng.integers(0, words.shape[0]), rng.integers(0, k // 64)
            lane, j, i = rng.integers(0, 32), rng.integers(0, 2), rng.integers(0, 8)
            col = 8 * t + lane // 4
            nib = (int(words[t, s, lane, j]) >> (4 * i)) & 0xF
            want = q[64 * s + 32 * j + 8 * (lane % 4) + i, col] if col < n else 0
            assert nib == want + 8


def test_msd_pack_rejects_values_outside_int4(rng):
    from moegen.targets.cuda.layout import pack_msd_weights
    q = rng.integers(-8, 8, (64, 16), dtype=np.int8)
    q[3, 5] = 8
    with pytest.raises(ValueError, match=r"w_q: values -?\d+\.\.8 are not int4"):
        pack_msd_weights(q)
