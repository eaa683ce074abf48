"""The scratch memory of the MoE layers: one buffer per (device, stream), shared by every layer.

A layer call fills the scratch it reads (routing, the GEMMs' rows, split-K partial sums), so the
layers of a model, called one after another on a stream, can share one buffer: a 48-layer model
holds one workspace, not 48. Calls on different streams may overlap, so each stream gets its own.

A layer reserves its launch plan's `workspace.bytes` when it is built. A stream's first call
allocates that stream's buffer, and its first call after a larger layer was built replaces it
by one of the new size (the old one kept alive, since a CUDA graph captured earlier may still
point into it): an allocation once per stream and growth, never per call. For PyTorch callers
the buffer comes from PyTorch's allocator, so that a first call inside a CUDA graph capture (as
torch.cuda.graph and torch.compile's CUDA graphs make) takes it from the graph's memory pool,
which is allowed there, where a plain device allocation is not.
"""
from __future__ import annotations

_NEED: dict[int, int] = {}                 # device -> the largest workspace a layer reserved
_BUFFERS: dict[tuple[int, int], object] = {}   # (device, stream) -> uint8 device array
_RETIRED: list = []                         # outgrown buffers a captured graph may still use
_HELD: dict = {}                            # the PyTorch tensors behind PyTorch-made buffers


def reserve(cp, nbytes: int) -> None:
    """A layer of `nbytes` of workspace exists on the current device: its streams' buffers
    grow to that at their next call."""
    device = cp.cuda.Device().id
    _NEED[device] = max(_NEED.get(device, 0), nbytes)


def scratch(cp, stream, torch_caller: bool = False) -> object:
    """The current device's workspace for `stream` (allocated on its first use, by PyTorch for
    a PyTorch caller)."""
    device = cp.cuda.Device().id
    key = (device, int(stream.ptr))
    buf = _BUFFERS.get(key)
    nbytes = max(_NEED.get(device, 0), 1)
    if buf is not None and buf.nbytes < nbytes:
        _RETIRED.append((buf, _HELD.pop(key, None)))
        buf = None
    if buf is None:
        if torch_caller:
            import torch
            held = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
            buf = cp.from_dlpack(held)
            _HELD[key] = held
        else:
            buf = cp.empty(nbytes, dtype=cp.uint8)
        _BUFFERS[key] = buf
    return buf


def reserved_bytes(device: int) -> int:
    """The largest workspace a layer built on `device` needs: each stream's buffer's size."""
    return _NEED.get(device, 0)


def held_bytes() -> int:
    """Bytes of workspace held now, over all devices and streams (outgrown buffers included)."""
    return sum(int(b.nbytes) for b in (*_BUFFERS.values(), *(r[0] for r in _RETIRED)))
