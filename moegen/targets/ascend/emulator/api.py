"""The AscendC API the emitted kernel calls, with each call's documented semantics on 910B
(`__NPU_ARCH__` 2201), in numpy. Only what the kernel uses is here; anything else is a
NameError in the translated code, not a silent guess.

Units and rules kept, as the AscendC documentation gives them (the notes of moegen's Ascend
target list the sources):
- DataCopyPad: blockLen in bytes; GM -> UB srcStride in bytes, dstStride in 32-byte blocks;
  UB -> GM srcStride in 32-byte blocks, dstStride in bytes; each block starts on a 32-byte
  boundary in UB.
- DataCopy GM -> L1 with Nd2NzParams: counts in elements, dstNzC0Stride and dstNzNStride in
  32-byte C0 blocks; ndNum = 0 copies nothing. int4b_t copies run as int8 copies on this core,
  so for int4 every count is in bytes (two values a byte).
- Cast: the documented source/destination pairs and round modes only; float -> half rounds to
  the nearest half (CAST_RINT: ties to even), float -> float with a round mode rounds to an
  integer; half -> int4 saturates to [-8, 7].
- Vector operands start on a 32-byte block; count is in elements.
- ReduceMax (level 2): dst[0] = the largest of the first count elements; the shared temporary
  buffer is scratch.
- MatmulImpl with A1/B1 inputs: A is an NZ tile of CeilAlign(M, 16) rows, B an NZ tile of
  CeilAlign(K, 16) rows (int4: 64-column fractals of 32 bytes); C goes to GM in ND with row
  stride orgKc (or orgN); it reads L1 on MTE1 and writes GM on FIX.
"""
from __future__ import annotations

import copy

import numpy as np

from .memory import BLOCK, CACHE_LINE, CONTEXT, EmulationError
from .scalars import DTYPES, conv, element

SYS_WORKSPACE = 16 * 1024          # what GetUserWorkspace skips (the library's part)
EVENT_IDS = 8                      # event ids per HardEvent type
FLAG_COUNTER_MAX = 15              # a cross-core flag counts this many outstanding sets


def core():
    return CONTEXT.core


class _Names:
    def __init__(self, *names: str):
        for n in names:
            setattr(self, n, n)


HardEvent = _Names("MTE2_MTE1", "MTE1_MTE2", "MTE1_M", "M_MTE1", "MTE2_V", "V_MTE2", "MTE3_V",
                   "V_MTE3", "M_V", "V_M", "V_V", "MTE3_MTE1", "MTE1_MTE3", "MTE1_V", "MTE2_M",
                   "M_MTE2", "V_MTE1", "M_FIX", "FIX_M", "MTE3_MTE2", "MTE2_MTE3", "S_V", "V_S",
                   "S_MTE2", "MTE2_S", "S_MTE3", "MTE3_S", "MTE2_FIX", "FIX_MTE2", "FIX_S",
                   "S_FIX", "MTE1_FIX", "FIX_MTE1")
RoundMode = _Names("CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL", "CAST_ROUND",
                   "CAST_TRUNC", "CAST_ODD")
TPosition = _Names("GM", "A1", "A2", "B1", "B2", "C1", "C2", "CO1", "CO2", "VECIN", "VECOUT",
                   "VECCALC", "TSCM", "LCM", "SPM", "SHM")
