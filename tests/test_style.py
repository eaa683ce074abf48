"""The Python sources pass ruff with the project's configuration (pyproject.toml: 100 columns,
pycodestyle errors and warnings, pyflakes). The C++ the templates emit is held to 100 columns
by tests/test_generated.py and tests/test_ascend.py; .clang-format gives editors the house
style."""
import shutil
import subprocess
import sys

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
