"""`moegen run SPEC --target ascend`: the spec's emitted op project, run in the emulator on the
data its own gen_data.py draws, both templates, judged by its own verify_result.py and against
moegen.reference."""
from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from ... import reference
from ...passes.ascend_tiling import msd_tiling, workspace_bytes
from ...schedule_model import MODES
from ...quant import pack_int4
from ...spec import Spec
from ..compile import emit
from .emulator import emulate


def _script(text: str, name: str) -> dict:
    namespace = {"__name__": name}
    exec(compile(text, f"<{name}>", "exec"), namespace)
    return namespace


def run_emulated(spec: Spec, seed: int | None = None, out: Callable = print) -> bool:
    """True when both templates pass the project's verify_result; prints a line each."""
    files = emit(spec, "ascend")
    gen = _script(files["examples/scripts/gen_data.py"], "gen_data")
    check = _script(files["examples/scripts/verify_result.py"], "verify_result")["check"]
    x, w, scale = gen["make_inputs"](gen["SAMPLE_SEED"] if seed is None else seed)
    golden = gen["golden"](x, w, scale)
    want = reference.msd_matmul(x, w, scale, spec.quant.group_size, spec.msd.steps)
    s, group = spec.msd, spec.quant.group_size
    tiling = msd_tiling(s.m, s.n, s.k, group, s.steps, spec.targets.ascend.aic_cores)
    slots = {mode: meta["slots"] for mode, meta in json.loads(next(
        t for p, t in files.items() if p.endswith("_schedule.json"))).items()}
    ok = True
    for mode, template in sorted(MODES.items(), key=lambda kv: kv[1]):
        y, _ = emulate(files, tiling, x, pack_int4(w), scale, template,
                       workspace_bytes(s.m, s.n, group, s.steps, slots[mode]), seed=seed)
        passed, why = check(y, golden)
        err = np.linalg.norm(y.astype(np.float64) - want) / np.linalg.norm(want)
        out(f"{mode:8s} M={s.m} N={s.n} K={s.k}: rel. error {err:.2e} against the reference; "
            f"verify_result: {'PASS' if passed else 'FAIL'} ({why})")
        ok = ok and passed
    return ok
