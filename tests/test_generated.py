"""generated/ is up to date, and every example's CUDA source, planned for each arch of
moegen.target, compiles cleanly for it with no register spills."""
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

import gpu_cases
import moegen
from moegen.target import CUDA_ARCHS, gpu_target
from moegen.passes.manager import PipelineError
from moegen.targets import cpp_format
from moegen.targets.compile import emit
from moegen.passes.tiling.cta import one_token_routing_bytes, wide_static_bytes
from moegen.targets.cuda.emitter import device_headers
from moegen.targets.cuda.launch import GATE_UP_PDL_MIN_TOKENS, PDL_MIN_TOKENS
from moegen.targets.cuda.occupancy import ctas_per_sm
from moegen.targets.cuda.ptxas_report import kernel_uses, planned_ctas, ptxas_stats
from conftest import ROOT

GENERATED = ROOT / "generated"
CUDA_EXAMPLES = ["moe-seed", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite",
                 "qwen3-30b-a3b-awq", "mixtral-8x7b-gptq", "msd-seed"]


INCLUDE = GENERATED / "cuda" / "include"      # the examples' one copy of the device headers
# the top-k sum kernels: every slot routed (the layer's own routing), and checked (the caller's ids)
AGGREGATES = {"moe_aggregate", "moe_aggregate_checked"}


@pytest.mark.skipif(cpp_format.executable() is None,
                    reason="clang-format not installed: emit() writes the C++ unformatted")
@pytest.mark.parametrize("name", CUDA_EXAMPLES)
def test_generated_is_up_to_date(name):
    spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
    files = emit(spec, "cuda")
    headers = device_headers()
    folder = GENERATED / "cuda" / name
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert on_disk == set(files) - set(headers), \
        "generated/ holds other files than moegen compile --headers writes"
    for rel, text in files.items():
        where = INCLUDE if rel in headers else folder
        assert (where / rel).read_text() == text, (
            f"{(where / rel).relative_to(ROOT)} is stale: regenerate (see generated/README.md)")


def test_generated_keeps_one_copy_of_the_headers():
    """generated/cuda/include holds the device header and its include tree, once for every
    example, and nothing else; the examples' folders hold none."""
    on_disk = {p.relative_to(INCLUDE).as_posix() for p in INCLUDE.rglob("*") if p.is_file()}
    assert on_disk == set(device_headers())
    assert not [p for p in (GENERATED / "cuda").rglob("*.cuh")
                if INCLUDE not in p.parents]
    tree = device_headers()
    umbrella = tree["moegen_w4a16.cuh"]
    assert {f"moegen/{m}" for m in re.findall(r'#include "moegen/(\w+\.cuh)"', umbrella)} == \
        set(tree) - {"moegen_w4a16.cuh"}


def test_output_is_reproducible():
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    assert emit(spec, "cuda") == emit(spec, "cuda")


