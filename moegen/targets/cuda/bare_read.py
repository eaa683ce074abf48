"""A bare read of the bytes a kernel call must read, for `moegen bench` to time beside it.

The memory floor (bytes over copy bandwidth) leaves out what the bench's harness itself costs a
kernel: a graph launch, the ramp of a grid, the write-back of the dirty lines the L2 flush
leaves. A kernel that streams the same bytes and does nothing with them
(templates/cuda/bare_read.cu), timed the same way, pays all of that: about the least time any
kernel reading those bytes can take under this harness.
"""
from __future__ import annotations

import functools

import numpy as np

from ...resources import data_dir
from .device import get_cupy

THREADS, LOADS = 512, 4              # as bare_read.cu's MOEGEN_READ_THREADS and _LOADS
CHUNK_BYTES = THREADS * LOADS * 16   # the bytes one CTA reads


@functools.cache
def _kernel():
    """The compiled kernel, once a process (NVRTC picks the current GPU's arch)."""
    source = (data_dir("templates") / "cuda" / "bare_read.cu").read_text()
    return get_cupy().RawModule(code=source, options=("--std=c++17",)).get_function(
        "moegen_bare_read")


def chunk_table(regions) -> tuple[list[int], list[int]]:
    """(starts, lengths) of the chunks of `regions` [(address, bytes)], in order, each at most
    CHUNK_BYTES. The kernel reads 16-byte words: a region must start on one, and its last
    bytes % 16 (less than a word) are left unread."""
    starts, lengths = [], []
    for n, (start, nbytes) in enumerate(regions):
        if start % 16 or nbytes < 0:
            raise ValueError(f"region {n} (address {start:#x}, {nbytes} bytes): a bare read "
                             f"needs a start on a 16-byte boundary and a length >= 0")
        words = nbytes - nbytes % 16
        for at in range(0, words, CHUNK_BYTES):
            starts.append(start + at)
            lengths.append(min(CHUNK_BYTES, words - at))
    return starts, lengths


def array_region(a) -> tuple[int, int]:
    """(address, bytes) of a whole device array."""
    return a.data.ptr, a.nbytes


def expert_regions(arrays, experts, num_experts: int) -> list[tuple[int, int]]:
    """(address, bytes) of the given experts' parts of arrays whose first axis is the expert."""
    out = []
    for e in experts:
        for a in arrays:
            per = a.nbytes // num_experts
            out.append((a.data.ptr + int(e) * per, per))
    return out


class BareRead:
    """reader() streams `regions` once on the current stream (graph-capturable: its table lives
    on the device); reader.checksum() is the XOR of every 32-bit word read, after a call."""

    def __init__(self, regions):
        cp = get_cupy()
        self.kernel = _kernel()
        starts, lengths = chunk_table(regions)
        if not starts:
            raise ValueError("a bare read of nothing: the regions hold no whole 16-byte word")
        self.starts = cp.asarray(starts, dtype=cp.uint64)
        self.lengths = cp.asarray(lengths, dtype=cp.int32)
        self.chunks = len(starts)                  # a CTA each
        self.xor_out = cp.empty(self.chunks, dtype=cp.uint32)

    def __call__(self):
        self.kernel((self.chunks,), (THREADS,), (self.starts, self.lengths, self.xor_out))

    def checksum(self) -> int:
        return int(np.bitwise_xor.reduce(self.xor_out.get()))
