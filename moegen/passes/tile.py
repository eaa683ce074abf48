"""`tile`: record tile choices as op attributes (visible in the printed IR).

Defaults are documented here and in docs/PASSES.md. A tuning database entry (moegen autotune)
replaces the MoE block, split-K, ring depth, k per stage and warps per bucket when the context
carries one and no option fixes them (moe-block and the split options set aside the whole
entry; stages, block-k and warps only their own value); the buckets then end at the geometric
midpoints between the measured token counts.

MoE (`moe_w4a16`):
- moe block size per token-count bucket, ``block_buckets = [[max_tokens, block], ...]``, after
  the seed: 8 for decode-sized calls, 32 for prefill (T > 64). Decode is split at T = 16 and 64;
  a decode bucket whose largest call routes more than 8 slots to an average expert
  (T * top_k / E > 8, e.g. Mixtral at T = 64) takes the next power of two up to 32, so each
  expert's weights are read by one block instead of several. Where an average expert still
  gets at most 8 slots above T = 64 (T <= 8 E / top_k: Qwen3 128, DeepSeek 85), a bucket up to
  that T keeps block 8 and the K-split CTA (measured on the H200: at T = 65 Qwen3 121.5 against
  163.5 us with the wide CTA, DeepSeek 120.3 against 155.1; at T = 128 Qwen3 156.9 against
  165.6, while DeepSeek at 12 slots an expert is faster wide, 156.9 against 179.1). A spec
  with `moe.block_size` or the option ``moe-block=N`` uses that block in every bucket. Where
  the down GEMM of one token has fewer 64-column tiles than SMs (single_token_bucket: Mixtral,
  the seed), T = 1 is a bucket of its own, of 2-warp CTAs.
- GEMM tile for CUDA on each grouped GEMM: ``tile = {block_n, block_k, warps, stages, split_k}``:
  64 columns per CTA (the packed weight tile), then one entry per bucket in each list: k per
  ring stage (16; block-k=32 puts two k16 steps in each stage: fewer waits and barriers per
  byte), 4 warps splitting the CTA's K range (options set these for every bucket, a tuning
  entry per bucket; 2 warps in the single-token bucket); stages: each warp streams its k16
  steps through a cp.async ring of that
  many shared-memory stages (8, fewer where a bucket's block makes the CTA's rings pass
  48 KB: block 32 -> 4, 64 -> 3; from 4 up a power of two, so that the unrolled K loop's
  ring offsets are constants); split_k: in a decode bucket whose smallest call (one block
  per active expert) has fewer 64-column tiles than the GPU has SMs (132 on an H200), the K loop is
  split over CTAs until about 16 warps per SM are busy (four CTAs of 4 warps, eight of 2; the
  bucket after the single-token one keeps the split sized for one token); otherwise 1
  (measured: splitting when every SM already has a tile only adds the reduction); then, in
  any decode bucket, doubled while a CTA's share of K passes 256 k16 steps (DECODE_CTA_STEPS:
  Mixtral's down GEMM splits 4 ways at T = 17..64, whose last wave was left to few SMs). K/16 must
  divide evenly over split_k x warps (warps drop to 2 or 1 when it does not).
  Where an average expert gets more than WIDE_DECODE_SLOTS (13) slots in decode calls (Mixtral
  T = 53..64), those calls have a bucket of block 32 on the wide CTA below, split over K
  (_wide_decode_split) and, where split, its registers capped for 16 warps an SM (``ctas_per_sm``:
  4 CTAs of one warpgroup, 2 of two), which pins its copy addresses in registers (a GEMM left
  whole, as Mixtral's gate/up, is the prefill kernel: see wgmma below for its cap; a GEMM whose
  column tiles no wide CTA divides, as gate/up at I = 96, keeps the K-split CTA and its split):
  its cost is flat in T where 16-row blocks add a block for each expert past 16 slots (measured on
  the H200: Mixtral T = 64 301 against 371 us). Its GEMMs launch plainly (with programmatic
  dependent launch 320 against 301 us at T = 64). Where that split is above 1 (Mixtral's down
  GEMM, 4), the grid has it doubled (``split_k``) and the kernel picks per call: the bucket's own
  (``split_many``), or the doubled one where the call's moe blocks leave the CTAs at
  ``split_many`` short of WIDE_SPLIT_FILL of those the SMs hold (routing to few experts).
  Prefill buckets (T > 64) with block 32 or 64 take the wide CTA instead: ``col_tiles`` (per
  bucket; 1 = the K-split CTA) 64-column tiles per CTA, 4 or fewer to divide the weight's
  tiles, ``warp_rows`` (32, or 64 with ``warp-rows=64``; 0 in other buckets) rows a warp, warps
  = col_tiles x block / warp_rows over the whole K, one ring of 4 stages of 32 k for the CTA
  (``stages`` and ``block-k`` set them, the ring capped at 48 KB); ``wide-cols=0`` keeps the
  K-split CTA. Measured on the H200: 1.3-1.8x faster than the K-split CTA at T = 65..2048 on
  the three example models (docs/DESIGN.md). Where even a prefill bucket's largest call leaves
  the SMs short of a GEMM's CTA tiles (``prefill_fill``: Mixtral's down GEMM up to T = 159,
  10 blocks x 16 tiles), that GEMM splits over K as a decode bucket's wide CTA does (the split
  sized for the bucket's smallest call, doubled per call, registers capped): measured 4-23%
  faster at Mixtral T = 65..200 (before the tall tile took its calls from T = 160).
  ``wgmma`` (per bucket): the wide tile on warpgroup MMA where compiled for sm_90a (4 column
  tiles, warp_rows = block, 32 k a stage, 3 or more stages; ``wgmma=0`` keeps mma.sync): 4-6%
  faster at T = 2048 on the three models. Over the whole K with block 32 its registers are
  capped as a split one's (``ctas_per_sm``, its copy addresses pinned) and its K loop unrolled
  over a turn of the ring, every stage offset a constant: 74-76 SASS instructions a k16 step
  against 92-94, the layer 2% faster at Qwen3 and DeepSeek T = 256, 7% with AWQ zero points.
  In plans for an arch with warpgroup MMA (WGMMA_ARCHS: sm_90a; the plan's arch is the
  runtime's GPU, or the spec's targets.cuda.arch), from the call whose average expert gets
  TALL_SLOTS (64) slots, or TALL_SLOTS_FEW (40) with 8 experts or fewer (Mixtral T = 160), a
  last bucket of block TALL_BLOCK (128) takes the
  tall tile (``tall`` per bucket): 4 column tiles, a warpgroup each, 4 stages of 128 k (the
  group where smaller), dynamic shared memory. Compiled without warpgroup MMA the same kernel
  is the wide CTA of that block (16 warps of 32 rows, 64 k a stage), slower than block 32
  there, so other archs' plans have no tall bucket unless ``tall=1`` asks for one.
  ``tall=0``, ``wgmma=0``, ``block-k``, ``wide-cols``, ``warp-rows`` or a prefill split
  (``prefill-split-k``, ``prefill-split-k-down``: the prefill buckets' GEMMs split as given,
  registers capped as a split decode bucket's; ``split-k`` sets only the decode buckets')
  keep the wide CTA there;
  a tuning entry's bucket of block 128 is the tall tile (at the entry's stages, split 1), and
  ``moe-block=128`` puts the tall tile in every bucket (``stages`` its only other option).
- Router, on ``moe.topk_softmax``: ``router`` = redux (the default: redux.sync on
  order-preserving integer keys, two per pick; measured 1 to 1.4 us faster than shuffle per
  decode call) or shuffle (``router=shuffle``: five shuffle rounds of value and id per pick;
  the same ids and weights); ``align_tokens``: calls of up to that many
  tokens are routed inside the align kernel's CTA, one token per warp of it (16) by default,
  ``route-align-tokens=N`` up to 64 tokens and 512 slots, 0 never; ``gemm_route``: a call of
  one token with router logits is routed inside every CTA of both GEMMs instead, with no router
  or align launch (up to top-k GEMM_ROUTE_MAX_TOPK; ``route-in-gemm=0`` never; measured on the
  H200, T = 1 1.3-3.6 us faster on the three example models, the other calls as fast as
  without: the routing runs in forms of the first bucket's kernels of their own). Its shared
  memory (one_token_routing_bytes) comes off the first bucket's rings. ``one_launch``
  (``one-launch=1``; off by default): that call runs as one launch, the CTAs of both GEMMs'
  first-bucket kernels in one grid (the emitter's moe_one_token), where both are K-split CTAs
  of one block and warp count, gate/up ends in SwiGLU and the spec has no act-order (an error
  where asked otherwise). Measured on the H200 it is slower than the three launches it
  replaces (Qwen3-30B-A3B 23.6 against 18.4 us; docs/DESIGN.md).
- Align, on ``moe.align``: ``chunked_from`` (``align-chunked-from=N``): calls of at least N
  slots (T*K) align in chunks of ALIGN_CHUNK slots, a CTA each, in two launches (per-chunk
  counts, then each chunk's slots in place), instead of one CTA; the same outputs. 0: always
  one CTA. By default ALIGN_CHUNKED_FROM (2049): the one CTA is as fast up to about 2048 slots
  and slower beyond (measured in cta.py). Recorded as 0 where N is more than the spec's
  largest call has (tokens.max * top_k), so no chunked kernel is built for it.

MSD (`msd_matmul`) on Ascend, TCubeTiling-style numbers on the K loop:
singleCoreM = steps*M, baseM = align16(steps*M), baseK = group, singleCoreK = K,
singleCoreN = N over the AIC cores rounded up to 64 (the last core takes the tail),
baseN = min(singleCoreN, 512), depthA1 = depthB1 = 2, stepM = stepN = stepKa = stepKb = 1,
dbL0C = 1. At M=1, N=12288, K=8192 on 24 cores: 3, 16, 128, 512, 512, 2, 2, 1 as the sample.
MSD on CUDA, ``lowering: msd``: ``tile = {block_n, w_stages, x_stages, mma, vec_warps,
cube_warps, split_k}``: the warp layout by M (measured at the seed shape, M = 1, 4, 16): 2 vector
warps for M <= 2, 4 for M <= 4, else 8 (each unfolds rows r = its index mod vec_warps and merges
its share of the columns; where the rows take at most half of them, only the other half merges);
128 output columns per CTA over 2 matrix warps up to M = 4, else 256 over 4 (8 n8 tiles a
matrix warp); columns and matrix warps halved while the kernel would need more than the GPU's
shared memory a CTA (227 KB on sm_90), at 64 columns first the weight ring cut to 2 stages
(M = 64 with 3 slices: 64 columns, 1 matrix warp, 2 stages: 1.8x faster than 32 columns with 4);
block-n/vec-warps/cube-warps=N by hand. The matrix warps' weight ring 4 groups deep (stages=N),
the vector warps' activation ring as deep as 4 KB per warp allows (2..4 groups), K split over
CTAs (whole groups, at least two each) until about 3 CTAs per SM are busy, and the integer MMA
`s8` (the default: mma.sync m16n8k32 s8 x s8, the offset-binary weights widened to the bytes
16 q in registers, the slices unfolded as int8) or `s4` (mma.sync m16n8k64 s4 x u4 directly).
Measured
on the H200 at the seed shape, s8 is 3-4x faster: Hopper's tensor cores have no int4 mode and
run the s4 instruction emulated (docs/DESIGN.md).
``lowering: dequant``: the W4A16 GEMM of the MoE layer on one expert, ``tile = {block, block_n,
warps, stages, split_k}``: rows per CTA 8 for M <= 8, else min(32, M rounded up to 16), 64
columns, 4 warps, ring stages as for MoE, K split until about four CTAs per SM are busy.
"""
from __future__ import annotations

