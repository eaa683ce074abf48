"""int4 quantization: quantize, pack/unpack, and the public checkpoint formats (read and write).

moegen's reference layout: int4 values q in [-8, 7] held in int8 arrays (an unsigned stored
value u in 0..15 is q = u - 8), one scale per group of `group_size` rows along K (the reduction
axis, axis -2 of [..., K, N]), and optionally
- a zero point per group and column, held as z - 8 in [-8, 7] (`zeros`, int8 [..., K/G, N]):
  w = (q - zeros) * scale, which is AWQ's and asymmetric GPTQ's (u - z) * s; without zeros,
  w = q * scale (symmetric: every zero point 8);
- the group of each row (`g_idx`, int32 [..., K]; GPTQ act-order): row k takes the scale and zero
  of group g_idx[k] instead of k // group_size.
Packed form: two values per byte along the last axis, the even index in the low nibble.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# AWQ stores output column 8c + AWQ_ORDER[i] in nibble i of int32 column c.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


class QuantFormatError(ValueError):
    """A checkpoint tensor moegen cannot import; the message says which and why."""


class QuantizedWeight(NamedTuple):
    """One int4 weight in moegen's reference layout (see the module docstring)."""
    q: np.ndarray                   # int8 [..., K, N] in [-8, 7]
    scales: np.ndarray              # [..., K/G, N], float16 (or the checkpoint's float type)
    zeros: np.ndarray | None = None     # int8 [..., K/G, N] in [-8, 7] (z - 8); None: symmetric
    g_idx: np.ndarray | None = None     # int32 [..., K]; None: row // group_size


def row_groups(k: int, group_size: int, g_idx=None) -> np.ndarray:
    """The group of each of the K rows: g_idx, or row // group_size."""
    return np.arange(k) // group_size if g_idx is None else np.asarray(g_idx)


def dequantize(qw: QuantizedWeight, group_size: int, dtype=np.float32) -> np.ndarray:
    """w [..., K, N] = (q - zero) * scale, each row with its group's scale and zero."""
    groups = row_groups(qw.q.shape[-2], group_size, qw.g_idx)

    def per_row(a):
        a = np.asarray(a).astype(dtype)
        if qw.g_idx is not None and np.ndim(groups) > 1:        # a g_idx per leading index
            return np.take_along_axis(a, groups[..., :, None].astype(np.int64), axis=-2)
        return np.take(a, groups, axis=-2)

    q = qw.q.astype(dtype)
    if qw.zeros is not None:
        q = q - per_row(qw.zeros)
    return q * per_row(qw.scales)


