"""The house style of emitted C++. A template's line holds names and numbers the spec chooses,
so no template can know where its lines must break; `moegen compile` therefore writes every
.cu/.cuh/.cpp/.h file as clang-format (a pinned dependency) leaves it under the project's style,
templates/.clang-format. Formatting moves whitespace and comments only: what compiles is the
same."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path

from ..resources import data_dir

CPP_SUFFIXES = (".cu", ".cuh", ".cpp", ".h")


def style_file() -> Path:
    return data_dir("templates") / ".clang-format"


@lru_cache(maxsize=1)
def executable() -> str | None:
    """The pinned clang-format package's binary (other versions break lines otherwise), else one
    on PATH or beside this Python; None if there is none."""
    candidates = []
    try:
        import clang_format
        candidates.append(clang_format.get_executable("clang-format"))
    except (ImportError, AttributeError):
        pass
    candidates += [shutil.which("clang-format"), Path(sys.executable).parent / "clang-format",
                   Path(sysconfig.get_path("scripts")) / "clang-format"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def format_sources(files: dict[str, str]) -> dict[str, str]:
    """`files` (relative path -> text) with each C++ file's text formatted; the others as given.
    Without clang-format the files come back as rendered, with a warning saying so."""
    cpp = [rel for rel in files if rel.endswith(CPP_SUFFIXES)]
    exe = executable()
    if not cpp:
        return dict(files)
    if exe is None:
        warnings.warn("clang-format is not installed: the C++ is written as the templates render "
                      "it, not in the house style (pip install clang-format==23.1.5)",
                      RuntimeWarning, stacklevel=2)
        return dict(files)
    out = dict(files)
    with tempfile.TemporaryDirectory(prefix="moegen-format-") as tmp:
        # one process for all: each file under its own numbered folder keeps its name (and so
        # the language clang-format reads from the suffix)
        paths = []
        for i, rel in enumerate(cpp):
            path = Path(tmp) / str(i) / Path(rel).name
            path.parent.mkdir()
            path.write_text(files[rel])
            paths.append(path)
        proc = subprocess.run([exe, f"--style=file:{style_file()}", "-i", *map(str, paths)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"clang-format failed on the emitted sources: {proc.stderr}")
        for rel, path in zip(cpp, paths):
            out[rel] = path.read_text()
    return out