from ..tile_model import TALL_BLOCK
from ..ir import Module
from ..ir.ops.moe import ROUTERS
from .base import Context, Option, Pass, PipelineError
from .tiling.cta import (ALIGN_CHUNK, ALIGN_CHUNKED_FROM, GEMM_ROUTE_MAX_TOPK, WGMMA_ARCHS,
                        WIDE_WARP_ROWS)
from .tiling.gemm_cta import GemmTiling
from .tiling.moe_buckets import FEW_EXPERTS, TALL_SLOTS, TALL_SLOTS_FEW
from .tiling.moe_tile import MoeTiling
from .tiling.msd import MSD_BLOCK_N, MSD_WARPS
from .tiling.msd_tile import MsdTiling


class TilePass(MoeTiling, GemmTiling, MsdTiling, Pass):
    name = "tile"
    OPTIONS = {
        "moe-block": Option(int, None, "one moe block size for every token count (128: the "
                                       "tall tile, with stages=N its only other option)",
                            choices=(1, 2, 4, 8, 16, 32, 64, 128)),
        "block-n": Option(int, None, "columns per CTA (MoE: the packed tile, 64; MSD: 16..256)",
                          choices=MSD_BLOCK_N),
        "block-k": Option(int, None, "MoE: k per copy-ring stage (16 or 32)", choices=(16, 32)),
        "mma": Option(str, None, "MSD integer MMA: s4 or s8", choices=("s4", "s8")),
        "vec-warps": Option(int, None, "MSD: warps of the vector unit per CTA", choices=MSD_WARPS),
        "cube-warps": Option(int, None, "MSD: warps of the matrix unit per CTA",
                             choices=MSD_WARPS),
        "warps": Option(int, None, "warps per CTA, splitting its K range (decode buckets)",
                        choices=(1, 2, 4, 8)),
        "warp-rows": Option(int, None, "MoE prefill buckets: rows per warp of the wide CTA",
                            choices=WIDE_WARP_ROWS),
        "wide-cols": Option(int, None, "MoE prefill buckets: 64-column tiles per wide CTA (0 or 1: "
                                       "the K-split CTA)", choices=(0, 1, 2, 4, 8), minimum=0),
        "wgmma": Option(int, None, "MoE prefill buckets: 1 runs the wide CTA on warpgroup MMA "
                                   "where its tile allows and the GPU has it (sm_90a); 0 "
                                   "mma.sync only",
                        choices=(0, 1), minimum=0),
        "tall": Option(int, None, "MoE prefill buckets: calls whose average expert gets "
                                  f"{TALL_SLOTS} slots or more ({TALL_SLOTS_FEW} with "
                                  f"{FEW_EXPERTS} experts or fewer) take the tall tile (blocks of "
                                  f"{TALL_BLOCK}) where the plan's arch has warpgroup MMA "
                                  f"({', '.join(WGMMA_ARCHS)}); 1: on any arch (elsewhere "
                                  f"the bucket runs the wide CTA of block {TALL_BLOCK}); 0: "
                                  "never (the wide CTA of block 32)", choices=(0, 1), minimum=0),
        "stages": Option(int, None, "most copy-ring stages per warp (k16 steps in flight)"),
        "occupancy": Option(int, None, "MSD: CTAs an SM the kernel is built for (registers "
                                       "capped to hold them, K split to fill them); 0: uncapped",
                            minimum=0),
        "split-k": Option(int, None, "K splits (MoE: at decode sizes; MSD: over whole groups)"),
        "split-k-down": Option(int, None, "K splits of the down GEMM at decode sizes (default: "
                                          "split-k)"),
        "prefill-split-k": Option(int, None, "MoE prefill buckets: K splits of the wide or "
                                             "K-split CTA (the wide CTA over whole groups, its "
                                             "registers capped as a split decode bucket's; "
                                             "default: whole, or the tile pass's own split where "
                                             "a call leaves the SMs short)"),
        "prefill-split-k-down": Option(int, None, "MoE prefill buckets: K splits of the down "
                                                  "GEMM (default: prefill-split-k)"),
        "router": Option(str, ROUTERS[0], "MoE top-k search of a warp: redux or shuffle",
                         choices=ROUTERS),
        "route-align-tokens": Option(int, None, "MoE: calls of up to N tokens route inside the "
                                                "align kernel (0: never)", minimum=0),
        "align-chunked-from": Option(int, None, "MoE: calls of at least N slots (T*K) align "
                                                f"in chunks of {ALIGN_CHUNK} slots, a CTA each, "
                                                "in two launches; 0: always in one CTA "
                                                f"(default {ALIGN_CHUNKED_FROM}; 0 where no call "
                                                "has N slots)",
                                     minimum=0),
        "route-in-gemm": Option(int, None, "MoE: 1 (the default where top_k <= "
                                           f"{GEMM_ROUTE_MAX_TOPK}) routes a call of one token "
                                           "with router logits inside every CTA of both GEMMs, "
                                           "with no router or align launch; 0 never",
                                choices=(0, 1), minimum=0),
        "one-launch": Option(int, 0, "MoE: 1 runs a call of one token with router logits as "
                                     "one launch (both GEMMs' CTAs in one grid, the top-k sum "
                                     "in the down GEMM's epilogue; routed in the GEMMs); 0 (the "
                                     "default, faster as measured) three",
                             choices=(0, 1), minimum=0),
    }

    def apply(self, module: Module, ctx: Context) -> None:
        spec = ctx.spec
        self.gpu = ctx.gpu_target()
        try:
            tuned = (ctx.tuning.lookup(spec, ctx.target, self.gpu) if ctx.tuning is not None
                     else None)
        except ValueError as exc:           # a database file edited by hand
            raise PipelineError(f"tuning entry: {exc}") from None
        if spec.pipeline == "moe_w4a16":
            self._moe(module, ctx, tuned or {})
        else:
            self._msd(module, ctx, tuned or {})

    def _check_entry_value(self, where: str, option: str, value, name: str | None = None) -> None:
        """A tuning entry's value takes a value of `option` (the error calls it `name`, where
        not by the option's name)."""
        opt = self.OPTIONS[option]
        if type(value) is not opt.type or (      # (an int, not a bool: JSON true)
                value not in opt.choices if opt.choices
                else opt.type is int and value < opt.minimum):
            rule = (f"one of {', '.join(map(str, opt.choices))}" if opt.choices
                    else f"an integer >= {opt.minimum}")
            raise PipelineError(f"{where} has {name or option} {value!r}: must be {rule}")
