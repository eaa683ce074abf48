"""The GPU side of the CUDA runtime: CuPy (imported lazily), the device's architecture, and the
arrays a call is given (CuPy arrays or DLPack tensors such as PyTorch's, viewed without copies)
and the stream it runs on.

bf16 arrays: CuPy holds them as their 16-bit patterns (uint16). A PyTorch bf16 tensor is viewed
so, and a bf16 result given back to PyTorch is viewed as bf16 again; a CuPy caller passes and
gets uint16 arrays of bf16 bits (numpy: `.view(ml_dtypes.bfloat16)`).
"""
from __future__ import annotations

import numpy as np

from ...target import GpuTarget, from_device, gpu_target


class CudaUnavailable(RuntimeError):
    """No CuPy or no GPU: the message says which, in one line."""


def get_cupy():
    """The cupy module, where there is a usable GPU; else CudaUnavailable."""
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise CudaUnavailable("no CUDA GPU is visible")
        return cupy
    except ImportError:
        raise CudaUnavailable("CuPy is not installed (pip install 'moegen[cuda]', or the "
                              "cupy-cudaXXx wheel for your CUDA)") from None
    except Exception as exc:  # CUDA driver errors arrive as cupy exceptions
        if isinstance(exc, CudaUnavailable):
            raise
        raise CudaUnavailable(f"no usable CUDA GPU ({exc})") from None


def device_arch() -> str:
    """The current GPU's architecture, e.g. sm_80; sm_90a on Hopper (its arch-specific features,
    such as the warpgroup MMA the prefill GEMMs use)."""
    cc = get_cupy().cuda.Device().compute_capability
    return f"sm_{cc}a" if cc in ("90", "100") else f"sm_{cc}"


def device_gpu(arch: str | None = None) -> GpuTarget:
    """The GPU a runtime plans for: the current device (its arch's table entry with the SMs it
    has), or the table's entry of `arch` where one is given."""
    if arch is not None:
        return gpu_target(arch)
    sms = get_cupy().cuda.Device().attributes["MultiProcessorCount"]
    return from_device(device_arch(), sms)


def is_torch(value) -> bool:
    return type(value).__module__.startswith("torch")


def _check(arr, name: str, dtype, shape, shown=None):
    if arr.dtype != np.dtype(dtype):
        raise TypeError(f"{name}: dtype {shown or arr.dtype}, expected {np.dtype(dtype)}")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")
    return arr


def as_device(cp, value, name: str, dtype, shape: tuple | None = None):
    """A CuPy view of a CuPy array or DLPack tensor (no copy); checks dtype, shape, layout."""
    if isinstance(value, cp.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__"):
        if is_torch(value) and str(value.dtype) == "torch.bfloat16":
            raise TypeError(f"{name}: dtype bfloat16, expected {np.dtype(dtype)}")
        arr = cp.from_dlpack(value)
    else:
        raise TypeError(f"{name}: expected a CuPy array or a DLPack tensor on the GPU, got "
                        f"{type(value).__name__}")
    return _check(arr, name, dtype, shape)


def as_activation(cp, value, name: str, dtype: str, shape: tuple | None = None):
    """An activation-typed input (dtype "float16" or "bfloat16", the spec's): a CuPy view, fp16
    as float16, bf16 as its bits (uint16): a PyTorch bf16 tensor, or a CuPy uint16 array."""
    if dtype == "float16":
        return as_device(cp, value, name, np.float16, shape)
    if is_torch(value) and hasattr(value, "__dlpack__"):
        if str(value.dtype) != "torch.bfloat16":
            raise TypeError(f"{name}: dtype {str(value.dtype).removeprefix('torch.')}, "
                            f"expected bfloat16 (the spec's dtype)")
        import torch
        return _check(cp.from_dlpack(value.view(torch.int16)).view(cp.uint16), name, np.uint16,
                      shape)
    if isinstance(value, cp.ndarray) and value.dtype != np.uint16:
        raise TypeError(f"{name}: dtype {value.dtype}, expected bfloat16 (the spec's dtype; "
                        f"CuPy arrays hold it as uint16 bits)")
    return as_device(cp, value, name, np.uint16, shape)


def activation_storage(dtype: str):
    """The CuPy dtype activations of the spec's dtype are held in: float16, or uint16 bits."""
    return np.float16 if dtype == "float16" else np.uint16


def stream_for(cp, *values):
    """PyTorch's current stream for PyTorch inputs, else CuPy's current stream."""
    for v in values:
        if is_torch(v):
            import torch
            current = torch.cuda.current_stream()
            if hasattr(cp.cuda.Stream, "from_external"):
                return cp.cuda.Stream.from_external(current)
            return cp.cuda.ExternalStream(current.cuda_stream)
    return cp.cuda.get_current_stream()


def result_for(x, y, out, dtype: str = "float16"):
    """What a call returns: `out` when given, else the output view (as PyTorch for PyTorch x,
    bf16 viewed as bf16)."""
    if out is not None:
        return out
    if is_torch(x):
        import torch
        if dtype == "bfloat16":
            return torch.from_dlpack(y.view(np.int16)).view(torch.bfloat16)
        return torch.from_dlpack(y)
    return y


def to_activation(cp, a, dtype: str):
    """A CuPy float array -> activations of the spec's dtype as held on the device (fp16, or
    bf16 bits rounded to nearest even)."""
    if dtype == "float16":
        return a.astype(cp.float16)
    u = cp.ascontiguousarray(a, dtype=cp.float32).view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


def host_activation(a):
    """A numpy fp16 or bf16 (ml_dtypes) array as CuPy takes it: fp16, or bf16 bits."""
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a
