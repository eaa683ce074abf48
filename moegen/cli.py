"""The `moegen` command."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from .version import __version__
from .ir import DimError, ParseError, VerifyError, parse
from .passes.manager import Context, PassManager, PipelineError
from .passes.pipelines import default_target, lower
from .schedule_model import ScheduleError
from .quant import QuantFormatError
from .spec import CUDA_ARCHS, SpecError, load_spec

# Errors that are the user's input, not moegen's bug: one line, exit 2.
USER_ERRORS = (SpecError, ParseError, VerifyError, DimError, QuantFormatError, PipelineError,
               ScheduleError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
               FileExistsError, PermissionError)


MOE_TOKENS = "1,16,64,256,2048"      # bench's and autotune's token counts by default


class UsageError(Exception):
    """A command that cannot run as asked (bad option value, no GPU, ...)."""


def _print_after(name: str, module) -> None:
    print(f"// ----- IR after {name} ----- //")
    print(module, end="")


def _manager_options(args) -> dict:
    return {"print_after": set(args.print_ir_after or []),
            "print_after_all": args.print_ir_after_all, "on_print": _print_after}


def cmd_inspect(args) -> int:
    spec = load_spec(args.spec)
    target = args.target or default_target(spec)
    if args.arch and target != "cuda":
        raise UsageError(f"--arch {args.arch}: a CUDA plan's; this inspects the {target} target")
    module, ctx, pm = lower(spec, target, args.pass_pipeline, tuning=_compile_tuning(args),
                            arch=args.arch, **_manager_options(args))
    printed = args.print_ir_after_all or args.print_ir_after
    if args.launches:
        print(_launch_report(spec, module, target, pm.pipeline, args.arch))
    if args.resources:
        print(_resources_report(spec, module, target, pm.pipeline, args.arch))
    if args.buffers:
        from .passes.alloc import plan_of
        plan = ctx.results.get("alloc") or plan_of(module, spec.tokens.max)
        print(plan.table())
    if args.schedule or args.svg:
        print(_schedule_report(spec, module, target, args.svg))
    if not (printed or args.launches or args.resources or args.buffers or args.schedule
            or args.svg):
        print(f"// pipeline: {pm.pipeline}")
        print(module, end="")
    if args.time_passes:
        print(pm.timing_report(), file=sys.stderr)
    return 0


def _cuda_program(spec, module, target: str, pipeline: str, arch: str | None, flag: str):
    if target != "cuda":
        raise UsageError(f"{flag}: the CUDA target's kernels; this inspects the {target} target")
    if spec.pipeline == "msd_matmul":
        from .targets.cuda.msd_emitter import emit_msd
        return emit_msd(spec, module, pipeline, arch)
    from .targets.cuda.emitter import emit_moe
    return emit_moe(spec, module, pipeline, arch)


def _launch_report(spec, module, target: str, pipeline: str, arch: str | None) -> str:
    from .targets.cuda import plan_table
    plan = _cuda_program(spec, module, target, pipeline, arch, "--launches").plan
    if spec.pipeline == "msd_matmul":
        return plan_table.msd_launch_table(plan)
    return plan_table.moe_launch_table(plan)


def _resources_report(spec, module, target: str, pipeline: str, arch: str | None) -> str:
    from .targets.cuda.ptxas_report import NvccError, resources_table
    program = _cuda_program(spec, module, target, pipeline, arch, "--resources")
    try:
        return resources_table(program, spec.name, program.plan["arch"])
    except NvccError as exc:
        raise UsageError(f"--resources: {exc}") from None


def _schedule_report(spec, module, target: str, svg_path: str | None) -> str:
    from .passes.schedule import derived_schedule
    from .sim.engine import Machine, simulate
    from .sim.timeline import Panel, ascii_gantt, svg, window
    if spec.pipeline != "msd_matmul":
        raise UsageError(f"--schedule: pipeline {spec.pipeline} has no K-loop schedule "
                         "(msd_matmul has)")
    loop = module.function().op("msd.group_loop")
    cores = spec.targets.ascend.aic_cores if spec.targets.ascend else 24
    shape = (spec.msd.m, spec.msd.n, spec.quant.group_size, spec.msd.steps)
    out, panels = [], []
    for mode in ("basic", "preload"):
        sched = derived_schedule(loop, mode)
        checked = simulate(sched, Machine(cores=2))            # hazards and deadlock
        if target == "ascend":
            timed = simulate(sched, Machine(cores=cores), shape=shape, check=False)
            panel = Panel(f"{mode}, {cores} cores of the cost model", timed, window(timed, 6))
        else:   # the cost model is an Ascend chip's: the CUDA view shows the order alone
            panel = Panel(f"{mode}, stage order (a step a stage)", checked, window(checked, 6))
        panels.append(panel)
        out += [sched.listing(), f"check on 2 cores, {sched.iterations} iterations: "
                f"{checked.report()}", ascii_gantt(panel, target), ""]
    if svg_path:
        how = "simulated (moegen.sim cost model)" if target == "ascend" else "stage order"
        Path(svg_path).write_text(svg(panels, target, f"{spec.name}: MSD K loop, {how}"))
        out.append(f"wrote {svg_path}")
    return "\n".join(out).rstrip()


def _gpu(fn, *a, **kw):
    from .targets.cuda.device import CudaUnavailable
    try:
        return fn(*a, **kw)
    except CudaUnavailable as exc:
        raise UsageError(f"needs an NVIDIA GPU: {exc}") from None


def _token_list(text: str, most: int | None = None, flag: str = "--tokens") -> list[int]:
    """Comma-separated positive counts, each at most `most` (a spec's tokens.max) where given."""
    try:
        tokens = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        tokens = []
    if not tokens or min(tokens) < 1:
        raise UsageError(f"{flag} {text!r}: expected positive integers separated by commas")
    if most is not None and max(tokens) > most:
        raise UsageError(f"{flag} {text!r}: {max(tokens)} is above the spec's tokens.max "
                         f"({most})")
    return tokens


def _sweep_tokens(spec, tokens: list[int]) -> list[int]:
    """autotune's `--tokens`, refused where the spec's layer serves none of them (autotune
    skips those above tokens.max with a line, as bench does)."""
    if min(tokens) > spec.tokens.max:
        raise UsageError(f"--tokens: {', '.join(map(str, tokens))} all above the spec's "
                         f"tokens.max ({spec.tokens.max})")
    return tokens


def _run_tuning(args):
    """`--tuning-db PATH`: that database (measured on this GPU); else the runtime's default."""
    if not args.tuning_db:
        return "auto"
    from .tuning import tuning_for
    path = Path(args.tuning_db)
    if not path.exists():
        raise UsageError(f"--tuning-db {args.tuning_db}: no such file")
    return tuning_for(path)


def _moe_tokens(spec, args, default: str | None = MOE_TOKENS, rows_option: bool = False):
    """--tokens of a command, or its default; an msd_matmul spec takes none (its rows are
    msd.m, or, `rows_option`, the command's --rows)."""
    if spec.pipeline == "msd_matmul" and args.tokens is not None:
        raise UsageError(f"--tokens {args.tokens!r}: token counts of a moe_w4a16 spec; an "
                         f"msd_matmul spec runs its msd.m rows ({spec.msd.m}"
                         f"{'; bench: --rows' if rows_option else ''})")
    return default if args.tokens is None else args.tokens


def cmd_run(args) -> int:
    spec = load_spec(args.spec)
    tuning = _run_tuning(args)
    tokens_text = _moe_tokens(spec, args, None)
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed {args.seed}: a random seed, 0 or more")
    if args.target == "ascend":
        if spec.pipeline != "msd_matmul" or spec.targets.ascend is None:
            raise UsageError(f"--target ascend: {spec.name} is not an msd_matmul spec with "
                             "targets.ascend (the Ascend target emits the MSD op)")
        if args.tuning_db:
            raise UsageError("--tuning-db: a CUDA tuning database; --target ascend runs the "
                             "emulator")
        from .targets.ascend.run import run_emulated
        return 0 if run_emulated(spec, args.seed) else 1
    if spec.pipeline == "msd_matmul":
        from .targets.cuda.bench import run_msd
        return 0 if _gpu(run_msd, spec, args.seed, tuning=tuning) <= 2e-3 else 1
    from .reference import MOE_REL_TOLERANCE
    from .targets.cuda.bench import run_moe
    ok = True
    tokens = (_token_list(tokens_text, spec.tokens.max) if tokens_text is not None
              else [min(16, spec.tokens.max)])
    for t in tokens:
        err = _gpu(run_moe, spec, t, args.seed, tuning=tuning)
        ok = ok and err <= MOE_REL_TOLERANCE[spec.dtype]
    return 0 if ok else 1


def cmd_bench(args) -> int:
    spec = load_spec(args.spec)
    tuning = _run_tuning(args)
    tokens_text = _moe_tokens(spec, args, rows_option=True)
    if args.reps < 1:
        raise UsageError(f"--reps {args.reps}: timed repetitions a point, at least 1")
    if spec.pipeline == "msd_matmul":
        from .targets.cuda.bench import bench_msd
        if args.pass_pipeline:
            raise UsageError("--pass-pipeline: an msd_matmul bench times its fixed variants "
                             "(basic, preload, s4, dequant); set tile options in a tuning "
                             "database instead")
        if args.experts is not None or args.dtype or args.versus is not None:
            flag = ("--experts" if args.experts is not None else "--dtype" if args.dtype
                    else "--versus")
            raise UsageError(f"{flag}: a moe_w4a16 bench option; this is an msd_matmul spec "
                             f"(fp16 activations only)")
        rows = (_token_list(args.rows, flag="--rows") if args.rows is not None
                else [spec.msd.m])
        _gpu(bench_msd, spec, args.json, args.reps, rows, tuning=tuning,
             baseline=not args.no_baseline)
        return 0
    from .targets.cuda.bench import bench_moe, check_experts
    if args.rows is not None:
        raise UsageError(f"--rows {args.rows!r}: the M values of an msd_matmul spec; a moe_w4a16 "
                         f"bench times token counts (--tokens)")
    try:
        check_experts(spec, args.experts)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
    if args.dtype and args.dtype != "both":
        spec = replace(spec, dtype=args.dtype)
    if args.pack_layers is not None:
        if args.pack_layers < 1 or args.dtype == "both" or args.versus is not None:
            raise UsageError(f"--pack-layers {args.pack_layers}: a layer count of at least 1, "
                             f"with one --dtype and no --versus")
        from .targets.cuda.bench import bench_pack
        _gpu(bench_pack, spec, args.pack_layers, args.json)
        return 0
    kw = dict(tuning=tuning, pipeline=args.pass_pipeline, experts=args.experts)
    if args.versus is not None:
        if args.dtype == "both":
            raise UsageError("--versus: times two pipelines with one --dtype (not both)")
        try:        # (a bad pipeline says so before any GPU is looked for)
            lower(spec, "cuda", args.versus)
        except PipelineError as exc:
            raise UsageError(f"--versus {args.versus!r}: {exc}") from None
        from .targets.cuda.bench import bench_versus
        _gpu(bench_versus, spec, _token_list(tokens_text), args.versus, args.json, args.reps,
             **kw)
        return 0
    if args.dtype == "both":
        from .targets.cuda.bench import bench_dtypes
        _gpu(bench_dtypes, spec, _token_list(tokens_text), args.json, args.reps, **kw)
        return 0
    _gpu(bench_moe, spec, _token_list(tokens_text), args.json, args.reps,
         not args.no_baseline, **kw)
    return 0


def _compile_tuning(args):
    """The tuning database of a command that plans without a GPU (compile, inspect): only when
    given (--tuning-db or $MOEGEN_TUNING_DB), its entry for the spec on any GPU."""
    if not (args.tuning_db or os.environ.get("MOEGEN_TUNING_DB")):
        return None
    if args.tuning_db and not Path(args.tuning_db).exists():
        raise UsageError(f"--tuning-db {args.tuning_db}: no such file")
    from .tuning import tuning_for
    return tuning_for(args.tuning_db, device=None)


def cmd_compile(args) -> int:
    from .targets.compile import compile_spec
    spec = load_spec(args.spec)
    target = args.target or default_target(spec)
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise UsageError(f"-o {args.output}: a file; compile writes a folder of files there")
    if args.headers and target != "cuda":
        raise UsageError(f"--headers {args.headers}: the CUDA target's device headers; this "
                         f"compile is for {target}")
    written = compile_spec(spec, target, args.output, args.pass_pipeline, _compile_tuning(args),
                           args.headers)
    for path in written:
        print(path)
    return 0


def cmd_autotune(args) -> int:
    spec = load_spec(args.spec)
    from .autotune import autotune_moe, autotune_msd, results_table, sweep_listing
    from .tuning import TuningDB, check_writable, db_path
    tokens_text = _moe_tokens(spec, args)
    if args.list and args.top:
        raise UsageError(f"--top {args.top}: ranks the candidates a sweep times; --list times "
                         f"none")
    if args.list:
        print(sweep_listing(spec, _token_list(tokens_text), args.arch))
        return 0
    if args.arch:
        raise UsageError(f"--arch {args.arch}: with --list only (a sweep plans for its GPU)")
    if args.top < 0:
        raise UsageError(f"--top {args.top}: a count of candidates, 0 or more")
    if args.budget_s is not None and not args.budget_s > 0:
        raise UsageError(f"--budget-s {args.budget_s:g}: seconds of sweeping, more than 0")
    path = db_path(args.tuning_db)
    try:
        check_writable(path)
    except OSError as exc:
        raise UsageError(f"tuning database {path}: cannot be written ({exc.strerror or exc}); "
                         f"the sweep records its results there (--tuning-db PATH)") from None
    db = TuningDB(path)
    if spec.pipeline == "msd_matmul":
        results = _gpu(autotune_msd, spec, db, args.budget_s, top=args.top)
    else:
        results = _gpu(autotune_moe, spec, _sweep_tokens(spec, _token_list(tokens_text)), db,
                       args.budget_s, top=args.top)
    print(results_table(results, "M" if spec.pipeline == "msd_matmul" else "T"))
    print(f"wrote {db.path}")
    return 0


def cmd_opt(args) -> int:
    path = Path(args.file)
    text = sys.stdin.read() if args.file == "-" else path.read_text()
    module = parse(text, source=str(path))
    module.verify()
    if args.pass_pipeline:
        from .build import spec_of
        spec = load_spec(args.spec) if args.spec else spec_of(module)
        if spec is None:
            raise UsageError("--pass-pipeline on a module without a spec attribute (a raw "
                             "pipeline file) needs --spec SPEC: the passes read its sizes")
        pm = PassManager(args.pass_pipeline, **_manager_options(args))
        pm.run(module, Context(spec=spec, target=args.target or default_target(spec)))
        if args.time_passes:
            print(pm.timing_report(), file=sys.stderr)
        if args.print_ir_after_all or args.print_ir_after:
            return 0
    print(module, end="")
    return 0


def cmd_passes(args) -> int:
    from .passes.registry import describe
    print(describe(args.name))
    return 0


def _tuning_db_option(s: argparse.ArgumentParser) -> None:
    """`--tuning-db` of the commands that run the layer (run, bench)."""
    s.add_argument("--tuning-db", metavar="PATH", help="tuning database (default: "
                   "$MOEGEN_TUNING_DB or ~/.cache/moegen/tuning.json, when it exists)")


def _pass_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--target", choices=("cuda", "ascend"),
                   help="target whose default pipeline runs (default: the spec's first)")
    s.add_argument("--pass-pipeline", metavar="PIPELINE",
                   help="passes to run instead of the default, e.g. "
                        "'tile{moe-block=8},alloc' ('' runs none)")
    s.add_argument("--print-ir-after-all", action="store_true",
                   help="print the IR after every pass")
    s.add_argument("--print-ir-after", metavar="NAME", action="append",
                   help="print the IR after pass NAME (repeatable)")
    s.add_argument("--time-passes", action="store_true", help="report the time of each pass")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moegen",
        description="Compile W4A16 MoE and MSD matmul pipelines to CUDA and AscendC kernels.")
    p.add_argument("--version", action="version", version=f"moegen {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("inspect", help="print a spec's pipeline as IR, its buffers, its schedule",
                       description="Build the spec's pipeline, run the target's passes (or "
                                   "--pass-pipeline), verify after each and print the IR.")
    s.add_argument("spec", help="path to a spec.yaml")
    _pass_options(s)
    s.add_argument("--launches", action="store_true",
                   help="CUDA: print the launch plan as a table: per token bucket the kernel "
                        "each GEMM runs, its CTA, K split, copy ring, threads and launch (MSD: "
                        "its kernels)")
    s.add_argument("--resources", action="store_true",
                   help="CUDA: compile the plan's kernels with nvcc and print per kernel its "
                        "registers, spills, shared memory and barriers (ptxas -v), the CTAs an "
                        "SM holds at those and the limit that sets them")
    s.add_argument("--arch", choices=CUDA_ARCHS,
                   help="CUDA: plan for this arch (default: the spec's targets.cuda.arch; a "
                        "runtime plans for its GPU's)")
    s.add_argument("--tuning-db", metavar="PATH",
                   help="plan with this tuning database (default: $MOEGEN_TUNING_DB; inspect "
                        "uses one only when given)")
    s.add_argument("--buffers", action="store_true",
                   help="print the workspace plan: buffers, sizes, lifetimes, offsets, peak")
    s.add_argument("--schedule", action="store_true",
                   help="print the basic and preload action lists and their simulated timelines")
    s.add_argument("--svg", metavar="FILE", help="also draw the timelines as SVG into FILE")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("compile", help="emit the kernels of a spec for a target",
                       description="Lower the spec for the target and write the generated "
                                   "sources, the launch plan and the IR after each pass.")
    s.add_argument("spec", help="path to a spec.yaml")
    s.add_argument("--target", choices=("cuda", "ascend"),
                   help="target (default: the spec's first)")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    s.add_argument("--headers", metavar="DIR",
                   help="CUDA: write the device headers (moegen_w4a16.cuh and its include tree "
                        "moegen/) here instead of into the output folder, for sources that share "
                        "one copy (compile them with -I DIR)")
    s.add_argument("--pass-pipeline", metavar="PIPELINE", help="passes instead of the default")
    s.add_argument("--tuning-db", metavar="PATH",
                   help="use this tuning database (default: $MOEGEN_TUNING_DB; compile uses "
                        "one only when given)")
    s.set_defaults(func=cmd_compile)

    s = sub.add_parser("passes", help="list the passes and default pipelines, or one pass's "
                       "options", description="Without NAME: every pass, with what it does, "
                       "and the default pipeline of each pipeline and target. With NAME: the "
                       "options of that pass, their values, defaults and meaning.")
    s.add_argument("name", nargs="?", help="a pass, e.g. tile")
    s.set_defaults(func=cmd_passes)

    s = sub.add_parser("opt", help="parse, verify, transform and print a .mir file",
                       description="Parse a module in moegen's textual IR, verify it, run "
                                   "--pass-pipeline over it (with --spec), print it.")
    s.add_argument("file", help="a .mir file, or - for standard input")
    s.add_argument("--spec", help="the spec the passes read (default: the one a built module "
                                  "carries in its attributes)")
    _pass_options(s)
    s.set_defaults(func=cmd_opt)

    s = sub.add_parser("run", help="run the layer on random inputs on the GPU, check it",
                       description="Run the spec's layer on random inputs on the GPU and print "
                                   "its relative error against moegen.reference. With --target "
                                   "ascend: run the emitted Ascend op in moegen's emulator on "
                                   "its gen_data.py's draws, both templates, no NPU needed.")
    s.add_argument("spec")
    s.add_argument("--target", choices=("cuda", "ascend"), default="cuda",
                   help="cuda (default: on the GPU) or ascend (the emitted op, emulated)")
    s.add_argument("--tokens", help="moe_w4a16 specs: token counts, e.g. 1,16,64 (default 16, "
                   "or tokens.max where smaller)")
    s.add_argument("--seed", type=int, default=None, help="random seed (default: fresh; "
                   "--target ascend: 1, the CANN sample's draws)")
    _tuning_db_option(s)
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("bench", help="time the layer on the GPU against its memory floor",
                       description="Per token count: median time (CUDA graph replay, L2 "
                                   "flushed), the int4 memory floor, % of floor, a bare read of "
                                   "the same bytes timed the same way, PyTorch bf16.")
    s.add_argument("spec")
    s.add_argument("--tokens", help=f"moe_w4a16 specs: token counts (default {MOE_TOKENS})")
    s.add_argument("--rows", metavar="M,...", help="msd_matmul specs: the M values to time "
                   "(default: the spec's msd.m)")
    s.add_argument("--pass-pipeline", metavar="PIPELINE", help="moe_w4a16 specs: time the "
                   "layer built by these passes, e.g. 'fuse-align,fuse-swiglu,"
                   "tile{block-k=32},alloc' (default: the target's pipeline)")
    _tuning_db_option(s)
    s.add_argument("--experts", type=int, metavar="N", help="moe_w4a16 specs: route every "
                   "token among the first N experts (a skewed router; default: a random "
                   "router over all of them)")
    s.add_argument("--dtype", choices=["float16", "bfloat16", "both"], help="moe_w4a16 specs: "
                   "time the layer with these activations instead of the spec's; both: fp16 "
                   "and bf16, then the two side by side")
    s.add_argument("--pack-layers", type=int, metavar="N", help="moe_w4a16 specs: instead, time "
                   "packing N layers of random weights on the GPU")
    s.add_argument("--versus", metavar="PIPELINE", help="moe_w4a16 specs: instead, time the "
                   "layer built by PIPELINE side by side with the one above (--pass-pipeline "
                   "or the target's), in turns on the same weights and inputs, and say whether "
                   "their outputs are the same bits")
    s.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    s.add_argument("--reps", type=int, default=30, help="timed repetitions per point")
    s.add_argument("--no-baseline", action="store_true", help="skip the PyTorch baseline")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("autotune", help="sweep block sizes and split-K on the GPU, record the best",
                       description="Per token count: every candidate config is checked against "
                                   "the reference, timed (graph replay, L2 flushed), the best "
                                   "recorded in the tuning database.")
    s.add_argument("spec")
    s.add_argument("--tokens", help=f"moe_w4a16 specs: token counts to tune (default "
                   f"{MOE_TOKENS})")
    s.add_argument("--budget-s", type=float, default=None, help="stop sweeping after N seconds")
    s.add_argument("--tuning-db", metavar="PATH", help="database file (default: "
                   "$MOEGEN_TUNING_DB or ~/.cache/moegen/tuning.json)")
    s.add_argument("--list", action="store_true", help="list the candidates the sweep would "
                   "time, per token count, as pass pipelines (for --pass-pipeline of inspect, "
                   "compile and, MoE, bench; no GPU needed)")
    s.add_argument("--arch", choices=CUDA_ARCHS, help="with --list: plan for this arch "
                   "(default: the spec's targets.cuda.arch)")
    s.add_argument("--top", type=int, default=0, metavar="N", help="also print the N fastest "
                   "candidates (per token count; MSD: with their lowering and schedule), with "
                   "their speed-up over the default, as pass pipelines")
    s.set_defaults(func=cmd_autotune)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        text = str(exc) if not isinstance(exc, OSError) else f"{exc.filename}: {exc.strerror}"
        print(f"moegen: error: {text}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"moegen: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
