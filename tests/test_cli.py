import re
import shutil

import pytest

from conftest import EXAMPLES, ROOT, run_moegen


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_inspect_examples(path):
    proc = run_moegen("inspect", path, check=True)
    assert proc.stdout.startswith("// pipeline: ")
    assert "\nmodule @" in proc.stdout
    assert "func @" in proc.stdout


def test_opt_round_trips_a_file(tmp_path):
    first = run_moegen("opt", ROOT / "ir" / "moe_w4a16.mir", check=True).stdout
    f = tmp_path / "x.mir"
    f.write_text(first)
    assert run_moegen("opt", f, check=True).stdout == first


@pytest.mark.parametrize("args", [["--help"], ["inspect", "--help"], ["opt", "--help"]])
def test_help(args):
    proc = run_moegen(*args)
    assert proc.returncode == 0 and "usage: moegen" in proc.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npipeline: moe_w4a16\nmoe: {hidden_size: 100, intermediate_size: 128,"
                   " num_experts: 4, top_k: 2}\n")
    for args in (["inspect", bad], ["inspect", tmp_path / "none.yaml"],
                 ["opt", tmp_path / "none.mir"]):
        proc = run_moegen(*args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "moe.hidden_size: 100" in run_moegen("inspect", bad).stderr
    mir = tmp_path / "bad.mir"
    mir.write_text((ROOT / "ir" / "msd_matmul.mir").read_text().replace("msd.unfold", "msd.unfld"))
    proc = run_moegen("opt", mir)
    assert proc.returncode == 2 and "unknown op 'msd.unfld'" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_inspect_pass_options(tmp_path):
    spec = ROOT / "examples" / "qwen3-30b-a3b.yaml"
    out = run_moegen("inspect", spec, "--print-ir-after-all", check=True).stdout
    assert [l for l in out.splitlines() if l.startswith("// ----- IR after")] == [
        "// ----- IR after fuse-align ----- //", "// ----- IR after fuse-swiglu ----- //",
        "// ----- IR after tile ----- //",
        "// ----- IR after alloc ----- //"]
    out = run_moegen("inspect", spec, "--print-ir-after", "tile", check=True).stdout
    assert out.count("// ----- IR after") == 1 and "block_buckets" in out
    proc = run_moegen("inspect", spec, "--time-passes", check=True)
    assert "pass timing:" in proc.stderr and "alloc" in proc.stderr
    out = run_moegen("inspect", spec, "--pass-pipeline", "tile{moe-block=16}", check=True).stdout
    assert out.startswith("// pipeline: tile{moe-block=16}\n") and "[[16, 16], [64, 16]" in out
    out = run_moegen("inspect", spec, "--buffers", check=True).stdout
    assert "activation" in out and "naive sum" in out and "peak live" in out
    assert out.startswith("workspace plan at tokens = 8192 ")     # sized at tokens.max
    msd = run_moegen("inspect", ROOT / "examples" / "msd-seed.yaml", "--buffers",
                     check=True).stdout
    assert msd.startswith("workspace plan (") and "y_int" in msd  # no token count in its sizes
    proc = run_moegen("inspect", spec, "--pass-pipeline", "tile,nope")
    assert proc.returncode == 2 and "unknown pass 'nope'" in proc.stderr


@pytest.mark.parametrize("example,target,pipeline,missing", [
    ("qwen3-30b-a3b", "cuda", "fuse-align,fuse-swiglu,tile", "alloc"),
    ("qwen3-30b-a3b", "cuda", "", "tile and alloc"),
    ("mixtral-8x7b", "cuda", "fuse-align,alloc", "tile"),
    ("msd-seed", "cuda", "schedule,alloc", "tile")])
def test_a_pipeline_without_the_passes_a_target_reads(tmp_path, example, target, pipeline,
                                                     missing):
    """compile and inspect --launches name the passes a custom pipeline leaves out that the
    target emits from, in one line; the default pipeline and what the spec's target writes
    are left as they were."""
    spec = ROOT / "examples" / f"{example}.yaml"
    for args in (["compile", spec, "--target", target, "-o", tmp_path / "out"],
                 ["inspect", spec, "--launches"]):
        proc = run_moegen(*args, "--pass-pipeline", pipeline)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"pass pipeline '{pipeline}' leaves out {missing}:" in proc.stderr, proc.stderr
        assert "the default pipeline: '" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_compile_with_shared_headers(tmp_path):
    """--headers DIR: the device header and its include tree go to DIR, the rest to -o; two
    specs share one copy; on the Ascend target one line, exit 2."""
    for name in ("qwen3-30b-a3b", "msd-seed"):
        run_moegen("compile", ROOT / "examples" / f"{name}.yaml", "--target", "cuda", "-o",
                   tmp_path / name, "--headers", tmp_path / "include", check=True)
        assert (tmp_path / name / f"{name}.cu").is_file()
        assert not list((tmp_path / name).rglob("*.cuh"))
    assert (tmp_path / "include" / "moegen_w4a16.cuh").is_file()
    assert (tmp_path / "include" / "moegen" / "gemm_ksplit.cuh").is_file()
    proc = run_moegen("compile", ROOT / "examples" / "msd-seed.yaml", "--target", "ascend",
                      "-o", tmp_path / "asc", "--headers", tmp_path / "include")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--headers" in proc.stderr and "ascend" in proc.stderr


def test_compile_into_a_file_is_one_line_exit_2(tmp_path):
    """-o naming a file, or a folder under a file: one line naming the path, nothing written."""
    spec = ROOT / "examples" / "moe-seed.yaml"
    afile = tmp_path / "afile"
    afile.write_text("kept")
    for out, says in ((afile, f"-o {afile}: a file; compile writes a folder of files there"),
                      (afile / "sub", f"{afile / 'sub'}: Not a directory")):
        proc = run_moegen("compile", spec, "-o", out)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert says in proc.stderr, proc.stderr
    assert afile.read_text() == "kept"


def test_inspect_schedule_svg(tmp_path):
    svg_file = tmp_path / "t.svg"
    out = run_moegen("inspect", ROOT / "examples" / "msd-seed.yaml", "--target", "ascend",
                     "--schedule", "--svg", svg_file, check=True).stdout
    assert "slots: a_max 2, a_unfold 3, y_int 2" in out and "slots: a_max 1, a_unfold 1" in out
    assert out.count("no hazard, no deadlock") == 2
    assert "AIV unfold |" in out and "AIC matmul |" in out
    assert svg_file.read_text().startswith("<svg")
    assert "basic, 24 cores of the cost model: 361.2 us in all" in out
    # the cost model is the Ascend chip's: the CUDA view draws the stage order, in steps
    cuda = run_moegen("inspect", ROOT / "examples" / "msd-seed.yaml", "--target", "cuda",
                      "--schedule", "--svg", svg_file, check=True).stdout
    assert "producer warps unfold |" in cuda and "MMA warps matmul      |" in cuda
    assert "preload, stage order (a step a stage):" in cuda and " us" not in cuda
    assert "stage order" in svg_file.read_text() and ">us<" not in svg_file.read_text()
    proc = run_moegen("inspect", ROOT / "examples" / "qwen3-30b-a3b.yaml", "--schedule")
    assert proc.returncode == 2 and "no K-loop schedule" in proc.stderr


def test_opt_pass_pipeline(tmp_path):
    spec = ROOT / "examples" / "moe-seed.yaml"
    built = run_moegen("inspect", spec, "--pass-pipeline", "", check=True).stdout
    f = tmp_path / "m.mir"
    f.write_text(built)
    out = run_moegen("opt", f, "--spec", spec, "--pass-pipeline", "fuse-align,tile",
                     check=True).stdout
    assert "moe.align(" in out and "block_buckets = [[1, 4], [16, 4], [64, 4]]" in out
    # a built module carries its spec: no --spec needed
    out2 = run_moegen("opt", f, "--pass-pipeline", "fuse-align,tile", check=True).stdout
    assert out2 == out
    proc = run_moegen("opt", ROOT / "ir" / "moe_w4a16.mir", "--pass-pipeline", "tile")
    assert proc.returncode == 2 and "needs --spec" in proc.stderr


def test_gpu_commands_without_a_gpu_say_so(tmp_path):
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here: the commands would try the GPU")
    except ImportError:
        pass
    db = tmp_path / "t.json"
    db.write_text('{"format": 1, "entries": {}}')
    small = tmp_path / "small.yaml"       # run's default 16 tokens: tokens.max where smaller
    small.write_text((ROOT / "examples" / "moe-seed.yaml").read_text().replace("max: 64",
                                                                               "max: 8"))
    for args in (["run", "examples/moe-seed.yaml"], ["bench", "examples/qwen3-30b-a3b.yaml"],
                 ["run", str(small)], ["bench", "examples/moe-seed.yaml", "--tokens", "65"],
                 ["run", "examples/msd-seed.yaml"], ["autotune", "examples/moe-seed.yaml"],
                 ["bench", "examples/msd-seed.yaml", "--rows", "1,4"],
                 ["autotune", "examples/msd-seed.yaml"],
                 ["bench", "examples/moe-seed.yaml", "--tuning-db", str(db)]):
        proc = run_moegen(*args, cwd=ROOT)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "needs an NVIDIA GPU" in proc.stderr
    proc = run_moegen("bench", "examples/moe-seed.yaml", "--tokens", "1,x", cwd=ROOT)
    assert proc.returncode == 2 and "--tokens '1,x'" in proc.stderr
    proc = run_moegen("bench", "examples/msd-seed.yaml", "--pass-pipeline", "tile", cwd=ROOT)
    assert proc.returncode == 2 and "--pass-pipeline: an msd_matmul bench" in proc.stderr
    proc = run_moegen("bench", "examples/moe-seed.yaml", "--tuning-db", str(tmp_path / "no.json"),
                      cwd=ROOT)
    assert proc.returncode == 2 and "no.json: no such file" in proc.stderr


def assert_fails_in_one_line(args, says):
    """`moegen ARGS` exits 2 with one line of stderr that contains `says`."""
    proc = run_moegen(*args, cwd=ROOT)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


def test_bench_experts_option_is_checked_before_the_gpu():
    """`bench --experts N` routes among the first N experts: N below top-k, above the spec's
    experts or on an msd_matmul spec fails in one line, exit 2, with or without a GPU."""
    for spec, n, says in (("mixtral-8x7b", "1", "--experts 1: routing among the first N experts "
                           "needs top_k <= N <= num_experts (2 .. 8)"),
                          ("mixtral-8x7b", "9", "--experts 9:"),
                          ("msd-seed", "2", "--experts: a moe_w4a16 bench option; this is an "
                                            "msd_matmul spec")):
        assert_fails_in_one_line(("bench", f"examples/{spec}.yaml", "--experts", n), says)
    assert_fails_in_one_line(("bench", "examples/msd-seed.yaml", "--dtype", "bfloat16"),
                             "--dtype: a moe_w4a16 bench option; this is an msd_matmul spec "
                             "(fp16 activations only)")
    assert_fails_in_one_line(("bench", "examples/mixtral-8x7b.yaml", "--pack-layers", "0"),
                             "--pack-layers 0: a layer count of at least 1, with one --dtype")


def test_bench_versus_is_checked_before_the_gpu():
    """`bench --versus PIPELINE` times two builds side by side: a pipeline the tile pass
    refuses (its rule named), --dtype both, --pack-layers or an msd_matmul spec fail in one
    line, exit 2, with or without a GPU."""
    refused = "fuse-align,fuse-swiglu,tile{one-launch=1,route-in-gemm=0},alloc"
    other = "fuse-align,fuse-swiglu,tile{one-launch=1},alloc"
    for args, says in (
            (("examples/mixtral-8x7b.yaml", "--versus", refused),
             f"--versus {refused!r}: tile{{one-launch=1}}: a call of one token is not routed in "
             f"the GEMMs"),
            (("examples/qwen3-30b-a3b.yaml", "--versus", "tile{moe-block=3}"), "--versus"),
            (("examples/qwen3-30b-a3b.yaml", "--dtype", "both", "--versus", other),
             "--versus: times two pipelines with one --dtype (not both)"),
            (("examples/qwen3-30b-a3b.yaml", "--pack-layers", "2", "--versus", other),
             "--pack-layers 2: a layer count of at least 1, with one --dtype and no --versus"),
            (("examples/msd-seed.yaml", "--versus", other),
             "--versus: a moe_w4a16 bench option; this is an msd_matmul spec")):
        assert_fails_in_one_line(("bench", *args), says)


def test_reps_budget_and_seed_are_checked_before_the_gpu():
    """`bench --reps` below 1, `autotune --budget-s` not above 0 (a sweep that would time
    nothing), `autotune --top` below 0 or with --list, and `run --seed` below 0
    (numpy's generators take none) fail in one line, exit 2, with or without a GPU."""
    for args, says in ((("run", "examples/msd-seed.yaml", "--seed", "-1"),
                        "--seed -1: a random seed, 0 or more"),
                       (("bench", "examples/qwen3-30b-a3b.yaml", "--reps", "0"),
                        "--reps 0: timed repetitions a point, at least 1"),
                       (("bench", "examples/msd-seed.yaml", "--reps", "-3"), "--reps -3:"),
                       (("autotune", "examples/msd-seed.yaml", "--budget-s", "0"),
                        "--budget-s 0: seconds of sweeping, more than 0"),
                       (("autotune", "examples/mixtral-8x7b.yaml", "--budget-s", "nan"),
                        "--budget-s nan:"),
                       (("autotune", "examples/mixtral-8x7b.yaml", "--top", "-1"),
                        "--top -1: a count of candidates, 0 or more"),
                       (("autotune", "examples/msd-seed.yaml", "--list", "--top", "3"),
                        "--top 3: ranks the candidates a sweep times; --list times none")):
        assert_fails_in_one_line(args, says)


def test_unwritable_tuning_database_is_refused_before_the_sweep(tmp_path):
    """A tuning database autotune could not write (under a file, or a folder's path) fails in
    one line, exit 2, before the GPU is asked for: not after minutes of sweeping."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    for db, says in ((afile / "tuning.json", f"tuning database {afile / 'tuning.json'}: cannot "
                                             f"be written ("),
                     (tmp_path, f"tuning database {tmp_path}: cannot be written ({tmp_path} is "
                                f"a folder); the sweep records its results there")):
        for spec in ("mixtral-8x7b", "msd-seed"):
            assert_fails_in_one_line(("autotune", f"examples/{spec}.yaml", "--tuning-db",
                                      str(db)), says)
    assert afile.read_text() == "x" and sorted(tmp_path.iterdir()) == [afile]


def test_token_counts_are_checked_before_the_gpu():
    """`run --tokens` above the spec's tokens.max, `autotune --tokens` all above it (bench and
    autotune skip the counts above it with a line, so their defaults serve small specs), and
    `--rows` that are not positive fail in one line, exit 2, with or without a GPU; so does
    `--tokens` on an msd_matmul spec, whose rows are its msd.m (bench: --rows), and `--rows` on a
    moe_w4a16 spec."""
    for args, says in ((("run", "examples/msd-seed.yaml", "--tokens", "4"),
                        "--tokens '4': token counts of a moe_w4a16 spec; an msd_matmul spec runs "
                        "its msd.m rows (1)"),
                       (("bench", "examples/msd-seed.yaml", "--tokens", "1,4"),
                        "msd.m rows (1; bench: --rows)"),
                       (("autotune", "examples/msd-seed.yaml", "--list", "--tokens", "8"),
                        "--tokens '8': token counts of a moe_w4a16 spec"),
                       (("bench", "examples/moe-seed.yaml", "--rows", "4"),
                        "--rows '4': the M values of an msd_matmul spec; a moe_w4a16 bench times "
                        "token counts (--tokens)"),
                       (("run", "examples/qwen3-30b-a3b.yaml", "--tokens", "1,9000"),
                        "--tokens '1,9000': 9000 is above the spec's tokens.max (8192)"),
                       (("autotune", "examples/moe-seed.yaml", "--tokens", "65,256"),
                        "--tokens: 65, 256 all above the spec's tokens.max (64)"),
                       (("bench", "examples/msd-seed.yaml", "--rows", "0,4"),
                        "--rows '0,4': expected positive integers")):
        assert_fails_in_one_line(args, says)


def test_passes_lists_every_pass_and_its_options():
    """`moegen passes` names every registered pass and the default pipelines; `moegen passes
    NAME` every option of that pass with its meaning; an unknown pass fails in one line. Each
    pass's heading in docs/PASSES.md names all of its options."""
    from moegen.passes.pipelines import DEFAULT_PIPELINES
    from moegen.passes.registry import PASSES as REGISTERED   # (importing it registers them)
    # moegen's own passes (other tests register passes of their own in this process)
    PASSES = {n: c for n, c in REGISTERED.items() if c.__module__.startswith("moegen.passes.")}
    assert {"tile", "alloc", "schedule", "fuse-align"} <= set(PASSES)
    proc = run_moegen("passes", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for name in PASSES:
        assert f"\n  {name} " in proc.stdout
    for (pipeline, target), passes in DEFAULT_PIPELINES.items():
        assert f"{pipeline} on {target}: {','.join(passes)}" in proc.stdout
    headings = [line for line in (ROOT / "docs" / "PASSES.md").read_text().splitlines()
                if line.startswith("## ")]
    for name, cls in PASSES.items():
        proc = run_moegen("passes", name, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        heading = next(h for h in headings if h.split()[1] == name)
        for key, opt in cls.OPTIONS.items():
            assert f"  {key}={opt.type.__name__}  (" in proc.stdout, (name, key)
            assert " ".join(opt.doc.split()[:4]) in " ".join(proc.stdout.split()), (name, key)
            assert re.search(rf"\b{re.escape(key)}\b", heading), (name, key, heading)
    proc = run_moegen("passes", "tiles", cwd=ROOT)
    assert proc.returncode == 2 and "unknown pass 'tiles'" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_inspect_launches_tabulates_the_launch_plan():
    """`inspect --launches`: a row per token bucket and GEMM with the kernel the launch plan
    names, its CTA, split, ring, threads and launch, where the top-k sum runs, from which T
    the align is chunked (Mixtral: 2049 slots, T = 1025; PDL only where the arch has it), and a
    line for the one launch of a call of one token where planned; `--arch` plans for another
    GPU (sm_80: no tall bucket, no warpgroup MMA, no PDL); MSD: its kernels and rotating slots;
    the Ascend target has no launch plan (one line, exit 2)."""
    import json
    proc = run_moegen("inspect", "examples/mixtral-8x7b.yaml", "--launches", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    plan = json.loads((ROOT / "generated" / "cuda" / "mixtral-8x7b" /
                       "mixtral-8x7b.launch.json").read_text())
    rows = [line.split() for line in out.splitlines() if "moe_gemm_" in line]
    assert [r[-1] for r in rows] == [g["variants"][i]["kernel"]
                                     for i in range(len(plan["buckets"])) for g in plan["gemms"]]
    assert "plan for sm_90a" in out
    assert re.search(r"T = 1 +8 +gate_up +K-split, 2 warps +1 +8 x 16 k +64 +PDL from T = 1; "
                     r"releases down after its K loop", out)
    assert "T = 1 with router logits: the first bucket's kernels in their routing form" in out
    assert "\ntop-k sum: its own kernel, after the down GEMM (PDL)\n" in out
    assert ("\nalign: one CTA; from 2049 slots (T >= 1025) a CTA per 1024 slots, counts then "
            "chunks (PDL)\n") in out
    assert re.search(r"T = 53\.\.64 +32 +gate_up +wide, 4 col tiles x 32 rows a warp, wgmma +1 ",
                     out)
    assert re.search(r"down +wide, 4 col tiles x 32 rows a warp, wgmma +4 or 8, per call +4 x 32 k "
                     r"+128, capped for 4 an SM +plain", out)
    assert re.search(r"T = 160\.\.8192 +128 +gate_up +tall tile +1 +4 x 128 k +512 +plain", out)
    proc = run_moegen("inspect", "examples/mixtral-8x7b.yaml", "--launches", "--arch", "sm_80",
                      cwd=ROOT)
    assert proc.returncode == 0 and "plan for sm_80" in proc.stdout
    assert "\ntop-k sum: its own kernel, after the down GEMM\n" in proc.stdout
    assert "\nalign: one CTA; from 2049 slots (T >= 1025) a CTA per 1024 slots, counts then " \
        "chunks\n" in proc.stdout
    assert not re.search(r"wgmma|PDL|tall", proc.stdout.split("\n", 3)[3])
    assert "T = 65..8192" in proc.stdout
    assert "one launch" not in out
    proc = run_moegen("inspect", "examples/deepseek-v2-lite.yaml", "--launches",
                      "--pass-pipeline", "fuse-align,fuse-swiglu,tile{one-launch=1},alloc",
                      cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "\nT = 1 with router logits: one launch, moe_one_token (" in proc.stdout
    proc = run_moegen("inspect", "examples/msd-seed.yaml", "--launches", cwd=ROOT)
    assert re.search(r"msd_matmul_preload +96 x 8 x 1 +128 +\d+ +a_max 2, a_unfold 3, y_int 2",
                     proc.stdout), proc.stdout
    for args, says in ((("--target", "ascend", "--launches"), "--launches: the CUDA target's"),
                       (("--target", "ascend", "--arch", "sm_90"), "--arch sm_90: a CUDA plan's")):
        proc = run_moegen("inspect", "examples/msd-seed.yaml", *args, cwd=ROOT)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_inspect_resources_tabulates_what_each_kernel_takes():
    """`inspect --resources`: a row per kernel of the plan with ptxas's registers, spills and
    shared memory (the launch's dynamic after the static), the CTAs an SM holds at them and the
    limit that sets them, beside the CTAs the plan counts on; sm_86 (100 KB an SM): the wide
    CTAs are held 3 an SM by their shared memory, and the plan counts on 3 (the launch plan
    says so beside their register cap)."""
    proc = run_moegen("inspect", "examples/msd-seed.yaml", "--resources", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("msd-seed: its kernels for sm_90a as nvcc ")
    rows = {r.split()[0]: r.split() for r in proc.stdout.splitlines() if r.startswith("msd_")}
    assert set(rows) == {"msd_matmul_basic", "msd_matmul_preload"}
    for name, row in rows.items():
        threads, registers, spills = int(row[1]), int(row[2]), row[3]
        assert threads == 128 and 32 <= registers <= 255 and spills == "0", row
        assert re.fullmatch(r"\d+ \+ \d+", " ".join(row[5:8])), row   # static + dynamic
        assert int(row[9]) >= int(row[-1]) == 6, row     # CTAs an SM, planned
    proc = run_moegen("inspect", "examples/qwen3-30b-a3b.yaml", "--resources", "--arch",
                      "sm_86", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    wide = [r for r in proc.stdout.splitlines() if "_c4_r32_" in r]
    assert wide and all(re.search(r" 3 +shared memory +3$", r) for r in wide), proc.stdout
    launches = run_moegen("inspect", "examples/qwen3-30b-a3b.yaml", "--launches", "--arch",
                          "sm_86", cwd=ROOT).stdout
    assert all(re.search(r"capped for 4 an SM \(3 fit its shared memory\)", r)
               for r in launches.splitlines() if "_c4_r32_" in r), launches
    for args, env, says in (
            (("--target", "ascend"), None, "--resources: the CUDA target's kernels"),
            ((), {"PATH": ""}, "--resources: nvcc (the CUDA toolkit")):
        proc = run_moegen("inspect", "examples/msd-seed.yaml", "--resources", *args, cwd=ROOT,
                          env=env)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, (
            proc.stderr)


def test_inspect_and_compile_plan_with_a_tuning_database_when_given(tmp_path):
    """`inspect --tuning-db PATH` shows the plan a tuning entry gives (its buckets and splits);
    a --tuning-db that does not exist fails in one line (compile too), where it once planned the
    defaults without a word."""
    import moegen
    from moegen import tuning as tdb
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    path = tmp_path / "t.json"
    tdb.TuningDB(path).record(spec, tdb.Device("NVIDIA H200", "nvrtc 13.0"), [
        {"tokens": t, "config": {"moe_block": b, "split_k": s}, "time_us": 1.0,
         "default_us": 2.0, "checked": True} for t, b, s in ((1, 16, 2), (256, 32, 1))])
    proc = run_moegen("inspect", "examples/qwen3-30b-a3b.yaml", "--launches", "--tuning-db",
                      str(path), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"T = 1\.\.16 +16 +gate_up +K-split, 4 warps +2 .* moe_gemm_gate_up_b16_s2_p8",
                     proc.stdout), proc.stdout
    assert "T = 17..8192" in proc.stdout
    default = run_moegen("inspect", "examples/qwen3-30b-a3b.yaml", "--launches", cwd=ROOT)
    assert "T = 1..16 " in default.stdout and "b16_s2" not in default.stdout
    for command in (("inspect", "examples/qwen3-30b-a3b.yaml"),
                    ("compile", "examples/qwen3-30b-a3b.yaml", "-o", str(tmp_path / "out"))):
        proc = run_moegen(*command, "--tuning-db", str(tmp_path / "no.json"), cwd=ROOT)
        assert proc.returncode == 2 and "no.json: no such file" in proc.stderr
        assert proc.stderr.count("\n") == 1


def test_autotune_list_shows_the_sweep_without_a_gpu():
    """`autotune --list` prints, per token count, every candidate's pass pipeline (the default
    marked where a candidate builds its kernels), skips counts above tokens.max, and needs no
    GPU; MSD specs list their candidates with the default marked."""
    import moegen
    from moegen import autotune as at
    proc = run_moegen("autotune", "examples/mixtral-8x7b.yaml", "--list", "--tokens",
                      "128,2048,9000", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    blocks = proc.stdout.split("\nT = ")
    for block, t in zip(blocks, (128, 2048)):
        lines = block.splitlines()
        head = lines[0].removeprefix("T = ")
        assert head.startswith(f"{t}: {len(at.config_space(spec, t))} candidates")
        assert [line.split()[0] for line in lines[1:]] == [
            c.pipeline() for c in at.config_space(spec, t)]
    assert "prefill-split-k-down=8" in blocks[0]
    assert blocks[1].count("<- builds the default's kernels") == 1
    assert blocks[2].startswith("9000: skipped, above tokens.max (8192)")
    proc = run_moegen("autotune", "examples/msd-seed.yaml", "--list", cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.count("<- the default") == 1
    proc = run_moegen("autotune", "examples/msd-seed.yaml", "--arch", "sm_80", cwd=ROOT)
    assert proc.returncode == 2 and "--arch sm_80: with --list only" in proc.stderr


def test_run_target_ascend_emulates_the_op_without_a_device(tmp_path):
    """`moegen run --target ascend` runs the emitted Ascend op in the emulator, both templates,
    and exits 0 only when its verify_result passes; it refuses what is no Ascend MSD spec."""
    spec = tmp_path / "small.yaml"
    spec.write_text((ROOT / "examples" / "msd-seed.yaml").read_text()
                    .replace("n: 12288", "n: 1024").replace("k: 8192", "k: 512")
                    .replace("m: 1,", "m: 3,"))
    assert "m: 3," in spec.read_text() and "n: 1024" in spec.read_text()
    proc = run_moegen("run", spec, "--target", "ascend", "--seed", "7", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["basic", "preload"]
    assert all("M=3 N=1024 K=512" in line and "verify_result: PASS" in line for line in lines)
    assert_fails_in_one_line(("run", "examples/moe-seed.yaml", "--target", "ascend"),
                             "--target ascend: moe-seed is not an msd_matmul spec")
