"""The Python sources pass ruff with the project's configuration (pyproject.toml: 100 columns,
pycodestyle errors and warnings, pyflakes); the C++ is as clang-format leaves it under
templates/.clang-format: the plain files (the device header and its include tree, the bench's
bare read) as written, and what `moegen compile` emits from the Jinja templates (generated/: every
example's CUDA source and the Ascend op project; tests/test_generated.py and test_ascend.py hold
generated/ to what compile writes now)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moegen.targets import cpp_format
from conftest import ROOT


def ruff_command() -> list[str] | None:
    if shutil.which("ruff"):
        return ["ruff"]
    try:
        import ruff  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "ruff"]


def test_ruff_is_clean():
    cmd = ruff_command()
    if cmd is None:
        pytest.skip("ruff not installed (pip install -e '.[dev]')")
    proc = subprocess.run([*cmd, "check", "--output-format", "concise", "moegen", "tests",
                           "examples"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def assert_clang_formatted(files: list[Path]) -> None:
    exe = cpp_format.executable()
    if exe is None:
        pytest.skip("clang-format not installed (pip install -e .)")
    assert files
    proc = subprocess.run([exe, f"--style=file:{cpp_format.style_file()}", "--dry-run", "--Werror",
                           *map(str, files)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_device_headers_are_clang_formatted():
    cuda = ROOT / "templates" / "cuda"
    assert_clang_formatted([cuda / "moegen_w4a16.cuh", cuda / "bare_read.cu",
                            *sorted((cuda / "moegen").glob("*.cuh"))])


def test_emitted_cpp_is_clang_formatted():
    assert_clang_formatted(sorted(p for p in (ROOT / "generated").rglob("*")
                                  if p.suffix in cpp_format.CPP_SUFFIXES))


def test_emitting_formats_only_cpp(tmp_path):
    """format_sources reflows the C++ files it is given and leaves the others as they are."""
    if cpp_format.executable() is None:
        pytest.skip("clang-format not installed (pip install -e .)")
    messy = "int   f( int a ,int b ){return a+b;}\n"
    out = cpp_format.format_sources({"k.cu": messy, "sub/k.h": messy, "plan.json": messy})
    assert out["k.cu"] == out["sub/k.h"] == "int f(int a, int b) { return a + b; }\n"
    assert out["plan.json"] == messy


def test_without_clang_format_the_sources_come_back_as_rendered(monkeypatch):
    monkeypatch.setattr(cpp_format, "executable", lambda: None)
    messy = {"k.cu": "int   f( ){return 1;}\n"}
    with pytest.warns(RuntimeWarning, match="clang-format is not installed"):
        assert cpp_format.format_sources(messy) == messy
