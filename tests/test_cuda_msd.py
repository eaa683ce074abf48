"""The CUDA MSD matmul against the numpy reference (run with -m gpu on a GPU machine)."""
import numpy as np
import pytest

import moegen
from moegen import reference as R

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

CASES = [(1, 12288, 8192, 3), (1, 12288, 8192, 1), (2, 4096, 4096, 2), (5, 11008, 4096, 3),
         (16, 4096, 4096, 3), (64, 1000, 1024, 3), (5, 1000, 1024, 1), (16, 1000, 1024, 2)]


def spec_for(m, n, k, steps):
    return moegen.load_spec({"name": f"msd-{m}-{n}-{k}-{steps}", "pipeline": "msd_matmul",
                             "msd": {"m": m, "n": n, "k": k, "steps": steps},
                             "targets": {"cuda": {"arch": "sm_90"}}})


@pytest.mark.parametrize("m,n,k,steps", CASES, ids=[f"m{c[0]}-n{c[1]}-k{c[2]}-s{c[3]}" for c in CASES])
def test_against_reference_and_basic_equals_preload(rng, m, n, k, steps):
    op = moegen.cuda.MsdMatmul(spec_for(m, n, k, steps))
    for seed_style in (True, False):
        if seed_style:   # as the sample's golden generator draws
            x = rng.uniform(-3, 3, (m, k)).astype(np.float16)
            w = rng.integers(-6, 7, (k, n), dtype=np.int8)
            s = rng.uniform(-3, 3, (k // 128, n)).astype(np.float16)
        else:
            x = rng.standard_normal((m, k)).astype(np.float16)
            w = rng.integers(-8, 8, (k, n), dtype=np.int8)
            s = (rng.random((k // 128, n)) * 0.05).astype(np.float16)
        packed = op.pack(w)
        want = R.msd_matmul(x, w, s, 128, steps, accumulate=np.float64)
        outs = {}
        for mode in ("basic", "preload"):
            op.out.fill(np.float16(np.nan))
            y = cp.asnumpy(op(cp.asarray(x), packed, cp.asarray(s), schedule=mode))
            assert not np.isnan(y).any(), mode
            err = np.linalg.norm(y.astype(np.float64) - want) / np.linalg.norm(want)
            assert err <= 2e-3, f"{mode}: relative error {err:.2e}"
            outs[mode] = y.view(np.uint16).copy()
        assert np.array_equal(outs["basic"], outs["preload"]), "basic and preload differ"
