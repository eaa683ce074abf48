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
  per active expert) has fewer 64-column tiles than the GPU has SMs (132), the K loop is
  split over CTAs until about 16 warps per SM are busy (four CTAs of 4 warps, eight of 2; the
  bucket after the single-token one keeps the split sized for one token); otherwise 1
  (measured: splitting when every SM already has a tile only adds the reduction); then, in
  any decode bucket, doubled while a CTA's share of K passes 256 k16 steps (DECODE_CTA_STEPS:
  Mixtral's down GEMM splits 4 ways at T = 17..64, whose last wave was left to few SMs). K/16 must
  divide evenly over split_k x warps (warps drop to 2 or 1 when it does not).
  Where an average expert gets more than WIDE_DECODE_SLOTS (13) slots in decode calls (Mixtral
  T = 53..64), those calls have a bucket of block 32 on the wide CTA below, split over K
  (_wide_decode_split) and, where split, its registers capped for 16 warps an SM
  (``ctas_per_sm``: 4 CTAs of one warpgroup, 2 of two), which pins its copy addresses in
  registers (a GEMM left whole, as Mixtral's gate/up, is the prefill kernel, uncapped): its cost
  is flat in T where 16-row blocks add a block for each expert past 16 slots (measured on the
  H200: Mixtral T = 64 301 against 371 us). Its GEMMs launch plainly (with programmatic
  dependent launch 320 against 301 us at T = 64). Where that split is above 1 (Mixtral's down
  GEMM, 4), the grid has it doubled (``split_k``) and the kernel picks per call: the bucket's
  own (``split_many``), or the doubled one where the call's moe blocks leave the CTAs at
  ``split_many`` short of WIDE_SPLIT_FILL of those the SMs hold (routing to few experts).
  Prefill buckets (T > 64) with block 32 or 64 take the wide CTA instead: ``col_tiles`` (per
  bucket; 1 = the K-split CTA) 64-column tiles per CTA, 4 or fewer to divide the weight's
  tiles, ``warp_rows`` (32, or 64 with ``warp-rows=64``; 0 in other buckets) rows a warp, warps
  = col_tiles x block / warp_rows over the whole K, one ring of 4 stages of 32 k for the CTA
  (``stages`` and ``block-k`` set them, the ring capped at 48 KB); ``wide-cols=0`` keeps the
  K-split CTA. Measured on the H200: 1.3-1.8x faster than the K-split CTA at T = 65..2048 on
  the three example models (docs/PERF.md). Where even a prefill bucket's largest call leaves
  the SMs short of a GEMM's CTA tiles (``prefill_fill``: Mixtral's down GEMM up to T = 159,
  10 blocks x 16 tiles), that GEMM splits over K as a decode bucket's wide CTA does (the split
  sized for the bucket's smallest call, doubled per call, registers capped): measured 4-23%
  faster at Mixtral T = 65..200 (before the tall tile took its calls from T = 160).
  ``wgmma`` (per bucket): the wide tile on warpgroup MMA where compiled for sm_90a (4 column
  tiles, warp_rows = block, 32 k a stage, 3 or more stages; ``wgmma=0`` keeps mma.sync): 4-6%
  faster at T = 2048 on the three models.
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
  memory (one_token_routing_bytes) comes off the first bucket's rings.

