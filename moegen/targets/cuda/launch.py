"""Kernel launches with programmatic dependent launch (PDL, sm_90 and later).

A kernel launched with the attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may
start while the kernel before it in the stream is still running: its CTAs are scheduled once
every CTA of that kernel has executed `griddepcontrol.launch_dependents` (or exited), and they
see that kernel's writes only after `griddepcontrol.wait` (`moegen::release_dependents` and
`moegen::wait_for_previous_kernel` in templates/cuda/moegen/sync.cuh). The MoE layer launches
its down GEMM (the K-split CTA) this way: its CTAs fill the SMs that the gate/up GEMM's last
wave leaves free and stream their first weight stages, which do not depend on gate/up, before
they wait. Its gate/up GEMM (the K-split CTA) follows the align kernel so: resident while align
runs, it waits before it reads anything, and only then releases the down GEMM. Stream capture
records these launches as programmatic edges of the CUDA graph.

CuPy launches without attributes, so these go through the driver's `cuLaunchKernelEx` (ctypes;
the structures below follow cuda.h).
"""
from __future__ import annotations

import ctypes

import numpy as np

from ...target import gpu_target

PROGRAMMATIC_STREAM_SERIALIZATION = 6   # CUlaunchAttributeID

# The fewest tokens a call must have for its down GEMM to follow gate/up with PDL. Measured on
# the H200 (docs/DESIGN.md), with gate/up releasing it at its start: faster from T = 4 on the
# three example models (2-4% at T = 4..32), and at T = 1 and 3 (Qwen3 and DeepSeek T = 1 5%
# faster) and at T = 2, except on DeepSeek-V2-Lite (7% slower). A bucket whose largest call
# is below it compiles its down GEMM without the PDL prologue and is launched plainly. The
# single-token bucket (Mixtral's T = 1) differs in where gate/up releases the down GEMM: only
# after its K loop (measured: Mixtral T = 1 70.6 us against 72.4 plain and 77 with the release
# at the start).
PDL_MIN_TOKENS = 1

# The fewest tokens a call must have for its gate/up GEMM (the K-split CTA) to follow the align
# kernel with PDL: its CTAs are resident while align runs and wait for it before reading
# anything. Measured on the H200 (docs/DESIGN.md), against the same kernels launched plainly:
# 0.5-2% faster at T = 2..40 on the three example models; at T = 1 6% slower on
# DeepSeek-V2-Lite and even on Qwen3, but 1.5% faster in Mixtral's single-token bucket, which
# follows from T = 1.
GATE_UP_PDL_MIN_TOKENS = 2


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_launch_kernel_ex = None


def _driver_entry():
    """cuLaunchKernelEx from the driver library, loaded once; None where there is none."""
    global _launch_kernel_ex
    if _launch_kernel_ex is None:
        try:
            fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        except (OSError, AttributeError):
            _launch_kernel_ex = False
        else:
            fn.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
            fn.restype = ctypes.c_int
            _launch_kernel_ex = fn
    return _launch_kernel_ex or None


def arch_has_pdl(arch: str) -> bool:
    """Whether GPUs of `arch` launch with PDL (sm_90 and later: moegen.target)."""
    return gpu_target(arch).pdl


def supported(arch: str) -> bool:
    """Whether this process can launch with PDL for `arch` (sm_90 or later, a driver with
    cuLaunchKernelEx)."""
    return arch_has_pdl(arch) and _driver_entry() is not None


NULL = np.uint64(0)   # a null pointer argument (an optional array left out), for either launch


def kernel_argument(value):
    """One kernel argument as the ctypes value cuLaunchKernelEx copies: device arrays as their
    pointer, NULL as a null pointer, numpy int32 / float32 scalars as themselves."""
    data = getattr(value, "data", None)
    if hasattr(data, "ptr"):                       # a CuPy array: its device pointer
        return ctypes.c_void_p(data.ptr)
    if isinstance(value, np.uint64) and value == 0:
        return ctypes.c_void_p(0)
    if isinstance(value, np.int32):
        return ctypes.c_int32(int(value))
    if isinstance(value, np.float32):
        return ctypes.c_float(float(value))
    raise TypeError(f"kernel argument: {type(value).__name__} {value!r} is not a device array, "
                    f"NULL, np.int32 or np.float32")


def launch_after_previous(kernel, grid: tuple, block: int, args: tuple, stream,
                          shared_bytes: int = 0) -> None:
    """Launch a CuPy RawKernel on `stream` with PDL: it may be scheduled before the previous
    kernel in the stream has finished (its code waits for that kernel before it reads what
    that kernel writes; see the module docstring)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    values = [kernel_argument(a) for a in args]
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1                              # programmaticStreamSerializationAllowed
    config = LaunchConfig(grid[0], grid[1], grid[2], block, 1, 1, shared_bytes, stream.ptr,
                          ctypes.pointer(attr), 1)
    function = getattr(kernel, "kernel", kernel)   # a RawKernel's driver function
    status = _driver_entry()(ctypes.byref(config), function.ptr, params, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx({getattr(kernel, 'name', 'kernel')}): CUDA error "
                           f"{status}")
