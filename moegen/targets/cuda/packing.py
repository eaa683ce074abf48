"""The MoE weights into the layout the CUDA GEMMs read: on the GPU (`pack_moe_weights`, kernels
rendered from templates/cuda/pack_w4a16.cu.j2) or on the host (`pack_moe_weights_host`, numpy,
the reference: layout.py). Both give the same bits.

The input is moegen's reference layout (moegen.quant.QuantizedWeight: q int8 [E, K, N], scales
[E, K/G, N], zero points int8 [E, K/G, N] as z - 8, g_idx int32 [E, K]), for the gate/up weight
w13 [E, H, 2I] and the down weight w2 [E, I, H]; numpy arrays, CuPy arrays or PyTorch tensors.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...version import __version__
from ...ir.types import numpy_dtype
from ...quant import QuantizedWeight
from ...render import render
from ...spec import Spec
from .device import get_cupy, is_torch
from .launch import NULL
from .layout import (act_order_rows, gate_up_columns, pack_group_values, pack_weights,
                     padded_columns)

PACK_THREADS = 256


@dataclass
class PackedMoeWeights:
    """Weights in the kernels' layout (device arrays), from `MoeW4A16.pack` or
    `pack_moe_weights`: words uint32, scales (and zero points) as the bits of the activations'
    type (uint16), act-order row orders int32 [E, K] (the layer gathers activations by them)."""
    w13: object
    w13_scales: object
    w2: object
    w2_scales: object
    w13_zeros: object = None
    w2_zeros: object = None
    w13_rows: object = None
    w2_rows: object = None
    dtype: str = "float16"

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.__dict__.values() if hasattr(a, "nbytes"))


def weight_shapes(spec: Spec) -> dict[str, tuple[int, int, int]]:
    """(E, K, N) of each weight in the reference layout."""
    m = spec.moe
    return {"w13": (m.num_experts, m.hidden_size, 2 * m.intermediate_size),
            "w2": (m.num_experts, m.intermediate_size, m.hidden_size)}


def _columns(spec: Spec, which: str) -> np.ndarray | None:
    return gate_up_columns(spec.moe.intermediate_size) if which == "w13" else None


def _check_weight(spec: Spec, which: str, qw: QuantizedWeight) -> None:
    """Shapes and presence of zero points and g_idx against the spec; one error naming both."""
    e, k, n = weight_shapes(spec)[which]
    groups = k // spec.quant.group_size
    want = {"q": (e, k, n), "scales": (e, groups, n), "zeros": (e, groups, n), "g_idx": (e, k)}
    for field, shape in want.items():
        a = getattr(qw, field)
        if field == "zeros" and (a is None) != spec.quant.symmetric:
            raise ValueError(f"{which}: the spec has quant.symmetric: "
                             f"{str(spec.quant.symmetric).lower()}, the weight "
                             f"{'has' if a is not None else 'has no'} zero points")
        if field == "g_idx" and a is not None and not spec.quant.act_order:
            raise ValueError(f"{which}: the weight has a g_idx (act-order), the spec has "
                             f"quant.act_order: false")
        if a is not None and tuple(a.shape) != shape:
            raise ValueError(f"{which}.{field}: shape {tuple(a.shape)}, expected {shape}")


def _rows(spec: Spec, which: str, qw: QuantizedWeight) -> np.ndarray | None:
    """The act-order row order of each expert (None: rows in order)."""
    if not spec.quant.act_order:
        return None
    e, k, _ = weight_shapes(spec)[which]
    g_idx = (np.broadcast_to(np.arange(k) // spec.quant.group_size, (e, k)) if qw.g_idx is None
             else _host(qw.g_idx))
    return act_order_rows(g_idx, spec.quant.group_size)


def _host(a) -> np.ndarray:
    """numpy, CuPy or PyTorch -> numpy (bf16 tensors as ml_dtypes bf16)."""
    if is_torch(a):
        import torch
        t = a.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(numpy_dtype("bf16"))
        return t.numpy()
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def pack_moe_weights_host(spec: Spec, w13: QuantizedWeight,
                          w2: QuantizedWeight) -> dict[str, np.ndarray | None]:
    """The packed weights as numpy arrays (the reference packer), keyed by the field names of
    PackedMoeWeights; scales and zero points as the bits of the activations' type."""
    act = numpy_dtype("bf16" if spec.dtype == "bfloat16" else "f16")
    out = {}
    for which, qw in (("w13", w13), ("w2", w2)):
        _check_weight(spec, which, qw)
        qw = QuantizedWeight(*(None if a is None else _host(a) for a in qw))
        rows = _rows(spec, which, qw)
        q = qw.q if rows is None else np.take_along_axis(qw.q, rows[:, :, None], axis=1)
        cols = _columns(spec, which)
        words, _ = pack_weights(q, np.zeros((q.shape[0], 1, q.shape[2]), np.float16),
                                q.shape[1], cols)
        out[which] = words
        out[f"{which}_scales"] = pack_group_values(qw.scales, cols, act).view(np.uint16)
        out[f"{which}_zeros"] = (None if qw.zeros is None else
                                 pack_group_values(qw.zeros, cols, act).view(np.uint16))
        out[f"{which}_rows"] = rows
    return out


