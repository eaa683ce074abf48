"""C scalar semantics for the translated kernel: conversions to a declared type, `sizeof`,
truncating division, and the element types of tensors (one table)."""
from __future__ import annotations

import numpy as np

f32 = np.float32

# element type -> (numpy dtype, bytes; int4b_t is two to a byte)
DTYPES = {
    "half": (np.dtype(np.float16), 2), "float": (np.dtype(np.float32), 4),
    "int32_t": (np.dtype(np.int32), 4), "uint32_t": (np.dtype(np.uint32), 4),
    "int16_t": (np.dtype(np.int16), 2), "uint16_t": (np.dtype(np.uint16), 2),
    "int8_t": (np.dtype(np.int8), 1), "uint8_t": (np.dtype(np.uint8), 1),
    "int64_t": (np.dtype(np.int64), 8), "uint64_t": (np.dtype(np.uint64), 8),
    "int4b_t": (np.dtype(np.int8), 0.5),
}
_UNSIGNED = {"uint8_t": 8, "uint16_t": 16, "uint32_t": 32, "uint64_t": 64, "size_t": 64,
             "unsigned": 32, "GM_ADDR": 64}
_SIGNED = {"int8_t": 8, "int16_t": 16, "int32_t": 32, "int": 32, "int64_t": 64, "event_t": 8,
           "TEventID": 8}
_SIZES = {"bool": 1, "float": 4, "double": 8, "half": 2, "bfloat16_t": 2, **{
    k: v // 8 for k, v in {**_UNSIGNED, **_SIGNED}.items()}}


def conv(ctype: str, value):
    """`value` as C converts it to `ctype` (wrapping integers, float32 floats)."""
    bits = _UNSIGNED.get(ctype)
    if bits is not None:
        return int(value) & ((1 << bits) - 1)
    bits = _SIGNED.get(ctype)
    if bits is not None:
        v = int(value) & ((1 << bits) - 1)
        return v - (1 << bits) if v >> (bits - 1) else v
    if ctype == "float":
        return f32(value)
    if ctype == "half":
        return np.float16(value)
    if ctype == "double":
        return float(value)
    if ctype == "bool":
        return bool(value)
    raise TypeError(f"no C conversion to {ctype}")


def sizeof(ctype: str) -> int:
    return _SIZES[ctype]


def div(a, b):
    """C division: integers truncate toward zero; floats divide in their own precision."""
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def mod(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a - div(a, b) * b
    return np.fmod(a, b)


def element(dtype: str) -> tuple[np.dtype, float]:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise TypeError(f"no tensor element type {dtype}") from None
