"""The bare read `moegen bench` times beside the kernels: its chunk table (CPU), its kernel's
build (nvcc) and, on a GPU (-m gpu), that it reads every word of its regions exactly once."""
import re
import shutil

import numpy as np
import pytest

from conftest import ROOT
from moegen.targets.cuda import bare_read as B

SOURCE = ROOT / "templates" / "cuda" / "bare_read.cu"


def words_of(regions):
    """Every 16-byte word address the chunk table of `regions` covers, in its order."""
    starts, lengths = B.chunk_table(regions)
    assert all(0 < n <= B.CHUNK_BYTES and n % 16 == 0 for n in lengths)
    return [s + i for s, n in zip(starts, lengths) for i in range(0, n, 16)]


def test_chunks_cover_each_region_word_once_in_order(rng):
    regions, want = [], []
    base = 1 << 30
    for _ in range(6):
        nbytes = int(rng.integers(0, 5 * B.CHUNK_BYTES))
        regions.append((base, nbytes))
        want += range(base, base + nbytes - nbytes % 16, 16)   # the last bytes % 16 unread
        base += (nbytes + 1024) & ~255
    assert words_of(regions) == want


def test_a_misaligned_region_is_refused_by_its_number():
    with pytest.raises(ValueError, match=r"region 1 \(address 0x1008, 64 bytes\).*16-byte"):
        B.chunk_table([(0x1000, 64), (0x1008, 64)])


def test_expert_regions_are_the_experts_parts_of_each_array():
    class Fake:                       # a device array: its address and size are what counts
        def __init__(self, ptr, nbytes):
            self.data = type("Ptr", (), {"ptr": ptr})()
            self.nbytes = nbytes
    a, b = Fake(1 << 20, 8 * 4096), Fake(1 << 24, 8 * 256)
    assert B.expert_regions((a, b), [1, 6], 8) == [
        ((1 << 20) + 4096, 4096), ((1 << 24) + 256, 256),
        ((1 << 20) + 6 * 4096, 4096), ((1 << 24) + 6 * 256, 256)]


def test_the_host_constants_are_the_kernels():
    text = SOURCE.read_text()
    defined = dict(re.findall(r"#define MOEGEN_READ_(\w+) (\d+)", text))
    assert int(defined["THREADS"]) == B.THREADS and int(defined["LOADS"]) == B.LOADS
    assert B.CHUNK_BYTES == B.THREADS * B.LOADS * 16


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kernel_builds_warning_free_without_spills(tmp_path, arch):
    from test_generated import assert_no_spills, nvcc_build
    assert_no_spills(nvcc_build(SOURCE, tmp_path, arch))


@pytest.mark.gpu
def test_every_word_is_read_once_also_in_a_graph(rng):
    """Regions of odd sizes (tails short of a word left out), thousands of chunks: the XOR of
    what the CTAs read is the XOR of every word of the regions, on a plain call and on a graph
    replay after new data, with the output poisoned before each."""
    cp = pytest.importorskip("cupy")
    sizes = [int(rng.integers(1, 40 << 20)) for _ in range(3)] + [100 << 20, 15, 48]
    arrays = [cp.asarray(rng.integers(0, 256, n, dtype=np.uint8)) for n in sizes]
    reader = B.BareRead([B.array_region(a) for a in arrays])
    assert reader.chunks > 3000

    def want():
        out = 0
        for a in arrays:
            host = cp.asnumpy(a)
            out ^= int(np.bitwise_xor.reduce(host[:host.size - host.size % 16].view(np.uint32)))
        return out

    def poison():
        reader.xor_out[...] = cp.asarray(rng.integers(0, 2**32, reader.chunks, dtype=np.uint32))

    poison()
    reader()
    assert reader.checksum() == want()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        reader()
        graph = stream.end_capture()
        for a in arrays:
            a[...] = cp.asarray(rng.integers(0, 256, a.size, dtype=np.uint8))
        poison()
        graph.launch(stream)
        stream.synchronize()
    assert reader.checksum() == want()
