"""Where the textual pipelines (ir/) and the templates (templates/) are.

In a source checkout they sit at the top of the repository; in an installed wheel they are
package data under moegen/_data.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder `name` ('ir' or 'templates')."""
    for candidate in (_HERE / "_data" / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"moegen's '{name}' folder is missing from the installation "
                            f"(looked in {_HERE / '_data' / name} and {_HERE.parent / name})")


def pipeline_file(pipeline: str) -> Path:
    return data_dir("ir") / f"{pipeline}.mir"
