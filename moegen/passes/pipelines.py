"""The default pass pipeline of each (pipeline, target), in one place."""
from __future__ import annotations

from ..build import build
from ..ir import Module
from ..spec import Spec
from ..target import GpuTarget
from .manager import Context, PassManager, PipelineError

DEFAULT_PIPELINES: dict[tuple[str, str], list[str]] = {
    ("moe_w4a16", "cuda"): [
        "fuse-align",   # count, pad_scan, slot_lists, marlin_indices -> one moe.align (one launch)
        "fuse-swiglu",  # SwiGLU in the gate/up GEMM's epilogue (leave out: separate kernel)
        "tile",         # moe block per token bucket; GEMM tile: k a stage, warps, stages, split
        "alloc",        # liveness and offsets of every intermediate in one workspace arena
    ],
    ("msd_matmul", "cuda"): [
        "tile",         # columns per CTA, warps
        "schedule",     # basic | preload action lists; rotating-buffer slots derived
        "alloc",        # workspace arena (rotating buffers take their slots)
    ],
    ("msd_matmul", "ascend"): [
        "tile",         # TCubeTiling numbers: singleCoreM/N/K, baseM/N/K, depths, tail
        "schedule",     # basic | preload action lists, flags 0..10, slots derived
        "alloc",        # workspace arena: A_max, unfolded A, int32 Y with their slots
    ],
}


def default_pipeline(pipeline: str, target: str) -> str:
    try:
        return ",".join(DEFAULT_PIPELINES[(pipeline, target)])
    except KeyError:
        served = sorted(p for p, t in DEFAULT_PIPELINES if t == target)
        raise PipelineError(f"target {target} serves pipeline(s) {', '.join(served)}, "
                            f"not {pipeline}") from None


def require_passes(spec_pipeline: str, target: str, text: str, missing: list[str]) -> None:
    """An emitter's check that the pass pipeline `text` ran the passes whose results it reads:
    `missing` names those whose results the module lacks."""
    if missing:
        raise PipelineError(
            f"pass pipeline '{text}' leaves out {' and '.join(missing)}: the {target} target "
            f"emits {spec_pipeline} from {'their' if len(missing) > 1 else 'its'} results (the "
            f"default pipeline: '{default_pipeline(spec_pipeline, target)}')")


def default_target(spec: Spec) -> str:
    return "cuda" if spec.targets.cuda is not None else "ascend"


def lower(spec: Spec, target: str | None = None, pipeline: str | None = None, tuning=None,
          arch: str | None = None, gpu: GpuTarget | None = None,
          **manager_options) -> tuple[Module, Context, PassManager]:
    """Build the spec's module and run a pipeline (the target's default unless given); `arch`:
    the CUDA architecture to plan for, where not the spec's (a runtime plans for its GPU's);
    `gpu`: that GPU's numbers, where not the arch's table entry (a runtime's SM count)."""
    target = target or default_target(spec)
    text = default_pipeline(spec.pipeline, target) if pipeline is None else pipeline
    pm = PassManager(text, **manager_options)
    ctx = Context(spec=spec, target=target, tuning=tuning,
                  arch=arch or (gpu.arch if gpu else spec.cuda_arch if target == "cuda"
                                else None), gpu=gpu)
    module = pm.run(build(spec), ctx)
    return module, ctx, pm
