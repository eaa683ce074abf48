"""The packed weight layout, on the CPU: round trips, and a numpy emulation of how the kernel
consumes it (dequant8 + mma.sync m16n8k16 fragment conventions)."""
import numpy as np

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


def emulate_b_tile(words, packed_scales, kstep, tile, g):
    """The 16 x 64 dequantized B tile a warp builds from one k16 step, as the kernel does."""
    b = np.zeros((16, 64), np.float32)
    for lane in range(32):
        sc = packed_scales[kstep * 16 // g, tile, lane // 4]          # 8 scales, tiles 0..7
        for j in range(4):
            w = int(words[kstep, tile, lane, j])
            nib = [(w >> (4 * i)) & 0xF for i in range(8)]
            pairs = [(nib[0], nib[4]), (nib[1], nib[5]), (nib[2], nib[6]), (nib[3], nib[7])]
            vals = [(a - 8, c - 8) for a, c in pairs]                   # dequant8: u - 8
            k0, n = 2 * (lane % 4), lane // 4
            for t_off, (b0, b1) in ((0, (vals[0], vals[1])), (1, (vals[2], vals[3]))):
                ntile = 2 * j + t_off
                s = float(sc[ntile])
                col = ntile * 8 + n
                b[k0, col], b[k0 + 1, col] = b0[0] * s, b0[1] * s        # fragment b0
                b[k0 + 8, col], b[k0 + 9, col] = b1[0] * s, b1[1] * s    # fragment b1
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
            got = emulate_b_tile(words[0], ps[0], kstep, tile, g)
            assert np.array_equal(got, dense[kstep * 16:(kstep + 1) * 16, tile * 64:(tile + 1) * 64])


def test_msd_pack_round_trip_and_fragment_view(rng):
    from moegen.targets.cuda.layout import pack_msd_weights, unpack_msd_weights
    for k, n in ((256, 100), (128, 64), (512, 8)):
        q = rng.integers(-8, 8, (k, n), dtype=np.int8)
        words = pack_msd_weights(q)
        assert words.shape == (-(-n // 8), k // 64, 32, 2)
        assert np.array_equal(unpack_msd_weights(words, n), q)
        # mma.sync m16n8k64 s4 B fragment: lane l's word j, nibble i is
        # k = 64 s + 32 j + 8 (l % 4) + i of column 8 t + l / 4
        t, s, lane, j, i = rng.integers(0, words.shape[0]), rng.integers(0, k // 64), 13, 1, 5
        col = 8 * t + lane // 4
        if col < n:
            nib = (int(words[t, s, lane, j]) >> (4 * i)) & 0xF
            assert nib == q[64 * s + 32 * j + 8 * (lane % 4) + i, col] & 0xF