CubeFormat = _Names("ND", "NZ", "ZN", "ZZ", "NN", "ND_ALIGN", "SCALAR", "VECTOR")
CacheLine = _Names("SINGLE_CACHE_LINE", "ENTIRE_DATA_CACHE")
DcciDst = _Names("CACHELINE_ALL", "CACHELINE_UB", "CACHELINE_OUT", "CACHELINE_ATOMIC")
PIPES_BY_NAME = {f"PIPE_{p}": p for p in ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX", "ALL")}
UB_POSITIONS = {"VECIN", "VECOUT", "VECCALC"}
L1_POSITIONS = {"A1", "B1", "C1", "TSCM"}


def _event_pipes(event: str) -> tuple[str, str]:
    src, dst = event.split("_", 1)
    return src, dst


# --- structures --------------------------------------------------------------------------------

class _Struct:
    """A C struct: typed fields (assignments convert), positional construction in field order."""
    FIELDS: tuple = ()

    def __init__(self, *values, _t=()):
        types = {name: ctype for name, ctype, _ in self.FIELDS}
        object.__setattr__(self, "_types", types)
        for name, ctype, default in self.FIELDS:
            object.__setattr__(self, name, conv(ctype, default))
        for (name, _, _), value in zip(self.FIELDS, values):
            setattr(self, name, value)

    def __setattr__(self, name, value):
        ctype = self._types.get(name)
        if ctype is None:
            raise EmulationError(f"{type(self).__name__} has no field {name}")
        object.__setattr__(self, name, conv(ctype, value))


class DataCopyExtParams(_Struct):
    FIELDS = (("blockCount", "uint16_t", 1), ("blockLen", "uint32_t", 0),
              ("srcStride", "uint32_t", 0), ("dstStride", "uint32_t", 0), ("rsv", "uint32_t", 0))


class Nd2NzParams(_Struct):
    FIELDS = tuple((name, "uint16_t", 0) for name in (
        "ndNum", "nValue", "dValue", "srcNdMatrixStride", "srcDValue", "dstNzC0Stride",
        "dstNzNStride", "dstNzMatrixStride"))


class DataCopyPadExtParams(_Struct):
    def __init__(self, *values, _t=()):
        dtype = _t[0] if _t else "float"
        object.__setattr__(self, "FIELDS", (("isPad", "bool", False), ("leftPadding", "uint8_t", 0),
                       ("rightPadding", "uint8_t", 0),
                       ("paddingValue", dtype if dtype in DTYPES and dtype != "int4b_t"
                        else "int8_t", 0)))
        super().__init__(*values)


# the library's TCubeTiling (kernel_tiling.h), every field int32, in its order
TCUBE_TILING_FIELDS = (
    "usedCoreNum", "M", "N", "Ka", "Kb", "singleCoreM", "singleCoreN", "singleCoreK", "baseM",
    "baseN", "baseK", "depthA1", "depthB1", "stepM", "stepN", "isBias", "transLength",
    "iterateOrder", "shareMode", "shareL1Size", "shareL0CSize", "shareUbSize", "batchM",
    "batchN", "singleBatchM", "singleBatchN", "stepKa", "stepKb", "depthAL1CacheUB",
    "depthBL1CacheUB", "dbL0A", "dbL0B", "dbL0C", "ALayoutInfoB", "ALayoutInfoS",
    "ALayoutInfoN", "ALayoutInfoG", "ALayoutInfoD", "BLayoutInfoB", "BLayoutInfoS",
    "BLayoutInfoN", "BLayoutInfoG", "BLayoutInfoD", "CLayoutInfoB", "CLayoutInfoS1",
    "CLayoutInfoN", "CLayoutInfoG", "CLayoutInfoS2", "BatchNum", "mxTypePara")


class TCubeTiling(_Struct):
    FIELDS = tuple((name, "int32_t", 0) for name in TCUBE_TILING_FIELDS)


# --- tensors -----------------------------------------------------------------------------------

def _span(dtype: str, count: int) -> int:
    """Bytes of `count` elements."""
    _, size = element(dtype)
    if size < 1:
        if count % 2:
            raise EmulationError(f"an odd number ({count}) of int4 elements")
        return count // 2
    return int(count * size)


class GlobalTensor:
    def __init__(self, _t=(), addr=None):
        self.dtype = _t[0]
        self.addr = addr

    def SetGlobalBuffer(self, addr, size=None):
        self.addr = int(addr)

    def __getitem__(self, index):
        return GlobalTensor((self.dtype,), self.addr + _span(self.dtype, int(index)))

    def _scalar_at(self, index):
        addr = self.addr + _span(self.dtype, int(index))
        dtype, size = element(self.dtype)
        line = addr - addr % CACHE_LINE
        return line, addr - line, dtype, int(size)

    def GetValue(self, index):
        """A scalar load through this core's data cache."""
        line, offset, dtype, size = self._scalar_at(index)
        entry = core().cached_line(line)
        core().issue("S")
        return entry[0][offset:offset + size].view(dtype)[0]

    def SetValue(self, index, value):
        """A scalar store: it lands in this core's data cache, not in GM."""
        line, offset, dtype, size = self._scalar_at(index)
        entry = core().cached_line(line)
        core().issue("S")
        entry[0][offset:offset + size] = np.array([value], dtype=dtype).view(np.uint8)
        entry[1] = True


class LocalTensor:
    def __init__(self, dtype: str, offset: int, lo: int, hi: int, position: str):
        self.dtype, self.offset, self.lo, self.hi, self.position = dtype, offset, lo, hi, position

    def __getitem__(self, index):
        return LocalTensor(self.dtype, self.offset + _span(self.dtype, int(index)), self.lo,
                           self.hi, self.position)

    def ReinterpretCast(self, _t=()):
        return LocalTensor(_t[0], self.offset, self.lo, self.hi, self.position)

    def bytes(self, pipe: str, seq: int, count: int, write: bool, what: str) -> np.ndarray:
        return core().access(self.offset, _span(self.dtype, count), pipe, seq, write, what,
                             (self.lo, self.hi))

    def GetValue(self, index):
        dtype, size = element(self.dtype)
        if size < 1:
            raise EmulationError("LocalTensor::GetValue of int4 is not emulated")
        seq = core().issue("S")
        raw = self[index].bytes("S", seq, 1, False, "LocalTensor::GetValue")
        return raw.view(dtype)[0]

    def SetValue(self, index, value):
        dtype, size = element(self.dtype)
        if size < 1:
            raise EmulationError("LocalTensor::SetValue of int4 is not emulated")
        seq = core().issue("S")
        raw = self[index].bytes("S", seq, 1, True, "LocalTensor::SetValue")
        raw[:] = np.array([value], dtype=dtype).view(np.uint8)


class TBuf:
    def __init__(self, _t=()):
        self.position = _t[0] if _t else "VECCALC"
        self.offset = self.size = None

    def Get(self, length=None, _t=()):
        if self.offset is None:
            raise EmulationError("TBuf::Get before TPipe::InitBuffer")
        dtype = _t[0]
        hi = self.offset + (self.size if length is None else _span(dtype, int(length)))
        return LocalTensor(dtype, self.offset, self.offset, min(hi, self.offset + self.size),
                           self.position)


class TPipe:
    def __init__(self, _t=()):
        core().pipe = self

    def InitBuffer(self, buf, length):
        c = core()
        want = "aiv" if buf.position in UB_POSITIONS else "aic"
        if buf.position not in UB_POSITIONS | L1_POSITIONS:
            raise EmulationError(f"InitBuffer at {buf.position}: not emulated")
        if c.kind != want:
            raise EmulationError(f"{c.name}: InitBuffer at {buf.position}, a memory this core "
                                 "does not have")
        mem = c.memory
        size = -(-int(length) // BLOCK) * BLOCK
        if size <= 0 or mem.used + size > mem.capacity:
            raise EmulationError(f"{c.name}: InitBuffer of {length} bytes: {mem.name} holds "
                                 f"{mem.capacity}, {mem.used} taken")
        buf.offset, buf.size = mem.used, size
        mem.used += size
        return True

    def FetchEventID(self, event, _t=()):
        taken = core().allocated.get(event, set())
        return next(i for i in range(EVENT_IDS) if i not in taken)

    def AllocEventID(self, _t=()):
        event = _t[0]
        taken = core().allocated.setdefault(event, set())
        free = [i for i in range(EVENT_IDS) if i not in taken]
        if not free:
            raise EmulationError(f"{core().name}: no {event} event id left to allocate")
        taken.add(free[0])
        return free[0]

    def ReleaseEventID(self, event_id, _t=()):
        event = _t[0]
        if core().events.get((event, event_id)):
            raise EmulationError(f"{core().name}: ReleaseEventID<{event}>({event_id}) with a "
                                 "SetFlag not waited")
        core().allocated.get(event, set()).discard(event_id)


def GetTPipePtr():
    if core().pipe is None:
        raise EmulationError("GetTPipePtr before a TPipe was constructed")
    return core().pipe


# --- synchronisation ---------------------------------------------------------------------------

def _event_id(event_id) -> int:
    if not 0 <= int(event_id) < EVENT_IDS:
        raise EmulationError(f"event id {event_id} outside 0..{EVENT_IDS - 1}")
    return int(event_id)


def SetFlag(event_id, _t=()):
    core().set_flag(*_event_pipes(_t[0]), _event_id(event_id))


def WaitFlag(event_id, _t=()):
    core().wait_flag(*_event_pipes(_t[0]), _event_id(event_id))


def PipeBarrier(_t=()):
    if _t[0] == "ALL":
        core().barrier_all()


def CrossCoreSetFlag(flag, _t=()):
    mode, pipe = int(_t[0]), _t[1]
    CONTEXT.machine.cross_set(core(), mode, int(flag), pipe)


def CrossCoreWaitFlag(flag, _t=()):
    mode = int(_t[0]) if _t else 0
    c = core()
    while not CONTEXT.machine.cross_try_wait(c, mode, int(flag)):
        yield


def DataCacheCleanAndInvalid(tensor, _t=()):
    if not isinstance(tensor, GlobalTensor):
        return
    line = tensor.addr - tensor.addr % CACHE_LINE
    core().issue("S")
    core().clean_invalidate(line)


def GetBlockIdx():
    return core().index


def GetSubBlockIdx():
    return core().sub


def GetBlockNum():
    return len(CONTEXT.machine.aic)


def GetUserWorkspace(workspace):
    return int(workspace) + SYS_WORKSPACE


# --- data movement -----------------------------------------------------------------------------

def _align(x: int) -> int:
    return -(-x // BLOCK) * BLOCK


def _gm_rows(addr: int, count: int, length: int, stride: int, what: str):
    """(array, index [count, length]) of `count` GM rows of `length` bytes, `stride` apart."""
    array, start = CONTEXT.machine.gm.locate(addr, (count - 1) * stride + length, what)
    return array, start + np.arange(count)[:, None] * stride + np.arange(length)[None, :]


def DataCopyPad(dst, src, params, pad=None, _t=()):
    c = core()
    count, length = params.blockCount, params.blockLen
    if count == 0 or length == 0:
        raise EmulationError("DataCopyPad of zero blocks or zero bytes")
    if isinstance(dst, LocalTensor) and isinstance(src, GlobalTensor):
        what = "DataCopyPad GM -> UB"
        seq = c.issue("MTE2")
        ub_stride = _align(length) + params.dstStride * BLOCK
        array, index = _gm_rows(src.addr, count, length, length + params.srcStride, what)
        data = array[index]
        fill = None
        if pad is not None and pad.isPad and pad.rightPadding:
            fill = np.full(pad.rightPadding, pad.paddingValue,
                           dtype=element(dst.dtype)[0]).view(np.uint8)
        if ub_stride == length and fill is None:          # one contiguous span in UB
            raw = c.access(dst.offset, count * length, "MTE2", seq, True, what, (dst.lo, dst.hi))
            raw[:] = data.reshape(-1)
            return
        for i in range(count):
            raw = c.access(dst.offset + i * ub_stride, _align(length), "MTE2", seq, True, what,
                           (dst.lo, dst.hi))
            raw[:length] = data[i]
            if fill is not None:
                raw[length:length + fill.size] = fill
    elif isinstance(dst, GlobalTensor) and isinstance(src, LocalTensor):
        what = "DataCopyPad UB -> GM"
        seq = c.issue("MTE3")
        ub_stride, gm_stride = _align(length) + params.srcStride * BLOCK, length + params.dstStride
        if ub_stride == length and gm_stride == length:   # contiguous on both sides
            raw = c.access(src.offset, count * length, "MTE3", seq, False, what, (src.lo, src.hi))
            c.gm_write("MTE3", dst.addr, raw, what)
            return
        for i in range(count):
            raw = c.access(src.offset + i * ub_stride, length, "MTE3", seq, False, what,
                           (src.lo, src.hi))
            c.gm_write("MTE3", dst.addr + i * gm_stride, raw, what)
    else:
        raise EmulationError("DataCopyPad between these positions is not emulated")


def DataCopy(dst, src, params, _t=()):
    if not (isinstance(dst, LocalTensor) and isinstance(src, GlobalTensor)
            and isinstance(params, Nd2NzParams)):
        raise EmulationError("only DataCopy GM -> L1 with Nd2NzParams is emulated")
    c = core()
    if dst.position not in L1_POSITIONS:
        raise EmulationError(f"DataCopy with Nd2NzParams into {dst.position}, not L1")
    seq = c.issue("MTE2")
    if params.ndNum == 0 or params.nValue == 0 or params.dValue == 0:
        return                                   # the hardware copies nothing
    # int4 runs as int8: every count is bytes; otherwise elements of the type
    es = 1 if dst.dtype == "int4b_t" else int(element(dst.dtype)[1])
    c0 = BLOCK // es
    gm = CONTEXT.machine.gm
    rows, cols = params.nValue, params.dValue
    col = np.arange(cols)
    for matrix in range(params.ndNum):
        src_base = src.addr + matrix * params.srcNdMatrixStride * es
        last = src_base + ((rows - 1) * params.srcDValue + cols) * es
        array, start = gm.locate(src_base, last - src_base, "DataCopy Nd2Nz GM -> L1")
        index = (start + (np.arange(rows)[:, None] * params.srcDValue + col[None, :]) * es)
        byte = np.arange(es)
        data = array[index[..., None] + byte]                       # [rows, cols, es]
        dst_elem = ((col // c0)[None, :] * params.dstNzC0Stride * c0
                    + np.arange(rows)[:, None] * params.dstNzNStride * c0
                    + (col % c0)[None, :])
        dst_bytes = (dst.offset + matrix * params.dstNzMatrixStride * es
                     + dst_elem[..., None] * es + byte)
        lo, hi = int(dst_bytes.min()), int(dst_bytes.max()) + 1
        raw = c.access(lo, hi - lo, "MTE2", seq, True, "DataCopy Nd2Nz GM -> L1",
                       (dst.lo, dst.hi))
        raw[(dst_bytes - lo).reshape(-1)] = data.reshape(-1)


# --- vector computation ------------------------------------------------------------------------

def _int4_unpack(raw: np.ndarray) -> np.ndarray:
    low = (raw & 0x0F).astype(np.int8)
    high = (raw >> 4).astype(np.int8)
    out = np.empty(raw.size * 2, dtype=np.int8)
    out[0::2], out[1::2] = low, high
    return np.where(out > 7, out - 16, out).astype(np.int8)


def _int4_pack(values: np.ndarray) -> np.ndarray:
    u = values.astype(np.int16) & 0x0F
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8)


def _check_operand(t, what: str) -> None:
    if not isinstance(t, LocalTensor) or t.position not in UB_POSITIONS:
        raise EmulationError(f"{what}: operands must be LocalTensors in UB")
    if t.offset % BLOCK:
        raise EmulationError(f"{what}: an operand at UB byte {t.offset}, not on a 32-byte block")


def _vector(what: str, dst, sources, count):
    """Issues one V instruction: the sources' values (copies) and the destination's bytes."""
    count = int(count)
    if count <= 0:
        raise EmulationError(f"{what}: count {count}")
    for t in (dst, *sources):
        _check_operand(t, what)
    seq = core().issue("V")
    values = []
    for s in sources:
        raw = s.bytes("V", seq, count, False, what)
        values.append(_int4_unpack(raw)[:count] if s.dtype == "int4b_t"
                      else raw.view(element(s.dtype)[0])[:count].copy())
    out = dst.bytes("V", seq, count, True, what)
    return values, out


def _store(out: np.ndarray, dtype: str, values: np.ndarray) -> None:
    if dtype == "int4b_t":
        out[:] = _int4_pack(values)
    else:
        out.view(element(dtype)[0])[:values.size] = values


def _same(what: str, *tensors) -> str:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise EmulationError(f"{what}: operand types {sorted(dtypes)} differ")
    return dtypes.pop()


def _arith(what, dst, srcs, count, fn):
    dtype = _same(what, dst, *srcs)
    (values, out) = _vector(what, dst, srcs, count)
    _store(out, dtype, fn(*values).astype(element(dtype)[0]))


def Add(dst, a, b, count, _t=()):
    _arith("Add", dst, (a, b), count, lambda x, y: x + y)


def Sub(dst, a, b, count, _t=()):
    _arith("Sub", dst, (a, b), count, lambda x, y: x - y)


def Mul(dst, a, b, count, _t=()):
    _arith("Mul", dst, (a, b), count, lambda x, y: x * y)


def Div(dst, a, b, count, _t=()):
    _arith("Div", dst, (a, b), count, lambda x, y: x / y)


def Max(dst, a, b, count, _t=()):
    _arith("Max", dst, (a, b), count, np.maximum)


def Min(dst, a, b, count, _t=()):
    _arith("Min", dst, (a, b), count, np.minimum)


def Abs(dst, src, count, _t=()):
    _arith("Abs", dst, (src,), count, np.abs)


def Muls(dst, src, scalar, count, _t=()):
    dtype = element(dst.dtype)[0]
    _arith("Muls", dst, (src,), count, lambda x: x * dtype.type(scalar))


def Adds(dst, src, scalar, count, _t=()):
    dtype = element(dst.dtype)[0]
    _arith("Adds", dst, (src,), count, lambda x: x + dtype.type(scalar))


def Axpy(dst, src, scalar, count, _t=()):
    """dst = dst + src * scalar (src half or float, dst float or half)."""
    if src.dtype not in ("half", "float") or dst.dtype not in ("half", "float"):
        raise EmulationError(f"Axpy: {src.dtype} -> {dst.dtype} is not a documented pair")
    values, out = _vector("Axpy", dst, (src, dst), count)
    ftype = element(dst.dtype)[0]
    product = (values[0] * element(src.dtype)[0].type(scalar)).astype(ftype)
    _store(out, dst.dtype, (values[1] + product).astype(ftype))


def Duplicate(dst, scalar, count, _t=()):
    values, out = _vector("Duplicate", dst, (), count)
    _store(out, dst.dtype, np.full(int(count), scalar, dtype=element(dst.dtype)[0]))


def ReduceMax(dst, src, tmp, count, calIndex=False, _t=()):
    """dst[0] = the largest of src's first `count` elements; tmp is the call's scratch."""
    if calIndex:
        raise EmulationError("ReduceMax with calIndex is not emulated")
    dtype = _same("ReduceMax", dst, src, tmp)
    count = int(count)
    for t in (dst, src, tmp):
        _check_operand(t, "ReduceMax")
    seq = core().issue("V")
    values = src.bytes("V", seq, count, False, "ReduceMax").view(element(dtype)[0])[:count].max()
    scratch = tmp.bytes("V", seq, count, True, "ReduceMax scratch")
    scratch[:] = CONTEXT.machine.rng.integers(0, 256, scratch.size, dtype=np.uint8)
    _store(dst.bytes("V", seq, 1, True, "ReduceMax"), dtype, np.array([values]))


# documented (destination, source) pairs of Cast on this core, with their round modes
_ALL = {"CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL", "CAST_ROUND", "CAST_TRUNC"}
CAST_MODES = {
    ("float", "half"): {"CAST_NONE"},
    ("half", "float"): _ALL | {"CAST_ODD"},
    ("float", "float"): _ALL - {"CAST_NONE"},
    ("int4b_t", "half"): _ALL,
    ("half", "int4b_t"): {"CAST_NONE"},
    ("float", "int32_t"): _ALL,
    ("int32_t", "float"): _ALL - {"CAST_NONE"},
    ("half", "int32_t"): _ALL,
    ("int32_t", "half"): _ALL - {"CAST_NONE"},
}


def _to_integer(x: np.ndarray, mode: str) -> np.ndarray:
    x = x.astype(np.float64)
    if mode in ("CAST_RINT", "CAST_NONE"):
        return np.rint(x)
    if mode == "CAST_ROUND":
        return np.sign(x) * np.floor(np.abs(x) + 0.5)
    return {"CAST_FLOOR": np.floor, "CAST_CEIL": np.ceil, "CAST_TRUNC": np.trunc}[mode](x)


def _to_half(x: np.ndarray, mode: str) -> np.ndarray:
    x = x.astype(np.float64)
    h = x.astype(np.float16)                     # nearest, ties to even
    if mode in ("CAST_NONE", "CAST_RINT"):
        return h
    hf = h.astype(np.float64)
    down = np.nextafter(h, np.float16(-np.inf))
    up = np.nextafter(h, np.float16(np.inf))
    if mode == "CAST_FLOOR":
        return np.where(hf > x, down, h)
    if mode == "CAST_CEIL":
        return np.where(hf < x, up, h)
    if mode == "CAST_TRUNC":
        return np.where(np.abs(hf) > np.abs(x), np.where(x > 0, down, up), h)
    if mode == "CAST_ROUND":                     # ties away from zero
        other = np.where(hf < x, up, down)
        tie = np.abs(other.astype(np.float64) - x) == np.abs(hf - x)
        away = np.abs(other.astype(np.float64)) > np.abs(hf)
        return np.where(tie & away, other, h)
    # CAST_ODD: an inexact result takes the neighbour whose last mantissa bit is 1
    exact = hf == x
    lower = np.where(hf > x, down, h)
    upper = np.where(hf < x, up, h)
    odd = (lower.view(np.uint16) & 1) == 1
    return np.where(exact, h, np.where(odd, lower, upper))


def Cast(dst, src, roundMode, count, _t=()):
    modes = CAST_MODES.get((dst.dtype, src.dtype))
    if modes is None:
        raise EmulationError(f"Cast {src.dtype} -> {dst.dtype} is not supported on this core")
    if roundMode not in modes:
        raise EmulationError(f"Cast {src.dtype} -> {dst.dtype} with {roundMode} is not "
                             "supported on this core")
    (x,), out = _vector("Cast", dst, (src,), count)
    if dst.dtype == "half":
        result = _to_half(x, roundMode) if src.dtype == "float" else x.astype(np.float16)
    elif dst.dtype == "float":
        result = (_to_integer(x, roundMode).astype(np.float32) if src.dtype == "float"
                  else x.astype(np.float32))
    elif dst.dtype == "int4b_t":
        result = np.clip(_to_integer(x, roundMode), -8, 7).astype(np.int8)
    else:
        info = np.iinfo(element(dst.dtype)[0])
        result = np.clip(_to_integer(x, roundMode), info.min, info.max)
    _store(out, dst.dtype, result)


# --- the matmul ----------------------------------------------------------------------------------

class MatmulType:
    def __init__(self, _t=()):
        self.position, self.format, self.dtype = _t[0], _t[1], _t[2]
        self.transposed = bool(_t[3]) if len(_t) > 3 else False


class MatmulImpl:
    L0A = L0B = 64 * 1024
    L0C = 128 * 1024

    def __init__(self, _t=()):
        self.a_type, self.b_type, self.c_type = _t[0], _t[1], _t[2]
        self.tiling = None
        self.org = self.tail = None
        self.a = self.b = None

    def SetSubBlockIdx(self, index):
        self.sub_block = int(index)

    def Init(self, tiling, pipe=None):
        c = core()
        if c.kind != "aic":
            raise EmulationError(f"{c.name}: MatmulImpl::Init on a vector core")
        t = tiling
        bits = 4 if self.a_type.dtype == "int4b_t" else 8 * int(element(self.a_type.dtype)[1])
        ab_double = 2 if ((t.dbL0A - 1) & (t.dbL0B - 1)) else 1
        need = {"L0A": t.baseM * t.baseK * bits // 8 * ab_double,
                "L0B": t.baseN * t.baseK * bits // 8 * ab_double,
                "L0C": t.baseM * t.baseN * 4 * (2 if t.dbL0C == 2 else 1)}
        for name, nbytes in need.items():
            if nbytes > getattr(self, name) or nbytes <= 0:
                raise EmulationError(f"{c.name}: the tiling's base tiles need {nbytes} bytes of "
                                     f"{name} ({getattr(self, name)})")
        self.tiling = t

    def SetOrgShape(self, orgM, orgN, orgKa, orgKb=None, orgKc=0):
        self.org = (int(orgM), int(orgN), int(orgKa), int(orgKa if orgKb is None else orgKb),
                    int(orgKc))

    def SetTensorA(self, tensor, isTransposeA=False):
        self._input(tensor, isTransposeA, self.a_type, "A")
        self.a = tensor

    def SetTensorB(self, tensor, isTransposeB=False):
        self._input(tensor, isTransposeB, self.b_type, "B")
        self.b = tensor

    @staticmethod
    def _input(tensor, transposed, mtype, name):
        if not isinstance(tensor, LocalTensor) or tensor.position not in L1_POSITIONS:
            raise EmulationError(f"SetTensor{name}: only an L1 tensor is emulated")
        if transposed or mtype.format != "NZ" or tensor.dtype != mtype.dtype:
            raise EmulationError(f"SetTensor{name}: only untransposed NZ {mtype.dtype} "
                                 "is emulated")

    def SetTail(self, tailM=-1, tailN=-1, tailK=-1):
        self.tail = (int(tailM), int(tailN), int(tailK))

    def IterateAll(self, gm, enAtomic=0, enSequentialWrite=False, waitIterateAll=False,
                   fakeMsg=False, _t=()):
        if self.tiling is None or self.a is None or self.b is None or self.org is None:
            raise EmulationError("IterateAll before Init, SetOrgShape, SetTensorA and SetTensorB")
        if enAtomic:
            raise EmulationError("IterateAll with atomic accumulation is not emulated")
        t = self.tiling
        tail = self.tail or (-1, -1, -1)
        m = tail[0] if tail[0] > 0 else t.singleCoreM
        n = tail[1] if tail[1] > 0 else t.singleCoreN
        k = tail[2] if tail[2] > 0 else t.singleCoreK
        c = core()
        seq = c.issue("MTE1")
        a = self._nz(self.a, m, k, seq, "A")                       # [m, k]
        b = self._nz(self.b, k, n, seq, "B")                       # [k, n]
        # exact in float64: |products| <= 64, sums far below 2^53
        product = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int32)
        c.issue("FIX")
        ldc = self.org[4] if self.org[4] > 0 else self.org[1]
        for row in range(m):
            c.gm_write("FIX", gm.addr + row * ldc * 4, product[row].view(np.uint8),
                       "Matmul IterateAll -> GM")

    @staticmethod
    def _nz(tensor, rows, cols, seq, name):
        """An int4 NZ tile of `rows` (padded to 16) x `cols` (64-column fractals) as
        [rows, cols]."""
        if tensor.dtype != "int4b_t":
            raise EmulationError(f"Matmul {name}: only int4 inputs are emulated")
        height = -(-rows // 16) * 16
        fractals = -(-cols // 64)
        raw = core().access(tensor.offset, fractals * height * 32, "MTE1", seq, False,
                            f"Matmul reads {name} from L1", (tensor.lo, tensor.hi))
        values = _int4_unpack(raw).reshape(fractals, height, 64)
        return values.transpose(1, 0, 2).reshape(height, fractals * 64)[:rows, :cols]

    def End(self):
        pass


def REGISTER_TILING_DEFAULT(struct):
    pass


def namespace() -> dict:
    """The names the translated kernel sees besides its own."""
    from types import SimpleNamespace
    api = SimpleNamespace(**{name: value for name, value in globals().items()
                             if name[:1].isupper() and not name.isupper()})
    api.int4b_t = "int4b_t"
    return {"AscendC": api, "TCubeTiling": TCubeTiling, "CubeFormat": CubeFormat,
            "GetTPipePtr": GetTPipePtr, "REGISTER_TILING_DEFAULT": REGISTER_TILING_DEFAULT,
            **PIPES_BY_NAME, "half": "half", "event_t": "event_t"}


def copy_value(value):
    return copy.copy(value)
