"""int4 quantization: quantize, pack/unpack, and import of public checkpoint formats.

moegen's reference layout: signed int4 values q in [-8, 7] held in int8 arrays, w = q * scale,
one fp16 scale per group of `group_size` rows along K (the reduction axis, axis -2 of
[..., K, N]). Packed form: two values per byte along the last axis, the even index in the low
nibble.
"""
from __future__ import annotations

import numpy as np

# AWQ stores output column 8c + AWQ_ORDER[i] in nibble i of int32 column c.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


class QuantFormatError(ValueError):
    """A checkpoint tensor moegen cannot import; the message says which and why."""


def quantize_int4(w, group_size: int):
    """Symmetric per-group quantization of w [..., K, N] along K.

    Returns (q int8 [..., K, N] in [-8, 7], scales float16 [..., K/G, N]) with
    scale = max|w| / 7 per group (rounded to fp16 first, so q * scale is what a kernel sees).
    """
    w = np.asarray(w, dtype=np.float32)
    k = w.shape[-2]
    if k % group_size:
        raise QuantFormatError(f"K = {k} is not a multiple of group_size = {group_size}")
    groups = w.reshape(*w.shape[:-2], k // group_size, group_size, w.shape[-1])
    scales = (np.abs(groups).max(axis=-2) / 7.0).astype(np.float16)
    safe = np.where(scales > 0, scales.astype(np.float32), 1.0)
    q = np.clip(np.round(groups / safe[..., None, :]), -8, 7).astype(np.int8)
    return q.reshape(w.shape), scales


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


def _nibbles(words: np.ndarray) -> np.ndarray:
    """int32 [...] -> uint8 [..., 8]: nibble i of each word."""
    u = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
    return np.stack([(u >> (4 * i)) & 0xF for i in range(8)], axis=-1).astype(np.uint8)


def _awq_unpack(packed: np.ndarray) -> np.ndarray:
    """AWQ int32 [..., R, N/8] -> uint4 values [..., R, N] in natural column order."""
    nib = _nibbles(packed)                        # [..., R, N/8, 8], nibble i
    out = np.empty_like(nib)
    out[..., list(AWQ_ORDER)] = nib               # column 8c + AWQ_ORDER[i] <- nibble i
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def from_awq(qweight, qzeros, scales, group_size: int):
    """AutoAWQ tensors -> (q int8 [..., K, N], scales float16 [..., K/G, N]).

    qweight [..., K, N/8] int32, qzeros [..., K/G, N/8] int32, scales [..., K/G, N] fp16;
    w = (q - z) * s. Only z = 8 everywhere (symmetric) maps exactly onto signed int4.
    """
    q = _awq_unpack(np.asarray(qweight)).astype(np.int16)
    z = _awq_unpack(np.asarray(qzeros)).astype(np.int16)
    scales = np.asarray(scales)
    k, n = q.shape[-2:]
    if z.shape[-2:] != (k // group_size, n) or scales.shape[-2:] != (k // group_size, n):
        raise QuantFormatError(f"AWQ shapes qweight {np.shape(qweight)}, qzeros "
                               f"{np.shape(qzeros)}, scales {scales.shape} do not fit "
                               f"group_size {group_size}")
    if np.any(z != 8):
        raise QuantFormatError("AWQ zero points other than 8 are not supported yet (moegen's "
                               "kernels take symmetric int4: w = q * scale)")
    return (q - 8).astype(np.int8), scales.astype(np.float16)


def from_gptq(qweight, qzeros, scales, group_size: int, g_idx=None):
    """Symmetric GPTQ ("uint4b8") tensors -> (q int8 [..., K, N], scales float16 [..., K/G, N]).

    qweight [..., K/8, N] int32 packed along K (nibble i = row 8r + i); qzeros [..., K/G, N/8]
    stored minus one (7 = zero point 8); w = (q - 8) * s.
    """
    qweight = np.asarray(qweight)
    nib = _nibbles(qweight)                                   # [..., K/8, N, 8]
    q = np.moveaxis(nib, -1, -2)                              # [..., K/8, 8, N]
    q = q.reshape(*qweight.shape[:-2], qweight.shape[-2] * 8, qweight.shape[-1]).astype(np.int16)
    k = q.shape[-2]
    if g_idx is not None and not np.array_equal(np.asarray(g_idx), np.arange(k) // group_size):
        raise QuantFormatError("GPTQ act-order (a g_idx that is not row // group_size) is not "
                               "supported: reorder the rows of the checkpoint first")
    z = _nibbles(np.asarray(qzeros)).reshape(*np.shape(qzeros)[:-1], -1)
    if np.any(z != 7):
        raise QuantFormatError("GPTQ zero points other than 8 (stored as 7) are not supported "
                               "yet: only symmetric GPTQ maps onto w = q * scale")
    scales = np.asarray(scales)
    if scales.shape[-2:] != (k // group_size, q.shape[-1]):
        raise QuantFormatError(f"GPTQ scales {scales.shape} do not fit K = {k}, "
                               f"group_size {group_size}")
    return (q - 8).astype(np.int8), scales.astype(np.float16)
