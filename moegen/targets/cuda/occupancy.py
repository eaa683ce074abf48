"""CTAs of a compiled kernel an SM holds at once, by the rules of CUDA's occupancy calculator
(cuda_occupancy.h) for compute capability 8.0 and later, from a GpuTarget's limits.

- registers: a warp's registers (threads' registers x 32) are allocated in units of 256, in
  each of the SM's 4 sub-partitions: warps an SM = 4 x (its registers / 4 / a warp's);
- shared memory: the CTA's static and dynamic bytes and the KB the SM reserves a CTA, in units
  of 128 bytes, out of what the SM gives its CTAs;
- warp slots: the SM's threads, in whole warps; CTA slots; CTA barriers (`__syncthreads` and
  named barriers), `barriers_per_cta_slot` of them a CTA slot.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...passes.tiling.cta import align_up
from ...target import GpuTarget

REGISTER_UNIT = 256        # registers allocated to a warp at a time
SUB_PARTITIONS = 4         # an SM's register file is split among its 4 schedulers
MAX_THREAD_REGISTERS = 255


@dataclass(frozen=True)
class KernelUse:
    """What one CTA of a kernel takes: ptxas's figures and the launch's."""
    threads: int
    registers: int            # a thread's
    static_shared: int        # bytes
    dynamic_shared: int = 0   # bytes, given at launch
    barriers: int = 0

    @property
    def shared(self) -> int:
        return self.static_shared + self.dynamic_shared


def ctas_per_sm(gpu: GpuTarget, use: KernelUse) -> tuple[int, str]:
    """How many CTAs of the kernel an SM of `gpu` holds, and the limit that sets it (0: the CTA
    does not fit one SM)."""
    warps = -(-use.threads // 32)
    limits = {
        "registers": _register_limit(gpu, use.registers, warps),
        "shared memory": gpu.ctas_by_shared(use.shared),
        "warp slots": gpu.threads_per_sm // 32 // warps,
        "CTA slots": gpu.resident_ctas,
    }
    if use.barriers:
        limits["barriers"] = gpu.resident_ctas * gpu.barriers_per_cta_slot // use.barriers
    bound = min(limits, key=lambda k: limits[k])   # the first of equal limits, in this order
    return limits[bound], bound


def _register_limit(gpu: GpuTarget, registers: int, warps: int) -> int:
    warp_registers = align_up(registers * 32, REGISTER_UNIT)
    # the launch check counts the CTA's warps in whole rounds of the sub-partitions
    if (registers > MAX_THREAD_REGISTERS
            or warp_registers * align_up(warps, SUB_PARTITIONS) > gpu.registers_per_sm):
        return 0
    if not warp_registers:
        return gpu.resident_ctas
    per_partition = gpu.registers_per_sm // SUB_PARTITIONS // warp_registers
    return SUB_PARTITIONS * per_partition // warps
