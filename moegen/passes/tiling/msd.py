"""Tiles of the MSD matmul on CUDA (warp layout, rings, shared memory, occupancy, K split) and
of its dequant lowering."""
from __future__ import annotations

from ...target import GpuTarget
from .cta import CTAS_PER_SM, align_up, doubled_split, splits_evenly


MSD_CUDA_TILE = {"stages": 4, "mma": "s8", "occupancy": 0}   # and msd_warp_layout(m)
MSD_WARPS = (1, 2, 4, 8)    # choices of vector and of matrix warps per MSD CTA
MSD_BLOCK_N = (16, 32, 64, 128, 256)
MSD_CTAS_PER_SM = 3         # MSD split-K target (the sweep's best at M = 1, 4, 16, seed shape)
MSD_MIN_REGISTERS = 80      # an MSD thread's registers are never capped below this (M = 1 needs 80)
MSD_X_RING_BYTES = 4096     # activation ring of one vector warp (MSD on CUDA)
DENSE_MAX_BLOCK = 32        # rows per CTA of the dequant lowering


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
    pass builds it; a layout that passes the GPU's shared memory a CTA does not build)."""
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


def msd_occupancy(wanted: int, threads: int, shared_bytes: int, gpu: GpuTarget) -> int:
    """CTAs an SM the MSD kernel is built for: `wanted` (0: no register cap), at most what the
    shared memory holds and what leaves a thread MSD_MIN_REGISTERS registers. A CTA holds its
    `shared_bytes` of dynamic shared memory after a line of static (the K split's flag: the
    dynamic area starts on the next 128-byte line), in 128-byte units."""
    if not wanted:
        return 0
    by_shared = gpu.ctas_by_shared(MSD_SHARED_LINE + shared_bytes)
    by_registers = gpu.registers_per_sm // (threads * MSD_MIN_REGISTERS)
    return max(1, min(wanted, by_shared, by_registers))


def msd_split_k(groups: int, col_blocks: int, gpu: GpuTarget,
                ctas_per_sm: int = MSD_CTAS_PER_SM) -> int:
    """CTAs along K for the MSD kernel: doubled while about `ctas_per_sm` CTAs per SM are not
    yet busy, each keeping at least two whole groups."""
    return doubled_split(col_blocks, ctas_per_sm,
                         lambda sp: groups % sp == 0 and groups // sp >= 2, gpu)


def dense_split_k(k_dim: int, tiles: int, warps: int, gpu: GpuTarget) -> int:
    """K splits for a dense GEMM of `tiles` output tiles: until about four CTAs per SM."""
    return doubled_split(tiles, CTAS_PER_SM, lambda sp: splits_evenly(k_dim, sp, warps), gpu)


def fit_warps(k_dim: int, warps: int) -> int:
    """The most warps (<= warps) that split K/16 steps evenly."""
    while warps > 1 and (k_dim // 16) % warps:
        warps //= 2
    return warps
