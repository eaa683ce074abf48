"""What a plan's kernels take, as nvcc compiles them (`moegen inspect SPEC --resources`): a
thread's registers, spills, a CTA's shared memory and barriers (ptxas's statistics), and the
CTAs an SM holds at those figures (occupancy.py), beside the CTAs an SM the plan counts on
(planned_ctas)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...target import gpu_target
from .emitter import CudaProgram
from .occupancy import KernelUse, ctas_per_sm
from .plan_table import table_rows


class NvccError(RuntimeError):
    """nvcc is missing or failed; the message names the command (and the kept source)."""


@dataclass(frozen=True)
class PtxasStats:
    registers: int
    barriers: int
    static_shared: int
    stack: int
    spill_stores: int
    spill_loads: int


_FUNCTION = re.compile(
    r"Function properties for (\w+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
    r"(\d+) bytes spill loads\n[^\n]*?Used (\d+) registers(.*)")


def ptxas_stats(log: str) -> dict[str, PtxasStats]:
    """Kernel name -> its statistics, from the log of `nvcc -Xptxas -v`."""
    out = {}
    for name, stack, stores, loads, regs, rest in _FUNCTION.findall(log):
        barriers = re.search(r"used (\d+) barriers", rest)
        smem = re.search(r"(\d+) bytes smem", rest)
        out[name] = PtxasStats(int(regs), int(barriers.group(1)) if barriers else 0,
                               int(smem.group(1)) if smem else 0, int(stack), int(stores),
                               int(loads))
    return out


def nvcc_path() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise NvccError("nvcc (the CUDA toolkit, 12.8 or later) is not on PATH")
    return nvcc


def compile_stats(program: CudaProgram, stem: str, arch: str) -> tuple[dict, str]:
    """Compile the program's source for `arch` with nvcc; its kernels' statistics and nvcc's
    release. A failed compile keeps the source and names it and the command."""
    nvcc = nvcc_path()
    folder = Path(tempfile.mkdtemp(prefix="moegen-ptxas-"))
    for name, text in program.files(stem).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    cmd = [nvcc, "-cubin", f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", f"-I{folder}",
           str(folder / f"{stem}.cu"), "-o", str(folder / f"{stem}.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise NvccError(f"nvcc failed on {folder / f'{stem}.cu'}: {' '.join(cmd)}\n"
                        f"{proc.stderr}")
    shutil.rmtree(folder)
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release ([\d.]+)", version)
    return ptxas_stats(proc.stderr), release.group(1) if release else "?"


def planned_ctas(plan: dict) -> dict[str, int]:
    """Kernel name -> the CTAs an SM the plan counts on it holding (absent: none): a capped
    wide CTA's resident_ctas (its split sized for them), the tall tile's one, the MSD tile's
    occupancy."""
    if "gemms" in plan:
        out = {}
        for gemm in plan["gemms"]:
            for v in gemm["variants"]:
                ctas = v["resident_ctas"] or (1 if v["tall"] else 0)
                for name in (v["kernel"], v.get("route_kernel")):
                    if name and ctas:
                        out[name] = ctas
        return out
    occupancy = plan.get("tile", {}).get("occupancy", 0)
    return {k["name"]: occupancy for k in plan["kernels"] if occupancy}


def kernel_uses(plan: dict, stats: dict[str, PtxasStats]) -> dict[str, KernelUse]:
    """Kernel name -> what a CTA of it takes: its launch's threads and dynamic shared memory
    (the plan's), ptxas's registers, static shared memory and barriers."""
    uses = {}
    for k in plan["kernels"]:
        s = stats[k["name"]]
        uses[k["name"]] = KernelUse(k["block"], s.registers, s.static_shared,
                                    k.get("shared_bytes", 0), s.barriers)
    return uses


def resources_table(program: CudaProgram, stem: str, arch: str) -> str:
    gpu = gpu_target(arch)
    stats, release = compile_stats(program, stem, arch)
    planned = planned_ctas(program.plan)
    head = ["kernel", "threads", "registers", "spills B", "stack B", "shared B", "barriers",
            "CTAs an SM", "bound by", "planned"]
    rows = []
    for name, use in kernel_uses(program.plan, stats).items():
        s = stats[name]
        ctas, bound = ctas_per_sm(gpu, use)
        shared = (f"{use.static_shared} + {use.dynamic_shared}" if use.dynamic_shared
                  else str(use.static_shared))
        spills = f"{s.spill_stores} / {s.spill_loads}" if s.spill_stores or s.spill_loads else "0"
        rows.append([name, str(use.threads), str(s.registers), spills, str(s.stack), shared,
                     str(s.barriers), str(ctas), bound,
                     str(planned[name]) if name in planned else "-"])
    lines = [f"{stem}: its kernels for {arch} as nvcc {release} compiles them (ptxas -v)",
             f"CTAs an SM: what an SM of {gpu.name} holds at those figures "
             f"({gpu.registers_per_sm} registers, {gpu.shared_per_sm // 1024} KB shared memory, "
             f"{gpu.threads_per_sm} threads, {gpu.resident_ctas} CTAs)",
             "planned: the CTAs an SM the plan counts on it holding (its grid sized for them)", ""]
    return "\n".join(lines + table_rows(head, rows))
