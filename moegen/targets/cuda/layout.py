"""The weight layout the CUDA W4A16 GEMM reads, and its inverse (host side, numpy, offline).

For a weight q [E, K, N] (int4 values in [-8, 7]) with scales [E, K/G, N]:
- columns are padded to a multiple of 64 (zero weights, zero scales); for the gate/up weight the
  64-column tile t holds gate columns [32t, 32t + 32) then up columns [I + 32t, I + 32t + 32), so
  one CTA sees both halves of its SwiGLU outputs;
- words [E, K/16, N/64, 32 lanes, 4] uint32: lane l's word t holds the mma.sync m16n8k16 A
  fragment of the 16 columns 16 t .. 16 t + 15 (the weights are the A operand, rows = columns
  of the output, the block's activation rows the B operand): with r = l / 4 and
  k = 2 (l % 4), nibble i is column 16 t + r + 8 (i % 2), k offset k + i // 4 + 8 ((i % 4) // 2),
  stored as q + 8 (so `dequant8` in templates/cuda/moegen/dequant.cuh unpacks the four A
  registers, two values per lop3);
- scales [E, K/G, N/64, 8, 8] in the activations' type (fp16 or bf16): [.., n, j] is the scale
  of column 8 j + n, so lane l reads the scales of its eight columns 8 j + l / 4 in one 16-byte
  load; zero points (asymmetric int4) the same, z - 8 in the activations' type;
- act-order (GPTQ desc_act, a group index per row): each expert's rows sorted by group
  (`act_order_rows`), so that row j lies in group j / G; the layer gathers its activations in
  the same order.

`pack_weights` is the reference the GPU packer (moegen/targets/cuda/packing.py) is checked
against, bit for bit.
"""
from __future__ import annotations

import numpy as np

LANE = np.arange(32)[:, None, None]
WORD = np.arange(4)[None, :, None]
NIBBLE = np.arange(8)[None, None, :]
K_OF = 2 * (LANE % 4) + NIBBLE // 4 + 8 * ((NIBBLE % 4) // 2)          # [32, 1, 8]
N_OF = 16 * WORD + LANE // 4 + 8 * (NIBBLE % 2)                        # [32, 4, 8]
K_IDX, N_IDX = np.broadcast_arrays(K_OF, N_OF)


def gate_up_columns(intermediate: int) -> np.ndarray:
    """Column order of the packed gate/up weight: per 64-column tile 32 gate then 32 up."""
    tiles = intermediate // 32
    gate = np.arange(intermediate).reshape(tiles, 32)
    return np.concatenate([gate, gate + intermediate], axis=1).ravel()


