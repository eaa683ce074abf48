"""The MoE layer's token buckets: which calls share a moe block size, where T = 1 gets a bucket
of its own, where decode ends, where the wide decode CTA and the tall tile take over."""
from __future__ import annotations

from ...tile_model import TALL_BLOCK
from ...target import GpuTarget
from .cta import (GEMM_TILE, WIDE_BLOCKS, WIDE_TILE, tall_fits, wgmma_fits, wide_col_tiles,
                  wide_resident_ctas, wide_stages)


DECODE_MAX_TOKENS = 64     # bucket edge: T <= 64 is decode-sized
DECODE_BLOCK = 8
NARROW_MAX_SLOTS = 8       # above T = 64, block 8 while an average expert gets this many slots
PREFILL_BLOCK = 32
# Decode calls whose average expert gets more than this many slots (most experts would spill
# into a second 16-row block) take the wide CTA with block 32, split over K. Measured on the
# H200, Mixtral, on two routing draws (group scales through the rings): at T = 56, 60 and 64 the
# wide CTA is 3-19% faster than 16-row blocks (T = 64: 301 against 371 us); at T = 52 even
# (299-301 against 298-301), at T = 40..48 slower (299 against 252-290): its cost is flat in
# T, the 16-row blocks' steps with each expert that passes 16 slots. Its ring is the prefill
# one (WIDE_TILE: 4 stages; 3 stages 11% slower, 5 or 6 within 1%; 3 stages of 64 k 3% slower),
# its registers capped for CTAS_PER_SM CTAs of 4 warps an SM.
WIDE_DECODE_SLOTS = 13
# Prefill calls whose average expert gets TALL_SLOTS slots or more take the tall tile: blocks of
# TALL_BLOCK (moegen/build.py) rows x 4 column tiles, a warpgroup a column tile, each warp's
# dequantized weights serving every row of the block (grouped_gemm_wgmma_tall), 4 ring stages
# of 128 k. Measured on the H200 against the wide CTA (block 32; docs/DESIGN.md), the layer in
# us, tall against wide:
#   64 slots an expert: Mixtral T = 256 539 against 688, DeepSeek 683 279 / 290, Qwen3 1024
#   329 / 335; 128: Mixtral 512 955 / 1144, DeepSeek 1366 450 / 495, Qwen3 2048 565 / 592;
#   256: Mixtral 1024 1536 / 1907, DeepSeek 2731 778 / 900, Qwen3 4096 983 / 1085.
#   Below 64, slower where experts are many: 48 slots DeepSeek 255 / 236, Qwen3 296 / 273
#   (Mixtral 486 / 581); 32 slots Mixtral 467 / 455, DeepSeek 239 / 184, Qwen3 273 / 217.
# 128 k a stage: 3% faster than 64 k at Mixtral T = 2048, 4% at 1024; 2 or 3 stages, 32 k a
# stage, 2 column tiles a CTA (2 CTAs an SM) and 3 wgmmas in flight were slower.
# With few experts (FEW_EXPERTS or fewer) the tall tile pays from TALL_SLOTS_FEW slots: measured
# against the wide CTA with its prefill split, the layer in us, tall against wide, at 40 / 50 / 60
# slots: Mixtral (8 experts) T = 160 / 200 / 240 481-483 / 494-497 / 530-531 against
# 495-496 / 518-520 / 619; H = 2048, I = 1408, 8 experts, T = 160 / 200 / 240 56.0 / 57.6 /
# 61.5 against 65.9 / 67.3 / 69.4; with 16 experts (H = 4096, I = 6400, T = 320 / 400 / 480)
# 466 / 481 / 508 against 453 / 485 / 546, and with 64 or 128 (DeepSeek, Qwen3) 4-12% slower
# (docs/DESIGN.md).
TALL_SLOTS = 64
TALL_SLOTS_FEW = 40
FEW_EXPERTS = 8


DECODE_EDGES = (16, DECODE_MAX_TOKENS)
SINGLE_TOKEN_WARPS = 2     # warps of the single-token bucket's CTAs (see single_token_bucket)


def single_token_bucket(top_k: int, hidden: int, gpu: GpuTarget) -> bool:
    """Whether T = 1 gets a bucket of its own: where the down GEMM of one token has fewer
    64-column tiles than the GPU has SMs (top_k x H / 64 < 132 on the H200; Mixtral: 2 x 64),
    so its K is split. There both GEMMs take 2 warps a CTA and the split doubles to keep about
    16 warps on an SM: smaller CTAs spread the split more evenly (measured on the H200,
    Mixtral T = 1: 73.3 against 75.6 us and 70.1 against 75.2 on another machine; slower from
    T = 4 on, so only for T = 1; a third run: 72.7-73.4 against 74.5-75.3 on one draw, even on
    another)."""
    return top_k * -(-hidden // GEMM_TILE["block_n"]) < gpu.sms


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


def moe_buckets(spec, gpu: GpuTarget, fixed: int | None, tall: bool = True) -> list[list[int]]:
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
    edges = ([1] if top > 1 and single_token_bucket(m.top_k, m.hidden_size, gpu) else []) + (
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


def wide_call_ctas(spec, gpu: GpuTarget, tokens: int, block: int, ntiles: int, cols: int,
                   rows: int) -> tuple[int, int]:
    """(CTAs, room): a GEMM's wide CTAs (of `cols` column tiles of its `ntiles`, `rows` rows a
    warp) in a call of `tokens` tokens, unsplit, and the CTAs the SMs hold of the split wide
    CTA (wide_resident_ctas of its default ring, on every SM)."""
    cols = wide_col_tiles(ntiles, block, cols)
    ctas = call_blocks(spec, tokens, block) * ntiles // cols
    bk, zeros = WIDE_TILE["block_k"], not spec.quant.symmetric
    stages = wide_stages(block, cols, WIDE_TILE["stages"], bk, zeros)
    wg = wgmma_fits(cols, rows, block, bk, stages)
    return ctas, wide_resident_ctas(gpu, block, cols, cols * block // rows, stages, bk, zeros,
                                    wg) * gpu.sms


def prefill_short(spec, gpu: GpuTarget, tokens: int, block: int, ntiles: int, cols: int,
                  rows: int) -> bool:
    """Whether a call of `tokens` tokens leaves the SMs short of a GEMM's wide CTAs: fewer
    unsplit than the SMs hold at the split CTA's register cap (wide_call_ctas)."""
    if block not in WIDE_BLOCKS:
        return False
    ctas, room = wide_call_ctas(spec, gpu, tokens, block, ntiles, cols, rows)
    return ctas < room


def bucket_floor(buckets: list[list[int]], index: int) -> int:
    """The smallest token count of bucket `index`."""
    return 1 if index == 0 else buckets[index - 1][0] + 1
