"""The config-space sweep of `moegen autotune` (GPU): the candidate configs per token count,
each checked against the reference and timed; the best recorded in the tuning database
(tuning.py).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace

from .build import MOE_BLOCK_CHOICES
from .spec import Spec, load_spec
from .target import gpu_target
from .tile_model import TALL_BLOCK, GemmTile, MoeConfig
from .tuning import Device, TuningDB

# --- the config space ------------------------------------------------------------------------

STAGE_CHOICES = (2, 4, 8)
# (k per ring stage, warps per CTA): the tile pass's default first, so that a sweep cut short
# by its budget has covered the default tile's neighbourhood
TILE_CHOICES = ((16, 4), (32, 4), (16, 2))
# the wide CTA at prefill sizes: (column tiles, k per stage, rows per warp, warpgroup MMA), the
# default first; ring depths
WIDE_CHOICES = ((4, 32, 32, 1), (8, 32, 32, 1), (4, 32, 32, 0), (2, 32, 32, 0), (4, 16, 32, 0),
                (4, 32, 64, 1), (4, 32, 64, 0), (2, 32, 64, 0))
WIDE_STAGE_CHOICES = (4, 2, 6)
# the tall tile's ring depths, the default first (3 is its least)
TALL_STAGE_CHOICES = (4, 3)


def tall_configs(spec: Spec, tokens: int, arch: str | None) -> list[MoeConfig]:
    """The tall tile's candidates at a prefill token count, where the plan's arch has warpgroup
    MMA and both GEMMs' columns fill its CTAs (elsewhere its kernel is a slower wide CTA)."""
    from .passes.tiling.cta import GEMM_TILE, TALL_TILE, WGMMA_ARCHS, tall_block_k, tall_fits
    from .passes.tiling.moe_buckets import DECODE_MAX_TOKENS
    m = spec.moe
    if (tokens <= DECODE_MAX_TOKENS or (arch or spec.cuda_arch) not in WGMMA_ARCHS
            or not (tall_fits(2 * m.intermediate_size) and tall_fits(m.hidden_size))
            or m.block_size):
        return []
    return [MoeConfig(TALL_BLOCK, 1, d, 1, tall_block_k(spec.quant.group_size),
                      GEMM_TILE["warps"], TALL_TILE["col_tiles"], TALL_TILE["warp_rows"], 1)
            for d in TALL_STAGE_CHOICES]


def wide_split_configs(spec: Spec, tokens: int, arch: str | None = None) -> list[MoeConfig]:
    """The wide CTA's default tile split over K at a prefill token count, where a call of
    `tokens` evenly routed tokens leaves the SMs short of a GEMM's CTAs: splits of 2, 4 and 8
    while half the split's CTAs stay under those the SMs hold at the split CTA's register cap,
    over whole groups of K and (as a recorded entry is checked) the K-split CTA's warps; every
    pair of the two GEMMs' splits but the unsplit one."""
    from .passes.tiling.cta import GEMM_TILE, WIDE_TILE, splits_evenly, wide_epilogue_fits
    from .passes.tiling.moe_buckets import PREFILL_BLOCK, wide_call_ctas
    from .passes.tiling.msd import fit_warps
    m, g = spec.moe, spec.quant.group_size
    gpu = gpu_target(arch or spec.cuda_arch)
    cols, block_k, rows, wg = WIDE_CHOICES[0]
    block = PREFILL_BLOCK
    if g % block_k or not wide_epilogue_fits(cols, block) or m.block_size not in (None, block):
        return []

    def splits(k: int, n: int) -> list[int]:
        ctas, room = wide_call_ctas(spec, gpu, tokens, block, n // GEMM_TILE["block_n"], cols,
                                    rows)
        return [1] + [s for s in (2, 4, 8) if ctas * s // 2 < room and (k // g) % s == 0
                      and splits_evenly(k, s, fit_warps(k, GEMM_TILE["warps"]), block_k)]
    return [MoeConfig(block, up, WIDE_TILE["stages"], down, block_k, GEMM_TILE["warps"], cols,
                      rows, wg)
            for up in splits(m.hidden_size, 2 * m.intermediate_size)
            for down in splits(m.intermediate_size, m.hidden_size) if (up, down) != (1, 1)]