def quantize(w, group_size: int, symmetric: bool = True, g_idx=None) -> QuantizedWeight:
    """Quantize w [..., K, N] per group along K (rows of a group: g_idx, or k // group_size).

    Symmetric: scale = max|w| / 7 (the scale rounded to fp16 first, so q * scale is what a
    kernel sees), q = round(w / scale). Asymmetric (zero points, as AWQ): scale =
    (max - min) / 15 (rounded up to fp16), zero point z = round(-min / scale) in 0..15,
    u = round(w / scale) + z clipped to 0..15; held as q = u - 8, zeros = z - 8. Either way each
    weight is within half a step of its group's scale."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    *lead, k, n = w.shape
    if k % group_size:
        raise QuantFormatError(f"K = {k} is not a multiple of group_size = {group_size}")
    groups = row_groups(k, group_size, g_idx)
    if g_idx is not None:
        sizes = (groups[..., None] == np.arange(k // group_size)).sum(axis=-2)
        if groups.shape[-1] != k or np.any(sizes != group_size):
            raise QuantFormatError(f"g_idx must give each of the K / group_size groups "
                                   f"{group_size} rows")
        order = np.argsort(groups, axis=-1, kind="stable")
        sorted_w = np.take_along_axis(w, order[..., :, None], axis=-2) if np.ndim(order) > 1 \
            else np.take(w, order, axis=-2)
        qs = quantize(sorted_w, group_size, symmetric)
        inverse = np.argsort(order, axis=-1, kind="stable")
        q = (np.take_along_axis(qs.q, inverse[..., :, None], axis=-2) if np.ndim(inverse) > 1
             else np.take(qs.q, inverse, axis=-2))
        return QuantizedWeight(q, qs.scales, qs.zeros, np.asarray(g_idx, dtype=np.int32))
    blocks = w.reshape(*lead, k // group_size, group_size, n)
    if symmetric:
        scales = (np.abs(blocks).max(axis=-2) / 7.0).astype(np.float16)
        safe = np.where(scales > 0, scales.astype(np.float32), 1.0)
        q = np.clip(np.round(blocks / safe[..., None, :]), -8, 7).astype(np.int8)
        return QuantizedWeight(q.reshape(w.shape), scales)
    lo = np.minimum(blocks.min(axis=-2), 0.0)
    hi = np.maximum(blocks.max(axis=-2), 0.0)
    exact = (hi - lo) / 15.0
    scales = exact.astype(np.float16)          # rounded up, so that 15 steps span [lo, hi]
    scales = np.where(scales.astype(np.float32) < exact,
                      np.nextafter(scales, np.float16(np.inf)), scales)
    safe = np.where(scales > 0, scales.astype(np.float32), 1.0)
    z = np.clip(np.round(-lo / safe), 0, 15)
    u = np.clip(np.round(blocks / safe[..., None, :]) + z[..., None, :], 0, 15)
    return QuantizedWeight((u - 8).astype(np.int8).reshape(w.shape), scales,
                           (z - 8).astype(np.int8))


def quantize_int4(w, group_size: int):
    """Symmetric per-group quantization of w [..., K, N] along K: (q int8 [..., K, N] in
    [-8, 7], scales float16 [..., K/G, N]) with scale = max|w| / 7 per group."""
    qw = quantize(w, group_size)
    return qw.q, qw.scales


def pack_int4(q) -> np.ndarray:
    """int4 values [..., N] (N even) -> uint8 [..., N/2]; index 2j in the low nibble of byte j."""
    q = np.asarray(q)
    if q.shape[-1] % 2:
        raise QuantFormatError(f"the last axis ({q.shape[-1]}) must be even to pack two per byte")
    if q.size and (q.min() < -8 or q.max() > 7):
        raise QuantFormatError(f"int4 values must lie in [-8, 7], got {q.min()}..{q.max()}")
    u = q.astype(np.int16) & 0xF
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def unpack_int4(packed) -> np.ndarray:
    """uint8 [..., N/2] -> int8 [..., N] in [-8, 7] (inverse of `pack_int4`)."""
    p = np.asarray(packed).astype(np.int16)
    lo, hi = p & 0xF, (p >> 4) & 0xF
    out = np.stack([lo, hi], axis=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)
    return np.where(out >= 8, out - 16, out).astype(np.int8)


# --- int32 words of eight nibbles -----------------------------------------------------------------

def _nibbles(words: np.ndarray) -> np.ndarray:
    """int32 [...] -> uint8 [..., 8]: nibble i of each word."""
    u = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
    return np.stack([(u >> (4 * i)) & 0xF for i in range(8)], axis=-1).astype(np.uint8)


def _words(nibbles: np.ndarray) -> np.ndarray:
    """uint8 [..., 8] (values 0..15) -> int32 [...]: nibble i at bits 4i..4i+3."""
    u = np.zeros(nibbles.shape[:-1], np.uint32)
    for i in range(8):
        u |= nibbles[..., i].astype(np.uint32) << np.uint32(4 * i)
    return u.view(np.int32)


def _unpack_columns(packed, order=tuple(range(8))) -> np.ndarray:
    """int32 [..., R, C/8] -> uint4 [..., R, C]: column 8c + order[i] from nibble i."""
    packed = np.asarray(packed)
    nib = _nibbles(packed)
    out = np.empty_like(nib)
    out[..., list(order)] = nib
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def _pack_columns(u4, order=tuple(range(8))) -> np.ndarray:
    """uint4 [..., R, C] -> int32 [..., R, C/8], the inverse of `_unpack_columns`."""
    u4 = np.asarray(u4)
    nib = u4.reshape(*u4.shape[:-1], u4.shape[-1] // 8, 8)[..., list(order)]
    return _words(nib)


def _unpack_rows(packed) -> np.ndarray:
    """int32 [..., R/8, C] -> uint4 [..., R, C]: row 8r + i from nibble i."""
    packed = np.asarray(packed)
    nib = np.moveaxis(_nibbles(packed), -1, -2)                    # [..., R/8, 8, C]
    return nib.reshape(*packed.shape[:-2], packed.shape[-2] * 8, packed.shape[-1])


def _pack_rows(u4) -> np.ndarray:
    u4 = np.asarray(u4)
    nib = u4.reshape(*u4.shape[:-2], u4.shape[-2] // 8, 8, u4.shape[-1])
    return _words(np.moveaxis(nib, -2, -1))


def _check(name: str, got, want: tuple, fmt: str) -> None:
    if tuple(np.shape(got)[-len(want):]) != want:
        raise QuantFormatError(f"{fmt}: {name} has shape {tuple(np.shape(got))}, expected "
                               f"[..., {', '.join(map(str, want))}]")


def _zeros_or_none(z_u4: np.ndarray) -> np.ndarray | None:
    """Stored zero points (0..15) -> zeros (z - 8), or None where every one is 8."""
    z = z_u4.astype(np.int16) - 8
    return None if not np.any(z) else z.astype(np.int8)


# --- AutoAWQ (GEMM) ---------------------------------------------------------------------------

def from_awq(qweight, qzeros, scales, group_size: int) -> QuantizedWeight:
    """AutoAWQ tensors -> QuantizedWeight: qweight [..., K, N/8] int32 and qzeros
    [..., K/G, N/8] int32 (column 8c + AWQ_ORDER[i] in nibble i), scales [..., K/G, N];
    w = (q - z) * s with q, z in 0..15. zeros is None where every zero point is 8."""
    q = _unpack_columns(qweight, AWQ_ORDER)
    k, n = q.shape[-2:]
    if k % group_size:
        raise QuantFormatError(f"AWQ: K = {k} is not a multiple of group_size {group_size}")
    _check("qzeros", qzeros, (k // group_size, n // 8), "AWQ")
    _check("scales", scales, (k // group_size, n), "AWQ")
    z = _unpack_columns(qzeros, AWQ_ORDER)
    return QuantizedWeight((q.astype(np.int16) - 8).astype(np.int8), np.asarray(scales),
                           _zeros_or_none(z))


def to_awq(qw: QuantizedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """QuantizedWeight (no g_idx) -> AutoAWQ's (qweight, qzeros, scales)."""
    if qw.g_idx is not None:
        raise QuantFormatError("AWQ has no act-order: a weight with g_idx cannot be written")
    zeros = np.zeros(qw.scales.shape, np.int16) if qw.zeros is None else qw.zeros
    return (_pack_columns((qw.q.astype(np.int16) + 8).astype(np.uint8), AWQ_ORDER),
            _pack_columns((zeros.astype(np.int16) + 8).astype(np.uint8), AWQ_ORDER),
            np.asarray(qw.scales))