def test_launch_plan():
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    plan = json.loads((GENERATED / "cuda" / "mixtral-8x7b" / "mixtral-8x7b.launch.json").read_text())
    source = (GENERATED / "cuda" / "mixtral-8x7b" / "mixtral-8x7b.cu").read_text()
    assert plan["spec_hash"] == spec.hash and plan["passes"].startswith("fuse-align")
    for k in plan["kernels"]:
        assert re.search(r'extern "C" __global__ void[^;{]{0,80}?\b' + k["name"] + r"\(", source), \
            k["name"]
    ws = plan["workspace"]
    spans = sorted((b["offset"], b["offset"] + b["bytes"]) for b in ws["buffers"].values())
    assert spans[-1][1] <= ws["arena_bytes"] <= ws["partials"]["offset"]
    assert ws["partials"]["offset"] + ws["partials"]["bytes"] <= ws["bytes"]
    state = plan["state"]             # the layer's own: arrival counters, zero between calls
    assert state["counters"]["offset"] + 4 * state["counters"]["ints"] <= state["bytes"]
    assert plan["buckets"] == [[1, 8], [16, 8], [52, 16], [64, 32], [159, 32], [8192, 128]]
    # T >= 160 (40 slots an expert, of 8 experts): the tall tile, 16 warps, in dynamic shared
    # memory
    kernels = {k["name"]: k for k in plan["kernels"]}
    for g in plan["gemms"]:
        v = g["variants"][5]
        assert (v["tall"], v["block"], v["col_tiles"], v["warps"]) == (True, 128, 4, 16)
        assert kernels[v["kernel"]]["shared_bytes"] == v["shared_bytes"] > 48 * 1024
        body = kernel_body(source, v["kernel"])
        assert len(re.findall(r"__launch_bounds__\(512\)\s+" + v["kernel"] + r"\(", source)) == 1
        tall = call_args(body, "grouped_gemm_wgmma_tall")
        assert [tall[k] for k in ("BLOCK", "DYNAMIC_BYTES")] == ["128", str(v["shared_bytes"])]
        wide = call_args(body, "grouped_gemm_wide")       # compiled without warpgroup MMA
        assert body.index("grouped_gemm_wgmma_tall<") < body.index("#else") < body.index(
            "grouped_gemm_wide<")
        assert [wide[k] for k in ("BLOCK", "WARP_ROWS", "COLT", "DYNAMIC_BYTES")] == [
            "128", "32", "4", str(v["shared_bytes"])]
    # T = 53..64: the wide warpgroup-MMA CTA, its registers capped for 4 CTAs an SM: down
    # split over K, gate/up whole (its K loop unrolled over a ring turn); the partials hold
    # every split of every tile of the largest call
    for g in plan["gemms"]:
        v = g["variants"][3]
        assert (v["col_tiles"], v["wgmma"], v["ctas_per_sm"]) == (4, True, 4)
        assert (g["name"] == "down") == (v["split"] > 1)
        assert re.search(r"__launch_bounds__\(128, 4\)\s+" + v["kernel"] + r"\(", source)
        if v["split"] > 1:
            blocks = -(-64 * 2 // 32) + 8
            assert ws["partials"]["bytes"] >= blocks * g["ntiles"] * 64 * 32 * 4 * v["split"]
            assert state["counters"]["ints"] >= blocks * g["ntiles"] // v["col_tiles"]
    # the down GEMM splits K at T = 1 (2 experts x 64 tiles < 132 SMs): it has a partials area
    assert ws["partials"]["bytes"] > 0 and state["counters"]["ints"] > 0


def test_the_k_split_gemms_follow_with_pdl():
    """The launch plan marks the K-split kernels for programmatic dependent launch: the down
    GEMM's from PDL_MIN_TOKENS tokens (one), their source passing FOLLOWS = true; gate/up's
    after the align kernel from GATE_UP_PDL_MIN_TOKENS (two), passing WAITS_FIRST = true; both
    from one in the single-token bucket (Mixtral's T = 1, whose gate/up kernel alone releases
    the down GEMM after its K loop). The wide CTAs (prefill, and Mixtral's decode bucket of
    T = 53..64) launch plainly. The top-k sum follows the down GEMM at every T, and the
    chunked align's second launch its first (both examples' calls reach 2049 slots)."""
    for name in ("mixtral-8x7b", "qwen3-30b-a3b"):
        spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
        files = emit(spec, "cuda")
        plan = json.loads(files[f"{name}.launch.json"])
        source = files[f"{name}.cu"]
        up, down = plan["gemms"]
        single = name == "mixtral-8x7b"
        assert (down["variants"][0]["max_tokens"] == 1) == single
        follows, waits = set(), set()
        for g, least, marked in ((down, PDL_MIN_TOKENS, follows),
                                 (up, GATE_UP_PDL_MIN_TOKENS, waits)):
            for i, v in enumerate(g["variants"]):
                one_token = single and i == 0
                want = (None if v["col_tiles"] > 1 else 1 if one_token
                        else least if v["max_tokens"] >= least else None)
                assert v.get("follows_from") == want, v["kernel"]
                if want is not None:
                    marked.add(v["kernel"])
        wide_decode = {v["kernel"] for v in down["variants"]
                       if v["ctas_per_sm"] and v["split"] > 1}
        assert (len(wide_decode) == 1) == single     # Mixtral's wide decode bucket
        assert follows and waits and not (follows & waits)
        late = {v["kernel"] for v in up["variants"] if v["release_after_loop"]}
        assert late == ({up["variants"][0]["kernel"]} if single else set())
        assert all(not v["release_after_loop"] for v in down["variants"])
        # (and the down GEMM's routing form, after the routing gate/up, which launches first;
        # the top-k sum, after the down GEMM at every T; the chunks of the align, after its
        # counts)
        routed = {down["variants"][0]["route_kernel"]}
        assert {k["name"] for k in plan["kernels"] if "launch" in k} == \
            follows | waits | routed | AGGREGATES | {"moe_align_chunk"}
        for v in up["variants"] + down["variants"]:
            body = kernel_body(source, v["kernel"])
            if v["tall"]:               # the tall tile launches plainly
                assert "grouped_gemm_wgmma_tall<" in body
                assert "launch" not in next(k for k in plan["kernels"] if k["name"] == v["kernel"])
                continue
            if v["col_tiles"] > 1:      # the wide CTAs: SPLIT where split, PIN_ADDRESSES
                # where capped, SPLIT_MANY and FILL_CTAS where the device picks the split per
                # call (the header's defaults otherwise)
                wide = call_args(body, "grouped_gemm_wgmma")
                want = ({"SPLIT": str(v["split"]), "PIN_ADDRESSES": "true"} if v["ctas_per_sm"]
                        else {"SPLIT": str(v["split"])} if v["split"] > 1 else {})
                if v["split_many"] != v["split"]:
                    want.update(SPLIT_MANY=str(v["split_many"]), FILL_CTAS=str(v["fill_ctas"]))
                assert {k: wide[k] for k in ("SPLIT", "PIN_ADDRESSES", "SPLIT_MANY",
                                             "FILL_CTAS") if k in wide} == want, v
                assert "launch" not in next(k for k in plan["kernels"] if k["name"] == v["kernel"])
                continue
            args = call_args(body, "grouped_gemm")
            for key, kernels in (("FOLLOWS", follows), ("RELEASE_AFTER_LOOP", late),
                                 ("WAITS_FIRST", waits)):
                assert (args.get(key) == "true") == (v["kernel"] in kernels), (key, v["kernel"])


NVCC = shutil.which("nvcc")


def kernel_body(source: str, kernel: str) -> str:
    """A generated kernel's text, from its name to its closing brace, its spaces and line breaks
    one space each (clang-format breaks its lines where the names' lengths make it)."""
    start = source.index(kernel + "(")
    return " ".join(source[start:source.index("\n}\n", start)].split())


def call_args(body: str, fn: str) -> dict:
    """NAME -> value of the named template arguments (/*NAME=*/value) of the call of `fn`."""
    args = re.search(r"moegen::" + fn + r"<(.*?)>\(", body, re.S).group(1)
    return dict(re.findall(r"/\*(\w+)=\*/([^,>\s]+)", args))


def nvcc_build(source, out_dir, arch="sm_90", werror=True) -> str:
    """nvcc -cubin with ptxas statistics (the device headers beside the source, else in
    generated/cuda/include); asserts it builds and returns the log."""
    cmd = [NVCC, "-cubin", f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", f"-I{INCLUDE}",
           *(["-Werror", "all-warnings"] if werror else []), str(source),
           "-o", str(out_dir / "k.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return proc.stderr


def assert_no_spills(log: str) -> None:
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(a == "0" and b == "0" for a, b in spills), log


def spill_stores(log: str) -> dict:
    """Bytes of spill stores per function, from nvcc's ptxas statistics."""
    return {fn: int(n) for fn, n in re.findall(
        r"Function properties for (\w+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores", log)}


def cuda_moe_spec(name, hidden, inter, experts, top_k, renormalize=None):
    """A moe_w4a16 spec for the CUDA target's default arch (renormalize: the spec's default
    unless given)."""
    moe = {"hidden_size": hidden, "intermediate_size": inter, "num_experts": experts,
           "top_k": top_k}
    if renormalize is not None:
        moe["renormalize"] = renormalize
    return moegen.load_spec({"name": name, "pipeline": "moe_w4a16", "moe": moe,
                             "targets": {"cuda": {}}})


def write_emitted(files: dict, stem: str, out_dir) -> object:
    """The .cu of `files` (as `emit` returns them) and its headers into out_dir; the .cu path."""
    for rel in device_headers():
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / rel).write_text(files[rel])
    src = out_dir / f"{stem}.cu"
    src.write_text(files[f"{stem}.cu"])
    return src


def example_for(name: str, arch: str):
    """The example spec `name` with its plan made for `arch`."""
    data = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    data.setdefault("targets", {})["cuda"] = {"arch": arch}
    return moegen.load_spec(data)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", CUDA_ARCHS)
def test_nvcc_compiles_every_example_for_each_arch(tmp_path, arch):
    """Every example planned for `arch` (its SMs and shared memory: moegen.target) builds for
    it with nvcc: no warnings, no spills, no stack frames (sm_90a: generated/'s own plans); and
    an SM holds as many CTAs of each kernel, at ptxas's registers and shared memory, as the plan
    counts on (its grid sized for them: planned_ctas; MoE: exactly as many)."""
    def build(name: str) -> tuple[str, str, dict]:
        folder = tmp_path / name
        folder.mkdir()
        spec = example_for(name, arch)
        files = emit(spec, "cuda")
        plan = json.loads(files[f"{name}.launch.json"])
        plan["zeros"] = spec.pipeline == "moe_w4a16" and not spec.quant.symmetric
        return name, nvcc_build(write_emitted(files, name, folder), folder, arch), plan

    gpu = gpu_target(arch)
    counted = 0
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for name, log, plan in pool.map(build, CUDA_EXAMPLES):
            assert_no_spills(log)
            assert all(s == "0" for s in re.findall(r"(\d+) bytes stack frame", log)), (name, log)
            assert "warning" not in log.lower(), (name, log)
            uses = kernel_uses(plan, ptxas_stats(log))
            for kernel, planned in planned_ctas(plan).items():
                held = ctas_per_sm(gpu, uses[kernel])[0]
                # (MoE: no fewer CTAs planned than the SM holds either; the MSD tile's register
                # cap may leave room for more)
                assert held == planned if "gemms" in plan else held >= planned, (
                    name, kernel, uses[kernel], held, planned)
                counted += 1
            # the tile pass's count of a wide CTA's static shared memory: ptxas's, and at most
            # the 128 bytes it allows for flags more
            for v in (v for g in plan.get("gemms", []) for v in g["variants"]):
                if v["col_tiles"] > 1 and not v["tall"]:
                    counted_bytes = wide_static_bytes(v["block"], v["col_tiles"], v["stages"],
                                                      16 * v["ks"], plan["zeros"],
                                                      v["wgmma"] and gpu.wgmma)
                    ptxas = uses[v["kernel"]].static_shared
                    assert 0 <= counted_bytes - ptxas <= 128, (name, v["kernel"], counted_bytes,
                                                              ptxas)
    assert counted


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch, fn", [("sm_90a", "grouped_gemm_wgmma_tall"),
                                      ("sm_80", "grouped_gemm_wide")])
