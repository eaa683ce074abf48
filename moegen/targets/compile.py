"""`moegen compile`: lower a spec for a target and write what the target emits.

Every output is a pure function of the spec and moegen's version (no timestamps), so the
committed generated/ folder can be checked for staleness; the C++ is written in the house style
(cpp_format.py).
"""
from __future__ import annotations

from pathlib import Path

from ..ir import Module
from ..passes.manager import PipelineError
from ..passes.pipelines import default_pipeline, lower
from ..spec import Spec
from .cpp_format import format_sources


def _ir_dumps(spec: Spec, target: str, pipeline: str | None,
              tuning=None) -> tuple[Module, str, dict]:
    """The lowered module, its pipeline string, and the IR after each pass (file -> text)."""
    dumps: dict[str, str] = {}
    step = [0]

    def keep(name: str, module: Module) -> None:
        step[0] += 1
        dumps[f"ir/{step[0]:02d}-{name.split('{')[0]}.mir"] = f"// after {name}\n{module}"

    module, ctx, pm = lower(spec, target, pipeline, tuning=tuning, print_after_all=True,
                            on_print=keep)
    from ..build import build
    dumps["ir/00-input.mir"] = f"// {spec.name}: input\n{build(spec)}"
    return module, pm.pipeline, dict(sorted(dumps.items()))


def emit(spec: Spec, target: str, pipeline: str | None = None, tuning=None) -> dict[str, str]:
    """relative path -> file text of everything `moegen compile` writes."""
    if pipeline is None:
        pipeline = default_pipeline(spec.pipeline, target)
    module, text, dumps = _ir_dumps(spec, target, pipeline, tuning)
    if target == "cuda" and spec.pipeline == "moe_w4a16":
        from .cuda.emitter import emit_moe
        files = emit_moe(spec, module, text).files(spec.name)
    elif target == "cuda" and spec.pipeline == "msd_matmul":
        from .cuda.msd_emitter import emit_msd
        files = emit_msd(spec, module, text).files(spec.name)
    elif target == "ascend" and spec.pipeline == "msd_matmul":
        from .ascend.emitter import emit_msd_project
        files = emit_msd_project(spec, module, text)
    else:
        raise PipelineError(f"target {target} does not emit pipeline {spec.pipeline} yet")
    return {**format_sources(files), **dumps}


def compile_spec(spec: Spec, target: str, out_dir: str | Path,
                 pipeline: str | None = None, tuning=None,
                 headers_dir: str | Path | None = None) -> list[Path]:
    """Write everything `emit` makes into out_dir; CUDA: the device headers into `headers_dir`
    instead where given (several specs' sources sharing one copy, compiled with -I there)."""
    out = Path(out_dir)
    headers = set()
    if target == "cuda" and headers_dir is not None:
        from .cuda.emitter import device_headers
        headers = set(device_headers())
    written = []
    for rel, text in emit(spec, target, pipeline, tuning).items():
        path = (Path(headers_dir) if rel in headers else out) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written
