"""The scratch memory of the MoE layers: one buffer per (device, stream), shared by every layer.

A layer call fills the scratch it reads (routing, the GEMMs' rows, split-K partial sums), so the
layers of a model, called one after another on a stream, can share one buffer: a 48-layer model
holds one workspace, not 48. Calls on different streams may overlap, so each stream gets its own.

A layer reserves its launch plan's `workspace.bytes` when it is built: buffers of that device
grow then (never inside a call), the old ones kept alive, since a CUDA graph captured earlier may
still point into them. A stream's first call allocates that stream's buffer; for PyTorch
callers through PyTorch's allocator, so that a first call inside a CUDA graph capture (as
torch.cuda.graph and torch.compile's CUDA graphs make) takes it from the graph's memory pool,
which is allowed there, where a plain device allocation is not.
"""
from __future__ import annotations

_NEED: dict[int, int] = {}                 # device -> the largest workspace a layer reserved
_BUFFERS: dict[tuple[int, int], object] = {}   # (device, stream) -> uint8 device array
_RETIRED: list = []                         # outgrown buffers a captured graph may still use
_HELD: dict = {}                            # the PyTorch tensors behind PyTorch-made buffers


def reserve(cp, nbytes: int) -> None:
    """A layer of `nbytes` of workspace exists on the current device: grow its buffers now."""
    device = cp.cuda.Device().id
    if nbytes <= _NEED.get(device, 0):
        return
    _NEED[device] = nbytes
    for key, buf in list(_BUFFERS.items()):
        if key[0] == device and buf.nbytes < nbytes:
            _RETIRED.append((buf, _HELD.pop(key, None)))
            _BUFFERS[key] = cp.empty(nbytes, dtype=cp.uint8)


def scratch(cp, stream, torch_caller: bool = False) -> object:
    """The current device's workspace for `stream` (allocated on its first use, by PyTorch for
    a PyTorch caller)."""
    device = cp.cuda.Device().id
    key = (device, int(stream.ptr))
    buf = _BUFFERS.get(key)
    if buf is None:
        nbytes = max(_NEED.get(device, 0), 1)
        if torch_caller:
            import torch
            held = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
            buf = cp.from_dlpack(held)
            _HELD[key] = held
        else:
            buf = cp.empty(nbytes, dtype=cp.uint8)
        _BUFFERS[key] = buf
    return buf


def held_bytes() -> int:
    """Bytes of workspace held now, over all devices and streams (outgrown buffers included)."""
    return sum(int(b.nbytes) for b in (*_BUFFERS.values(), *(r[0] for r in _RETIRED)))