def test_tall_kernels_check_their_dynamic_shared_memory(tmp_path, arch, fn):
    """A tall-tile kernel is told the dynamic shared memory its launch gives (the tile pass's
    tall_shared_bytes) and does not build where that is short of what it lays out: 16 bytes
    short of the tall ring (sm_90a), or 1 KB for the wide CTA in its place (the same source
    built for sm_80)."""
    files = emit(example_for("qwen3-30b-a3b", "sm_90a"), "cuda")
    plan = json.loads(files["qwen3-30b-a3b.launch.json"])
    tall = [v for g in plan["gemms"] for v in g["variants"] if v["tall"]]
    assert tall
    source = files["qwen3-30b-a3b.cu"]
    for v in tall:
        assert call_args(kernel_body(source, v["kernel"]), fn)["DYNAMIC_BYTES"] == str(
            v["shared_bytes"])
    for given in {v["shared_bytes"] for v in tall}:
        short = given - 16 if fn == "grouped_gemm_wgmma_tall" else 1024
        source = source.replace(f"/*DYNAMIC_BYTES=*/{given}", f"/*DYNAMIC_BYTES=*/{short}")
    files["qwen3-30b-a3b.cu"] = source
    src = write_emitted(files, "qwen3-30b-a3b", tmp_path)
    proc = subprocess.run([NVCC, "-cubin", f"-arch={arch}", "-std=c++17", str(src),
                           "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert proc.returncode != 0 and "dynamic shared memory holds the ring" in proc.stderr, (
        proc.stderr)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("experts,top_k,kernels",
                         [(512, 8, "moe_"), (64, 40, "moe_(route|align)")],
                         ids=["e512-k8", "e64-k40"])
def test_nvcc_compiles_the_largest_expert_count(tmp_path, arch, experts, top_k, kernels):
    """E = 512 (the spec's limit): every kernel without spills; top-k 40 unnormalized (two picks
    a lane): the router and align kernels without spills; align's shared memory (< 48 KB
    static)."""
    spec = cuda_moe_spec("e", 1024, 256, experts, top_k, renormalize=top_k <= 32)
    log = nvcc_build(write_emitted(emit(spec, "cuda"), "e", tmp_path), tmp_path, arch,
                     werror=False)
    stores = spill_stores(log)
    checked = [fn for fn in stores if re.match(kernels, fn)]
    assert len(checked) >= (3 if top_k > 32 else 8), log
    assert all(stores[fn] == 0 for fn in checked), log
    smem = [int(s) for s in re.findall(r"(\d+) bytes smem", log)]
    assert smem and max(smem) <= 48 * 1024


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("hidden,inter,experts,top_k", [
    (1024, 512, 32, 8),      # Granite-3.0-1B-A400M's shape
    (1024, 256, 64, 16), (2048, 256, 64, 16), (1024, 128, 64, 16),
    (1024, 256, 64, 40)])     # two picks a lane (unnormalized: top-k above 32)
def test_nvcc_compiles_small_models_split_wide(tmp_path, arch, hidden, inter, experts, top_k):
    """Small models whose wide decode bucket splits gate/up over K (its few column tiles leave
    the SMs short), some into CTAs of 4 K iterations. At the bucket's 128-register cap only the
    split gate/up kernel may spill, at most 76 bytes (its split sums unrolled over the splits:
    measured faster on the H200 than the form that does not spill); the mma.sync wide CTA's
    short K loops, once unrolled whole, spilled 100-180 bytes in the down GEMM."""
    spec = cuda_moe_spec("s", hidden, inter, experts, top_k, renormalize=top_k <= 32)
    files = emit(spec, "cuda")
    plan = json.loads(files["s.launch.json"])
    assert any(v["ctas_per_sm"] and v["split"] > 1
               for g in plan["gemms"] for v in g["variants"] if g["name"] == "gate_up")
    log = nvcc_build(write_emitted(files, "s", tmp_path), tmp_path, arch)
    stores = spill_stores(log)
    assert len(stores) >= 8, log
    spilled = {fn: n for fn, n in stores.items() if n}
    assert all(re.fullmatch(r"moe_gemm_gate_up_b32_c4_\w+_s\d\w*_o4", fn) and n <= 76
               for fn, n in spilled.items()), spilled


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvcc_compiles_a_gemm_no_wide_cta_divides(tmp_path, arch):
    """I = 96 with groups of 32 (gate/up: 3 column tiles, K = 128, 8 k16 steps): the decode
    bucket that would split the wide CTA over K runs the K-split CTA with a split its warps
    divide, and every kernel builds without a warning."""
    data = gpu_cases.moe_spec(128, 96, 4, 2, group=32, dtype="bfloat16", symmetric=False)
    data["targets"]["cuda"]["arch"] = arch
    spec = moegen.load_spec(data)
    files = emit(spec, "cuda")
    log = nvcc_build(write_emitted(files, spec.name, tmp_path), tmp_path, arch)
    assert "moe_gemm_gate_up_b32_s2_p4" in log, log


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nvcc_builds_random_shapes(tmp_path, rng):
    """Two specs of random shape, quantization, activation type, token limit and arch
    (gpu_cases.random_moe_spec): every kernel builds without a warning. (I = 96 with groups of
    32 once failed here: a K split its kernel's static_assert rejects.)"""
    for i in range(2):
        data = gpu_cases.random_moe_spec(rng, f"r{i}")
        spec = moegen.load_spec(data)
        folder = tmp_path / spec.name
        folder.mkdir()
        arch = data["targets"]["cuda"]["arch"]
        log = nvcc_build(write_emitted(emit(spec, "cuda"), spec.name, folder), folder, arch)
        assert "moe_gemm_gate_up" in log, (data, log)


MSD_VARIANTS = [  # (spec msd, group, lowering, pipeline): what generated/cuda/msd-seed does not hold
    ({"m": 64, "n": 1000, "k": 1024, "steps": 3}, 128, "msd", None),
    ({"m": 5, "n": 4096, "k": 4096, "steps": 2}, 64, "msd", None),
    ({"m": 16, "n": 11008, "k": 4096, "steps": 1}, 128, "msd", "tile{mma=s4,block-n=32},schedule,alloc"),
    # warp layouts: 16 warps of one n8 tile each; one vector warp; an odd N (scales copied plainly)
    ({"m": 5, "n": 4096, "k": 4096, "steps": 3}, 128, "msd",
     "tile{block-n=64,vec-warps=8,cube-warps=8},schedule,alloc"),
    ({"m": 3, "n": 1001, "k": 1024, "steps": 2}, 64, "msd", "tile{vec-warps=1},schedule,alloc"),
    ({"m": 1, "n": 12288, "k": 8192, "steps": 3}, 128, "dequant", None),
    ({"m": 64, "n": 1000, "k": 1024, "steps": 3}, 128, "dequant", None),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("msd,group,lowering,pipeline", MSD_VARIANTS,
                         ids=[f"{v[2]}-m{v[0]['m']}-g{v[1]}{'-' + v[3][5:v[3].index('}')] if v[3] else ''}"
                              for v in MSD_VARIANTS])
def test_nvcc_compiles_msd_variants(tmp_path, arch, msd, group, lowering, pipeline):
    spec = moegen.load_spec({"name": "v", "pipeline": "msd_matmul", "msd": msd,
                             "quant": {"bits": 4, "group_size": group, "symmetric": True},
                             "lowering": lowering, "targets": {"cuda": {}}})
    src = write_emitted(emit(spec, "cuda", pipeline), "v", tmp_path)
    assert_no_spills(nvcc_build(src, tmp_path, arch))


def source_ptx(tmp_path, src, arch: str) -> str:
    """The PTX of a CUDA source compiled for `arch`."""
    ptx_path = tmp_path / f"{arch}.ptx"
    proc = subprocess.run([NVCC, "-ptx", f"-arch={arch}", "-std=c++17", str(src), "-o",
                           str(ptx_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return ptx_path.read_text()


def source_ptx_entries(tmp_path, src, arch: str) -> dict[str, str]:
    """ptx_entries of a CUDA source compiled for `arch`."""
    return ptx_entries(source_ptx(tmp_path, src, arch))


def example_ptx(tmp_path, example: str) -> str:
    """The PTX of an example spec's CUDA source, for sm_90a."""
    spec = moegen.load_spec(ROOT / "examples" / f"{example}.yaml")
    return source_ptx(tmp_path, write_emitted(emit(spec, "cuda"), example, tmp_path), "sm_90a")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("example, least", [("msd-seed", 2), ("mixtral-8x7b", 4)])
def test_hinted_copies_take_an_or_ed_shared_address(tmp_path, example, least):
    """Every L2-hinted cp.async (the MSD weights, the decode GEMMs' weights) gets its shared
    address from an `or.b32` (the address OR-ed with a zero ptxas cannot prove uniform): ptxas
    then cannot split it into a register plus a uniform register, the form it builds wrongly for
    hinted copies on sm_90. The wide prefill CTA's copies carry no hint."""
    ptx = example_ptx(tmp_path, example)
    hinted = re.findall(r"cp\.async\.cg\.shared\.global\.L2::cache_hint \[(%r\d+)\]", ptx)
    assert len(hinted) >= least, f"{example}: the weight copies carry no L2 policy"
    for reg in hinted:
        assert re.search(r"\bor\.b32\s+" + re.escape(reg) + r",", ptx), reg


def ptx_entries(ptx: str) -> dict[str, str]:
    """PTX text per kernel entry (its name -> its body)."""
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_only_the_checked_top_k_sum_reads_ids(tmp_path):
    """moe_aggregate (the layer's own routing) takes no ids and reads only the down rows, one
    128-bit load per slot of a chunk (Qwen3: top-8); moe_aggregate_checked takes the caller's
    ids as a fourth argument and reads them."""
    entries = ptx_entries(example_ptx(tmp_path, "qwen3-30b-a3b"))
    plain, checked = entries["moe_aggregate"], entries["moe_aggregate_checked"]

    def params(body):
        return body[:body.index(")")].count(".param")

    def loads(body):
        return re.findall(r"ld\.global[\w.]*", body)
    assert (params(plain), params(checked)) == (3, 4)
    assert loads(plain) == ["ld.global.nc.v4.u32"] * 8
    assert "ld.global.nc.u32" in loads(checked)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("example, least", [("msd-seed", 2), ("mixtral-8x7b", 4)])
def test_split_counts_are_one_acquire_release_atomic(tmp_path, example, least):
    """Where the CTAs of a split count their arrivals (the MSD matmul's split, the K-split
    GEMMs, the fused top-k sum), thread 0 counts with `atom.acq_rel.gpu` after the CTA meets;
    no kernel fences at GPU scope (`membar.gl` or `fence.sc`/`fence.acq_rel`), which in every
    thread cost the MSD matmul 0.4 us at M = 1 (docs/DESIGN.md)."""
    ptx = example_ptx(tmp_path, example)
    counting = [name for name, body in ptx_entries(ptx).items()
                if "atom.acq_rel.gpu.global.add" in body]
    assert len(counting) >= least, f"{example}: {counting}"
    assert not re.search(r"\bmembar\.gl\b|\bfence\.(sc|acq_rel)\.gpu\b", ptx)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_the_down_gemm_copies_weights_before_it_waits(tmp_path):
    """sm_90: every K-split GEMM and the align kernels release the next kernel
    (griddepcontrol.launch_dependents); the down GEMM's K-split kernels copy weights (the
    L2-hinted copies; where they stage scales, the .ca copies too) before griddepcontrol.wait and
    no activation rows (the plain .cg copies) before it; gate/up's wait before they read or
    copy anything, and release the down GEMM only after the wait; gate/up's routing form
    (T = 1 with router logits, the call's first launch) waits for no kernel; the top-k sum
    follows the down GEMM and the chunked align's chunks its counts, each reading nothing before
    its wait. sm_80 has neither instruction."""
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    files = emit(spec, "cuda")
    plan = json.loads(files["qwen3-30b-a3b.launch.json"])
    src = write_emitted(files, "qwen3-30b-a3b", tmp_path)
    follows = {k["name"] for k in plan["kernels"] if "launch" in k}
    assert AGGREGATES <= follows
    k_split = {v["kernel"] for g in plan["gemms"] for v in g["variants"] if v["col_tiles"] == 1}
    gate_up = {v["kernel"] for v in plan["gemms"][0]["variants"]}
    routing = {plan["gemms"][0]["variants"][0]["route_kernel"]}
    releases = k_split | routing | {plan["gemms"][1]["variants"][0]["route_kernel"],
                                    "moe_align", "moe_route_align", "moe_align_count",
                                    "moe_align_chunk"}
    read_nothing_first = gate_up | AGGREGATES | {"moe_align_chunk"}
    for arch in ("sm_90a", "sm_80"):
        entries = source_ptx_entries(tmp_path, src, arch)
        for name, body in entries.items():
            if arch == "sm_80":
                assert "griddepcontrol" not in body, name
                continue
            assert ("griddepcontrol.launch_dependents" in body) == (name in releases), name
            assert ("griddepcontrol.wait" in body) == (name in follows), name
            if name in follows and name in read_nothing_first:
                before = body[:body.index("griddepcontrol.wait")]
                assert not re.search(r"\bld\.(global|shared)|cp\.async", before), name
                assert (name not in gate_up
                        or body.index("griddepcontrol.launch_dependents") > len(before)), name
            elif name in follows:
                before = body[:body.index("griddepcontrol.wait")]
                assert "cp.async.cg.shared.global.L2::cache_hint" in before, name
                assert not re.search(r"cp\.async\.cg\.shared\.global \[", before), name


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_the_wide_ctas_launch_plainly_and_stage_their_scales(tmp_path):
    """sm_90a, Mixtral: the wide CTAs (prefill, and the decode bucket's) neither release nor
    wait for another kernel; they copy their group scales into the ring (the .ca copies) and
    load no 16-byte vectors from global memory themselves (where the scales came from before).
    The decode bucket's, capped at 128 registers, pin their copy addresses (shuffles); the
    prefill ones do not."""
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    files = emit(spec, "cuda")
    plan = json.loads(files["mixtral-8x7b.launch.json"])
    entries = source_ptx_entries(tmp_path, write_emitted(files, "mixtral-8x7b", tmp_path),
                                 "sm_90a")
    up, down = plan["gemms"]
    wide = [v for v in up["variants"] + down["variants"] if v["col_tiles"] > 1]
    assert any(v["ctas_per_sm"] for v in wide) and not all(v["ctas_per_sm"] for v in wide)
    for v in wide:
        body = entries[v["kernel"]]
        assert "griddepcontrol" not in body, v["kernel"]
        assert "cp.async.ca.shared.global" in body, v["kernel"]
        assert "ld.global.nc.v4" not in body, v["kernel"]
        assert ("shfl.sync" in body) == bool(v["ctas_per_sm"]), v["kernel"]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("tile", ["block-k=32", "block-k=32,warps=2", "moe-block=64,warp-rows=64",
                                  "stages=6", "wide-cols=8"])
def test_nvcc_compiles_the_swept_gemm_tiles(tmp_path, arch, tile):
    """The sweep's tiles (k per stage, warps; block 64 and 6 stages on the warpgroup MMA kernel
    where sm_90a has it; two warpgroups a CTA, whose decode bucket is capped for 2 CTAs an SM)
    for the largest example: builds, no spills, rings within 48 KB."""
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    files = emit(spec, "cuda", f"fuse-align,fuse-swiglu,tile{{{tile}}},alloc")
    log = nvcc_build(write_emitted(files, "mixtral-8x7b", tmp_path), tmp_path, arch)
    assert_no_spills(log)
    smem = [int(s) for s in re.findall(r"(\d+) bytes smem", log)]
    assert smem and max(smem) <= 48 * 1024


FUSED_SUM = "fuse-align,fuse-swiglu,fuse-topk-sum,tile,alloc"


def test_fused_topk_sum_plan():
    """fuse-topk-sum: no aggregate launch; the down GEMM takes the output and one arrival
    counter per column tile, placed after the split-K counters."""
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    files = emit(spec, "cuda", FUSED_SUM)
    plan = json.loads(files["mixtral-8x7b.launch.json"])
    source = files["mixtral-8x7b.cu"]
    assert not AGGREGATES & {k["name"] for k in plan["kernels"]}
    up, down = plan["gemms"]
    assert (up["epilogue"], up["sum_topk"], down["epilogue"], down["sum_topk"]) == (1, 0, 2, 2)
    state = plan["state"]
    assert state["sum_counters"] == {"offset": state["sum_counters"]["offset"],
                                     "ints": down["ntiles"]}
    assert (state["counters"]["offset"] + 4 * state["counters"]["ints"]
            <= state["sum_counters"]["offset"])
    assert state["sum_counters"]["offset"] + 4 * down["ntiles"] <= state["bytes"]
    for v in down["variants"]:      # the split-K (T = 1) and wide (prefill) kernels sum as well
        sig = _kernel_params(source, v["kernel"])
        assert sig.endswith("act_t* sum_out, int* sum_counters, const int* routed_ids"), v["kernel"]
        # every call sums 2 top-k rows and multiplies the routing weights; the K-split one
        # follows gate/up under PDL; the wide ones, split over K, take the grid's split (the
        # warpgroup MMA kernel for sm_90a, else the wide CTA on mma.sync, with the same
        # arguments); the tall tile's stand-in is the wide CTA of its block in dynamic shared
        # memory
        body = kernel_body(source, v["kernel"])
        calls = [re.search(r"moegen::(grouped_gemm\w*)<", part).group(1)
                 for part in body.split("#else")]
        want = (["grouped_gemm"] if v["col_tiles"] == 1 else
                ["grouped_gemm_wgmma_tall" if v["tall"] else "grouped_gemm_wgmma",
                 "grouped_gemm_wide"] if v["wgmma"] else ["grouped_gemm_wide"])
        assert calls == want, v["kernel"]
        for fn in calls:
            args = call_args(body, fn)
            assert (args["SUM_TOPK"], args["MUL_WEIGHTS"]) == ("2", "true"), (fn, v["kernel"])
            if fn == "grouped_gemm":
                assert args["FOLLOWS"] == "true"
            elif fn != "grouped_gemm_wgmma_tall":
                assert args.get("SPLIT", "1") == str(v["split"]), (fn, v["kernel"])
                assert ("DYNAMIC_BYTES" in args) == (fn == "grouped_gemm_wide" and v["tall"])
        # (and the caller's expert ids: slots routed outside [0, E) are left out of the sum)
        routed = ", moegen::Routed{routed_ids, E});"
        ends = ("out, partials, counters, sum_out, sum_counters" + routed
                if v["col_tiles"] == 1 else
                "out, sum_out, sum_counters, " + ("partials, counters" if v["split"] > 1
                                                  else "nullptr, nullptr") + routed)
        assert body.endswith(ends), v["kernel"]
    assert down["variants"][-1]["col_tiles"] == 4 and down["variants"][-1]["wgmma"]
    for v in up["variants"]:
        assert "sum_out" not in re.search(r"\b" + v["kernel"] + r"\(([^)]*)\)", source).group(1)
    assert plan["gemms"][1]["variants"][0]["split"] > 1


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_nvcc_compiles_the_fused_topk_sum(tmp_path, arch, name):
    spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
    log = nvcc_build(write_emitted(emit(spec, "cuda", FUSED_SUM), name, tmp_path), tmp_path, arch)
    assert_no_spills(log)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_the_shuffle_router(tmp_path, arch):
    """tile{router=shuffle,route-align-tokens=64}: shuffle top-k (the generated examples use
    redux), four tokens per align warp."""
    spec = moegen.load_spec(ROOT / "examples" / "deepseek-v2-lite.yaml")
    files = emit(spec, "cuda", "fuse-align,fuse-swiglu,tile{router=shuffle,route-align-tokens=64},"
                               "alloc")
    assert "constexpr bool ROUTER_REDUX = false;" in files["deepseek-v2-lite.cu"]
    assert "constexpr int ROUTE_ALIGN_MAX_TOKENS = 64;" in files["deepseek-v2-lite.cu"]
    log = nvcc_build(write_emitted(files, "deepseek-v2-lite", tmp_path), tmp_path, arch)
    assert_no_spills(log)


def test_no_fused_route_align_when_turned_off():
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    files = emit(spec, "cuda", "fuse-align,fuse-swiglu,tile{route-align-tokens=0},alloc")
    plan = json.loads(files["qwen3-30b-a3b.launch.json"])
    assert plan["route_align_max_tokens"] == 0
    assert "moe_route_align" not in files["qwen3-30b-a3b.cu"]
    assert "moe_route_align" not in [k["name"] for k in plan["kernels"]]
    assert plan["router"] == "redux"


def _kernel_params(source: str, name: str) -> str:
    """The parameter list of kernel `name` in a generated source, its spaces one each."""
    return " ".join(re.search(rf"\b{name}\(([^)]*)\)", source).group(1).split())


def test_one_token_routed_in_the_gemms_plan():
    """route-in-gemm (the default up to top-k 32): the first bucket's kernel of each GEMM has a
    routing form (`<kernel>_routed`: the same GEMM call on the routing in shared memory, the
    same arguments and the router logits last) for T = 1 with logits, the gate/up one launched
    first and plainly (its GEMM waits for no kernel), the down one after it as its bucket's
    kernel; the route/align kernel serves T = 2 on. Off where asked, where top-k passes a
    warp's lanes (asked for there: an error), where the first bucket runs no K-split CTA, and
    where its shared memory would cost the first bucket's rings stages."""
    for name in ("mixtral-8x7b", "qwen3-30b-a3b"):
        plan = json.loads((GENERATED / "cuda" / name / f"{name}.launch.json").read_text())
        source = (GENERATED / "cuda" / name / f"{name}.cu").read_text()
        assert plan["gemm_route"]
        kernels = {k["name"]: k for k in plan["kernels"]}
        assert kernels["moe_route_align"]["when"] == "router logits given, T = 2..16"
        for g in plan["gemms"]:
            first = g["variants"][0]
            routed = first["route_kernel"]
            assert routed == first["kernel"] + "_routed"
            assert all(v["route_kernel"] == (routed if v["kernel"] == first["kernel"] else None)
                       for v in g["variants"])
            assert kernels[routed]["bucket_max_tokens"] == 1
            assert ("launch" in kernels[routed]) == (g["name"] == "down")
            params = _kernel_params(source, routed)
            assert params == _kernel_params(source, first["kernel"]) + ", const float* logits"
            body = kernel_body(source, routed)
            # the same template arguments but WAITS_FIRST (those left out: the defaults)
            base = call_args(kernel_body(source, first["kernel"]), "grouped_gemm")
            got = call_args(body, "grouped_gemm")
            assert "WAITS_FIRST" not in got and all(base[k] == v for k, v in got.items())
            assert all(v in ("0", "false") for k, v in base.items()
                       if k not in got and k != "WAITS_FIRST")
            assert "one.sorted_ids, one.expert_ids, &one.total, one.weights_flat" in body
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    for pipeline in ("fuse-align,fuse-swiglu,tile{route-in-gemm=0},alloc",
                     "fuse-align,fuse-swiglu,tile{moe-block=128},alloc"):
        files = emit(spec, "cuda", pipeline)
        plan = json.loads(files["qwen3-30b-a3b.launch.json"])
        assert not plan["gemm_route"] and "_routed" not in files["qwen3-30b-a3b.cu"]
        assert not any(v["route_kernel"] for g in plan["gemms"] for v in g["variants"])
        assert plan["kernels"][0]["when"] == "router logits given, T = 1..16"
    wide = cuda_moe_spec("k40", 256, 128, 64, 40)
    plan = json.loads(emit(wide, "cuda")["k40.launch.json"])
    assert not plan["gemm_route"]
    with pytest.raises(PipelineError, match=r"route-in-gemm=1.*top_k 40 must be <= 32"):
        emit(wide, "cuda", "fuse-align,fuse-swiglu,tile{route-in-gemm=1},alloc")
    with pytest.raises(PipelineError, match=r"route-in-gemm=1.*the first bucket's GEMMs run the "
                                            r"wide CTA or the tall tile"):
        emit(spec, "cuda", "fuse-align,fuse-swiglu,tile{moe-block=128,route-in-gemm=1},alloc")
    ir = emit(spec, "cuda", "fuse-align,fuse-swiglu,tile{moe-block=128},alloc")["ir/03-tile.mir"]
    assert "gemm_route = false" in ir
    # where the routing would cost the first bucket's rings stages (top-k 16, blocks of 16: 8
    # stages would be 4), off unless asked for, and then at the fewer stages
    k16 = cuda_moe_spec("k16", 1024, 512, 64, 16)
    for asked, route, stages in (("", False, 8), (",route-in-gemm=1", True, 4)):
        files = emit(k16, "cuda", f"fuse-align,fuse-swiglu,tile{{moe-block=16{asked}}},alloc")
        plan = json.loads(files["k16.launch.json"])
        assert plan["gemm_route"] == route
        assert [g["variants"][0]["stages"] for g in plan["gemms"]] == [stages, stages]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_a_whole_k_loop_unrolled_keeps_its_wgmmas_together(tmp_path):
    """Intermediate size 128: the down GEMM's wide warpgroup-MMA CTA (32 k a stage, 4 stages)
    unrolls its whole K loop, 4 stages, and its zeroed accumulators stay ahead of the first
    wgmmas, so ptxas need not inject a warpgroup.arrive between them (C7519)."""
    spec = cuda_moe_spec("k128", 256, 128, 8, 2)
    files = emit(spec, "cuda")
    plan = json.loads(files["k128.launch.json"])
    down = plan["gemms"][1]
    assert down["kdim"] == 128
    whole = [v for v in down["variants"]
             if v["wgmma"] and v["col_tiles"] > 1 and v["split"] == 1 and not v["tall"]
             and 128 // (16 * v["ks"]) <= v["stages"]]
    assert whole, down["variants"]
    log = nvcc_build(write_emitted(files, "k128", tmp_path), tmp_path, "sm_90a")
    assert "is injected" not in log, log


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_one_token_routing_shared_memory(tmp_path):
    """A routed kernel's static shared memory over its plain form's (ptxas's) is at most what
    the tile pass takes off its rings (one_token_routing_bytes), and holds the rank search's
    keys only where it runs: with 128 threads 256 experts are ranked (their keys, 1 KB, beside
    the blocks' KB), 512 are picked by warp 0's chain (the blocks' KB only)."""
    for experts, extra in ((256, 2048), (512, 1024)):
        name = f"e{experts}"
        spec = cuda_moe_spec(name, 2048, 768, experts, 8)
        files = emit(spec, "cuda")
        plan = json.loads(files[f"{name}.launch.json"])
        stats = ptxas_stats(nvcc_build(write_emitted(files, name, tmp_path), tmp_path))
        for g in plan["gemms"]:
            v = g["variants"][0]
            assert v["warps"] == 4 and v["route_kernel"]
            routed = stats[v["route_kernel"]].static_shared - stats[v["kernel"]].static_shared
            assert routed == extra
            assert routed <= one_token_routing_bytes(experts, 8, v["block"], 128)


ONE_LAUNCH = "fuse-align,fuse-swiglu,tile{one-launch=1},alloc"


def test_one_launch_plan():
    """tile{one-launch=1}: a call of one token with router logits is one kernel, moe_one_token,
    a grid of both GEMMs' first-bucket CTAs (gate/up's first) whose down CTAs sum the top-k,
    planned with its own state (ticket, finished CTAs, gate/up CTAs done per block, the top-k
    sum's and both GEMMs' split-K arrivals) and room for both GEMMs' partial sums at once; in
    the IR as the router's `one_launch`. Off by default (measured slower); an error naming the
    rule where the GEMMs, the pipeline or act-order do not allow it."""
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    files = emit(spec, "cuda")
    assert not json.loads(files["qwen3-30b-a3b.launch.json"])["one_launch"]
    assert "moe_one_token" not in files["qwen3-30b-a3b.cu"]
    for name, tiles in (("qwen3-30b-a3b", (24, 32)), ("mixtral-8x7b", (448, 64))):
        spec = moegen.load_spec(ROOT / "examples" / f"{name}.yaml")
        files = emit(spec, "cuda", ONE_LAUNCH)
        plan = json.loads(files[f"{name}.launch.json"])
        m, (up, down) = spec.moe, plan["gemms"]
        assert plan["one_launch"] and (up["ntiles"], down["ntiles"]) == tiles
        splits = [g["variants"][0]["split"] for g in (up, down)]
        kernel = next(k for k in plan["kernels"] if k["name"] == "moe_one_token")
        assert kernel["grid"] == [m.top_k * (tiles[0] * splits[0] + tiles[1] * splits[1]), 1, 1]
        assert kernel["block"] == up["variants"][0]["warps"] * 32
        ints = 2 + m.top_k + tiles[1] + m.top_k * sum(tiles)
        assert plan["state"]["one_launch"]["ints"] == ints
        assert plan["state"]["bytes"] >= plan["state"]["one_launch"]["offset"] + 4 * ints
        assert f"static_assert(STATE_INTS == {ints}," in files[f"{name}.cu"]
        rows = up["variants"][0]["block"] * 64 * 4 * m.top_k
        both = sum(t * sp * rows for t, sp in zip(tiles, splits) if sp > 1)
        assert plan["workspace"]["partials"]["bytes"] >= both
        assert "one_launch = true" in files["ir/03-tile.mir"]
    assert splits == [1, 8]        # (Mixtral's down GEMM splits K at T = 1)
    for pipeline, rule in (
            ("fuse-align,tile{one-launch=1},alloc", r"gate/up must end in SwiGLU"),
            ("fuse-align,fuse-swiglu,tile{one-launch=1,route-in-gemm=0},alloc",
             r"not routed in the GEMMs"),
            ("fuse-align,fuse-swiglu,tile{one-launch=1,moe-block=128},alloc",
             r"not routed in the GEMMs")):
        with pytest.raises(PipelineError, match=r"tile\{one-launch=1\}: .*" + rule):
            emit(spec, "cuda", pipeline)
    gptq = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b-gptq.yaml")
    with pytest.raises(PipelineError, match=r"one-launch=1.*act-order"):
        emit(gptq, "cuda", ONE_LAUNCH)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvcc_compiles_the_one_launch_layer(tmp_path, arch):
    """moe_one_token builds without warnings, spills or stack for examples with and without
    split-K at T = 1 and zero points; on sm_90a its CTAs count done gate/up work with a release
    and wait for it with acquire loads at GPU scope, and release no dependent launch."""
    def build(name: str) -> tuple[str, str, str]:
        folder = tmp_path / name
        folder.mkdir()
        src = write_emitted(emit(example_for(name, arch), "cuda", ONE_LAUNCH), name, folder)
        log = nvcc_build(src, folder, arch)
        if arch != "sm_90a":
            return name, log, ""
        return name, log, ptx_entries(source_ptx(folder, src, arch))["moe_one_token"]

    names = ("qwen3-30b-a3b", "mixtral-8x7b", "moe-seed", "qwen3-30b-a3b-awq")
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for name, log, body in pool.map(build, names):
            assert_no_spills(log)
            assert "moe_one_token" in log and "warning" not in log.lower(), (name, log)
            if arch == "sm_90a":
                assert "red.release.gpu.global.add" in body and "ld.acquire.gpu.global" in body
                assert "griddepcontrol" not in body


def test_named_template_arguments_match_the_header():
    """Each GEMM call's template arguments carry their parameter's name (/*NAME=*/value): the
    names of every call in the examples' sources, and of the dequant lowering's, are the
    header's parameters of that function, in its order."""
    header = "".join(device_headers().values())
    params = {name: re.findall(r"(?:int|bool) (\w+)", plist)
              for plist, name in re.findall(r"template <([^>]*)>\s*__device__ __forceinline__ "
                                            r"void (grouped_gemm\w*)\(", header)}
    assert set(params) == {"grouped_gemm", "grouped_gemm_wide", "grouped_gemm_wgmma",
                           "grouped_gemm_wgmma_tall"}
    sources = [(GENERATED / "cuda" / n / f"{n}.cu").read_text() for n in CUDA_EXAMPLES
               if n != "msd-seed"]
    spec = moegen.load_spec({**_msd_seed_dict(), "lowering": "dequant"})
    sources.append(emit(spec, "cuda")[f"{spec.name}.cu"])
    calls = [(fn, re.findall(r"/\*(\w+)=\*/", args)) for src in sources
             for fn, args in re.findall(r"moegen::(grouped_gemm\w*)<(.*?)>\(", src, re.S)]
    assert len(calls) > 20 and {fn for fn, _ in calls} == set(params)
    for fn, names in calls:
        assert names == params[fn][:len(names)], (fn, names)


def _msd_seed_dict() -> dict:
    import yaml
    return yaml.safe_load((ROOT / "examples" / "msd-seed.yaml").read_text())


ONE_CTA_ALIGN = "fuse-align,fuse-swiglu,tile{align-chunked-from=0},alloc"


@pytest.fixture(scope="module")
def chunked_qwen3(tmp_path_factory):
    """Qwen3-30B-A3B as built by default (calls of 2049 slots and more align chunked): its
    spec, files and CUDA source path."""
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    files = emit(spec, "cuda")
    return spec, files, write_emitted(files, "qwen3-30b-a3b", tmp_path_factory.mktemp("chunked"))


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_chunked_align_by_default_follows_its_count(tmp_path, chunked_qwen3):
    """By default a spec whose calls reach 2049 slots aligns those chunked: the plan lists the
    two chunked align kernels (a CTA a chunk of align_chunk slots) and sizes their counts after
    the rest of the workspace, for the most slots a call has; the second launch follows the
    first with PDL, releasing gate/up at its start and reading nothing before its wait, and
    sm_80 has neither instruction. With tile{align-chunked-from=0}, or where no call reaches
    2049 slots (by default or asked for), neither kernel is emitted and the counts take no
    bytes."""
    spec, files, src = chunked_qwen3
    def with_tokens(most):     # Qwen3 with calls of up to `most` tokens (8 slots each)
        data = yaml.safe_load((ROOT / "examples" / "qwen3-30b-a3b.yaml").read_text())
        return moegen.load_spec(dict(data, tokens={"max": most}))

    small = with_tokens(256)
    asked = "fuse-align,fuse-swiglu,tile{align-chunked-from=2049},alloc"
    for plain in (json.loads(emit(spec, "cuda", ONE_CTA_ALIGN)["qwen3-30b-a3b.launch.json"]),
                  json.loads(emit(small, "cuda")["qwen3-30b-a3b.launch.json"]),
                  json.loads(emit(small, "cuda", asked)["qwen3-30b-a3b.launch.json"])):
        assert plain["align_chunked_from"] == 0
        assert plain["workspace"]["align_counts"]["bytes"] == 0
        assert not {"moe_align_count", "moe_align_chunk"} & {k["name"] for k in plain["kernels"]}
    assert json.loads(emit(with_tokens(257), "cuda")["qwen3-30b-a3b.launch.json"])[
        "align_chunked_from"] == 2049
    plan = json.loads(files["qwen3-30b-a3b.launch.json"])
    kernels = {k["name"]: k for k in plan["kernels"]}
    assert plan["align_chunked_from"] == 2049
    assert kernels["moe_align"]["when"].endswith("T*K < 2049")
    for name in ("moe_align_count", "moe_align_chunk"):
        assert kernels[name]["when"].startswith("T*K >= 2049")
        assert kernels[name]["grid"][0] == f"ceil(T*K / {plan['align_chunk']})"
    assert "launch" in kernels["moe_align_chunk"] and "launch" not in kernels["moe_align_count"]
    ws = plan["workspace"]
    chunks = -(-spec.tokens.max * spec.moe.top_k // plan["align_chunk"])
    assert ws["align_counts"]["bytes"] == chunks * spec.moe.num_experts * 4
    assert ws["partials"]["offset"] + ws["partials"]["bytes"] <= ws["align_counts"]["offset"]
    assert ws["align_counts"]["offset"] + ws["align_counts"]["bytes"] <= ws["bytes"]
    for arch in ("sm_90a", "sm_80"):
        entries = source_ptx_entries(tmp_path, src, arch)
        count, chunk = entries["moe_align_count"], entries["moe_align_chunk"]
        if arch == "sm_80":
            assert "griddepcontrol" not in count + chunk
            continue
        assert "griddepcontrol.launch_dependents" in count and "griddepcontrol.wait" not in count
        before = chunk[:chunk.index("griddepcontrol.wait")]
        assert "griddepcontrol.launch_dependents" in before
        assert not re.search(r"\bld\.(global|shared)|cp\.async", before)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_only_multi_round_align_kernels_hold_a_stage(tmp_path, chunked_qwen3):
    """moe_align and moe_align_chunk, whose calls may take more than one round, each declare
    the stage of a pass in shared memory (a slot and a weight for each of its ALIGN_THREADS x
    ALIGN_ROUNDS places: 512 x 8 at Qwen3's 128 experts); moe_route_align, whose calls are one
    round, declares less shared memory in all than that stage, and moe_align_count only its
    counts."""
    spec, _, src = chunked_qwen3
    entries = source_ptx_entries(tmp_path, src, "sm_90a")

    def arrays(name):
        return [int(n) for n in re.findall(r"\.shared \.align \d+ \.b8 \w+\[(\d+)\]",
                                           entries[name])]

    stage = 512 * 8 * (4 + 4)
    assert stage in arrays("moe_align") and stage in arrays("moe_align_chunk")
    assert 0 < sum(arrays("moe_route_align")) < stage
    assert arrays("moe_align_count") == [4 * spec.moe.num_experts]


def test_align_chunked_from_must_not_be_negative():
    spec = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")
    with pytest.raises(PipelineError, match=r"align-chunked-from"):
        emit(spec, "cuda", "fuse-align,fuse-swiglu,tile{align-chunked-from=-1},alloc")
