"""The GPUs a CUDA plan is made for: one frozen `GpuTarget` per architecture.

The tile pass sizes its CTAs, K splits and copy rings from these numbers (SMs to fill, shared
memory a CTA may declare or opt in to, registers an SM holds), so a plan for an A100 or an L4
uses that GPU's own limits rather than the H200's. A runtime plans for the GPU it runs on: the
table's entry for its architecture with the SM count the device reports (`from_device`).

Figures are the vendors' published limits (CUDA C Programming Guide, "Compute Capabilities",
the architecture whitepapers, and for CTA and barrier slots the CUDA toolkit's occupancy
calculator, cuda_occupancy.h). `sms` is the table's reference part for the architecture;
the others are the architecture's own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

KB = 1024


@dataclass(frozen=True)
class GpuTarget:
    arch: str                 # sm_XX as nvcc/NVRTC take it (sm_90a: Hopper's wgmma and setmaxnreg)
    name: str                 # the reference part the SM count is of
    sms: int                  # streaming multiprocessors
    shared_per_sm: int        # bytes of shared memory an SM can give its CTAs
    shared_per_cta: int       # bytes a CTA may opt in to (its static and dynamic together)
    static_shared: int = 48 * KB       # bytes a CTA may declare without opting in
    cta_reserved_shared: int = 1 * KB  # bytes each resident CTA takes besides its own
    registers_per_sm: int = 65536      # 32-bit registers
    threads_per_sm: int = 2048
    resident_ctas: int = 32            # CTAs an SM holds at most
    barriers_per_cta_slot: int = 2     # CTA barriers (__syncthreads, named) an SM holds a slot
    wgmma: bool = False       # warpgroup MMA (wgmma.mma_async): sm_90a only
    tma: bool = False         # the tensor memory accelerator (cp.async.bulk.tensor)
    pdl: bool = False         # programmatic dependent launch (griddepcontrol): sm_90 and later

    def ctas_by_shared(self, cta_bytes: int) -> int:
        """CTAs of `cta_bytes` shared memory (static and dynamic) an SM holds by its shared
        memory alone: each takes its bytes and the SM's reserve, in units of 128 bytes; 0 where
        one CTA may not have that much."""
        if cta_bytes > self.shared_per_cta:
            return 0
        return self.shared_per_sm // (-(-(cta_bytes + self.cta_reserved_shared) // 128) * 128)

    def with_sms(self, sms: int) -> "GpuTarget":
        """The same architecture on a part with `sms` SMs (the device's own count)."""
        return replace(self, sms=sms)


KNOWN_TARGETS: dict[str, GpuTarget] = {t.arch: t for t in (
    GpuTarget("sm_80", "A100 SXM", 108, 164 * KB, 163 * KB),
    GpuTarget("sm_86", "A10", 72, 100 * KB, 99 * KB, threads_per_sm=1536, resident_ctas=16,
              barriers_per_cta_slot=1),
    GpuTarget("sm_87", "Jetson AGX Orin", 16, 164 * KB, 163 * KB, threads_per_sm=1536,
              resident_ctas=16, barriers_per_cta_slot=1),
    GpuTarget("sm_89", "L40S", 142, 100 * KB, 99 * KB, threads_per_sm=1536, resident_ctas=24,
              barriers_per_cta_slot=1),
    GpuTarget("sm_90", "H100 SXM / H200", 132, 228 * KB, 227 * KB, tma=True, pdl=True),
    GpuTarget("sm_90a", "H100 SXM / H200", 132, 228 * KB, 227 * KB, wgmma=True, tma=True,
              pdl=True),
    GpuTarget("sm_100a", "B200", 148, 228 * KB, 227 * KB, tma=True, pdl=True),
    GpuTarget("sm_120", "RTX PRO 6000 Blackwell", 188, 100 * KB, 99 * KB, threads_per_sm=1536,
              resident_ctas=24, barriers_per_cta_slot=1, tma=True, pdl=True),
)}
CUDA_ARCHS = tuple(KNOWN_TARGETS)


def gpu_target(arch: str) -> GpuTarget:
    """The table's target of `arch`; an error naming the archs it knows."""
    try:
        return KNOWN_TARGETS[arch]
    except KeyError:
        raise ValueError(f"arch {arch!r}: not a known CUDA target (one of "
                         f"{', '.join(CUDA_ARCHS)})") from None


def from_device(arch: str, sms: int) -> GpuTarget:
    """The target of the GPU a runtime runs on: its architecture's entry, its own SM count."""
    return gpu_target(arch).with_sms(sms)
