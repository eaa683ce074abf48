"""generated/ is up to date, and every generated CUDA source compiles cleanly for sm_80 and
sm_90 with no register spills."""
import json
import re
import shutil
import subprocess

import pytest

import moegen
from moegen.targets.compile import emit
from conftest import ROOT

GENERATED = ROOT / "generated"
CUDA_EXAMPLES = ["moe-seed", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "msd-seed"]


@pytest.mark.parametrize("name", CUDA_EXAMPLES)
def test_generated_is_up_to_date(name):
    spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
    files = emit(spec, "cuda")
    folder = GENERATED / "cuda" / name
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert on_disk == set(files), "generated/ holds other files than moegen compile writes"
    for rel, text in files.items():
        assert (folder / rel).read_text() == text, (
            f"generated/cuda/{name}/{rel} is stale: regenerate (see generated/README.md)")


def test_output_is_reproducible():
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    assert emit(spec, "cuda") == emit(spec, "cuda")


def test_launch_plan():
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    plan = json.loads((GENERATED / "cuda" / "mixtral-8x7b" / "mixtral-8x7b.launch.json").read_text())
    source = (GENERATED / "cuda" / "mixtral-8x7b" / "mixtral-8x7b.cu").read_text()
    assert plan["spec_hash"] == spec.hash and plan["passes"].startswith("fuse-align")
    for k in plan["kernels"]:
        assert re.search(r'extern "C" __global__ void[^;{]{0,80}?\b' + k["name"] + r"\(", source), \
            k["name"]
    ws = plan["workspace"]
    spans = sorted((b["offset"], b["offset"] + b["bytes"]) for b in ws["buffers"].values())
    assert spans[-1][1] <= ws["arena_bytes"] <= ws["partials"]["offset"] < ws["counters"]["offset"]
    assert ws["counters"]["offset"] + 4 * ws["counters"]["ints"] <= ws["bytes"]
    assert plan["buckets"] == [[16, 8], [64, 16], [8192, 32]]
    # the down GEMM splits K at T = 1 (2 experts x 64 tiles < 132 SMs): it has a partials area
    assert ws["partials"]["bytes"] > 0 and ws["counters"]["ints"] > 0


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", CUDA_EXAMPLES)
def test_nvcc_compiles_without_spills(tmp_path, name, arch):
    folder = GENERATED / "cuda" / name
    cmd = [NVCC, "-cubin", f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", "-Werror",
           "all-warnings", str(folder / f"{name}.cu"), "-o", str(tmp_path / "k.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    log = proc.stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(a == "0" and b == "0" for a, b in spills), log
    stacks = re.findall(r"(\d+) bytes stack frame", log)
    assert all(s == "0" for s in stacks), log
    assert "warning" not in log.lower(), log


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nvcc_compiles_the_largest_expert_count(tmp_path):
    """E = 512 (the spec's limit): router registers, align's shared memory (< 48 KB static)."""
    spec = moegen.load_spec({"name": "e512", "pipeline": "moe_w4a16",
                             "moe": {"hidden_size": 1024, "intermediate_size": 256,
                                     "num_experts": 512, "top_k": 8},
                             "targets": {"cuda": {}}})
    src = tmp_path / "e512.cu"
    files = emit(spec, "cuda")
    src.write_text(files["e512.cu"])
    (tmp_path / "moegen_w4a16.cuh").write_text(files["moegen_w4a16.cuh"])
    cmd = [NVCC, "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", str(src), "-o",
           str(tmp_path / "k.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert all(a == "0" for a in re.findall(r"(\d+) bytes spill stores", proc.stderr))
    smem = [int(s) for s in re.findall(r"(\d+) bytes smem", proc.stderr)]
    assert smem and max(smem) <= 48 * 1024


MSD_VARIANTS = [  # (spec msd, group, lowering, pipeline): what generated/cuda/msd-seed does not hold
    ({"m": 64, "n": 1000, "k": 1024, "steps": 3}, 128, "msd", None),
    ({"m": 5, "n": 4096, "k": 4096, "steps": 2}, 64, "msd", None),
    ({"m": 16, "n": 11008, "k": 4096, "steps": 1}, 128, "msd", "tile{mma=s4,block-n=32},schedule,alloc"),
    ({"m": 1, "n": 12288, "k": 8192, "steps": 3}, 128, "dequant", None),
    ({"m": 64, "n": 1000, "k": 1024, "steps": 3}, 128, "dequant", None),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("msd,group,lowering,pipeline", MSD_VARIANTS,
                         ids=[f"{v[2]}-m{v[0]['m']}-g{v[1]}{'-' + v[3][5:13] if v[3] else ''}"
                              for v in MSD_VARIANTS])
def test_nvcc_compiles_msd_variants(tmp_path, arch, msd, group, lowering, pipeline):
    spec = moegen.load_spec({"name": "v", "pipeline": "msd_matmul", "msd": msd,
                             "quant": {"bits": 4, "group_size": group, "symmetric": True},
                             "lowering": lowering, "targets": {"cuda": {}}})
    files = emit(spec, "cuda", pipeline)
    (tmp_path / "v.cu").write_text(files["v.cu"])
    (tmp_path / "moegen_w4a16.cuh").write_text(files["moegen_w4a16.cuh"])
    cmd = [NVCC, "-cubin", f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", "-Werror",
           "all-warnings", str(tmp_path / "v.cu"), "-o", str(tmp_path / "k.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert spills and all(a == "0" and b == "0" for a, b in spills), proc.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_two_k16_steps_per_stage(tmp_path, arch):
    """tile{block-k=32} for the largest example: builds, no spills, rings within 48 KB."""
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    files = emit(spec, "cuda", "fuse-align,fuse-swiglu,tile{block-k=32},alloc")
    (tmp_path / "m.cu").write_text(files["mixtral-8x7b.cu"])
    (tmp_path / "moegen_w4a16.cuh").write_text(files["moegen_w4a16.cuh"])
    cmd = [NVCC, "-cubin", f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", "-Werror",
           "all-warnings", str(tmp_path / "m.cu"), "-o", str(tmp_path / "k.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert spills and all(a == "0" and b == "0" for a, b in spills), proc.stderr
    smem = [int(s) for s in re.findall(r"(\d+) bytes smem", proc.stderr)]
    assert smem and max(smem) <= 48 * 1024
