import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture
def rng(request):
    """A fresh random generator per test (seeded from the OS: new data every run).

    The seed is printed on failure so a failing case can be replayed with MOEGEN_SEED.
    """
    seed = int(os.environ.get("MOEGEN_SEED", np.random.SeedSequence().entropy % 2**32))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def run_moegen(*args, cwd=None, check=False, env=None):
    """`python -m moegen ARGS`; `env`: variables set over this process's."""
    proc = subprocess.run([sys.executable, "-m", "moegen", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True,
                          env={**os.environ, **env} if env else None)
    if check and proc.returncode:
        raise AssertionError(proc.stderr)
    return proc