MSD (`msd_matmul`) on Ascend, TCubeTiling-style numbers on the K loop:
singleCoreM = steps*M, baseM = align16(steps*M), baseK = group, singleCoreK = K,
singleCoreN = N over the AIC cores rounded up to 64 (the last core takes the tail),
baseN = min(singleCoreN, 512), depthA1 = depthB1 = 2, stepM = stepN = stepKa = stepKb = 1,
dbL0C = 1. At M=1, N=12288, K=8192 on 24 cores: 3, 16, 128, 512, 512, 2, 2, 1 as the sample.
MSD on CUDA, ``lowering: msd``: ``tile = {block_n, w_stages, x_stages, mma, vec_warps,
cube_warps, split_k}``: the warp layout by M (measured at the seed shape, M = 1, 4, 16): 2 vector
warps for M <= 2, 4 for M <= 4, else 8 (each unfolds rows r = its index mod vec_warps and merges
its share of the columns; where the rows take at most half of them, only the other half merges);
128 output columns per CTA over 2 matrix warps up to M = 4, else 256
over 4 (8 n8 tiles a matrix warp); columns and matrix warps halved while the kernel would need
more than 227 KB of shared memory, at 64 columns first the weight ring cut to 2 stages (M = 64
with 3 slices: 64 columns, 1 matrix warp, 2 stages: 1.8x faster than 32 columns with 4);
block-n/vec-warps/cube-warps=N by hand. The matrix warps' weight ring 4 groups deep (stages=N),
the vector warps' activation ring as deep as 4 KB per warp allows (2..4 groups), K split over
CTAs (whole groups, at least two each) until about 3 CTAs per SM are busy, and the integer MMA
`s8` (the default: mma.sync m16n8k32 s8 x s8, the offset-binary weights widened to the bytes
16 q in registers, the slices unfolded as int8) or `s4` (mma.sync m16n8k64 s4 x u4 directly). Measured
on the H200 at the seed shape, s8 is 3-4x faster: Hopper's tensor cores have no int4 mode and
run the s4 instruction emulated (docs/PERF.md).
``lowering: dequant``: the W4A16 GEMM of the MoE layer on one expert, ``tile = {block, block_n,
warps, stages, split_k}``: rows per CTA 8 for M <= 8, else min(32, M rounded up to 16), 64
columns, 4 warps, ring stages as for MoE, K split until about four CTAs per SM are busy.
"""
from __future__ import annotations

from ..build import MOE_BLOCK_CHOICES, TALL_BLOCK
from ..ir import Module
from ..ir.ops.moe import ROUTERS
from .base import Context, Option, Pass, PipelineError
from .ascend_tiling import msd_tiling

DECODE_MAX_TOKENS = 64     # bucket edge: T <= 64 is decode-sized
DECODE_BLOCK = 8
NARROW_MAX_SLOTS = 8       # above T = 64, block 8 while an average expert gets this many slots
PREFILL_BLOCK = 32
GEMM_TILE = {"block_n": 64, "block_k": 16, "warps": 4, "stages": 8}
SHARED_PER_CTA = 48 * 1024  # static shared memory a CTA may declare
SHARED_OPT_IN = 227 * 1024  # dynamic shared memory a CTA may opt in to on sm_90 (MSD, tall tile)
RING_ROW_PAD = 16           # bytes after each staged activation row (conflict-free reads)
SCALE_BYTES = 128           # a 64-column tile's scales of a group in a copy ring (SCALE_STAGE_BYTES)
SM_COUNT = 132             # H100/H200
# the options that split the prefill buckets' GEMMs over K (they pin the prefill tile: no tall
# tile, no tuning entry)
PREFILL_SPLITS = ("prefill-split-k", "prefill-split-k-down")
CTAS_PER_SM = 4            # split-K target: enough weight bytes in flight per SM
# most k16 steps of K a CTA of a decode-bucket GEMM takes (measured on the H200): Mixtral's down
# GEMM (K = 14336, 896 steps) at T = 17..64 in 1.45 waves of 4 CTAs an SM at T = 64 was 4%
# faster split 4 (224 a CTA) than whole, and even at T = 40, while split 8 was 12% slower; its
# gate/up GEMM at T = 1 (256 a CTA of 2 warps) was 3% slower split 2
DECODE_CTA_STEPS = 256
MSD_CUDA_TILE = {"stages": 4, "mma": "s8", "occupancy": 0}   # and msd_warp_layout(m)
MSD_WARPS = (1, 2, 4, 8)    # choices of vector and of matrix warps per MSD CTA
MSD_BLOCK_N = (16, 32, 64, 128, 256)
ALIGN_WARPS = 16            # the align kernel's CTA: 512 threads
ROUTE_ALIGN_MAX_TOKENS = 64  # routing inside it: at most 4 tokens per warp
ROUTE_ALIGN_SLOTS = 512     # and its shared slots (4 KB of ids and weights)
# A call of one token with router logits is routed inside every CTA of both GEMMs (route-in-gemm),
# a lane a top-k slot: top_k up to a warp's lanes
GEMM_ROUTE_MAX_TOPK = 32
MSD_CTAS_PER_SM = 3         # MSD split-K target (the sweep's best at M = 1, 4, 16 of the seed shape)
SM_SHARED_BYTES = 228 * 1024   # shared memory of an SM on sm_90 ...
CTA_RESERVED_SHARED = 1024     # ... of which each resident CTA takes this much besides its own
SM_REGISTERS = 65536        # 32-bit registers of an SM
MSD_MIN_REGISTERS = 80      # an MSD thread's registers are never capped below this (M = 1 needs 80)
MSD_X_RING_BYTES = 4096     # activation ring of one vector warp (MSD on CUDA)
DENSE_MAX_BLOCK = 32        # rows per CTA of the dequant lowering
WIDE_BLOCKS = (32, 64)      # moe blocks the wide (prefill) CTA takes (1 or 2 row groups of 32)
WIDE_COL_TILES = 4          # 64-column tiles of a wide CTA (fewer where N has fewer)
WIDE_TILE = {"block_k": 32, "stages": 4, "warp_rows": 32}
WIDE_WARP_ROWS = (32, 64)   # rows a warp of the wide CTA multiplies
WGMMA_TILE = {"col_tiles": (4, 8), "wgmma": 1}   # 4 column tiles a warpgroup, 1 or 2 of them
# Decode calls whose average expert gets more than this many slots (most experts would spill
# into a second 16-row block) take the wide CTA with block 32, split over K. Measured on the
# H200, Mixtral, on two routing draws (group scales through the rings): at T = 56, 60 and 64 the
# wide CTA is 3-19% faster than 16-row blocks (T = 64: 301 against 371 us); at T = 52 even
# (299-301 against 298-301), at T = 40..48 slower (299 against 252-290): its cost is flat in
# T, the 16-row blocks' steps with each expert that passes 16 slots. Its ring is the prefill
# one (WIDE_TILE: 4 stages; 3 stages 11% slower, 5 or 6 within 1%; 3 stages of 64 k 3% slower),
# its registers capped for CTAS_PER_SM CTAs of 4 warps an SM.
WIDE_DECODE_SLOTS = 13
# A decode bucket's wide CTA split over K (Mixtral's down GEMM at T = 53..64, split 4) doubles its
# split on the device in calls whose moe blocks would leave its grid short of this share of the
# CTAs the SMs hold (routing to fewer experts: fewer blocks). Measured on the H200, Mixtral T = 64
# routed to 2..7 of its 8 experts: split 8 against 4 at 4 blocks 185 against 222 us, 5: 246 / 260,
# 6: 251 / 264, 7 (448 CTAs split 4, 0.85 of 528): 260 / 264; at 8 blocks (512 CTAs) 293 / 288.
# Its gate/up GEMM (split 1) gained nothing split 2 at 4 blocks (190 against 185 us). The split
# chosen per call: 2-17% faster at 2..7 experts, 0.3% slower at 8 (docs/PERF.md, "A K split
# chosen per call; ...").
WIDE_SPLIT_FILL = 0.9
# Prefill calls whose average expert gets TALL_SLOTS slots or more take the tall tile: blocks of
# TALL_BLOCK (moegen/build.py) rows x 4 column tiles, a warpgroup a column tile, each warp's
# dequantized weights serving every row of the block (grouped_gemm_wgmma_tall), 4 ring stages
# of 128 k. Measured on the H200 against the wide CTA (block 32; docs/PERF.md, "The tall tile"
# and "The tall tile's shared-memory traffic"), the layer in us, tall against wide:
#   64 slots an expert: Mixtral T = 256 539 against 688, DeepSeek 683 279 / 290, Qwen3 1024
#   329 / 335; 128: Mixtral 512 955 / 1144, DeepSeek 1366 450 / 495, Qwen3 2048 565 / 592;
#   256: Mixtral 1024 1536 / 1907, DeepSeek 2731 778 / 900, Qwen3 4096 983 / 1085.
#   Below 64, slower where experts are many: 48 slots DeepSeek 255 / 236, Qwen3 296 / 273
#   (Mixtral 486 / 581); 32 slots Mixtral 467 / 455, DeepSeek 239 / 184, Qwen3 273 / 217.
# 128 k a stage: 3% faster than 64 k at Mixtral T = 2048, 4% at 1024; 2 or 3 stages, 32 k a
# stage, 2 column tiles a CTA (2 CTAs an SM) and 3 wgmmas in flight were slower.
# With few experts (FEW_EXPERTS or fewer) the tall tile pays from TALL_SLOTS_FEW slots: measured
# at the prefill split's wide CTA (4ef927d), the layer in us, tall against wide, at 40 / 50 / 60
# slots: Mixtral (8 experts) T = 160 / 200 / 240 481-483 / 494-497 / 530-531 against
# 495-496 / 518-520 / 619; H = 2048, I = 1408, 8 experts, T = 160 / 200 / 240 56.0 / 57.6 /
# 61.5 against 65.9 / 67.3 / 69.4; with 16 experts (H = 4096, I = 6400, T = 320 / 400 / 480)
# 466 / 481 / 508 against 453 / 485 / 546, and with 64 or 128 (DeepSeek, Qwen3) 4-12% slower
# (docs/PERF.md, "Every example on the GPU again; ...").
TALL_SLOTS = 64
TALL_SLOTS_FEW = 40
FEW_EXPERTS = 8
TALL_TILE = {"col_tiles": 4, "warp_rows": 32, "block_k": 128, "stages": 4}
# Architectures with warpgroup MMA: plans for them take the tall tile. Elsewhere its kernel is
# the wide CTA of block 128 (16 warps, one CTA an SM), which on the H200 compiled for sm_90 was
# 19-66% slower than the wide CTA of block 32 (docs/PERF.md, "The tall bucket without warpgroup
# MMA"), so plans for them keep block 32 at every prefill size.
WGMMA_ARCHS = ("sm_90a",)


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


DECODE_EDGES = (16, DECODE_MAX_TOKENS)
SINGLE_TOKEN_WARPS = 2     # warps of the single-token bucket's CTAs (see single_token_bucket)


def single_token_bucket(top_k: int, hidden: int) -> bool:
    """Whether T = 1 gets a bucket of its own: where the down GEMM of one token has fewer
    64-column tiles than the GPU has SMs (top_k x H / 64 < 132; Mixtral: 2 x 64), so its K is
    split. There both GEMMs take 2 warps a CTA and the split doubles to keep about 16 warps on
    an SM: smaller CTAs spread the split more evenly (measured on the H200, Mixtral T = 1:
    73.3 against 75.6 us and 70.1 against 75.2 on another machine; slower from T = 4 on, so
    only for T = 1; a third run: 72.7-73.4 against 74.5-75.3 on one draw, even on another)."""
    return top_k * -(-hidden // GEMM_TILE["block_n"]) < SM_COUNT


def starts_with_single_token_bucket(buckets: list) -> bool:
    """Whether `buckets` ([[max_tokens, block], ...]) open with a bucket for T = 1 alone, as
    moe_buckets puts one first where single_token_bucket holds (a spec whose tokens.max is 1
    has one bucket, an ordinary one)."""
    return len(buckets) > 1 and buckets[0][0] == 1


def decode_block(tokens: int, top_k: int, experts: int) -> int:
    """8, or the power of two (<= 32) that holds an average expert's slots at `tokens`.
    (Measured on the H200, Mixtral T = 32..64: 24-row blocks, which would put most experts in
    one block at T = 64, were 1-23% slower than 16-row ones: a block's cost follows its rows.)"""
    per_expert = -(-tokens * top_k // experts)
    block = DECODE_BLOCK
    while block < per_expert and block < PREFILL_BLOCK:
        block *= 2
    return block


def wide_decode_edge(top_k: int, experts: int) -> int:
    """The largest call whose average expert gets at most WIDE_DECODE_SLOTS slots: decode calls
    above it take the wide CTA split over K."""
    return WIDE_DECODE_SLOTS * experts // top_k


def narrow_tail_edge(top_k: int, experts: int) -> int:
    """The largest call whose average expert gets at most NARROW_MAX_SLOTS slots."""
    return NARROW_MAX_SLOTS * experts // top_k


def tall_fits(n: int) -> bool:
    """Whether the tall tile takes a weight of n columns: whole 64-column tiles, in whole CTAs
    of TALL_TILE's column tiles."""
    block_n = GEMM_TILE["block_n"]
    return n % block_n == 0 and (n // block_n) % TALL_TILE["col_tiles"] == 0


def tall_slots(experts: int) -> int:
    """Slots an average expert gets from which prefill calls take the tall tile: TALL_SLOTS, or
    TALL_SLOTS_FEW where the experts are FEW_EXPERTS or fewer."""
    return TALL_SLOTS_FEW if experts <= FEW_EXPERTS else TALL_SLOTS


def tall_edge(spec) -> int | None:
    """The smallest call whose average expert gets tall_slots slots, where the tall tile fits
    both GEMMs and lies above the decode sizes."""
    m = spec.moe
    edge = -(-tall_slots(m.num_experts) * m.num_experts // m.top_k)
    fits = tall_fits(2 * m.intermediate_size) and tall_fits(m.hidden_size)
    return edge if fits and DECODE_MAX_TOKENS < edge <= spec.tokens.max else None


def tall_block_k(group: int) -> int:
    """k a ring stage of the tall tile: TALL_TILE's, or the group where that is smaller (a
    stage's k16 steps share a scale group; groups are 32 k or more, so they come in pairs, as
    the alternating A fragments need)."""
    bk = TALL_TILE["block_k"]
    while group % bk:
        bk //= 2
    return bk


def group_bytes(zeros: bool) -> int:
    """A 64-column tile's bytes of a scale group in a copy ring: its scales, and its zero points
    where the weights have them (staged after the scales)."""
    return SCALE_BYTES * (2 if zeros else 1)


def tall_stages(most: int, block_k: int, zeros: bool = False) -> int:
    """Ring stages of the tall tile asked for at most `most`: 3 at least, fewer than `most`
    where the dynamic shared memory would not hold them."""
    stages = max(3, most)
    while stages > 3 and tall_shared_bytes(TALL_BLOCK, stages, block_k, zeros) > SHARED_OPT_IN:
        stages -= 1
    return stages


def moe_buckets(spec, fixed: int | None, tall: bool = True) -> list[list[int]]:
    """[[max_tokens, block], ...]: the decode buckets (the last split where its calls' average
    expert passes WIDE_DECODE_SLOTS slots, above which block 32: wide_decode_bucket), a
    bucket of block 8 up to the call whose average expert gets 8 slots where that lies above
    T = 64, then prefill up to tokens.max: block 32, and (`tall`) from the call whose average
    expert gets tall_slots slots on, block TALL_BLOCK (the tall tile)."""
    fixed = fixed or spec.moe.block_size
    m, top = spec.moe, spec.tokens.max
    tail = narrow_tail_edge(m.top_k, m.num_experts)
    wide = wide_decode_edge(m.top_k, m.num_experts)
    tall_from = tall_edge(spec) if tall and not fixed else None
    decode = [e for e in DECODE_EDGES if e < top]
    if not fixed and DECODE_EDGES[0] < wide < min(top, DECODE_MAX_TOKENS):
        decode = sorted(decode + [wide])
    edges = ([1] if top > 1 and single_token_bucket(m.top_k, m.hidden_size) else []) + (
        decode + ([tail] if DECODE_MAX_TOKENS < tail < top else []))
    if tall_from is not None and tall_from - 1 > max(edges + [DECODE_MAX_TOKENS]):
        edges.append(tall_from - 1)
    edges.append(top)
    buckets = []
    for i, edge in enumerate(edges):
        floor = edges[i - 1] + 1 if i else 1
        block = (TALL_BLOCK if tall_from is not None and floor >= tall_from else
                 PREFILL_BLOCK if edge > max(DECODE_MAX_TOKENS, tail) or floor > wide else
                 decode_block(edge, m.top_k, m.num_experts))
        buckets.append([edge, fixed or block])
    return buckets


def wide_decode_bucket(spec, buckets: list[list[int]], index: int, fixed: int | None) -> bool:
    """Whether decode bucket `index` takes the wide CTA split over K: its calls' average expert
    gets more than WIDE_DECODE_SLOTS slots, and no option or spec fixes the block."""
    m = spec.moe
    return (not (fixed or m.block_size) and buckets[index][0] <= DECODE_MAX_TOKENS
            and bucket_floor(buckets, index) > wide_decode_edge(m.top_k, m.num_experts))


def call_blocks(spec, tokens: int, block: int) -> int:
    """The moe blocks of a call of `tokens` tokens routed evenly: one an expert it reaches, or
    as many as its slots fill."""
    slots = tokens * spec.moe.top_k
    return max(min(spec.moe.num_experts, slots), -(-slots // block))


def wide_call_ctas(spec, tokens: int, block: int, ntiles: int, cols: int,
                   rows: int) -> tuple[int, int]:
    """(CTAs, room): a GEMM's wide CTAs (of `cols` column tiles of its `ntiles`, `rows` rows a
    warp) in a call of `tokens` tokens, unsplit, and the CTAs the SMs hold at the split wide
    CTA's register cap (the wide decode CTA's CTAs an SM on every SM)."""
    ctas = call_blocks(spec, tokens, block) * ntiles // wide_col_tiles(ntiles, block, cols)
    return ctas, wide_decode_ctas(cols * block // rows) * SM_COUNT


def prefill_short(spec, tokens: int, block: int, ntiles: int, cols: int, rows: int) -> bool:
    """Whether a call of `tokens` tokens leaves the SMs short of a GEMM's wide CTAs: fewer
    unsplit than the SMs hold at the split CTA's register cap (wide_call_ctas)."""
    if block not in WIDE_BLOCKS:
        return False
    ctas, room = wide_call_ctas(spec, tokens, block, ntiles, cols, rows)
    return ctas < room


def bucket_floor(buckets: list[list[int]], index: int) -> int:
    """The smallest token count of bucket `index`."""
    return 1 if index == 0 else buckets[index - 1][0] + 1


def splits_evenly(k_dim: int, split: int, warps: int, block_k: int = 16) -> bool:
    """Whether K's k16 steps divide over `split` CTAs x `warps` warps x block_k/16 per stage."""
    return (k_dim // 16) % (split * warps * (block_k // 16)) == 0


def doubled_split(tiles: int, ctas_per_sm: int, allowed) -> int:
    """A K split: doubled while `tiles` x split stays within `ctas_per_sm` CTAs on every SM and
    `allowed(split)` holds for the doubled split."""
    split = 1
    while tiles * split * 2 <= ctas_per_sm * SM_COUNT and allowed(split * 2):
        split *= 2
    return split


def decode_split_k(k_dim: int, n: int, active_experts: int, tile: dict) -> int:
    """K splits of a decode bucket's GEMM: 1 where its smallest call has a tile for every SM,
    else doubled up to about CTAS_PER_SM CTAs of the default 4 warps an SM (as many more CTAs
    as they have fewer warps); then doubled while a CTA's share of K passes DECODE_CTA_STEPS
    k16 steps, so that no CTA runs so long that the last wave of the largest call is left to a
    few SMs."""
    def allowed(split: int) -> bool:
        return splits_evenly(k_dim, split, tile["warps"], tile["block_k"])
    tiles = active_experts * -(-n // tile["block_n"])
    split = 1
    if tiles < SM_COUNT:       # else every SM has a tile already
        split = doubled_split(tiles, CTAS_PER_SM * GEMM_TILE["warps"] // tile["warps"], allowed)
    while k_dim // 16 // split > DECODE_CTA_STEPS and allowed(split * 2):
        split *= 2
    return split


def wide_epilogue_fits(col_tiles: int, block: int) -> bool:
    """Whether the wide CTA's epilogue rows (per column tile, block x 64 fp16 columns padded by
    8) fit the static shared memory."""
    return col_tiles * block * (64 + 8) * 2 <= SHARED_PER_CTA


def wide_decode_ctas(warps: int) -> int:
    """CTAs an SM that a decode bucket's wide CTA of `warps` warps is split for and its registers
    capped for: 16 warps an SM, as CTAS_PER_SM K-split CTAs of 4 warps (4 CTAs of one warpgroup,
    2 of two)."""
    return max(1, CTAS_PER_SM * GEMM_TILE["warps"] // warps)


def wide_split_fill_ctas(ctas_per_sm: int) -> int:
    """The CTAs below which a call doubles its wide decode split (call_split in the device
    header): WIDE_SPLIT_FILL of those `ctas_per_sm` CTAs on every SM hold."""
    return int(WIDE_SPLIT_FILL * ctas_per_sm * SM_COUNT)


def wide_col_tiles(ntiles: int, block: int, most: int) -> int:
    """64-column tiles per CTA of the wide GEMM: `most` (halved until it divides the weight's
    tiles and its epilogue fits); 1 (the K-split CTA) for blocks it does not take."""
    if block not in WIDE_BLOCKS:
        return 1
    cols = most
    while cols > 1 and (ntiles % cols or not wide_epilogue_fits(cols, block)):
        cols //= 2
    return cols


def wide_stages(block: int, col_tiles: int, most: int, block_k: int, zeros: bool = False) -> int:
    """Ring stages of the wide CTA (one ring for the CTA, each stage holding block_k of its
    weight tiles and rows, and where a scale group starts its scales and zeros): `most`, fewer
    where the ring would pass the static shared memory."""
    ks = block_k // 16
    stage = col_tiles * (ks * 512 + group_bytes(zeros)) + block * (32 * ks + RING_ROW_PAD)
    return max(2, min(most, (SHARED_PER_CTA - 64) // stage))


def wgmma_fits(col_tiles: int, warp_rows: int, block: int, block_k: int, stages: int) -> bool:
    """Whether a wide CTA's tile runs on the warpgroup MMA kernel: 4 or 8 column tiles (one
    or two warpgroups of 256 columns each), every row of the block in each warp, two or more k16
    steps a stage (the A fragments alternate by step parity) and a stage for the running MMA
    besides the two in flight."""
    return (col_tiles in WGMMA_TILE["col_tiles"] and warp_rows == block and block_k % 32 == 0
            and stages >= 3)


def tall_wide_block_k(block_k: int) -> int:
    """k a ring stage of the wide CTA that runs a tall-tile bucket where the GPU has no warpgroup
    MMA: at most 64 (at 128, 16 warps of mma.sync spill at the 128-register cap on sm_90)."""
    return min(block_k, 64)


def tall_shared_bytes(block: int, stages: int, block_k: int, zeros: bool = False) -> int:
    """Dynamic shared memory of a tall-tile GEMM kernel: the larger of the tall tile's (its ring,
    or the block's fp32 outputs of 4 column tiles, rows padded by 4 words) and that of the wide
    CTA in its place where the GPU has no warpgroup MMA (its ring, or its warps' fp16 output
    rows)."""
    ks, wide_ks, cols = block_k // 16, tall_wide_block_k(block_k) // 16, TALL_TILE["col_tiles"]
    tall = max(stages * (cols * (ks * 512 + group_bytes(zeros)) + block * ks * 32),
               cols * block * (64 + 4) * 4)
    wide = max(stages * (cols * (wide_ks * 512 + group_bytes(zeros))
                         + block * (32 * wide_ks + RING_ROW_PAD)),
               cols * block * (64 + 8) * 2)
    return max(tall, wide)


def one_token_routing_bytes(top_k: int, block: int) -> int:
    """Static shared memory of one token's routing in a GEMM CTA (OneTokenRouting in the
    template): sorted ids and weights of top_k blocks, their experts, the padded total, in whole
    KB aligned to a KB (so another KB at most in front of it)."""
    return align_up(8 * top_k * block + 4 * top_k + 4, 1024) + 1024


def gemm_stages(block: int, warps: int, most: int, block_k: int = 16, reserved: int = 0,
                zeros: bool = False) -> int:
    """Copy-ring stages per warp for a moe block: `most`, fewer where the CTA's rings (one per
    warp, each stage holding a k16 step's weights, 512 B, the block's rows padded to a
    multiple of 8 and room for a group's scales) would pass its static shared memory; from 4
    up, rounded down to a power of two (a ring of 3 keeps its third stage: not measured
    against 2); `reserved` bytes of the CTA's shared memory are not the rings' (one token's
    routing). The K
    loop is unrolled over whole scale groups and, where the ring's turn is a multiple of them,
    whole turns of the ring, so that every ring offset is a constant: with 5, 6, 7 or 12 stages
    it is not (Mixtral's gate/up at T = 1: 55 SASS instructions a k16 step at 8 stages, 86 at 6,
    77 at 12; measured on the H200, the call 72 us at 8 stages against 75 at 4, 81 at 6, 82 at
    12; block 32 at T = 64: 426 us at 4 stages against 440 at 5). (Measured too: building the
    decode blocks for 8 CTAs per SM, 64 registers and 4 stages, was 10-30% slower.)"""
    ks = block_k // 16
    stage = 512 * ks + align_up(block, 8) * (32 * ks + RING_ROW_PAD) + group_bytes(zeros)
    fits = max(2, min(most, (SHARED_PER_CTA - 64 - reserved) // (warps * stage)))
    return fits if fits < 4 else 1 << (fits.bit_length() - 1)


def msd_x_stages(m: int, group: int, vec_warps: int) -> int:
    """Activation-ring depth of a vector warp: its rows of one group, up to 4 KB, 2..4 deep."""
    stage = -(-m // vec_warps) * group * 2
    return max(2, min(4, MSD_X_RING_BYTES // stage))


MSD_MAX_SLOTS = {"a_max": 2, "a_unfold": 3, "y_int": 2}   # the preload schedule's (basic: 1 each)
MSD_MAX_BARRIERS = 16            # mbarriers of the flag rings, at most, in these schedules
# the CUDA MSD kernel's mbarriers take whole 128-byte lines of shared memory: the rings after
# them start on a line, as the dynamic area does
MSD_SHARED_LINE = 128


def msd_barrier_bytes(barriers: int) -> int:
    """Shared bytes of the CUDA MSD kernel's mbarriers (8 bytes each), whole lines of them."""
    return align_up(8 * barriers, MSD_SHARED_LINE)


def msd_shared_bytes(m: int, group: int, steps: int, tile: dict, slots: dict,
                     barriers: int) -> int:
    """Dynamic shared memory of the CUDA MSD kernel (templates/cuda/msd_matmul.cu.j2): the
    mbarriers (padded to whole 128-byte lines), the weight, activation and scale rings, and per
    slot the unfolded A (int8 fragments for the s8 MMA, padded int4 rows for s4), int32 Y (rows
    padded by 8 words), A_max and (s4, whose MMA takes the offset-binary weights) the slice
    sums."""
    rows = steps * m
    mt = -(-rows // 16)
    bn = tile["block_n"]
    unfold_words = mt * group * 4 if tile["mma"] == "s8" else mt * 16 * (group // 8 + 4)
    return (msd_barrier_bytes(barriers)
            + tile["w_stages"] * (bn // 8) * (group // 64) * 32 * 8
            + tile["vec_warps"] * tile["x_stages"] * -(-m // tile["vec_warps"]) * group * 2
            + (tile["x_stages"] + 1) * bn * 2
            + 4 * (slots["a_unfold"] * unfold_words + slots["y_int"] * rows * (bn + 8)
                   + slots["a_max"] * (m + (rows if tile["mma"] == "s4" else 0))))


def msd_layout_bytes(spec, block_n: int, vec_warps: int, stages: int, mma: str) -> int:
    """Dynamic shared memory of the CUDA MSD kernel of a spec in a layout: `block_n` columns,
    `vec_warps` vector warps, `stages` weight ring stages (2 at least), the `mma` (as the tile
    pass builds it; a layout that passes SHARED_OPT_IN does not build)."""
    s, g = spec.msd, spec.quant.group_size
    tile = {"block_n": block_n, "w_stages": max(2, stages), "mma": mma, "vec_warps": vec_warps,
            "x_stages": msd_x_stages(s.m, g, vec_warps)}
    return msd_shared_bytes(s.m, g, s.steps, tile, MSD_MAX_SLOTS, MSD_MAX_BARRIERS)


MSD_WARP_N8 = 8    # n8 tiles a matrix warp multiplies in the default layouts


def msd_cube_warps(block_n: int) -> int:
    """Matrix warps for `block_n` columns: MSD_WARP_N8 n8 tiles each (at least one warp)."""
    return max(1, block_n // (8 * MSD_WARP_N8))


def msd_warp_layout(m: int) -> dict:
    """Columns per CTA and warps of the vector and matrix units by rows of A (measured at the
    seed shape, M = 1, 4, 16): a vector warp for every row or two, up to 8; 128 columns over 2
    matrix warps up to M = 4, then 256 over 4. M = 1 is built for 6 CTAs an SM (3 weight
    stages, registers capped to hold them; msd_occupancy): its steps wait on one vector warp's
    unfold, so more CTAs an SM, each with fewer steps, keep more weights in flight (measured:
    preload 24.2 -> 23.5 us, basic 28.8 -> 24.6 at the seed shape)."""
    vec = 2 if m <= 2 else 4 if m <= 4 else 8
    block_n = 128 if m <= 4 else 256
    return {"block_n": block_n, "vec_warps": vec, "cube_warps": msd_cube_warps(block_n),
            **({"stages": 3, "occupancy": 6} if m == 1 else {})}


def msd_occupancy(wanted: int, threads: int, shared_bytes: int) -> int:
    """CTAs an SM the MSD kernel is built for: `wanted` (0: no register cap), at most what the
    shared memory holds and what leaves a thread MSD_MIN_REGISTERS registers. A CTA holds its
    `shared_bytes` of dynamic shared memory after a line of static (the K split's flag: the
    dynamic area starts on the next 128-byte line), in 128-byte units."""
    if not wanted:
        return 0
    cta = align_up(CTA_RESERVED_SHARED + MSD_SHARED_LINE + shared_bytes, MSD_SHARED_LINE)
    by_shared = SM_SHARED_BYTES // cta
    by_registers = SM_REGISTERS // (threads * MSD_MIN_REGISTERS)
    return max(1, min(wanted, by_shared, by_registers))


def msd_split_k(groups: int, col_blocks: int, ctas_per_sm: int = MSD_CTAS_PER_SM) -> int:
    """CTAs along K for the MSD kernel: doubled while about `ctas_per_sm` CTAs per SM are not
    yet busy, each keeping at least two whole groups."""
    return doubled_split(col_blocks, ctas_per_sm,
                         lambda sp: groups % sp == 0 and groups // sp >= 2)


def dense_split_k(k_dim: int, tiles: int, warps: int) -> int:
    """K splits for a dense GEMM of `tiles` output tiles: until about four CTAs per SM."""
    return doubled_split(tiles, CTAS_PER_SM, lambda sp: splits_evenly(k_dim, sp, warps))


def fit_warps(k_dim: int, warps: int) -> int:
    """The most warps (<= warps) that split K/16 steps evenly."""
    while warps > 1 and (k_dim // 16) % warps:
        warps //= 2
    return warps


class TilePass(Pass):
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
        "route-in-gemm": Option(int, None, "MoE: 1 (the default where top_k <= "
                                           f"{GEMM_ROUTE_MAX_TOPK}) routes a call of one token "
                                           "with router logits inside every CTA of both GEMMs, "
                                           "with no router or align launch; 0 never",
                                choices=(0, 1), minimum=0),
    }

    def apply(self, module: Module, ctx: Context) -> None:
        spec = ctx.spec
        tuned = ctx.tuning.lookup(spec, ctx.target) if ctx.tuning is not None else None
        if spec.pipeline == "moe_w4a16":
            self._moe(module, ctx, tuned or {})
        else:
            self._msd(module, ctx, tuned or {})

    def _moe(self, module: Module, ctx: Context, tuned: dict) -> None:
        spec = ctx.spec
        self._routing_costs_stages = False
        fixed = self.option("moe-block")
        if fixed == TALL_BLOCK:
            # the tall tile for every call: it sets its own k a stage, columns, rows and warps,
            # and runs the whole K in one CTA
            pinned = [name for name in ("block-k", "wide-cols", "warp-rows", "wgmma", "warps",
                                        "split-k", "split-k-down", *PREFILL_SPLITS, "tall")
                      if self.option(name) is not None]
            if pinned:
                raise PipelineError(f"tile{{moe-block={TALL_BLOCK}}} is the tall tile, whose "
                                    f"tile is its own (only stages=N applies); drop "
                                    f"{', '.join(pinned)}")
        elif fixed is not None and fixed > max(MOE_BLOCK_CHOICES):
            raise PipelineError(f"tile{{moe-block={fixed}}}: the K-split and wide CTAs take "
                                f"blocks of up to {max(MOE_BLOCK_CHOICES)} rows ({TALL_BLOCK}: "
                                f"the tall tile)")
        # a tuning entry gives the tile per bucket, unless options fixing block or split say
        # otherwise
        tuned_buckets = (tuned.get("buckets") if not (fixed or any(
            self.option(name) for name in ("split-k", "split-k-down", *PREFILL_SPLITS)))
            else None)
        # the tall tile where the arch has warpgroup MMA (or tall=1 asks for it), unless an
        # option pins the prefill tile (its block, k a stage, columns a CTA, a split, or
        # mma.sync)
        tall_wanted = self.option("tall")
        if tall_wanted is None:
            tall_wanted = (ctx.arch or spec.cuda_arch) in WGMMA_ARCHS
        tall = bool(tall_wanted) and all(
            self.option(name) is None
            for name in ("block-k", "wide-cols", "warp-rows", *PREFILL_SPLITS)) and \
            self.option("wgmma") != 0
        buckets = ([[b[0], b[1]] for b in tuned_buckets] if tuned_buckets
                   else moe_buckets(spec, fixed, tall))
        for op in module.function().walk():
            if "block" in op.ATTRS and "block_buckets" in op.ATTRS:
                if fixed is not None and fixed > op.attr("block"):
                    raise PipelineError(f"tile{{moe-block={fixed}}}: larger than the routing "
                                     f"buffers allow (block = {op.attr('block')})")
                if tuned_buckets:
                    self._check_entry(spec, tuned_buckets, op.attr("block"))
                op.attrs["block_buckets"] = [list(b) for b in buckets]
            if op.NAME == "moe.topk_softmax":
                op.attrs["router"] = self.option("router")
                op.attrs["align_tokens"] = self._align_tokens(spec.moe.top_k)
                op.attrs["gemm_route"] = self._gemm_route(spec.moe.top_k)
                if spec.quant.act_order:
                    self._routing_in_memory(op)
            if op.NAME == "moe.grouped_gemm_w4a16":
                for name in ("mma", "vec-warps", "cube-warps"):
                    if self.option(name) is not None:
                        raise PipelineError(f"tile{{{name}=...}}: an MSD option; this is an MoE "
                                            "spec")
                if self.option("block-n") not in (None, 64):
                    raise PipelineError(f"tile{{block-n={self.option('block-n')}}}: the MoE GEMM "
                                        "reads 64-column packed tiles (block-n=64)")
                k_dim = op.operands[0].type.shape[1].value
                n = op.operands[1].type.shape[2].value
                down = bool(op.attr("mul_topk_weights"))
                op.attrs["tile"] = self._gemm_tile(spec, k_dim, n, down, buckets, tuned_buckets)
        self._first_bucket_routes(module)

    def _first_bucket_routes(self, module: Module) -> None:
        """One token is routed inside the GEMMs only where both run the K-split CTA in their
        first bucket (the wide CTA and the tall tile take no routing of their own): off
        elsewhere, and an error where route-in-gemm=1 asks for it; and by default not where
        the routing's shared memory would cost a first bucket's ring stages."""
        fn = module.function()
        router = next((op for op in fn.walk() if op.NAME == "moe.topk_softmax"), None)
        if router is None or not router.attr("gemm_route"):
            return
        if self._routing_costs_stages:          # (_gemm_tile: off by default there)
            router.attrs["gemm_route"] = False
            return
        if all(op.attrs["tile"]["col_tiles"][0] == 1 for op in fn.walk()
               if op.NAME == "moe.grouped_gemm_w4a16"):
            return
        if self.option("route-in-gemm"):
            raise PipelineError("tile{route-in-gemm=1}: the first bucket's GEMMs run the wide "
                                "CTA or the tall tile, which do not route a token themselves "
                                "(the K-split CTA does)")
        router.attrs["gemm_route"] = False

    # a tuning entry's bucket: the option whose values each field after the edge must take
    ENTRY_FIELDS = ("moe-block", "split-k", "stages", "split-k-down", "block-k", "warps",
                    "wide-cols", "warp-rows", "wgmma")
    # the fields a tall bucket's tile sets itself, whatever the entry says
    TALL_OWN = ("block-k", "warps", "wide-cols", "warp-rows", "wgmma")

    def _check_entry(self, spec, tuned_buckets: list, routing_block: int) -> None:
        """A tuning entry (a database file, maybe edited by hand) takes the values the options
        take, its buckets end in ascending order, and its blocks fit the routing buffers (the
        spec's moe.block_size where it fixes one)."""
        edge = 0
        for b in tuned_buckets:
            where = f"tuning entry: the bucket up to T = {b[0]}"
            if not (type(b[0]) is int and b[0] > edge):
                raise PipelineError(f"{where}: bucket ends must be integers that ascend")
            edge = b[0]
            # (wide_decode, last, takes wgmma's values: 0 or 1)
            for option, name, value in zip(self.ENTRY_FIELDS + ("wgmma",),
                                           self.ENTRY_FIELDS + ("wide_decode",), b[1:]):
                if not (b[1] == TALL_BLOCK and option in self.TALL_OWN):
                    self._check_entry_value(where, option, value, name)
            if b[1] > routing_block or spec.moe.block_size not in (None, b[1]):
                rule = (f"the spec's moe.block_size, {spec.moe.block_size}"
                        if spec.moe.block_size else f"at most {routing_block}, as the routing "
                        f"buffers allow")
                raise PipelineError(f"{where} has moe-block {b[1]}: must be {rule}")

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

    def _align_tokens(self, top_k: int) -> int:
        """Up to how many tokens the router runs in the align kernel's CTA: one per warp of it
        by default (measured: 4 tokens per warp lose at T = 64 with either router), at most
        what its shared-memory slots hold."""
        most = min(ROUTE_ALIGN_MAX_TOKENS, ROUTE_ALIGN_SLOTS // top_k)
        n = self.option("route-align-tokens")
        if n is None:
            return min(ALIGN_WARPS, most)
        if not 0 <= n <= most:
            raise PipelineError(f"tile{{route-align-tokens={n}}}: must be 0..{most} (at most "
                                f"{ROUTE_ALIGN_MAX_TOKENS} tokens and {ROUTE_ALIGN_SLOTS} "
                                f"slots of top-k {top_k})")
        return n

    def _routing_in_memory(self, router) -> None:
        """Act-order: the activations are gathered per slot by its expert's row order, which
        reads the routing from memory: the router never runs inside the align kernel or the
        GEMMs (an error where an option asks it to)."""
        for option in ("route-align-tokens", "route-in-gemm"):
            if self.option(option):
                raise PipelineError(f"tile{{{option}={self.option(option)}}}: an act-order spec "
                                    "(quant.act_order) routes through the router kernel: its "
                                    "activations are gathered by the slots' experts")
        router.attrs["align_tokens"], router.attrs["gemm_route"] = 0, False

    def _gemm_route(self, top_k: int) -> bool:
        """Whether a call of one token with router logits is routed inside the GEMMs' CTAs
        (the first bucket's kernels, where they are K-split CTAs: the emitter): by default
        where top_k fits a warp's lanes."""
        asked = self.option("route-in-gemm")
        if asked and top_k > GEMM_ROUTE_MAX_TOPK:
            raise PipelineError(f"tile{{route-in-gemm=1}}: top_k {top_k} must be <= "
                                f"{GEMM_ROUTE_MAX_TOPK} (a lane of one warp routes each slot)")
        return top_k <= GEMM_ROUTE_MAX_TOPK if asked is None else bool(asked)

    def _pick(self, option: str, b: list | None, index: int, default):
        """The option's value, else a tuning entry bucket's at `index` (where it has one), else
        the default."""
        if self.option(option) is not None:
            return self.option(option)
        return b[index] if b is not None and len(b) > index else default

    def _split_name(self, name: str, down: bool) -> str:
        """The split option a GEMM takes: the down GEMM's own (`name`-down) where given."""
        return f"{name}-down" if down and self.option(f"{name}-down") else name

    def _gemm_tile(self, spec, k_dim: int, n: int, down: bool, buckets: list,
                   tuned_buckets: list | None) -> dict:
        """The tile attribute of one grouped GEMM: block_n, then per bucket block_k, warps,
        ring stages and split-K (options first, then a tuning entry, then the defaults), and the
        CTA each bucket runs (_bucket_cta)."""
        # a tuning entry's bucket: [edge, block, split, stages, split of the down GEMM,
        # block_k, warps]; older entries stop after the split of the down GEMM
        tuned = tuned_buckets or [None] * len(buckets)
        pick = self._pick
        single = starts_with_single_token_bucket(buckets)
        block_k = [pick("block-k", b, 5, GEMM_TILE["block_k"]) for b in tuned]
        warps = [fit_warps(k_dim, pick("warps", b, 6, SINGLE_TOKEN_WARPS if single and i == 0
                                       else GEMM_TILE["warps"]))
                 for i, b in enumerate(tuned)]
        # (a tall-tile bucket takes k a stage, warps and the whole K of its own: _bucket_cta)
        tall = [block == TALL_BLOCK for _, block in buckets]
        for bk, w, t in zip(block_k, warps, tall):
            if not t and (not splits_evenly(k_dim, 1, w, bk) or spec.quant.group_size % bk):
                raise PipelineError(f"tile{{block-k={bk}}}: K = {k_dim} over {w} warps, or the "
                                    f"group {spec.quant.group_size}, is not a whole number of "
                                    f"{bk}-deep stages")
        # the split option of each bucket: split-k for the decode buckets, prefill-split-k for
        # the prefill ones (their -down forms first for the down GEMM)
        names = [self._split_name("prefill-split-k" if edge > DECODE_MAX_TOKENS else "split-k",
                                  down) for edge, _ in buckets]
        asked = [self.option(name) for name in names]
        most = [pick("stages", b, 3, GEMM_TILE["stages"]) for b in tuned]
        # (the first bucket's K-split CTA may hold one token's routing besides its rings; where
        # that would cost its rings stages, the calls of up to its edge would lose more than the
        # one token gains: the routing stays with align, unless route-in-gemm=1 asks)
        routed = one_token_routing_bytes(spec.moe.top_k, buckets[0][1]) \
            if self._gemm_route(spec.moe.top_k) else 0
        zeros = not spec.quant.symmetric
        stages = [gemm_stages(block, w, m, bk, routed if i == 0 else 0, zeros)
                  for i, ((_, block), m, w, bk) in enumerate(zip(buckets, most, warps, block_k))]
        plain = gemm_stages(buckets[0][1], warps[0], most[0], block_k[0], zeros=zeros)
        if routed and stages[0] != plain and self.option("route-in-gemm") is None:
            stages[0] = plain
            self._routing_costs_stages = True
        if tuned_buckets:
            splits = [b[4] if down and len(b) > 4 else b[2] for b in tuned_buckets]
        else:
            # each decode bucket's split is sized for its smallest call; the bucket after the
            # single-token one keeps the split sized for one token that it had before there was
            # one (T = 2..16 measured so)
            floors = [1 if single and i == 1 else bucket_floor(buckets, i)
                      for i in range(len(buckets))]
            # (the tall tile runs the whole K; a prefill bucket is whole unless asked, or split
            # in _bucket_cta)
            splits = [
                1 if tall[i] else asked[i] or (1 if edge > DECODE_MAX_TOKENS else decode_split_k(
                    k_dim, n, min(spec.moe.num_experts, floors[i] * spec.moe.top_k),
                    {"block_n": GEMM_TILE["block_n"], "warps": warps[i], "block_k": block_k[i]}))
                for i, (edge, _) in enumerate(buckets)]
        for name, sp, w, bk, t in zip(names, splits, warps, block_k, tall):
            if t and sp != 1:
                raise PipelineError(f"tuning entry: split-k {sp} in a bucket of block "
                                    f"{TALL_BLOCK}; the tall tile runs the whole K (split-k 1)")
            if t or splits_evenly(k_dim, sp, w, bk):
                continue
            if tuned_buckets:
                raise PipelineError(f"tuning entry: split-k {sp} does not divide K = {k_dim} "
                                    f"over {w} warps of {bk}-deep stages")
            raise PipelineError(f"tile{{{name}={sp}}}: K = {k_dim} does not split into {sp} x "
                                f"{w} warps of {bk}-deep stages")
        ctas = [self._bucket_cta(spec, k_dim, n, buckets, i, b, asked[i], names[i],
                                 {"block_k": block_k[i], "warps": warps[i], "stages": stages[i],
                                  "split_k": splits[i]})
                for i, b in enumerate(tuned)]
        return {"block_n": GEMM_TILE["block_n"],
                **{key: [c[key] for c in ctas] for key in (
                    "block_k", "warps", "stages", "split_k", "col_tiles", "warp_rows", "wgmma",
                    "ctas_per_sm", "split_many", "tall")}}

    def _bucket_cta(self, spec, k_dim: int, n: int, buckets: list, i: int, b: list | None,
                    split: int | None, split_name: str, ksplit: dict) -> dict:
        """The CTA bucket i runs and its tile: the tall tile (block TALL_BLOCK), the wide CTA
        (col_tiles > 1: its warps tile columns and rows, one ring for the CTA; at prefill sizes
        over the whole K, in a decode bucket split over K), or the K-split CTA of `ksplit`
        (block_k, warps, stages, split_k). `b`: the bucket's tuning entry, which may add
        col_tiles and warp_rows at index 7 and 8 (and then its block_k and stages are the wide
        CTA's), wgmma at 9 and wide_decode at 10 (the wide CTA as the default builds a decode
        bucket's: registers capped, its split doubled for calls to pick from); `split`: the
        value of the bucket's split option, named `split_name` (split-k in decode buckets,
        prefill-split-k in prefill buckets, or their -down forms)."""
        edge, block = buckets[i]
        ntiles = -(-n // GEMM_TILE["block_n"])
        group = spec.quant.group_size
        cta = {**ksplit, "split_many": ksplit["split_k"], "col_tiles": 1, "warp_rows": 0,
               "wgmma": False, "ctas_per_sm": 0, "tall": block == TALL_BLOCK}
        if block == TALL_BLOCK:
            if not tall_fits(n):
                where = (f"tile{{moe-block={TALL_BLOCK}}}" if self.option("moe-block")
                         else f"tuning entry: a bucket of block {TALL_BLOCK}")
                raise PipelineError(f"{where} (the tall tile) needs the weight's {n} columns in "
                                    f"whole CTAs of {TALL_TILE['col_tiles']} tiles of 64")
            # the tall tile (grouped_gemm_wgmma_tall; where the GPU has no warpgroup MMA, the
            # wide CTA of the same block and columns, one warp per 32 rows of a column tile);
            # stages=N or the entry's is the most, as for the other tiles: fewer where the
            # shared memory would not hold them, and 3 at least
            bk = tall_block_k(group)
            stages = tall_stages(self._pick("stages", b, 3, TALL_TILE["stages"]), bk,
                                 not spec.quant.symmetric)
            return {**cta, "col_tiles": TALL_TILE["col_tiles"],
                    "warp_rows": TALL_TILE["warp_rows"], "block_k": bk, "stages": stages,
                    "warps": TALL_TILE["col_tiles"] * block // TALL_TILE["warp_rows"],
                    "wgmma": True}
        fixed = self.option("moe-block")
        wide = b is not None and len(b) > 7
        # (an entry without col_tiles was measured with the K-split CTA)
        cols = self._pick("wide-cols", b, 7, WIDE_COL_TILES if b is None else 1) or 1
        rows = min(block, self._pick("warp-rows", b, 8, WIDE_TILE["warp_rows"]))   # (wide CTA)
        # the wide CTA split over K: a tuning entry's in a decode bucket (or split, or marked
        # wide_decode), or the default of a decode bucket whose experts pass WIDE_DECODE_SLOTS
        # slots, or of a prefill bucket of the wide CTA whose largest call's CTA tiles still
        # leave the SMs short (prefill_fill; the split sized for its smallest call), or a
        # prefill bucket's as prefill-split-k asks
        wide_decode = wide and len(b) > 10 and bool(b[10])
        prefill = edge > DECODE_MAX_TOKENS
        prefill_fill = (b is None and not fixed and not split and prefill
                        and cols > 1 and prefill_short(spec, edge, block, ntiles, cols, rows))
        split_wide = cols > 1 and (
            wide and (cta["split_k"] > 1 or not prefill or wide_decode)
            or b is None and (wide_decode_bucket(spec, buckets, i, fixed) or prefill_fill
                              or prefill and cta["split_k"] > 1))
        ctas = 0
        if split_wide:
            if wide and (block not in WIDE_BLOCKS or ntiles % cols
                         or not wide_epilogue_fits(cols, block)):
                raise PipelineError(f"tuning entry: a wide CTA of {cols} column tiles and "
                                    f"block {block} does not fit {ntiles} tiles")
            cols = wide_col_tiles(ntiles, block, cols)
            # its registers are capped for this many CTAs an SM, and its split sized for them
            # (2 CTAs of 8 warps capped for 4 spilled ~1 KB a thread)
            ctas = wide_decode_ctas(cols * block // rows)
            if not wide and cols > 1:
                blocks = call_blocks(spec, bucket_floor(buckets, i), block)   # smallest call's
                cta["split_k"] = self._wide_decode_split(spec, k_dim, blocks * ntiles // cols,
                                                         split, ctas, not prefill_fill)
            if (k_dim // group) % cta["split_k"]:
                sp = cta["split_k"]
                where = f"tuning entry: split-k {sp}" if wide else f"tile{{{split_name}={sp}}}"
                raise PipelineError(f"{where}: the wide CTA splits K = {k_dim} into whole "
                                    f"groups of {group}")
            # a split of the bucket's own choosing may double per call (WIDE_SPLIT_FILL):
            # the grid has the doubled split, and calls with enough blocks use half of it
            cta["split_many"] = cta["split_k"]
            if (not wide or wide_decode) and not split and cta["split_k"] > 1 and (
                    k_dim // group) % (2 * cta["split_k"]) == 0:
                cta["split_k"] *= 2
            # a GEMM the split leaves whole is the prefill kernel, without the register cap
            # (measured on the H200, Mixtral T = 53..64 with gate/up so: the layer 2.4% faster,
            # docs/PERF.md "Autotune's tall candidates; ...")
            if cta["split_k"] == 1:
                ctas = 0
        elif prefill and cta["split_k"] == 1:
            cols = wide_col_tiles(ntiles, block, cols)
        else:
            cols = 1
        if cols == 1:
            return cta
        bk = self.option("block-k") or (b[5] if wide else WIDE_TILE["block_k"])
        if (k_dim // 16) % (bk // 16) or group % bk:
            raise PipelineError(f"tile{{block-k={bk}}}: K = {k_dim}, or the group "
                                f"{group}, is not a whole number of {bk}-deep stages")
        stages = wide_stages(block, cols, self.option("stages") or (
            b[3] if wide else WIDE_TILE["stages"]), bk, not spec.quant.symmetric)
        # the warpgroup MMA kernel where the tile allows (a tuning entry without index 9 was
        # measured on mma.sync)
        wg = bool(self._pick("wgmma", b, 9, WGMMA_TILE["wgmma"] if b is None else 0))
        return {**cta, "col_tiles": cols, "warp_rows": rows, "block_k": bk,
                "warps": cols * block // rows, "stages": stages,
                "ctas_per_sm": ctas if split_wide else 0,
                "wgmma": wg and wgmma_fits(cols, rows, block, bk, stages)}

    @staticmethod
    def _wide_decode_split(spec, k_dim: int, tiles: int, fixed: int | None, ctas: int,
                           short_k: bool = True) -> int:
        """K splits of a bucket's wide CTA (`tiles` of them in its smallest call): the
        option's, else doubled up to about `ctas` CTAs an SM (wide_decode_ctas), then (decode
        buckets, `short_k`) while a CTA's share of K passes DECODE_CTA_STEPS k16 steps; each CTA
        takes whole scale groups. (Measured on the H200, Mixtral T = 64, scales through the
        ring: its down GEMM split 4 301-302 us for the layer, 8 306, 2 342; gate/up, whose 896
        tiles fill the SMs already, 2 was 3% slower than 1. At T = 65..255, where prefill
        calls left the down GEMM whole before, split 4 was 4-23% faster: docs/PERF.md.)"""
        if fixed:
            return fixed

        def allowed(split: int) -> bool:
            return (k_dim // spec.quant.group_size) % split == 0
        split = doubled_split(tiles, ctas, allowed)
        while short_k and k_dim // 16 // split > DECODE_CTA_STEPS and allowed(split * 2):
            split *= 2
        return split

    def _msd(self, module: Module, ctx: Context, tuned: dict) -> None:
        spec = ctx.spec
        loop = module.function().op("msd.group_loop")
        for key, value in tuned.items():
            if key != "schedule":
                self._check_entry_value("tuning entry", key.replace("_", "-"), value)
        if ctx.target == "ascend":
            a = spec.targets.ascend
            cores = a.aic_cores if a else 24
            s = spec.msd
            loop.attrs["tile"] = msd_tiling(s.m, s.n, s.k, spec.quant.group_size, s.steps, cores)
        elif spec.lowering == "dequant":
            s = spec.msd
            block = 8 if s.m <= 8 else min(DENSE_MAX_BLOCK, align_up(s.m, 16))
            warps = fit_warps(s.k, self.option("warps", 4))
            tiles = -(-s.m // block) * -(-s.n // 64)
            split = self.option("split-k", tuned.get("split_k") or dense_split_k(s.k, tiles, warps))
            if not splits_evenly(s.k, split, warps):
                raise PipelineError(f"tile{{split-k={split}}}: K = {s.k} does not split into "
                                    f"{split} x {warps} warps of k16 steps")
            loop.attrs["tile"] = {"block": block, "block_n": 64, "warps": warps,
                                  "stages": gemm_stages(block, warps, self.option("stages", 8)),
                                  "split_k": split}
        else:
            loop.attrs["tile"] = self._msd_cuda_tile(spec, tuned)

    def _msd_cuda_tile(self, spec, tuned: dict) -> dict:
        """The CUDA MSD kernel's tile: options first, then a tuning entry, then the defaults;
        columns (and with them matrix warps) halved while shared memory would not hold it."""
        s = spec.msd
        base = {**MSD_CUDA_TILE, **msd_warp_layout(s.m)}
        if tuned and "occupancy" not in tuned:
            # an entry without stages and occupancy was measured before they were recorded
            base.update(stages=MSD_CUDA_TILE["stages"], occupancy=MSD_CUDA_TILE["occupancy"])
        tile = {k: self.option(k.replace("_", "-"), tuned.get(k, v)) for k, v in base.items()}
        g = spec.quant.group_size
        groups = s.k // g
        vec, fixed_n = tile["vec_warps"], self.option("block-n") is not None or "block_n" in tuned
        fixed_cube = self.option("cube-warps") is not None or "cube_warps" in tuned

        def full(block_n: int, cube: int) -> dict:
            return {"block_n": block_n, "w_stages": max(2, tile["stages"]),
                    "x_stages": msd_x_stages(s.m, g, vec), "mma": tile["mma"],
                    "vec_warps": vec, "cube_warps": cube}

        def shared(t: dict) -> int:
            return msd_shared_bytes(s.m, g, s.steps, t, MSD_MAX_SLOTS, MSD_MAX_BARRIERS)

        t = full(tile["block_n"], tile["cube_warps"])
        fixed_stages = self.option("stages") is not None
        while not fixed_n and t["block_n"] > 16 and shared(t) > SHARED_OPT_IN:
            if t["block_n"] == 64 and t["w_stages"] > 2 and not fixed_stages:
                t = {**t, "w_stages": 2}         # M = 64: 64 columns, 2 stages beat 32 x 4 (1.8x)
                continue
            bn = t["block_n"] // 2               # large M x steps: fewer columns per CTA
            t = full(bn, t["cube_warps"] if fixed_cube else max(1, t["cube_warps"] // 2))
        if t["block_n"] < 8 * t["cube_warps"]:
            raise PipelineError(f"tile{{cube-warps={t['cube_warps']}}}: {t['block_n']} columns "
                                f"per CTA (block-n) give each matrix warp less than one n8 "
                                f"tile: at most {t['block_n'] // 8} matrix warps")
        if shared(t) > SHARED_OPT_IN:
            # name what the user set: the columns where an option or entry fixed them, else
            # the rows; and say whether 2 weight stages would fit
            two = {**t, "w_stages": 2}
            hint = ("2 weight ring stages fit (tile{stages=2})"
                    if t["w_stages"] > 2 and shared(two) <= SHARED_OPT_IN else
                    "fewer columns per CTA" if fixed_n and t["block_n"] > 16 else
                    "fewer rows a call")
            where = (f"tile{{block-n={t['block_n']}}}" if self.option("block-n") is not None
                     else f"tuning entry: block_n {t['block_n']}" if fixed_n
                     else f"msd.m = {s.m}")
            raise PipelineError(f"{where}: the CUDA MSD kernel of msd.m = {s.m}, msd.steps = "
                                f"{s.steps} at {t['block_n']} columns a CTA and "
                                f"{t['w_stages']} weight ring stages would need {shared(t)} "
                                f"bytes of shared memory (at most {SHARED_OPT_IN}): "
                                f"{hint}")
        threads = 32 * (t["vec_warps"] + t["cube_warps"])
        occupancy = msd_occupancy(tile["occupancy"], threads, shared(t))
        split = self.option("split-k", tuned.get("split_k") or msd_split_k(
            groups, -(-s.n // t["block_n"]), max(occupancy, MSD_CTAS_PER_SM)))
        if groups % split:
            raise PipelineError(f"tile{{split-k={split}}}: the {groups} groups of K do not "
                                f"split evenly")
        return {**t, "split_k": split, "occupancy": occupancy}
