"""The wheel carries everything: build it, install it into a fresh venv, use it from elsewhere."""
import shutil
import subprocess
import sys
import venv

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_wheel_in_fresh_venv(tmp_path):
    src = tmp_path / "src"
    # a copy of the tracked tree, so build artefacts never land in the checkout
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, src],
                   check=True)
    wheel, = dist.glob("moegen-*.whl")
    env_dir = tmp_path / "venv"
    # system site packages give numpy & co without a download; moegen itself must come from
    # the wheel (checked below), so a missing data file fails
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel],
                   check=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "qwen3-30b-a3b.yaml", work / "spec.yaml")
    where = subprocess.run([py, "-c", "import moegen; print(moegen.__file__)"], cwd=work,
                           capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in where, where
    proc = subprocess.run([env_dir / "bin" / "moegen", "inspect", "spec.yaml"], cwd=work,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert 'module @"qwen3-30b-a3b"' in proc.stdout
    # every template ships: both targets compile from the installed wheel
    shutil.copy(ROOT / "examples" / "msd-seed.yaml", work / "msd.yaml")
    for spec, target in (("spec.yaml", "cuda"), ("msd.yaml", "ascend")):
        proc = subprocess.run([env_dir / "bin" / "moegen", "compile", spec, "--target", target,
                               "-o", f"out-{target}"], cwd=work, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert (work / "out-cuda" / "moegen_w4a16.cuh").is_file()
    # the C++ in the house style: the style file ships (clang-format is a dependency)
    assert (work / "out-cuda" / "qwen3-30b-a3b.cu").read_text() == (
        ROOT / "generated" / "cuda" / "qwen3-30b-a3b" / "qwen3-30b-a3b.cu").read_text()
    assert (work / "out-cuda" / "moegen" / "gemm_ksplit.cuh").is_file()     # the include tree
    # the bench's bare-read kernel ships beside the templates
    shipped = subprocess.run([py, "-c", "from moegen.resources import data_dir; "
                              "print((data_dir('templates') / 'cuda' / 'bare_read.cu').is_file())"],
                             cwd=work, capture_output=True, text=True, check=True).stdout
    assert shipped.strip() == "True"
    assert (work / "out-ascend" / "op_kernel" / "msd" / "msd_seed_msd_controller.h").is_file()
    proc = subprocess.run([env_dir / "bin" / "moegen", "inspect", "msd.yaml", "--target",
                           "ascend", "--schedule", "--svg", "t.svg"], cwd=work,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and (work / "t.svg").read_text().startswith("<svg"), proc.stderr
