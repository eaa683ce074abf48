"""The emitted Ascend op project against the REAL AscendC headers (tests/ascend_headers.py says
where they come from): every kernel translation unit compiles for both cores of an Atlas A2 with
both tiling keys instantiated, op_host compiles in host mode, and the host tiling fills the
library's TCubeTiling field by field as moegen's tiling says."""
import re
import subprocess

import pytest

import moegen
from ascend_headers import GPP, compile_host, compile_kernel, find_kit, tcube_tiling_fields
from moegen.passes.ascend_tiling import msd_tiling
from moegen.targets.ascend.emulator.api import TCUBE_TILING_FIELDS
from moegen.targets.compile import emit

KIT, WHY = find_kit()
pytestmark = [pytest.mark.skipif(GPP is None, reason="g++ not installed"),
              pytest.mark.skipif(KIT is None, reason=WHY)]


def spec(m, n, k, schedule="preload", steps=3, group=128):
    return moegen.load_spec({
        "name": f"mm-{m}-{n}", "pipeline": "msd_matmul",
        "msd": {"m": m, "n": n, "k": k, "steps": steps}, "schedule": schedule,
        "quant": {"bits": 4, "group_size": group, "symmetric": True},
        "targets": {"ascend": {"soc": "ascend910b", "aic_cores": 24, "aiv_cores": 48}}})


def write(tmp_path, files):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return next(p for p in files if p.startswith("op_kernel/") and p.count("/") == 1
                and p.endswith(".cpp"))[len("op_kernel/"):-len(".cpp")]


@pytest.mark.parametrize("core", ["vec", "cube"])
@pytest.mark.parametrize("shape", [(1, 12288, 8192, "preload", 3, 128),
                                   (5, 4160, 1024, "basic", 2, 64)])
def test_kernel_compiles_for_both_cores_and_tiling_keys(tmp_path, core, shape):
    m, n, k, schedule, steps, group = shape
    op = write(tmp_path, emit(spec(m, n, k, schedule, steps, group), "ascend"))
    result = compile_kernel(KIT, tmp_path, op, core)
    assert not result.errors, result.report()
    assert not result.warnings, result.report()


def test_op_host_compiles_in_host_mode(tmp_path):
    write(tmp_path, emit(spec(1, 12288, 8192), "ascend"))
    sources = sorted((tmp_path / "op_host").glob("*.cpp"))
    assert [p.name for p in sources] == ["mm_1_12288_def.cpp", "mm_1_12288_infershape.cpp",
                                         "mm_1_12288_tiling.cpp"]
    for source in sources:
        result = compile_host(KIT, tmp_path, source)
        assert not result.errors and not result.warnings, result.report()


def test_the_check_fails_on_what_the_real_api_lacks(tmp_path):
    """The finding that started it: `AscendC::CubeFormat` does not exist (CubeFormat is global),
    and an API the headers do not have is an error; the shim declares no AscendC API."""
    files = emit(spec(1, 4096, 1024), "ascend")
    cube = "op_kernel/msd/mm_1_4096_cube_compute.h"
    files[cube] = files[cube].replace("CubeFormat::NZ", "AscendC::CubeFormat::NZ")
    vec = "op_kernel/msd/mm_1_4096_vec_compute.h"
    files[vec] = files[vec].replace("AscendC::ReduceMax(", "AscendC::ReduceMaxOfAll(")
    op = write(tmp_path, files)
    cube_errors = compile_kernel(KIT, tmp_path, op, "cube").errors
    assert any("CubeFormat" in e for e in cube_errors), cube_errors
    vec_errors = compile_kernel(KIT, tmp_path, op, "vec").errors
    assert any("ReduceMaxOfAll" in e for e in vec_errors), vec_errors


def test_tcube_tiling_fields_are_the_headers():
    """The emulator's TCubeTiling and the tiling dict's keys are the real struct's fields."""
    real = tcube_tiling_fields(KIT)
    assert list(TCUBE_TILING_FIELDS) == real and "dbL0C" in real
    assert set(msd_tiling(1, 12288, 8192, 128, 3, 24)["matmulTiling"]) <= set(real)


SHAPES = [(1, 12288, 8192, 128, 3), (5, 4160, 1024, 128, 3), (16, 4096, 8192, 128, 2),
          (3, 100032, 256, 64, 1), (16, 98304, 1024, 64, 3), (2, 64, 128, 128, 3)]


def test_host_tiling_fills_every_field_by_name(tmp_path):
    """The emitted ComputeMsdTiling, compiled against the real kernel_tiling.h and run: every one
    of TCubeTiling's fields and the MSD fields, by name, equal msd_tiling's (a field it does
    not set is 0) at several shapes and group sizes; shapes it refuses, it refuses too."""
    files = emit(spec(1, 12288, 8192), "ascend")
    write(tmp_path, files)
    fields = tcube_tiling_fields(KIT)
    others = re.findall(r"^  uint32_t (\w+);", files["op_kernel/mm_1_12288_tiling_data.h"], re.M)
    prints = "".join(f'  std::printf("matmulTiling.{f} %d\\n", t.matmulTiling.{f});\n'
                     for f in fields)
    prints += "".join(f'  std::printf("{f} %u\\n", t.{f});\n' for f in others)
    refused = [(17, 4096, 1024, 128, 3), (1, 100, 1024, 128, 3), (1, 131136, 256, 128, 1)]
    calls = "".join(f"  Run({m}, {n}, {k}, {g}, {s});\n" for m, n, k, g, s in SHAPES + refused)
    driver = tmp_path / "driver.cpp"
    driver.write_text(f'''#include <cstdio>
#include "op_host/mm_1_12288_tiling.h"
static void Run(uint32_t m, uint32_t n, uint32_t k, uint32_t group, uint32_t steps) {{
  Mm112288TilingData t;
  const char* error = mm_1_12288_tiling::ComputeMsdTiling(m, n, k, group, steps, 24,
                                                          {184 * 1024}, {512 * 1024 - 1024}, &t);
  if (error != nullptr) {{
    std::printf("refused %s\\n", error);
    return;
  }}
{prints}  std::printf("end\\n");
}}
int main() {{
{calls}}}
''')
    exe = tmp_path / "driver"
    subprocess.run([GPP, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", str(tmp_path),
                    "-isystem", str(KIT.kernel_tiling.parent.parent), str(driver), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    blocks = out.split("end\n")
    for (m, n, k, g, s), block in zip(SHAPES, blocks):
        got = dict(line.rsplit(" ", 1) for line in block.strip().splitlines())
        want = msd_tiling(m, n, k, g, s, 24)
        expected = {f"matmulTiling.{f}": want["matmulTiling"].get(f, 0) for f in fields}
        expected.update({f: want[f] for f in others})
        assert {key: int(v) for key, v in got.items()} == expected, (m, n, k, g, s)
    tail = blocks[len(SHAPES)].strip().splitlines()
    assert len(tail) == len(refused) and all(line.startswith("refused ") for line in tail), tail
    for shape in refused:
        with pytest.raises(moegen.SpecError):
            msd_tiling(*shape, 24)
