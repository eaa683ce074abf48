"""The CUDA MSD matmul against the numpy reference (run with -m gpu on a GPU machine)."""
import itertools

import numpy as np
import pytest

import moegen
from moegen import reference as R

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

MS = (1, 2, 5, 16, 64)
NKS = ((12288, 8192), (4096, 4096), (11008, 4096), (1000, 1024))
# every M with every (N, K); the slice count cycles through 1, 2, 3
CASES = [(m, n, k, 1 + i % 3) for i, (m, (n, k)) in enumerate(itertools.product(MS, NKS))]


def spec_for(m, n, k, steps, group=128, lowering="msd"):
    return moegen.load_spec({"name": f"msd-{m}-{n}-{k}-{steps}", "pipeline": "msd_matmul",
                             "msd": {"m": m, "n": n, "k": k, "steps": steps},
                             "quant": {"bits": 4, "group_size": group, "symmetric": True},
                             "lowering": lowering, "targets": {"cuda": {"arch": "sm_90"}}})


def draws(rng, m, n, k, group, seed_style):
    if seed_style:   # as the sample's golden generator draws
        return (rng.uniform(-3, 3, (m, k)).astype(np.float16),
                rng.integers(-6, 7, (k, n), dtype=np.int8),
                rng.uniform(-3, 3, (k // group, n)).astype(np.float16))
    return (rng.standard_normal((m, k)).astype(np.float16),
            rng.integers(-8, 8, (k, n), dtype=np.int8),
            (rng.random((k // group, n)) * 0.05).astype(np.float16))


def run(op, x, packed, s, schedule):
    op.out.fill(np.float16(np.nan))          # poison: every element must be written
    y = cp.asnumpy(op(cp.asarray(x), packed, cp.asarray(s), schedule=schedule))
    assert not np.isnan(y).any(), schedule
    return y


def rel(y, want):
    return np.linalg.norm(y.astype(np.float64) - want) / np.linalg.norm(want)


def check_msd(rng, spec, pipeline=None):
    op = moegen.cuda.MsdMatmul(spec, pipeline=pipeline)
    s_ = spec.msd
    g = spec.quant.group_size
    outs = {}
    for seed_style in (True, False):
        x, w, s = draws(rng, s_.m, s_.n, s_.k, g, seed_style)
        packed = op.pack(w)
        want = R.msd_matmul(x, w, s, g, s_.steps, accumulate=np.float64)
        for mode in ("basic", "preload"):
            y = run(op, x, packed, s, mode)
            err = rel(y, want)
            assert err <= 2e-3, f"{mode}: relative error {err:.2e}"
            outs[mode] = y.view(np.uint16).copy()
        assert np.array_equal(outs["basic"], outs["preload"]), "basic and preload differ"
    return outs


@pytest.mark.parametrize("m,n,k,steps", CASES, ids=[f"m{c[0]}-n{c[1]}-k{c[2]}-s{c[3]}" for c in CASES])
def test_against_reference_and_basic_equals_preload(rng, m, n, k, steps):
    check_msd(rng, spec_for(m, n, k, steps))


@pytest.mark.parametrize("pipeline", ["tile{mma=s4},schedule,alloc", "tile{block-n=64},schedule,alloc",
                                      "tile{split-k=1},schedule,alloc",
                                      "tile{stages=2},schedule,alloc",
                                      # warp layouts: one vector warp; 16 warps of one n8 tile
                                      # each; 256 columns over 8 matrix warps, 4 merge columns a lane
                                      "tile{vec-warps=1,cube-warps=4},schedule,alloc",
                                      "tile{block-n=64,vec-warps=8,cube-warps=8},schedule,alloc",
                                      "tile{block-n=256,vec-warps=2,cube-warps=8,split-k=4},schedule,alloc",
                                      "tile{block-n=128,vec-warps=4,cube-warps=4},schedule,alloc"])
def test_tile_variants(rng, pipeline):
    check_msd(rng, spec_for(5, 1000, 1024, 3), pipeline)
    check_msd(rng, spec_for(16, 4096, 4096, 2), pipeline)


@pytest.mark.parametrize("m,pipeline,merging", [(2, "tile{vec-warps=4},schedule,alloc", "warps 2 .. 3"),
                                                (3, "tile{vec-warps=8},schedule,alloc", "warps 4 .. 7"),
                                                (1, "tile{block-n=64,vec-warps=8,cube-warps=8},schedule,alloc",
                                                 "warps 4 .. 7")])
def test_merging_warps_apart_from_the_unfolding_ones(rng, m, pipeline, merging):
    """Rows on at most half the vector warps: the other half merges (M = 1 by default), here
    with idle warps between them (M = 3 on 8) and 16 merge columns a warp (M = 1 on 8)."""
    op = moegen.cuda.MsdMatmul(spec_for(m, 1000, 1024, 3), pipeline=pipeline)
    assert f"columns per warp on {merging})" in op.program.source
    check_msd(rng, spec_for(m, 1000, 1024, 3), pipeline)
    check_msd(rng, spec_for(m, 4096, 4096, 2), pipeline)


def test_odd_n(rng):
    """Odd N: the scale rows are 2-byte aligned, copied with plain loads; tail columns."""
    check_msd(rng, spec_for(3, 1001, 1024, 3))
    check_msd(rng, spec_for(1, 1001, 1024, 2), "tile{block-n=256,cube-warps=8},schedule,alloc")


def test_group_64(rng):
    check_msd(rng, spec_for(2, 4096, 4096, 3, group=64))


@pytest.mark.parametrize("m", [2, 5])
def test_s4_and_s8_mma_agree_bitwise(rng, m):
    """The same int32 products: s4 (rows as the A operand) against s8, which takes the rows as
    the B operand at M = 2 (6 unfolded rows) and as the A operand at M = 5 (15)."""
    spec = spec_for(m, 4096, 4096, 3)
    x, w, s = draws(rng, m, 4096, 4096, 128, True)
    ys = []
    for pipeline in ("tile{mma=s4},schedule,alloc", "tile{mma=s8},schedule,alloc"):
        op = moegen.cuda.MsdMatmul(spec, pipeline=pipeline)
        rows_as_b = "constexpr bool ROWS_AS_B = true;" in op.program.source
        assert rows_as_b == (m == 2 and "s8" in pipeline), pipeline
        ys.append(run(op, x, op.pack(w), s, "preload").view(np.uint16))
    assert np.array_equal(ys[0], ys[1])


DIVISION = r"""
#include "moegen_w4a16.cuh"
// CTA b: divisor values[b + 1] (values[0] is +0); its threads stride over every dividend
extern "C" __global__ void division_mismatches(const unsigned short* values, int n,
                                               unsigned long long* bad, unsigned* example) {
  const float b = __half2float(__ushort_as_half(values[blockIdx.x + 1]));
  const float inv = __frcp_rn(b);
  unsigned long long count = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float a = __half2float(__ushort_as_half(values[i]));
    const float want = a / b, got = moegen::div_rn_by(a, b, inv);
    if (__float_as_uint(want) != __float_as_uint(got) && !(want == 0.0f && got == 0.0f)) {
      ++count;
      *example = (unsigned)values[i] << 16 | values[blockIdx.x + 1];
    }
  }
  atomicAdd(bad, count);
}
"""


def test_unfold_division_is_div_rn_for_every_pair_of_fp16_values():
    """unfold divides by A_max with div_rn_by (one reciprocal a row): the same float32 as a / b
    (div.rn) for every finite fp16 dividend and non-zero divisor, zeros of either sign equal."""
    from moegen.resources import data_dir
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = bits[np.isfinite(bits.view(np.float16))]
    nonzero = finite[finite.view(np.float16) != 0]
    values = cp.asarray(np.concatenate([np.zeros(1, np.uint16), nonzero, np.array([0x8000], np.uint16)]))
    kernel = cp.RawKernel(DIVISION, "division_mismatches",
                          options=("--std=c++17", f"-I{data_dir('templates') / 'cuda'}"))
    bad, example = cp.zeros(1, cp.uint64), cp.zeros(1, cp.uint32)
    kernel((len(nonzero),), (256,), (values, np.int32(len(values)), bad, example))
    assert len(values) == len(finite) == 63488
    e = int(example[0])
    assert int(bad[0]) == 0, (f"{int(bad[0])} quotients differ from div.rn, e.g. "
                              f"{np.uint16(e >> 16).view(np.float16)} / "
                              f"{np.uint16(e & 0xFFFF).view(np.float16)}")


DEQUANT = [(1, 12288, 8192, 128), (2, 1000, 1024, 128), (5, 11008, 4096, 64), (16, 4096, 4096, 128),
           (64, 1000, 1024, 128)]


@pytest.mark.parametrize("m,n,k,group", DEQUANT, ids=[f"m{c[0]}-n{c[1]}-k{c[2]}-g{c[3]}" for c in DEQUANT])
def test_dequant_lowering(rng, m, n, k, group):
    spec = spec_for(m, n, k, 3, group=group, lowering="dequant")
    op = moegen.cuda.MsdMatmul(spec)
    assert op.schedules == ["dequant"]
    for seed_style in (True, False):
        x, w, s = draws(rng, m, n, k, group, seed_style)
        packed = op.pack(w)
        first = run(op, x, packed, s, None)
        err = rel(first, R.dequant_matmul(x, w, s, group))
        assert err <= 2e-3, f"relative error {err:.2e}"
        again = run(op, x, packed, s, None)
        assert np.array_equal(first.view(np.uint16), again.view(np.uint16))   # split-K order fixed
    with pytest.raises(ValueError, match="schedule: 'preload' is not compiled"):
        op(cp.asarray(x), packed, cp.asarray(s), schedule="preload")


def test_graph_capture_replays_with_new_inputs(rng):
    spec = spec_for(2, 4096, 4096, 3)
    op = moegen.cuda.MsdMatmul(spec)
    x, w, s = draws(rng, 2, 4096, 4096, 128, True)
    packed = op.pack(w)
    xd, sd = cp.asarray(x), cp.asarray(s)
    op(xd, packed, sd)                                   # compile and load before capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        op(xd, packed, sd)
        graph = stream.end_capture()
    x2 = rng.uniform(-3, 3, x.shape).astype(np.float16)
    xd[...] = cp.asarray(x2)
    op.out.fill(np.float16(np.nan))
    cp.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    y = cp.asnumpy(op.out)
    assert rel(y, R.msd_matmul(x2, w, s, 128, 3, accumulate=np.float64)) <= 2e-3


def test_bench_msd_rows_json_and_baseline(tmp_path):
    """`moegen bench` of an msd_matmul spec: a row per M asked for (another M than the spec's
    among them), each variant timed, the JSON file the rows returned; fp16 cuBLAS timed and
    printed unless `baseline=False` (`--no-baseline`)."""
    import json
    from moegen.targets.cuda.bench import bench_msd
    spec = {"name": "b", "pipeline": "msd_matmul", "msd": {"m": 4, "n": 1024, "k": 1024, "steps": 2},
            "quant": {"group_size": 128}, "targets": {"cuda": {"arch": "sm_90a"}}}
    for baseline, rows in ((False, [1, 4]), (True, [2])):
        lines, path = [], tmp_path / f"b{int(baseline)}.json"
        got = bench_msd(spec, str(path), reps=3, rows=rows, log=lines.append, baseline=baseline)
        assert [r["m"] for r in got] == rows and json.loads(path.read_text()) == got
        for r in got:
            assert all(r[f"{v}_us"] > 0 for v in ("basic", "preload", "dequant", "read"))
            assert ("cublas_fp16_us" in r) == baseline
        assert all(("fp16 cuBLAS" in line) == baseline for line in lines if " M=" in line)
        assert all("bare read" in line for line in lines if " M=" in line)