def padded_columns(n: int) -> int:
    return -(-n // 64) * 64


def scale_dtype(scales) -> np.dtype:
    """The packed scales' type: bf16 (ml_dtypes) stays bf16, anything else becomes fp16."""
    dt = np.asarray(scales).dtype
    return dt if dt.name == "bfloat16" else np.dtype(np.float16)


def pack_group_values(values, columns: np.ndarray | None = None, dtype=None) -> np.ndarray:
    """Per-group values [E, K/G, N] (scales, or zero points) -> [E, K/G, N/64 (padded), 8, 8] of
    `dtype` (default: `scale_dtype`), [.., n, j] the value of column 8 j + n of the tile (after
    `columns`), 0 past N."""
    values = np.asarray(values)
    values = values.astype(dtype or scale_dtype(values))
    if columns is not None:
        values = values[..., columns]
    e, groups, n = values.shape
    npad = padded_columns(n)
    if npad != n:
        values = np.concatenate([values, np.zeros((e, groups, npad - n), values.dtype)], axis=-1)
    return np.ascontiguousarray(values.reshape(e, groups, npad // 64, 8, 8).swapaxes(-1, -2))


def act_order_rows(g_idx, group: int) -> np.ndarray:
    """int32 [E, K]: each expert's rows ordered by group (stable), so that sorted row j lies in
    group j / group; each group must hold exactly `group` rows (as GPTQ's g_idx does)."""
    g_idx = np.asarray(g_idx)
    groups = g_idx.shape[-1] // group
    if g_idx.size and (g_idx.min() < 0 or g_idx.max() >= groups):
        raise ValueError(f"g_idx: values {g_idx.min()}..{g_idx.max()} must lie in "
                         f"[0, K / group_size = {groups})")
    counts = np.stack([np.bincount(row, minlength=groups) for row in g_idx])
    bad = np.argwhere(counts != group)
    if len(bad):
        ex, grp = bad[0]
        raise ValueError(f"g_idx of expert {ex}: group {grp} holds {counts[ex, grp]} rows; "
                         f"act-order needs each of the {groups} groups to hold {group}")
    return np.argsort(g_idx, axis=-1, kind="stable").astype(np.int32)


def pack_weights(q: np.ndarray, scales: np.ndarray, group: int,
                 columns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """q int8 [E, K, N], scales [E, K/G, N] -> (words uint32, scales fp16 or bf16) as above."""
    q = np.asarray(q)
    e, k, n = q.shape
    if k % 16 or k % group:
        raise ValueError(f"K = {k} must be a multiple of 16 and of the group size {group}")
    if columns is not None:
        q = q[..., columns]
        n = q.shape[-1]
    npad = padded_columns(n)
    if npad != n:
        q = np.concatenate([q, np.zeros((e, k, npad - n), q.dtype)], axis=-1)
    u = ((q.astype(np.int16) + 8) & 0xF).astype(np.uint8)               # q + 8, in 0..15
    tiles = u.reshape(e, k // 16, 16, npad // 64, 64).transpose(0, 1, 3, 2, 4)
    words = np.zeros((e, k // 16, npad // 64, 32, 4), np.uint32)
    for i in range(8):                                                   # nibble i of each word
        words |= tiles[..., K_IDX[..., i], N_IDX[..., i]].astype(np.uint32) << np.uint32(4 * i)
    return np.ascontiguousarray(words), pack_group_values(scales, columns)


def unpack_weights(words: np.ndarray, packed_scales: np.ndarray, n: int,
                   columns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `pack_weights`: (q int8 [E, K, N], scales [E, K/G, N])."""
    e, ksteps, ntiles = words.shape[:3]
    nib = np.stack([(words >> np.uint32(4 * i)) & 0xF for i in range(8)], axis=-1)
    tiles = np.zeros((e, ksteps, ntiles, 16, 64), np.int16)
    tiles[..., K_IDX, N_IDX] = nib.astype(np.int16)
    q = tiles.transpose(0, 1, 3, 2, 4).reshape(e, ksteps * 16, ntiles * 64) - 8
    s = packed_scales.swapaxes(-1, -2).reshape(e, packed_scales.shape[1], ntiles * 64)
    keep = n if columns is None else len(columns)
    q, s = q[..., :keep], s[..., :keep]
    if columns is not None:
        inverse = np.argsort(columns)
        q, s = q[..., inverse], s[..., inverse]
    return q.astype(np.int8), s


def pack_dense_weights(q: np.ndarray) -> np.ndarray:
    """int4 q [K, N] -> the words of `pack_weights` for one expert, [K/16, N/64 (padded), 32, 4]:
    the A operand of the dequant lowering of the MSD matmul (its scales stay [K/G, N])."""
    q = np.asarray(q)
    k, n = q.shape
    words, _ = pack_weights(q[None], np.zeros((1, 1, n), np.float16), k)   # scales unused
    return words[0]


def pack_msd_weights(q: np.ndarray) -> np.ndarray:
    """int4 q [K, N] -> uint32 [N/8 (padded), K/64, 32 lanes, 2]: the B fragments of
    mma.sync m16n8k64 u4: lane l's word j holds k = 64 s + 32 j + 8 (l % 4) + i (nibble i) of
    column 8 t + l / 4, offset-binary nibbles q + 8 (0..15; the kernel subtracts 8 times the
    activation sums). Padding columns hold q = 0."""
    q = np.asarray(q)
    k, n = q.shape
    if k % 64:
        raise ValueError(f"K = {k} must be a multiple of 64 for the MSD kernel")
    if q.size and (q.min() < -8 or q.max() > 7):
        raise ValueError(f"w_q: values {q.min()}..{q.max()} are not int4 (must lie in -8..7)")
    n8 = -(-n // 8)
    if n8 * 8 != n:
        q = np.concatenate([q, np.zeros((k, n8 * 8 - n), q.dtype)], axis=1)
    u = (q.astype(np.int16) + 8).astype(np.uint32)                         # [K, N], 0..15
    lane = np.arange(32)
    t = u.reshape(k // 64, 2, 4, 8, n8, 8)      # [s, j, k-group of 8 (l % 4), i, tile, column]
    words = np.zeros((n8, k // 64, 32, 2), np.uint32)
    for i in range(8):
        # value for (tile, s, lane, j): u[64 s + 32 j + 8 (lane % 4) + i, 8 tile + lane // 4]
        v = t[:, :, lane % 4, i, :, lane // 4]          # [32 lanes, s, j, tile]
        words |= v.transpose(3, 1, 0, 2) << np.uint32(4 * i)
    return np.ascontiguousarray(words)


def unpack_msd_weights(words: np.ndarray, n: int) -> np.ndarray:
    """The inverse of `pack_msd_weights`: int8 [K, N]."""
    n8, steps = words.shape[:2]
    q = np.zeros((steps * 64, n8 * 8), np.int16)
    for lane in range(32):
        for j in range(2):
            for i in range(8):
                k = np.arange(steps)[:, None] * 64 + 32 * j + 8 * (lane % 4) + i
                col = np.arange(n8)[None, :] * 8 + lane // 4
                q[k, col] = ((words[:, :, lane, j] >> np.uint32(4 * i)) & 0xF).T
    return (q[:, :n] - 8).astype(np.int8)
