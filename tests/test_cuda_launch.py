"""The driver structures of programmatic dependent launch (moegen/targets/cuda/launch.py),
checked without a GPU: their layout is cuda.h's, and kernel arguments convert as the kernels
take them."""
import ctypes

import numpy as np
import pytest

from moegen.targets.cuda import launch


def test_structures_have_the_layout_of_cuda_h():
    # CUlaunchAttribute: a 4-byte id, 4 bytes of padding, a 64-byte value union
    assert ctypes.sizeof(launch.LaunchAttribute) == 72
    assert launch.LaunchAttribute.value.offset == 8
    # CUlaunchConfig: 7 unsigned ints, then (8-aligned) the stream, the attribute pointer, the count
    assert launch.LaunchConfig.stream.offset == 32
    assert launch.LaunchConfig.attrs.offset == 40
    assert launch.LaunchConfig.num_attrs.offset == 48
    assert ctypes.sizeof(launch.LaunchConfig) == 56


class _Pointer:
    ptr = 0x7f0000001000


class _DeviceArray:
    data = _Pointer()


def test_kernel_arguments_convert_by_type():
    assert launch.kernel_argument(_DeviceArray()).value == _Pointer.ptr
    arg = launch.kernel_argument(np.int32(-7))
    assert isinstance(arg, ctypes.c_int32) and arg.value == -7
    arg = launch.kernel_argument(np.float32(0.5))
    assert isinstance(arg, ctypes.c_float) and arg.value == 0.5
    arg = launch.kernel_argument(launch.NULL)        # an optional array left out
    assert isinstance(arg, ctypes.c_void_p) and not arg.value
    for bad in (7, 0.5, np.int64(7), np.uint64(3), "x"):
        with pytest.raises(TypeError, match="is not a device array, NULL, np.int32 or "
                                            "np.float32"):
            launch.kernel_argument(bad)


def test_no_pdl_before_sm_90():
    assert not launch.supported("sm_80")
    assert not launch.supported("sm_86")
