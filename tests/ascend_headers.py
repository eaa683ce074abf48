"""Compiling an emitted Ascend op project against the REAL AscendC headers with the host C++
compiler (g++ -fsyntax-only): the kernel for both cores of an Atlas A2 (dav-c220 vec and cube,
`__NPU_ARCH__` 2201) with both tiling keys instantiated, and op_host in host mode.

Headers come from, in order: $MOEGEN_ASCENDC_KIT (a kit laid out as ../shared/ascendc-kit:
asc-devkit/{include,impl}, inc/, hinc/, metadef/, ge/), $ASCEND_HOME_PATH (a CANN install:
its compiler/tikcpp/tikcfw tree and include/), or ../shared/ascendc-kit beside the checkout.
The device compiler's built-ins (address-space keywords, scalar types, pipe and event enums,
intrinsics) come from tests/ascendc_shim/, which declares nothing of the AscendC API.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "tests" / "ascendc_shim"
GPP = shutil.which("g++")
# errors the shim itself causes in the real headers under g++, not the generated code's: g++ has
# no address spaces, so asc_dump's overloads on them collapse into redefinitions
SHIM_ARTIFACTS = re.compile(r"asc_aicore_dump_impl\.h")


@dataclass(frozen=True)
class Kit:
    origin: str
    kernel: tuple[Path, ...]        # include directories, kernel side
    host: tuple[Path, ...]          # and host side

    @property
    def kernel_tiling(self) -> Path:
        return next(d / "kernel_tiling" / "kernel_tiling.h" for d in self.kernel
                    if (d / "kernel_tiling" / "kernel_tiling.h").exists())


def _kit_layout(root: Path, origin: str) -> Kit:
    a, m, ge = root / "asc-devkit", root / "metadef", root / "ge"
    return Kit(origin,
               kernel=(root / "inc", a, a / "include", a / "include" / "basic_api",
                       a / "include" / "utils", a / "impl", a / "impl" / "basic_api",
                       a / "include" / "adv_api"),
               host=(root / "hinc", root / "inc", a / "include" / "utils",
                     a / "include" / "adv_api", a / "include", m / "inc" / "external",
                     m / "inc" / "external" / "asc", m / "inc", m / "pkg_inc",
                     ge / "inc" / "graph_metadef" / "external", ge / "inc" / "graph_metadef"))


def _cann_layout(home: Path) -> Kit:
    tik = home / "compiler" / "tikcpp" / "tikcfw"
    return Kit(f"ASCEND_HOME_PATH={home}",
               kernel=(home / "include", tik, tik / "impl", tik / "interface",
                       tik / "lib", home / "include" / "ascendc"),
               host=(home / "include", home / "include" / "external", tik / "lib",
                     home / "include" / "ascendc"))


def find_kit() -> tuple[Kit | None, str]:
    """The headers to compile against, or None and why there are none."""
    env = os.environ.get("MOEGEN_ASCENDC_KIT")
    if env:
        root = Path(env)
        if not (root / "asc-devkit").is_dir():
            raise FileNotFoundError(f"MOEGEN_ASCENDC_KIT={env} has no asc-devkit/ folder")
        return _kit_layout(root, f"MOEGEN_ASCENDC_KIT={env}"), ""
    home = os.environ.get("ASCEND_HOME_PATH")
    if home:
        return _cann_layout(Path(home)), ""
    beside = ROOT.parent / "shared" / "ascendc-kit"
    if (beside / "asc-devkit").is_dir():
        return _kit_layout(beside, str(beside)), ""
    return None, ("no AscendC headers: set MOEGEN_ASCENDC_KIT (or ASCEND_HOME_PATH), or put the "
                  "kit at ../shared/ascendc-kit beside the checkout")


def _includes(dirs) -> list[str]:
    out = []
    for d in dirs:
        out += ["-isystem", str(d)]
    return out


@dataclass
class Result:
    command: list[str]
    errors: list[str]
    warnings: list[str]       # in the generated files only (the headers are system headers)

    def report(self) -> str:
        return f"$ {' '.join(self.command)}\n" + "\n".join(self.errors + self.warnings)


def _run(command: list[str], project: Path) -> Result:
    proc = subprocess.run(command, capture_output=True, text=True)
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if "error:" in line and not SHIM_ARTIFACTS.search(line)]
    warnings = [line for line in lines if "warning:" in line and str(project) in line]
    if proc.returncode and not errors and not any(SHIM_ARTIFACTS.search(x) for x in lines):
        errors = lines[-5:] or [f"exit status {proc.returncode}"]
    return Result(command, errors, warnings)


def compile_kernel(kit: Kit, project: Path, op: str, core: str, keys=("BASIC_MSD", "PRELOAD_MSD"),
                   arch: int = 2201) -> Result:
    """The kernel entry op_kernel/<op>.cpp for one core ("vec" or "cube"), with the kernel
    template explicitly instantiated for each tiling key."""
    unit = project / f"tu_{op}_{core}.cpp"
    unit.write_text(f'#include "{op}.cpp"\n' + "".join(
        f"template __global__ __aicore__ void {op}<{key}>(GM_ADDR, GM_ADDR, GM_ADDR, GM_ADDR, "
        "GM_ADDR, GM_ADDR);\n" for key in keys))
    side = "VEC" if core == "vec" else "CUBE"
    # -Wno-subobject-linkage: g++ warns that a class in a header holds a MatmulImpl, whose policy
    # types the library declares in an anonymous namespace; the device compiler (clang) has no
    # such warning, and the library's own samples hold one the same way
    command = [GPP, "-std=c++17", "-fsyntax-only", "-fmax-errors=0", "-Wall", "-Wextra",
               "-Wno-subobject-linkage",
               "-include", str(SHIM / "asc_shim.h"), f"-D__NPU_ARCH__={arch}", "-D__DAV_C220__",
               f"-D__DAV_C220_{side}__", f"-D__DAV_{side}__", "-DASCENDC_TPL_KERNEL",
               "-include", str(SHIM / "opc_kernel_shim.h"), *_includes(kit.kernel),
               "-I", str(project / "op_kernel"), str(unit)]
    return _run(command, project)


def compile_host(kit: Kit, project: Path, source: Path) -> Result:
    command = [GPP, "-std=c++17", "-fsyntax-only", "-fmax-errors=50", "-Wall", "-Wextra",
               *_includes(kit.host), str(source)]
    return _run(command, project)


def tcube_tiling_fields(kit: Kit) -> list[str]:
    """The field names of TCubeTiling in the kit's kernel_tiling.h, in order."""
    text = kit.kernel_tiling.read_text()
    body = re.search(r"struct TCubeTiling \{(.*?)\};", text, re.S).group(1)
    return re.findall(r"^\s*int32_t (\w+) = 0;", body, re.M)
