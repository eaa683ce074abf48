"""The CTAs an SM holds of a compiled kernel (moegen/targets/cuda/occupancy.py), ptxas's statistics
as `inspect --resources` reads them, and (GPU) the occupancy the driver reports for every kernel of
a compiled layer."""
import ctypes

import pytest

from moegen.target import gpu_target
from moegen.targets.cuda.occupancy import KernelUse, ctas_per_sm
from moegen.targets.cuda.ptxas_report import PtxasStats, kernel_uses, planned_ctas, ptxas_stats

H200 = gpu_target("sm_90a")     # 64 K registers, 228 KB shared memory, 2048 threads, 32 CTAs
A10 = gpu_target("sm_86")       # 100 KB shared memory, 1536 threads, 16 CTAs


@pytest.mark.parametrize("gpu, use, ctas, bound", [
    # 128 registers x 128 threads: 16 K registers a CTA, 4 of the SM's 64 K
    (H200, KernelUse(128, 128, 0), 4, "registers"),
    # 33 registers: 1056 a warp, allocated as 1280; 16 K / 1280 = 12 warps a sub-partition
    (H200, KernelUse(128, 33, 0), 12, "registers"),
    # 100 KB of shared memory and the KB reserved: 2 of 228 KB, 0 of A10's 100 KB SM
    (H200, KernelUse(128, 32, 100 * 1024), 2, "shared memory"),
    (A10, KernelUse(128, 32, 99 * 1024 + 1), 0, "shared memory"),
    # static and dynamic add up, with the reserve, in 128-byte units: 3 x (32 K + 1 K + 128)
    (A10, KernelUse(128, 32, 16 * 1024, 16 * 1024 + 1), 3, "shared memory"),
    (A10, KernelUse(128, 32, 16 * 1024, 16 * 1024 + 2 * 1024), 2, "shared memory"),
    # 1024 threads: 2 CTAs of H200's 64 warp slots, 1 of A10's 48
    (H200, KernelUse(1024, 16, 0), 2, "warp slots"),
    (A10, KernelUse(1024, 16, 0), 1, "warp slots"),
    # one warp, few registers: the CTA slots
    (H200, KernelUse(32, 16, 0), 32, "CTA slots"),
    (A10, KernelUse(32, 16, 0), 16, "CTA slots"),
    # 3 barriers a CTA, 2 a CTA slot: 64 // 3
    (H200, KernelUse(32, 16, 0, barriers=3), 21, "barriers"),
    # 1024 threads x 128 registers is twice the register file: it does not launch
    (H200, KernelUse(1024, 128, 0), 0, "registers"),
    # more than a thread may have
    (H200, KernelUse(32, 256, 0), 0, "registers"),
])
def test_ctas_per_sm_takes_the_tightest_limit(gpu, use, ctas, bound):
    assert ctas_per_sm(gpu, use) == (ctas, bound)


PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'moe_gemm_down_b32_c4_r32_p4_k32_s4or8_wg_o4' for 'sm_86'
ptxas info    : Function properties for moe_gemm_down_b32_c4_r32_p4_k32_s4or8_wg_o4
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 8 bytes cumulative stack size, \
28676 bytes smem, 488 bytes cmem[0]
ptxas info    : Compile time = 120.5 ms
ptxas info    : Compiling entry function 'moe_router_topk' for 'sm_86'
ptxas info    : Function properties for moe_router_topk
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 20 registers, used 0 barriers, 384 bytes cmem[0]
"""


def test_ptxas_stats_reads_each_kernel():
    stats = ptxas_stats(PTXAS_LOG)
    assert stats == {
        "moe_gemm_down_b32_c4_r32_p4_k32_s4or8_wg_o4": PtxasStats(168, 1, 28676, 8, 8, 12),
        "moe_router_topk": PtxasStats(20, 0, 0, 0, 0, 0)}
    plan = {"kernels": [{"name": "moe_router_topk", "block": 128},
                        {"name": "moe_gemm_down_b32_c4_r32_p4_k32_s4or8_wg_o4", "block": 128,
                         "shared_bytes": 0}]}
    uses = kernel_uses(plan, stats)
    assert uses["moe_router_topk"] == KernelUse(128, 20, 0, 0, 0)
    assert ctas_per_sm(A10, uses["moe_gemm_down_b32_c4_r32_p4_k32_s4or8_wg_o4"]) == (
        3, "registers")


def test_planned_ctas_names_what_each_plan_counts_on():
    moe = {"gemms": [{"variants": [
        {"kernel": "a", "resident_ctas": 3, "tall": False, "route_kernel": "a_routed"},
        {"kernel": "b", "resident_ctas": 0, "tall": True},
        {"kernel": "c", "resident_ctas": 0, "tall": False}]}]}
    assert planned_ctas(moe) == {"a": 3, "a_routed": 3, "b": 1}
    msd = {"tile": {"occupancy": 6}, "kernels": [{"name": "m_basic"}, {"name": "m_preload"}]}
    assert planned_ctas(msd) == {"m_basic": 6, "m_preload": 6}
    assert planned_ctas({"tile": {"occupancy": 0}, "kernels": [{"name": "m"}]}) == {}


class CompiledKernel:
    """What resident_grid reads of a CuPy RawKernel: its registers and static shared memory."""

    def __init__(self, registers: int, static_shared: int):
        self.num_regs = registers
        self.shared_size_bytes = static_shared


def test_resident_grid_spreads_the_first_items():
    """A persistent kernel's grid (the one-launch layer): two CTAs an SM where they hold the
    first (gate/up) items, else every CTA the SMs hold; at most one an item."""
    from moegen.targets.cuda.runtime import resident_grid
    gpu = H200.with_sms(132)
    # 128 registers x 128 threads: 4 an SM by registers (40 KB of shared memory would allow 5)
    kernel = CompiledKernel(128, 40 * 1024)
    assert resident_grid(gpu, kernel, 128, 1000, 192) == 2 * 132    # Qwen3's gate/up items
    assert resident_grid(gpu, kernel, 128, 1000, 264) == 2 * 132
    assert resident_grid(gpu, kernel, 128, 1000, 265) == 4 * 132    # then all the SMs hold
    assert resident_grid(gpu, CompiledKernel(128, 120 * 1024), 128, 1000, 192) == 132
    assert resident_grid(gpu, CompiledKernel(64, 0), 128, 100, 60) == 100
    assert resident_grid(gpu.with_sms(78), kernel, 128, 1000, 192) == 4 * 78


@pytest.mark.gpu
def test_ctas_per_sm_matches_the_driver_for_every_kernel_of_a_layer():
    """Every kernel of Qwen3-30B-A3B's and Mixtral's layers, as NVRTC built them here: the CTAs an
    SM occupancy.py works out from their registers and shared memory are the driver's."""
    import moegen
    from moegen.targets.cuda.device import device_gpu
    driver = ctypes.CDLL("libcuda.so.1")
    query = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor
    query.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int,
                      ctypes.c_size_t]
    gpu = device_gpu(None)
    checked = 0
    for example in ("qwen3-30b-a3b", "mixtral-8x7b"):
        layer = moegen.cuda.MoeW4A16(f"examples/{example}.yaml")
        for k in layer.plan["kernels"]:
            fn = layer.kernels[k["name"]]
            dynamic = k.get("shared_bytes", 0)
            held = ctypes.c_int(-1)
            function = getattr(fn, "kernel", fn)      # a RawKernel's driver function
            assert query(ctypes.byref(held), function.ptr, k["block"], dynamic) == 0
            # barriers: ptxas's count is not in the function's attributes; at one or two a CTA
            # they bind no kernel here
            use = KernelUse(k["block"], fn.num_regs, fn.shared_size_bytes, dynamic)
            assert ctas_per_sm(gpu, use)[0] == held.value, (example, k["name"], use)
            checked += 1
    assert checked >= 20