@lru_cache(maxsize=None)
def _pack_module(bf16: bool, device: int):
    cp = get_cupy()
    source = render("cuda/pack_w4a16.cu.j2", version=__version__, bf16=bf16)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    module = cp.RawModule(code=f"// sha256 {digest}\n{source}", options=("--std=c++17",))
    return {name: module.get_function(name)
            for name in ("pack_weight_words", "pack_scales", "pack_zeros")}


def _device_bits(cp, a, act) -> object:
    """Scales onto the device as the bits of the activations' type (uint16)."""
    if isinstance(a, cp.ndarray):
        if a.dtype == np.uint16:
            return cp.ascontiguousarray(a)
        if act == np.float16 and a.dtype == np.float16:
            return cp.ascontiguousarray(a).view(cp.uint16)
        a = a.get()
    elif is_torch(a):
        import torch
        want = torch.bfloat16 if act.name == "bfloat16" else torch.float16
        if a.is_cuda:
            t = a.detach().to(want).contiguous().view(torch.int16)
            return cp.from_dlpack(t).view(cp.uint16)
    return cp.asarray(np.ascontiguousarray(_host(a).astype(act)).view(np.uint16))


def _device_int8(cp, a, name: str):
    if is_torch(a):
        a = cp.from_dlpack(a.detach().contiguous()) if a.is_cuda else _host(a)
    arr = cp.ascontiguousarray(cp.asarray(a))
    if arr.dtype != np.int8:
        raise TypeError(f"{name}: dtype {arr.dtype}, expected int8 (int4 values)")
    return arr


def _grid(total: int) -> tuple[int]:
    return (max(1, min(-(-total // PACK_THREADS), 65535 * 8)),)


def pack_moe_weights(spec: Spec, w13: QuantizedWeight, w2: QuantizedWeight,
                     stream=None) -> PackedMoeWeights:
    """Both weights packed on the current GPU (on `stream`, default the current one); the device
    arrays it returns are ready once that stream reaches them."""
    cp = get_cupy()
    act = numpy_dtype("bf16" if spec.dtype == "bfloat16" else "f16")
    kernels = _pack_module(spec.dtype == "bfloat16", cp.cuda.Device().id)
    g = spec.quant.group_size
    out = {}
    with stream or cp.cuda.get_current_stream():
        for which, qw in (("w13", w13), ("w2", w2)):
            _check_weight(spec, which, qw)
            e, k, n = weight_shapes(spec)[which]
            ntiles = padded_columns(n) // 64
            cols = _columns(spec, which)
            cols = np.arange(n) if cols is None else cols
            columns = cp.asarray(np.concatenate([cols, np.full(ntiles * 64 - n, -1)])
                                 .astype(np.int32))
            rows = _rows(spec, which, qw)
            rows_d = None if rows is None else cp.asarray(rows)
            q = _device_int8(cp, qw.q, f"{which}.q")
            words = cp.empty((e, k // 16, ntiles, 32, 4), cp.uint32)
            total = e * (k // 16) * ntiles * 32
            kernels["pack_weight_words"](
                _grid(total), (PACK_THREADS,),
                (q, rows_d if rows_d is not None else NULL, columns, np.int32(e),
                 np.int32(k), np.int32(n), np.int32(ntiles), words))
            out[which], out[f"{which}_rows"] = words, rows_d
            group_rows = e * (k // g)
            for field, kernel, src in (("scales", "pack_scales", qw.scales),
                                       ("zeros", "pack_zeros", qw.zeros)):
                if src is None:
                    out[f"{which}_{field}"] = None
                    continue
                src_d = (_device_bits(cp, src, act) if field == "scales" else
                         _device_int8(cp, src, f"{which}.zeros"))
                dst = cp.empty((e, k // g, ntiles, 8, 8), cp.uint16)
                kernels[kernel](_grid(group_rows * ntiles * 64), (PACK_THREADS,),
                                (src_d, columns, np.int64(group_rows), np.int32(n),
                                 np.int32(ntiles), dst))
                out[f"{which}_{field}"] = dst
    return PackedMoeWeights(**out, dtype=spec.dtype)
