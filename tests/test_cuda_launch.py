"""Programmatic dependent launch: the driver structures, argument packing, and the kernels'
side of the contract (every MoE kernel waits for the previous one before it touches memory)."""
import ctypes
import re

import numpy as np
import pytest

import moegen
from moegen.targets.compile import emit
from moegen.targets.cuda import launch
from conftest import ROOT


def test_structures_match_cuda_h():
    # CUlaunchAttribute: id, pad to 8, a 64-byte union; CUlaunchConfig: 7 uints, the stream at
    # 32, the attribute pointer at 40, their count at 48 (64-bit)
    assert ctypes.sizeof(launch.LaunchAttribute) == 72
    assert launch.LaunchAttribute.value.offset == 8
    assert launch.LaunchConfig.shared_bytes.offset == 24
    assert launch.LaunchConfig.stream.offset == 32
    assert launch.LaunchConfig.attrs.offset == 40
    assert launch.LaunchConfig.num_attrs.offset == 48
    assert ctypes.sizeof(launch.LaunchConfig) == 56


def test_kernel_arguments():
    class Pointer:
        ptr = 0x7F00_1234_5670

    class DeviceArray:                  # what the packing reads of a CuPy array
        data = Pointer()

    assert launch.kernel_argument(DeviceArray()).value == Pointer.ptr
    i = launch.kernel_argument(np.int32(-7))
    assert isinstance(i, ctypes.c_int32) and i.value == -7
    f = launch.kernel_argument(np.float32(0.5))
    assert isinstance(f, ctypes.c_float) and f.value == 0.5
    for bad in (7, 0.5, np.int64(7), np.zeros(3, np.float16)):
        with pytest.raises(TypeError, match="kernel argument"):
            launch.kernel_argument(bad)


def test_only_sm90_and_later():
    assert not launch.supported("sm_80") and not launch.supported("sm_89")


@pytest.mark.parametrize("name", ["moe-seed", "qwen3-30b-a3b"])
@pytest.mark.parametrize("fuse", [True, False])
def test_every_moe_kernel_waits_for_the_previous_one_first(name, fuse):
    spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
    pipeline = None if fuse else "fuse-align,tile,alloc"
    files = emit(spec, "cuda", pipeline)
    source = files[f"{name}.cu"]
    bodies = re.findall(r'extern "C" __global__ void[^{]*\{\n([^\n]*)\n', source)
    names = re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s*(\w+)\(',
                       source)
    assert len(bodies) == len(names) >= 5, names
    for kernel, first in zip(names, bodies):
        assert first.strip() == "moegen::follow_previous_kernel();", kernel
    header = files["moegen_w4a16.cuh"]
    assert "griddepcontrol.wait" in header and "griddepcontrol.launch_dependents" in header
    # the wait comes before the release: a kernel lets the next one in only once its own
    # inputs are complete, so waiting on it transitively waits on every earlier kernel
    assert header.index("griddepcontrol.wait") < header.index("griddepcontrol.launch_dependents")


def test_launch_packs_config_attribute_and_arguments(monkeypatch):
    """What reaches cuLaunchKernelEx, read back through a stand-in for the driver entry."""
    seen = {}

    def entry(config, function, params, extra):
        c = config._obj
        seen.update(grid=(c.grid_x, c.grid_y, c.grid_z), block=(c.block_x, c.block_y, c.block_z),
                    stream=c.stream, shared=c.shared_bytes, n=c.num_attrs,
                    attr=(c.attrs[0].id, c.attrs[0].value[0]), function=function,
                    args=(ctypes.c_void_p.from_address(params[0]).value,
                          ctypes.c_int32.from_address(params[1]).value), extra=extra)
        return 0

    class Array:
        class data:
            ptr = 0xABC000

    class Kernel:
        __name__ = "k"

        class kernel:
            ptr = 0x1234

    class Stream:
        ptr = 0x5678

    monkeypatch.setattr(launch, "_driver_entry", lambda: entry)
    launch.launch_after_previous(Kernel(), (3, 2), 128, (Array(), np.int32(41)), Stream())
    assert seen == {"grid": (3, 2, 1), "block": (128, 1, 1), "stream": 0x5678, "shared": 0,
                    "n": 1, "attr": (launch.PROGRAMMATIC_STREAM_SERIALIZATION, 1),
                    "function": 0x1234, "args": (0xABC000, 41), "extra": None}
    monkeypatch.setattr(launch, "_driver_entry", lambda: lambda *a: 400)
    with pytest.raises(RuntimeError, match=r"cuLaunchKernelEx\(k\): CUDA error 400"):
        launch.launch_after_previous(Kernel(), (1,), 32, (), Stream())