# --- GPTQ ----------------------------------------------------------------------------------------

def from_gptq(qweight, qzeros, scales, group_size: int, g_idx=None,
              zero_offset: int = 1) -> QuantizedWeight:
    """GPTQ tensors -> QuantizedWeight: qweight [..., K/8, N] int32 packed along K (nibble i =
    row 8r + i), qzeros [..., K/G, N/8] int32 (nibble i = column 8c + i) holding z -
    zero_offset (1 in the original "gptq" checkpoint format, 0 in "gptq_v2"), scales
    [..., K/G, N], g_idx [..., K] for act-order (kept where it is not row // group_size).
    w = (q - z) * s; symmetric GPTQ ("uint4b8") has every z = 8 and zeros None."""
    q = _unpack_rows(qweight)
    k, n = q.shape[-2:]
    if k % group_size:
        raise QuantFormatError(f"GPTQ: K = {k} is not a multiple of group_size {group_size}")
    _check("qzeros", qzeros, (k // group_size, n // 8), "GPTQ")
    _check("scales", scales, (k // group_size, n), "GPTQ")
    z = _unpack_columns(qzeros).astype(np.int16) + zero_offset
    if np.any(z > 15):
        raise QuantFormatError(f"GPTQ: qzeros + {zero_offset} passes 15; is the checkpoint "
                               "format gptq_v2 (zero_offset=0)?")
    if g_idx is not None:
        g_idx = np.asarray(g_idx).astype(np.int32)
        _check("g_idx", g_idx, (k,), "GPTQ")
        if g_idx.min() < 0 or g_idx.max() >= k // group_size:
            raise QuantFormatError(f"GPTQ: g_idx values {g_idx.min()}..{g_idx.max()} are not "
                                   f"groups of 0..{k // group_size - 1}")
        if np.array_equal(g_idx, np.broadcast_to(np.arange(k) // group_size, g_idx.shape)):
            g_idx = None
    return QuantizedWeight((q.astype(np.int16) - 8).astype(np.int8), np.asarray(scales),
                           _zeros_or_none(z), g_idx)


def to_gptq(qw: QuantizedWeight, group_size: int):
    """QuantizedWeight -> GPTQ's (qweight, qzeros, scales, g_idx), original format (qzeros
    minus one)."""
    k = qw.q.shape[-2]
    zeros = np.zeros(qw.scales.shape, np.int16) if qw.zeros is None else qw.zeros
    g_idx = qw.g_idx if qw.g_idx is not None else np.broadcast_to(
        (np.arange(k) // group_size).astype(np.int32), (*qw.q.shape[:-2], k))
    return (_pack_rows((qw.q.astype(np.int16) + 8).astype(np.uint8)),
            _pack_columns((zeros.astype(np.int16) + 8 - 1).astype(np.uint8)),
            np.asarray(qw.scales), np.ascontiguousarray(g_idx, dtype=np.int32))


# --- compressed-tensors, pack-quantized -------------------------------------------------------

def from_compressed_tensors(weight_packed, weight_scale, group_size: int,
                            weight_shape=None, weight_zero_point=None,
                            weight_g_idx=None) -> QuantizedWeight:
    """compressed-tensors "pack-quantized" W4A16 tensors (the layout of torch's Linear, [N, K])
    -> QuantizedWeight in [K, N]: weight_packed [..., N, K/8] int32 (nibble i = column 8c + i of
    the row, stored q + 8), weight_scale [..., N, K/G], weight_zero_point [..., N/8, K/G]
    int32 (asymmetric; packed along N, stored z + 8), weight_g_idx [..., K] (act-order),
    weight_shape [N, K]."""
    packed = np.asarray(weight_packed)
    u = _unpack_columns(packed)                                   # [..., N, K (padded)]
    n, k = u.shape[-2:]
    if weight_shape is not None:
        n, k = (int(v) for v in np.asarray(weight_shape).ravel()[-2:])
        if k > u.shape[-1] or n != u.shape[-2]:
            raise QuantFormatError(f"compressed-tensors: weight_shape [{n}, {k}] does not fit "
                                   f"weight_packed {tuple(packed.shape)}")
        u = u[..., :k]
    if k % group_size:
        raise QuantFormatError(f"compressed-tensors: K = {k} is not a multiple of group_size "
                               f"{group_size}")
    _check("weight_scale", weight_scale, (n, k // group_size), "compressed-tensors")
    zeros = None
    if weight_zero_point is not None:
        _check("weight_zero_point", weight_zero_point, (-(-n // 8), k // group_size),
               "compressed-tensors")
        z = np.swapaxes(_unpack_rows(weight_zero_point), -1, -2)[..., :n]   # [..., K/G, N]
        zeros = _zeros_or_none(z)
    g_idx = None
    if weight_g_idx is not None:
        g_idx = np.asarray(weight_g_idx).astype(np.int32)
        _check("weight_g_idx", g_idx, (k,), "compressed-tensors")
        if np.array_equal(g_idx, np.broadcast_to(np.arange(k) // group_size, g_idx.shape)):
            g_idx = None
    q = np.swapaxes(u.astype(np.int16) - 8, -1, -2).astype(np.int8)
    return QuantizedWeight(np.ascontiguousarray(q),
                           np.ascontiguousarray(np.swapaxes(np.asarray(weight_scale), -1, -2)),
                           zeros, g_idx)


def to_compressed_tensors(qw: QuantizedWeight) -> dict[str, np.ndarray]:
    """QuantizedWeight -> the pack-quantized tensors of one Linear ([N, K] layout)."""
    *lead, k, n = qw.q.shape
    out = {"weight_packed": _pack_columns((np.swapaxes(qw.q, -1, -2).astype(np.int16) + 8)
                                          .astype(np.uint8)),
           "weight_scale": np.ascontiguousarray(np.swapaxes(qw.scales, -1, -2)),
           "weight_shape": np.array([n, k], dtype=np.int64)}
    if qw.zeros is not None:
        z = (qw.zeros.astype(np.int16) + 8).astype(np.uint8)          # [..., K/G, N]
        pad = -n % 8
        if pad:
            z = np.concatenate([z, np.full((*z.shape[:-1], pad), 8, np.uint8)], axis=-1)
        out["weight_zero_point"] = _pack_rows(np.swapaxes(z, -1, -2))     # [..., N/8, K/G]
    if qw.g_idx is not None:
        out["weight_g_idx"] = np.asarray(qw.g_idx, dtype=np.int32)
    return out
