"""Lit-style IR tests: each tests/lit/*.mir holds `// RUN:` lines (a `moegen opt` of the file
piped into `filecheck`, the Python port of LLVM's FileCheck) and the CHECK lines they match
against the printed IR, then the input module. `%s` is the file itself."""
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

LIT = Path(__file__).parent / "lit"
CASES = sorted(LIT.glob("*.mir"))


def run_lines(path: Path) -> list[str]:
    return [line.split("RUN:", 1)[1].strip() for line in path.read_text().splitlines()
            if line.startswith("// RUN:")]


def command(line: str, path: Path) -> str:
    """A RUN line as a shell command: moegen and filecheck through this Python."""
    py = shlex.quote(sys.executable)
    stages = []
    for stage in line.replace("%s", shlex.quote(str(path))).split("|"):
        tool, _, rest = stage.strip().partition(" ")
        assert tool in ("moegen", "filecheck"), f"{path.name}: unknown tool {tool!r}"
        stages.append(f"{py} -m {tool} {rest}")
    return " | ".join(stages)


def test_every_lit_file_has_run_and_check_lines():
    assert CASES, "no tests/lit/*.mir"
    for path in CASES:
        text = path.read_text()
        assert run_lines(path) and "// CHECK" in text, path.name


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_lit(path):
    pytest.importorskip("filecheck")
    for line in run_lines(path):
        proc = subprocess.run(command(line, path), shell=True, capture_output=True, text=True,
                              cwd=LIT.parent.parent)
        assert proc.returncode == 0, f"{path.name}: {line}\n{proc.stdout}\n{proc.stderr}"
