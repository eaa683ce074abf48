"""The Python sources pass ruff with the project's configuration (pyproject.toml: 100 columns,
pycodestyle errors and warnings, pyflakes); the plain C++ files (the device header and its
include tree, the bench's bare read) are as clang-format leaves them under .clang-format. The
Jinja templates cannot be formatted so: the C++ they emit is held to 100 columns by
tests/test_generated.py and tests/test_ascend.py."""
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

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


def clang_format() -> str | None:
    for candidate in (shutil.which("clang-format"), Path(sys.executable).parent / "clang-format",
                      Path(sysconfig.get_path("scripts")) / "clang-format"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def test_device_headers_are_clang_formatted():
    exe = clang_format()
    if exe is None:
        pytest.skip("clang-format not installed (pip install -e '.[dev]')")
    cuda = ROOT / "templates" / "cuda"
    files = [cuda / "moegen_w4a16.cuh", cuda / "bare_read.cu", *sorted((cuda / "moegen").glob("*.cuh"))]
    proc = subprocess.run([exe, "--style=file", "--dry-run", "--Werror", *map(str, files)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
