"""CTA shapes of the MoE GEMMs, whatever the bucket: the K-split CTA's warps, stages and K
splits, the wide CTA's column tiles and ring, the tall tile's stages, their shared memory, and
the routing kernels' CTAs. Sizes that depend on the GPU take its `GpuTarget`."""
from __future__ import annotations

from ...tile_model import TALL_BLOCK
from ...target import KNOWN_TARGETS, GpuTarget


GEMM_TILE = {"block_n": 64, "block_k": 16, "warps": 4, "stages": 8}
SHARED_PER_CTA = 48 * 1024  # static shared memory a CTA may declare (every arch)
RING_ROW_PAD = 16           # bytes after each staged activation row (conflict-free reads)
SCALE_BYTES = 128           # a 64-column tile's scales of a group in a ring (SCALE_STAGE_BYTES)
# the options that split the prefill buckets' GEMMs over K (they pin the prefill tile: no tall
# tile, no tuning entry)
PREFILL_SPLITS = ("prefill-split-k", "prefill-split-k-down")
CTAS_PER_SM = 4            # split-K target: enough weight bytes in flight per SM
# most k16 steps of K a CTA of a decode-bucket GEMM takes (measured on the H200): Mixtral's down
# GEMM (K = 14336, 896 steps) at T = 17..64 in 1.45 waves of 4 CTAs an SM at T = 64 was 4%
# faster split 4 (224 a CTA) than whole, and even at T = 40, while split 8 was 12% slower; its
# gate/up GEMM at T = 1 (256 a CTA of 2 warps) was 3% slower split 2
DECODE_CTA_STEPS = 256
ALIGN_WARPS = 16            # the align kernel's CTA: 512 threads
ALIGN_CHUNK = 1024          # slots of a CTA of the chunked align (tile{align-chunked-from})
# calls of this many slots (T*K) and more align chunked by default: the align alone on an H100,
# one CTA against chunked, us, at 2048 / 4096 slots: Qwen3 11.0 / 15.7 against 11.3 / 10.6,
# Mixtral 7.2 / 9.4 against 7.6 / 7.6 (DeepSeek 8.8 at 1536 and 12.1 at 3072 against 9.5)
ALIGN_CHUNKED_FROM = 2049
ROUTE_ALIGN_MAX_TOKENS = 64  # routing inside it: at most 4 tokens per warp
ROUTE_ALIGN_SLOTS = 512     # and its shared slots (4 KB of ids and weights)
# A call of one token with router logits is routed inside every CTA of both GEMMs (route-in-gemm),
# a lane a top-k slot: top_k up to a warp's lanes
GEMM_ROUTE_MAX_TOPK = 32
WIDE_BLOCKS = (32, 64)      # moe blocks the wide (prefill) CTA takes (1 or 2 row groups of 32)
WIDE_COL_TILES = 4          # 64-column tiles of a wide CTA (fewer where N has fewer)
WIDE_TILE = {"block_k": 32, "stages": 4, "warp_rows": 32}
WIDE_WARP_ROWS = (32, 64)   # rows a warp of the wide CTA multiplies
WGMMA_TILE = {"col_tiles": (4, 8), "wgmma": 1}   # 4 column tiles a warpgroup, 1 or 2 of them
# A decode bucket's wide CTA split over K (Mixtral's down GEMM at T = 53..64, split 4) doubles its
# split on the device in calls whose moe blocks would leave its grid short of this share of the
# CTAs the SMs hold (routing to fewer experts: fewer blocks). Measured on the H200, Mixtral T = 64
# routed to 2..7 of its 8 experts: split 8 against 4 at 4 blocks 185 against 222 us, 5: 246 / 260,
# 6: 251 / 264, 7 (448 CTAs split 4, 0.85 of 528): 260 / 264; at 8 blocks (512 CTAs) 293 / 288.
# Its gate/up GEMM (split 1) gained nothing split 2 at 4 blocks (190 against 185 us). The split
# chosen per call: 2-17% faster at 2..7 experts, 0.3% slower at 8 (docs/DESIGN.md).
WIDE_SPLIT_FILL = 0.9
TALL_TILE = {"col_tiles": 4, "warp_rows": 32, "block_k": 128, "stages": 4}
# Architectures with warpgroup MMA: plans for them take the tall tile. Elsewhere its kernel is
# the wide CTA of block 128 (16 warps, one CTA an SM), which on the H200 compiled for sm_90 was
# 19-66% slower than the wide CTA of block 32 (docs/DESIGN.md), so plans for them keep block 32
# at every prefill size.
WGMMA_ARCHS = tuple(arch for arch, gpu in KNOWN_TARGETS.items() if gpu.wgmma)   # sm_90a


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def tall_fits(n: int) -> bool:
    """Whether the tall tile takes a weight of n columns: whole 64-column tiles, in whole CTAs
    of TALL_TILE's column tiles."""
    block_n = GEMM_TILE["block_n"]
    return n % block_n == 0 and (n // block_n) % TALL_TILE["col_tiles"] == 0


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


def tall_stages(most: int, block_k: int, gpu: GpuTarget, zeros: bool = False) -> int:
    """Ring stages of the tall tile asked for at most `most`: 3 at least, fewer than `most`
    where its dynamic shared memory and the static beside it would pass the CTA's limit."""
    stages = max(3, most)
    while stages > 3 and (tall_shared_bytes(TALL_BLOCK, stages, block_k, zeros)
                          + tall_static_bytes(TALL_BLOCK, stages)) > gpu.shared_per_cta:
        stages -= 1
    return stages


def splits_evenly(k_dim: int, split: int, warps: int, block_k: int = 16) -> bool:
    """Whether K's k16 steps divide over `split` CTAs x `warps` warps x block_k/16 per stage."""
    return (k_dim // 16) % (split * warps * (block_k // 16)) == 0


def doubled_split(tiles: int, ctas_per_sm: int, allowed, gpu: GpuTarget) -> int:
    """A K split: doubled while `tiles` x split stays within `ctas_per_sm` CTAs on every SM and
    `allowed(split)` holds for the doubled split."""
    split = 1
    while tiles * split * 2 <= ctas_per_sm * gpu.sms and allowed(split * 2):
        split *= 2
    return split


def decode_split_k(k_dim: int, n: int, active_experts: int, tile: dict, gpu: GpuTarget) -> int:
    """K splits of a decode bucket's GEMM: 1 where its smallest call has a tile for every SM,
    else doubled up to about CTAS_PER_SM CTAs of the default 4 warps an SM (as many more CTAs
    as they have fewer warps); then doubled while a CTA's share of K passes DECODE_CTA_STEPS
    k16 steps, so that no CTA runs so long that the last wave of the largest call is left to a
    few SMs."""
    def allowed(split: int) -> bool:
        return splits_evenly(k_dim, split, tile["warps"], tile["block_k"])
    tiles = active_experts * -(-n // tile["block_n"])
    split = 1
    if tiles < gpu.sms:       # else every SM has a tile already
        split = doubled_split(tiles, CTAS_PER_SM * GEMM_TILE["warps"] // tile["warps"], allowed,
                              gpu)
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


def wide_static_bytes(block: int, col_tiles: int, stages: int, block_k: int, zeros: bool,
                      wgmma: bool) -> int:
    """Static shared memory of a wide CTA: the larger of its ring (the rows staged padded
    (gemm_wide.cuh) or, where it is built on warpgroup MMA, chunk-major (gemm_wgmma.cuh)) and
    its epilogue's fp16 output rows (64 columns a tile, padded by 8), and 128 bytes of flags."""
    ks = block_k // 16
    rows = chunk_major_row_bytes(block, ks) if wgmma else block * (32 * ks + RING_ROW_PAD)
    ring = stages * (col_tiles * (ks * 512 + group_bytes(zeros)) + rows)
    return max(ring, col_tiles * block * (64 + 8) * 2) + 128


def wide_resident_ctas(gpu: GpuTarget, block: int, col_tiles: int, warps: int, stages: int,
                       block_k: int, zeros: bool, wgmma: bool) -> int:
    """CTAs an SM holds of a capped wide CTA (`warps` warps, its ring of `stages` x block_k,
    on warpgroup MMA where `wgmma` and the GPU has it), which its K split is sized for:
    wide_decode_ctas (its register cap), fewer where the SM's shared memory holds fewer CTAs
    of its wide_static_bytes (3 of ~29 KB where the SM has 100 KB: sm_86, sm_89, sm_120, whose
    registers stay capped for 4: at 3, 168 registers, Mixtral's down kernel spills)."""
    static = wide_static_bytes(block, col_tiles, stages, block_k, zeros, wgmma and gpu.wgmma)
    return max(1, min(wide_decode_ctas(warps), gpu.ctas_by_shared(static)))


def wide_split_fill_ctas(resident: int, gpu: GpuTarget) -> int:
    """The CTAs below which a call doubles its wide decode split (call_split in the device
    header): WIDE_SPLIT_FILL of the `resident` CTAs an SM (wide_resident_ctas) on every SM."""
    return int(WIDE_SPLIT_FILL * resident * gpu.sms)


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


def tall_static_bytes(block: int, stages: int) -> int:
    """Static shared memory of the tall tile beside its dynamic ring: two mbarriers a stage and
    the block's slot ids and router weights, staged for the epilogue."""
    return stages * 2 * 8 + block * (4 + 4)


def tall_wide_block_k(block_k: int) -> int:
    """k a ring stage of the wide CTA that runs a tall-tile bucket where the GPU has no warpgroup
    MMA: at most 64 (at 128, 16 warps of mma.sync spill at the 128-register cap on sm_90)."""
    return min(block_k, 64)


def chunk_major_row_bytes(block: int, ks: int) -> int:
    """A warpgroup-MMA ring stage's rows (ChunkMajorRows in the device header): 2 ks k8 chunk
    columns of `block` rows and 16 bytes of padding each, in whole 128-byte lines."""
    return align_up(2 * ks * (block + 1) * 16, 128)


def tall_shared_bytes(block: int, stages: int, block_k: int, zeros: bool = False) -> int:
    """Dynamic shared memory of a tall-tile GEMM kernel: the larger of the tall tile's (its ring,
    or the block's fp32 outputs of 4 column tiles, rows and tiles padded by 4 words) and that of
    the wide CTA in its place where the GPU has no warpgroup MMA (its ring, or its warps' fp16
    output rows)."""
    ks, wide_ks, cols = block_k // 16, tall_wide_block_k(block_k) // 16, TALL_TILE["col_tiles"]
    tall = max(stages * (cols * (ks * 512 + group_bytes(zeros)) + chunk_major_row_bytes(block, ks)),
               cols * (block * (64 + 4) + 4) * 4)
    wide = max(stages * (cols * (wide_ks * 512 + group_bytes(zeros))
                         + block * (32 * wide_ks + RING_ROW_PAD)),
               cols * block * (64 + 8) * 2)
    return max(tall, wide)


# One token's routing in a GEMM CTA ranks the experts from RANK_MIN_EXPERTS up to
# RANK_EXPERTS_PER_THREAD a thread (the template's ranks_experts, which these are rendered
# into); else warp 0 picks them one at a time.
RANK_MIN_EXPERTS = 33
RANK_EXPERTS_PER_THREAD = 2


def ranks_experts(experts: int, threads: int) -> bool:
    """Whether a CTA of `threads` routes one token by ranking its experts (it then keeps one
    key an expert in shared memory)."""
    return RANK_MIN_EXPERTS <= experts <= RANK_EXPERTS_PER_THREAD * threads


def one_token_routing_bytes(experts: int, top_k: int, block: int, threads: int) -> int:
    """Static shared memory of one token's routing in a GEMM CTA of `threads` (OneTokenRouting
    in the template): the rank search's keys (one per expert, padded to 4; only where the CTA
    ranks them) sharing their room with the sorted ids and weights of top_k blocks, then the
    blocks' experts, the picks' experts and keys and the padded total, in whole KB aligned to
    a KB (so another KB at most in front of it)."""
    keys = 4 * align_up(experts, 4) if ranks_experts(experts, threads) else 4
    return align_up(max(keys, 8 * top_k * block) + 12 * top_k + 4, 1024) + 1024


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