def config_space(spec: Spec, tokens: int, arch: str | None = None) -> list[MoeConfig]:
    """Candidates for one token count: the blocks the routing buffers allow up to twice what an
    average routed expert needs, every split-K of each GEMM that divides its K steps over its
    warps (split-K only for decode sizes, T <= 64, where some SMs would otherwise idle), ring
    depths 2, 4, 8 (the tile pass lowers a depth that does not fit shared memory, so such
    candidates are left out as duplicates), and the (k per stage, warps) of TILE_CHOICES that
    divide K and the group; at prefill sizes (T > 64) first the wide CTA in the blocks it takes
    (WIDE_CHOICES x WIDE_STAGE_CHOICES) and the tall tile (tall_configs, in a plan for `arch`,
    the spec's where None; its block of 128 under the same bound), whichever the tile pass picks
    at `tokens` first."""
    from .passes.tiling.cta import (GEMM_TILE, WIDE_BLOCKS, gemm_stages, splits_evenly,
                                    wide_epilogue_fits)
    from .passes.tiling.moe_buckets import DECODE_MAX_TOKENS, PREFILL_BLOCK, tall_edge
    from .passes.tiling.msd import fit_warps
    m = spec.moe
    # a block far larger than an average routed expert's slots only pads: at most twice the
    # power of two that holds them (so T = 1 tries block 8 only)
    per_expert = -(-tokens * m.top_k // min(m.num_experts, tokens * m.top_k))
    useful = max(8, 2 * (1 << max(0, per_expert - 1).bit_length()))
    blocks = ([m.block_size] if m.block_size
              else [b for b in MOE_BLOCK_CHOICES if b <= useful])
    splits = [s for s in (1, 2, 4, 8) if s == 1 or tokens <= 64]

    out = []
    if tokens > DECODE_MAX_TOKENS:
        out += [MoeConfig(b, 1, d, 1, block_k, GEMM_TILE["warps"], cols, rows, wg)
                for b in blocks if b in WIDE_BLOCKS for cols, block_k, rows, wg in WIDE_CHOICES
                for d in WIDE_STAGE_CHOICES
                if spec.quant.group_size % block_k == 0 and rows <= b
                and wide_epilogue_fits(cols, b)]
        if PREFILL_BLOCK in blocks:
            out += wide_split_configs(spec, tokens, arch)
        tall = tall_configs(spec, tokens, arch) if TALL_BLOCK <= useful else []
        edge = tall_edge(spec)
        out = tall + out if edge is not None and tokens >= edge else out + tall
    for block_k, warps in TILE_CHOICES:
        if spec.quant.group_size % block_k:
            continue

        def fits(k: int, split: int) -> bool:
            return splits_evenly(k, split, fit_warps(k, warps), block_k)
        if warps < GEMM_TILE["warps"] and all(fit_warps(k, GEMM_TILE["warps"]) <= warps
                                              for k in (m.hidden_size, m.intermediate_size)):
            continue          # the default's warps already drop this far: a duplicate
        for b in blocks:
            depths = sorted({gemm_stages(b, warps, d, block_k, zeros=not spec.quant.symmetric)
                             for d in STAGE_CHOICES})
            out += [MoeConfig(b, up, d, down, block_k, warps)
                    for up in splits for down in splits for d in depths
                    if fits(m.hidden_size, up) and fits(m.intermediate_size, down)]
    return out


@dataclass(frozen=True)
class MsdConfig:
    """One point of the MSD sweep: the lowering and its tile (for msd also the MMA, columns per
    CTA, the warps of each unit, weight ring stages and the occupancy the kernel is built for;
    both schedules of a compiled module are timed)."""
    lowering: str
    split_k: int
    mma: str = "s8"
    block_n: int = 128
    vec_warps: int = 2
    cube_warps: int = 2
    stages: int = 4
    occupancy: int = 0

    def pipeline(self) -> str:
        opts = f"split-k={self.split_k}" + (
            f",mma={self.mma},block-n={self.block_n},vec-warps={self.vec_warps},"
            f"cube-warps={self.cube_warps},stages={self.stages},occupancy={self.occupancy}"
            if self.lowering == "msd" else "")
        return f"tile{{{opts}}},schedule,alloc"

    def as_dict(self, schedule: str | None = None) -> dict:
        if self.lowering == "dequant":
            return {"lowering": "dequant", "split_k": self.split_k}
        return {"lowering": "msd", "schedule": schedule, "mma": self.mma,
                "block_n": self.block_n, "vec_warps": self.vec_warps,
                "cube_warps": self.cube_warps, "split_k": self.split_k,
                "stages": self.stages, "occupancy": self.occupancy}


def msd_config_space(spec: Spec) -> list[MsdConfig]:
    """msd: s8 MMA on 64, 128 or 256 columns (8 n8 tiles a matrix warp) x 2, 4 or 8 vector
    warps, the s4 MMA on the default layout, each x split-K over whole groups (2+ per CTA);
    the default layout as the tile pass builds it (its columns, warps, ring stages and
    occupancy: fewer columns and stages where the rows need the shared memory), the others at
    the rows' ring stages, or 2 where those do not fit, and left out where 2 do not either;
    dequant: split-K over k16 steps of its warps, where its shape rule allows the lowering.
    Ordered so that a short budget covers the default layout and the dequant lowering."""
    from .passes.tiling.cta import splits_evenly
    from .passes.tiling.msd import (MSD_CUDA_TILE, fit_warps, msd_cube_warps, msd_layout_bytes,
                                    msd_warp_layout)
    most = gpu_target(spec.cuda_arch).shared_per_cta
    s = spec.msd
    groups = s.k // spec.quant.group_size
    splits = [x for x in (1, 2, 4, 8, 16) if groups % x == 0 and groups // x >= 2] or [1]
    built = msd_default_config(replace(spec, lowering="msd"))
    own = (built["block_n"], built["vec_warps"])
    rows = {**MSD_CUDA_TILE, **msd_warp_layout(s.m)}     # the rows' stages and occupancy

    def layout(mma: str, block_n: int, vec: int) -> tuple | None:
        """(columns, vector warps, matrix warps, stages, occupancy) of a layout that fits, else
        None."""
        if (block_n, vec) == own and mma == built["mma"]:
            return (block_n, vec, built["cube_warps"], built["stages"], built["occupancy"])
        stages = next((d for d in (rows["stages"], 2)
                       if msd_layout_bytes(spec, block_n, vec, d, mma) <= most), None)
        cube = built["cube_warps"] if (block_n, vec) == own else msd_cube_warps(block_n)
        return None if stages is None else (block_n, vec, cube, stages, rows["occupancy"])

    def msd(mma: str, block_n: int, vec: int) -> list[MsdConfig]:
        fit = layout(mma, block_n, vec)
        return [] if fit is None else [MsdConfig("msd", sp, mma, *fit) for sp in splits]
    # the default layout's splits first, then the dequant lowering, then the other layouts and
    # the s4 MMA: a short budget still measures both lowerings
    out = msd("s8", *own)
    if s.n % 8 == 0:
        w = fit_warps(s.k, 4)
        out += [MsdConfig("dequant", sp) for sp in (1, 2, 4, 8) if splits_evenly(s.k, sp, w)]
    for bn in (64, 128, 256):
        for vec in (2, 4, 8):
            if (bn, vec) != own:
                out += msd("s8", bn, vec)
    out += msd("s4", *own)
    return out


def msd_default_config(spec: Spec) -> dict:
    """The config (as recorded) the tile pass picks for an MSD spec without a database."""
    from .passes.pipelines import lower
    module = lower(spec, "cuda", tuning=None)[0]
    tile = module.function().op("msd.group_loop").attrs["tile"]
    if spec.lowering == "dequant":
        return MsdConfig("dequant", tile["split_k"]).as_dict()
    return MsdConfig("msd", tile["split_k"], tile["mma"], tile["block_n"], tile["vec_warps"],
                     tile["cube_warps"], tile["w_stages"], tile["occupancy"]).as_dict(spec.schedule)


def default_config(spec: Spec, tokens: int, arch: str | None = None) -> MoeConfig:
    """The config the tile pass picks without a database for a call of `tokens` tokens, in a
    plan for `arch` (the spec's where None)."""
    from .passes.tiling.cta import GEMM_TILE
    block, t, d = built_tiles(spec, tokens, None, arch)
    wide = t.col_tiles > 1
    # (a split the device may double per call counts as the bucket's own: split_many)
    return MoeConfig(block, t.split_many, t.stages, d.split_many,
                     t.block_k, GEMM_TILE["warps"] if wide else t.warps, t.col_tiles,
                     t.warp_rows if wide else MoeConfig.warp_rows,
                     int(t.wgmma) if wide else MoeConfig.wgmma,
                     int(wide and (t.split_k > 1 or d.split_k > 1)))


_BUILT: dict = {}        # built_tiles' plans of this process, by spec, tokens, pipeline, arch


def built_tiles(spec: Spec, tokens: int, config: MoeConfig | None,
                arch: str | None = None) -> tuple:
    """What the tile pass builds for a call of `tokens` tokens, in a plan for `arch` (the
    spec's where None): the moe block and the gate/up and down GemmTiles of the bucket the call
    runs, from `config`'s pass pipeline as the sweep times it (None: the default plan)."""
    from .passes.pipelines import lower
    pipeline = None if config is None else config.pipeline()
    key = (spec.hash, tokens, pipeline, arch or spec.cuda_arch)
    if key not in _BUILT:
        module = lower(spec, "cuda", pipeline, tuning=None, arch=arch)[0]
        up, down = (next(op for op in module.function().ops
                         if op.NAME == "moe.grouped_gemm_w4a16"
                         and op.attr("mul_topk_weights") == d) for d in (False, True))
        buckets = up.attrs["block_buckets"]
        i = next((i for i, (edge, _) in enumerate(buckets) if tokens <= edge), len(buckets) - 1)
        _BUILT[key] = (buckets[i][1], *(GemmTile.per_bucket(g.attrs["tile"])[i]
                                        for g in (up, down)))
    return _BUILT[key]


def same_tile(spec: Spec, tokens: int, a: MoeConfig, b: MoeConfig,
              arch: str | None = None) -> bool:
    """Whether two configs build the same kernels for a call of `tokens` tokens (built_tiles:
    a ring depth the block cannot hold is cut by the tile pass, so 8 and 5 stages are the same
    for block 32). The default config (default_config) is built as the default plan builds it:
    its wide_decode form has no pass pipeline of its own."""
    default = default_config(spec, tokens, arch)

    def built(c: MoeConfig) -> tuple:
        return built_tiles(spec, tokens, None if c == default else c, arch)
    return a == b or built(a) == built(b)


def _candidates(space: list, label: str, start: float, budget_s: float | None, log):
    """The candidates of one sweep, under a progress bar where stderr is a terminal (redrawn in
    place: a log file would get a line a candidate); stops once the budget is spent."""
    bar_shown = sys.stderr.isatty()
    for i, cfg in enumerate(space):
        if budget_s is not None and time.monotonic() - start > budget_s:
            log(f"  budget of {budget_s:.0f} s spent: stopping at {i}/{len(space)}")
            break
        if bar_shown:
            bar = "#" * (20 * (i + 1) // len(space))
            print(f"\r  {label} [{bar:<20}] {i + 1}/{len(space)}", end="", file=sys.stderr)
        yield cfg
    if bar_shown:
        print(file=sys.stderr)


def _nvrtc_inputs(spec: Spec, space: list, arch: str, built: dict | None = None):
    """(code, options) of each candidate's module, as MoeW4A16 will compile it; None where the
    candidate is in `built` (a layer the sweep already has) or does not lower (the sweep
    reports that itself)."""
    from .passes.pipelines import lower
    from .targets.cuda.emitter import emit_moe
    from .targets.cuda.runtime import nvrtc_input
    for cfg in space:
        if built and cfg in built:
            yield None
            continue
        try:
            module, _, pm = lower(spec, "cuda", cfg.pipeline(), tuning=None, arch=arch)
            yield nvrtc_input(emit_moe(spec, module, pm.pipeline, arch), arch)
        except Exception:                  # noqa: BLE001
            yield None


def _check(cp, out, call, want, dtype: str = "float16", limit: float = 2e-3) -> None:
    """Poison `out` (all bits set: NaN in fp16 and bf16), run `call`, and raise unless its
    result (of the spec's `dtype`) is within `limit` of `want`."""
    import numpy as np

    from .reference import activation_dtype
    out.view(cp.uint16).fill(0xFFFF)             # unwritten outputs fail
    y = cp.asnumpy(call()).view(np.uint16).view(activation_dtype(dtype)).astype(np.float64)
    err = np.linalg.norm(y - want) / np.linalg.norm(want)
    if not err <= limit:                         # NaN fails too
        raise ValueError(f"relative error {err:.2e}")


def _scored_infinite(cfg, exc: Exception, log) -> None:
    log(f"\n  {cfg}: scored infinite ({str(exc).splitlines()[0][:100]})")


TIMING_NOISE = 0.05    # repeated 10-rep graph-replay medians of one config differ by 1.5-6% here


def beats_default(us: float, default_us: float) -> bool:
    """Whether a candidate's time beats the default config's own timing by more than the timing
    noise (one that times at par on one run is no improvement, and may be slower on the next)."""
    return us < default_us * (1 - TIMING_NOISE)


def keep_default_unless_faster(best: tuple, default: MoeConfig, default_us: float) -> tuple:
    """(time, config) to record: the sweep's best where it beats the default, else the default."""
    return best if beats_default(best[0], default_us) else (default_us, default)


def config_text(config: dict) -> str:
    """A recorded config as people read it: key=value, ..."""
    return ", ".join(f"{k}={v}" for k, v in config.items())


def ranked_lines(timed: list[tuple], default_us: float, top: int) -> list[str]:
    """The `top` fastest of a sweep's (time, label) pairs, fastest first, each with its time
    against the default's: how close the runners-up came (labels hold the pass pipeline, for
    --pass-pipeline or, MoE, bench --versus, and there default_marked's mark)."""
    return [f"    {us:8.1f} us  {default_us / us:5.2f}x  {label}"
            for us, label in sorted(timed, key=lambda p: p[0])[:top]]


DEFAULT_MARK = "  <- builds the default's kernels"


def default_marked(spec: Spec, tokens: int, cfg: MoeConfig, default: MoeConfig,
                   arch: str | None = None) -> str:
    """A candidate's pass pipeline, marked where it builds the default's kernels (same_tile):
    its time is the default's, timed again."""
    return cfg.pipeline() + (DEFAULT_MARK if same_tile(spec, tokens, cfg, default, arch) else "")


def sweep_listing(spec: Spec, tokens: list[int], arch: str | None = None) -> str:
    """What a sweep would time, without a GPU: per token count (MSD: for the spec's M) each
    candidate's pass pipeline (MoE: as `moegen bench --pass-pipeline` takes it), the default
    marked."""
    if spec.pipeline == "msd_matmul":
        default = msd_default_config(spec)
        space = msd_config_space(spec)
        lines = [f"M = {spec.msd.m}: {len(space)} candidates, each timed in both schedules "
                 f"(default: {config_text(default)})"]
        lines += [f"  {c.pipeline()}" + ("  <- the default" if c.as_dict(
                      default.get("schedule")) == default else "") for c in space]
        return "\n".join(lines)
    lines = []
    for t in tokens:
        if t > spec.tokens.max:
            lines.append(f"T = {t}: skipped, above tokens.max ({spec.tokens.max})")
            continue
        default = default_config(spec, t, arch)
        space = config_space(spec, t, arch)
        lines.append(f"T = {t}: {len(space)} candidates, then the default "
                     f"({config_text(default.as_dict())})")
        lines += [f"  {default_marked(spec, t, c, default, arch)}" for c in space]
    return "\n".join(lines)


def results_table(results: list[dict], what: str = "T") -> str:
    """The sweep's outcome, one row per token count (MSD: per lowering): the config recorded,
    its time, the default's, the speed-up."""
    head = f"{what:>6}  {'recorded config':<72} {'us':>8} {'default us':>10} {'speed-up':>8}"
    rows = [head, "-" * len(head)]
    for r in results:
        cfg = config_text(r["config"])
        rows.append(f"{r['tokens']:>6}  {cfg:<72} {r['time_us']:>8.1f} {r['default_us']:>10.1f} "
                    f"{r['default_us'] / r['time_us']:>7.2f}x")
    return "\n".join(rows)


def sweep_line(spec: Spec, tokens: int, kept: tuple, swept: tuple, default: MoeConfig,
               default_us: float, timed: int, candidates: int, arch: str) -> str:
    """The sweep's verdict for one token count: (time, config) kept and the sweep's fastest."""
    if same_tile(spec, tokens, kept[1], default, arch):
        return (f"  T={tokens}: kept the default config {kept[1].as_dict()} ({default_us:.1f} us):"
                f" the fastest of {timed} candidates timed (of {candidates}), "
                f"{swept[1].as_dict()}, took {swept[0]:.1f} us; a candidate must beat the "
                f"default by {100 * TIMING_NOISE:.0f}%")
    return (f"  T={tokens}: best {kept[1].as_dict()} {kept[0]:.1f} us, default {default_us:.1f} "
            f"us ({default_us / kept[0]:.2f}x)")


def autotune_moe(spec, tokens: list[int], db: TuningDB, budget_s: float | None = None,
                 reps: int = 10, log=print, top: int = 0) -> list[dict]:
    """Sweep the config space on the GPU; every candidate is checked against the reference
    before it is timed; failures (compile, resources, wrong numbers) score infinite. `top`:
    log that many of each token count's fastest candidates, as pass pipelines."""
    import numpy as np

    from . import reference
    from .targets.cuda.bench import time_call
    from .targets.cuda.compile_ahead import AheadCompiler, compile_pool, worker_count
    from .targets.cuda.device import get_cupy, host_activation
    from .targets.cuda.runtime import MoeW4A16
    cp = get_cupy()
    spec = load_spec(spec)
    m, g = spec.moe, spec.quant.group_size
    device = Device.current()
    start = time.monotonic()
    rng = np.random.default_rng(0)
    w13, w2 = reference.random_moe_weights(rng, spec)
    act = reference.activation_dtype(spec.dtype)
    layers: dict = {}
    packed = None
    results = []
    workers = worker_count()
    pool = compile_pool(workers)            # one set of compile workers for every token count
    try:
        for t in tokens:
            if t > spec.tokens.max:
                log(f"  T={t}: skipped: above tokens.max ({spec.tokens.max})")
                continue
            x = rng.standard_normal((t, m.hidden_size)).astype(act)
            logits = rng.standard_normal((t, m.num_experts)).astype(np.float32)
            ids, w = reference.topk_softmax(logits, m.top_k, m.renormalize)
            want = reference.moe_w4a16_weights(x, ids, w, w13, w2, g)
            xd, ld = cp.asarray(host_activation(x)), cp.asarray(logits)
            default = layers.get(None) or MoeW4A16(spec, tuning=None)   # the documented defaults
            layers[None] = default
            if packed is None:        # the weight layout does not depend on the config: pack once
                packed = default.pack(w13, w2)
            default_us = time_call(cp, lambda: default(xd, ld, packed), reps)
            space = config_space(spec, t, default.arch)
            best = (math.inf, None)
            timed = []
            with AheadCompiler(_nvrtc_inputs(spec, space, default.arch, layers), pool,
                               2 * workers) as ahead:
                for cfg in _candidates(space, f"T={t:<5}", start, budget_s, log):
                    ahead.next()                # its module compiled in a worker, if it could be
                    try:
                        layer = layers.get(cfg) or MoeW4A16(spec, pipeline=cfg.pipeline(),
                                                            tuning=None)
                        layers[cfg] = layer
                        _check(cp, layer.out, lambda: layer(xd, ld, packed), want, spec.dtype,
                               reference.MOE_REL_TOLERANCE[spec.dtype])
                        us = time_call(cp, lambda: layer(xd, ld, packed), reps)
                    except Exception as exc:  # compile failure, resources, wrong numbers: infinite
                        _scored_infinite(cfg, exc, log)
                        continue
                    timed.append((us, cfg))
                    if us < best[0]:
                        best = (us, cfg)
            if best[1] is None:
                continue
            default_cfg = default_config(spec, t, default.arch)   # lowers: once per count
            if top:
                log(f"  T={t}: the {min(top, len(timed))} fastest of {len(timed)} candidates "
                    f"(default {default_us:.1f} us)")
                # (only the lines shown are marked: marking lowers the candidate)
                fastest = sorted(timed, key=lambda p: p[0])[:top]
                for line in ranked_lines([(us, default_marked(spec, t, cfg, default_cfg,
                                                              default.arch))
                                          for us, cfg in fastest], default_us, top):
                    log(line)
            swept = best
            best = keep_default_unless_faster(best, default_cfg, default_us)
            results.append({"tokens": t, "config": best[1].as_dict(), "time_us": best[0],
                            "default_us": default_us, "checked": True})
            log(sweep_line(spec, t, best, swept, default_cfg, default_us, len(timed),
                           len(space), default.arch))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    db.record(spec, device, results)
    return results


def autotune_msd(spec, db: TuningDB, budget_s: float | None = None, reps: int = 10,
                 log=print, top: int = 0) -> list[dict]:
    """Sweep the MSD config space on the GPU (both schedules of every msd candidate, and the
    dequant lowering); every candidate is checked against its reference before it is timed.
    Records the best config of each lowering; the tile pass applies the one of the spec's.
    `top`: log that many of the fastest timings (lowering, schedule and pass pipeline)."""
    import numpy as np

    from . import reference
    from .targets.cuda.bench import time_call
    from .targets.cuda.device import get_cupy
    from .targets.cuda.runtime import MsdMatmul
    cp = get_cupy()
    spec = load_spec(spec)
    s, g = spec.msd, spec.quant.group_size
    device = Device.current()
    start = time.monotonic()
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (s.m, s.k)).astype(np.float16)
    w = rng.integers(-6, 7, (s.k, s.n), dtype=np.int8)
    scale = rng.uniform(-3, 3, (s.k // g, s.n)).astype(np.float16)
    wants = {"msd": reference.msd_matmul(x, w, scale, g, s.steps, accumulate=np.float64),
             "dequant": reference.dequant_matmul(x, w, scale, g)}
    xd, sd = cp.asarray(x), cp.asarray(scale)
    default = MsdMatmul(spec, tuning=None)          # the documented defaults
    dpw = default.pack(w)
    default_us = time_call(cp, lambda: default(xd, dpw, sd), reps)
    space = msd_config_space(spec)
    best: dict[str, tuple] = {}
    packed: dict = {}
    timed = []
    for cfg in _candidates(space, f"M={s.m:<3}", start, budget_s, log):
        try:
            op = MsdMatmul(replace(spec, lowering=cfg.lowering), pipeline=cfg.pipeline(),
                           tuning=None)
            if cfg.lowering not in packed:     # the layout does not depend on the tile: pack once
                packed[cfg.lowering] = op.pack(w)
            pw = packed[cfg.lowering]
            for schedule in op.schedules:
                try:
                    _check(cp, op.out, lambda: op(xd, pw, sd, schedule=schedule),
                           wants[cfg.lowering])
                except ValueError as exc:
                    raise ValueError(f"{schedule}: {exc}") from None
                us = time_call(cp, lambda: op(xd, pw, sd, schedule=schedule), reps)
                timed.append((us, f"lowering={cfg.lowering}" + (
                    f" schedule={schedule}" if cfg.lowering == "msd" else "") +
                    f" {cfg.pipeline()}"))
                if us < best.get(cfg.lowering, (math.inf,))[0]:
                    best[cfg.lowering] = (us, cfg.as_dict(schedule if cfg.lowering == "msd"
                                                          else None))
        except Exception as exc:   # compile failure, resources, wrong numbers: infinite
            _scored_infinite(cfg, exc, log)
    if top and timed:
        log(f"  M={s.m}: the {min(top, len(timed))} fastest of {len(timed)} timings (every "
            f"candidate in each of its schedules; default {default_us:.1f} us)")
        for line in ranked_lines(timed, default_us, top):
            log(line)
    own = best.get(spec.lowering)
    kept_default = bool(own) and not beats_default(own[0], default_us)
    if kept_default:
        # recorded as such, like the MoE sweep: the entry says the defaults were measured best
        best[spec.lowering] = (default_us, msd_default_config(spec))
        log(f"  M={s.m} {spec.lowering}: the default config is the best (timed {default_us:.1f} "
            f"us; no candidate beat it by {100 * TIMING_NOISE:.0f}%)")
    results = [{"tokens": s.m, "config": c, "time_us": us, "default_us": default_us,
                "checked": True} for us, c in sorted(best.values(), key=lambda b: b[0])]
    for r in results:
        if kept_default and r["config"]["lowering"] == spec.lowering:
            continue                                      # said above
        log(f"  M={s.m} {r['config']['lowering']}: best {r['config']} {r['time_us']:.1f} us, "
            f"default ({spec.lowering}, {spec.schedule}) {default_us:.1f} us "
            f"({default_us / r['time_us']:.2f}x)")
    db.record(spec, device, results)
    return results

