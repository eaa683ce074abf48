"""IR (after the CUDA pipeline) -> CUDA C++ source, device header and launch plan.

The emitter reads everything from the lowered module: sizes from the types, the moe block per
token bucket and the GEMM tiles from the `tile` pass's attributes, the epilogue from
`fuse-swiglu`, the workspace offsets from `alloc`. Templates live in templates/cuda.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...version import __version__
from ..header import file_header
from ...ir import Module
from ...ir.ops.moe import EPILOGUES
from ...passes.pipelines import require_passes
from ...passes.tiling.cta import (ALIGN_CHUNK, ALIGN_WARPS, GEMM_TILE,
                                  RANK_EXPERTS_PER_THREAD, RANK_MIN_EXPERTS, align_up,
                                  tall_shared_bytes, tall_wide_block_k, wide_resident_ctas,
                                  wide_split_fill_ctas)
from ...passes.tiling.moe_buckets import starts_with_single_token_bucket
from ...build import ACTIVATION_TYPES
from ...render import render
from ...resources import data_dir
from ...spec import Spec
from ...target import GpuTarget, gpu_target
from ...tile_model import GemmTile
from .launch import GATE_UP_PDL_MIN_TOKENS, PDL_MIN_TOKENS
from .template_args import template_args

HEADER_FILE = "moegen_w4a16.cuh"    # the device header the generated .cu includes
HEADER_DIR = "moegen"                # and its include tree, beside it
ROUTER_WARPS = 4
ALIGN_THREADS = 32 * ALIGN_WARPS


def max_blocks(tokens: int, top_k: int, num_experts: int, block: int) -> int:
    """The most moe blocks a call with `tokens` tokens can need (sizes the GEMM grid)."""
    slots = tokens * top_k
    return min(slots, slots // block + min(num_experts, slots))


@dataclass
class GemmPlan:
    name: str            # gate_up | down
    weights: str         # w13 | w2
    a: str               # the IR value it reads rows from
    out: str             # the IR value it writes
    kdim: int
    n: int               # columns of the weight
    nout: int            # columns of the output
    ntiles: int
    row_div: int         # activation row = slot / row_div
    epilogue: int        # 0 none, 1 swiglu, 2 topk_sum
    sum_topk: int        # topk_sum: slot rows per token summed in the epilogue, else 0
    perm_gate_up: bool
    mul_weights: bool
    # per bucket: block, split, stages, warps, ks (k16 steps per ring stage), kernel
    variants: list[dict] = field(default_factory=list)


def device_headers() -> dict[str, str]:
    """The device header and its include tree (path relative to the .cu -> text): HEADER_FILE
    includes moegen/<job>.cuh (types, copy, sync, ring, mma, dequant, reduce, each GEMM form,
    msd)."""
    root = data_dir("templates") / "cuda"
    tree = sorted((root / HEADER_DIR).glob("*.cuh"))
    return {HEADER_FILE: (root / HEADER_FILE).read_text(),
            **{f"{HEADER_DIR}/{p.name}": p.read_text() for p in tree}}


@dataclass
class CudaProgram:
    source: str
    headers: dict[str, str]     # device_headers()
    plan: dict
    ir: str

    @property
    def header_text(self) -> str:
        """Every header the source includes, in one text (what a compile cache must key on)."""
        return "".join(f"// {name}\n{text}" for name, text in sorted(self.headers.items()))

    def files(self, stem: str) -> dict[str, str]:
        return {f"{stem}.cu": self.source, **self.headers,
                f"{stem}.launch.json": json.dumps(self.plan, indent=2) + "\n"}


def _gemm_plans(module: Module, gpu: GpuTarget) -> list[GemmPlan]:
    plans = []
    for op in module.function().ops:
        if op.NAME != "moe.grouped_gemm_w4a16":
            continue
        gate_up = not op.attr("mul_topk_weights")
        kdim = op.operands[0].type.shape[1].value
        n = op.operands[1].type.shape[2].value
        tile = op.attrs["tile"]
        zeros = bool(op.attr("zero_points"))
        # act-order: the GEMM reads its activations gathered per slot (moe_permute_x, _act),
        # one row a slot
        permuted = bool(op.attr("act_order"))
        epi = EPILOGUES.index(op.attr("epilogue"))   # the template's EPILOGUE number
        g = GemmPlan(
            name="gate_up" if gate_up else "down", weights="w13" if gate_up else "w2",
            a=(f"{op.operands[0].name}_permuted" if permuted else op.operands[0].name),
            out=op.results[0].name, kdim=kdim, n=n,
            nout=op.results[0].type.shape[1].value, ntiles=-(-n // 64),
            row_div=1 if permuted else int(op.attr("topk")), epilogue=epi,
            sum_topk=int(op.attr("sum_topk")) if op.attr("epilogue") == "topk_sum" else 0,
            perm_gate_up=gate_up,
            mul_weights=bool(op.attr("mul_topk_weights")))
        buckets = op.attrs["block_buckets"]
        single = starts_with_single_token_bucket(buckets)
        for i, ((edge, block), t) in enumerate(zip(buckets, GemmTile.per_bucket(tile))):
            split, stages, warps, block_k = t.split_k, t.stages, t.warps, t.block_k
            cols, rows, wg, ctas, many, tall = (t.col_tiles, t.warp_rows, t.wgmma,
                                                t.ctas_per_sm, t.split_many, t.tall)
            one_token = single and i == 0
            # the down GEMM's K-split CTA: launched with programmatic dependent launch where
            # the GPU has it (sm_90 and later), in calls of PDL_MIN_TOKENS tokens or more, and
            # in the single-token bucket, whose gate/up releases it only after its K loop
            # (launch.py). The wide CTAs launch plainly, also in a decode bucket (measured at
            # Mixtral T = 64 there: 320 us with PDL against 301 without; at T = 56 even).
            # The gate/up GEMM's K-split CTA follows the align kernel so (its CTAs resident
            # while align runs; they wait for it first: WAITS_FIRST in the device header), from
            # GATE_UP_PDL_MIN_TOKENS tokens and in the single-token bucket.
            least = PDL_MIN_TOKENS if g.name == "down" else GATE_UP_PDL_MIN_TOKENS
            follows_from = (None if cols > 1 else 1 if one_token
                            else least if edge >= least else None)
            # named by what varies; k per stage and warps only where they are not the defaults;
            # the wide CTA (cols > 1 column tiles, warps from its shape) by its column tiles
            # and rows per warp
            if tall:
                kernel = f"moe_gemm_{g.name}_b{block}_c{cols}_tall_p{stages}_k{block_k}"
            elif cols > 1:
                kernel = (f"moe_gemm_{g.name}_b{block}_c{cols}_r{rows}_p{stages}_k{block_k}"
                          + (f"_s{many}or{split}" if many != split else
                             f"_s{split}" if split > 1 else "") + ("_wg" if wg else "")
                          + (f"_o{ctas}" if ctas else ""))
            else:
                kernel = (f"moe_gemm_{g.name}_b{block}_s{split}_p{stages}"
                          + (f"_k{block_k}" if block_k != GEMM_TILE["block_k"] else "")
                          + (f"_w{warps}" if warps != GEMM_TILE["warps"] else ""))
            # a capped wide CTA: the CTAs an SM holds (its split sized for them); split_many <
            # split: the kernel takes split_many K ranges in calls whose blocks fill fill_ctas
            # CTAs so, else split (call_split in the device header)
            resident = (wide_resident_ctas(gpu, block, cols, warps, stages, block_k, zeros, wg)
                        if ctas else 0)
            g.variants.append({"max_tokens": edge, "block": block, "split": split,
                               "split_many": many, "resident_ctas": resident,
                               "fill_ctas": (wide_split_fill_ctas(resident, gpu)
                                             if many != split else 0),
                               "stages": stages, "warps": warps, "ks": block_k // 16,
                               "col_tiles": cols, "warp_rows": rows, "wgmma": wg,
                               "ctas_per_sm": ctas, "tall": tall,
                               # dynamic shared memory of the launch (0: static only)
                               "shared_bytes": (tall_shared_bytes(block, stages, block_k,
                                                                  zeros)
                                                if tall else 0),
                               # (the wide CTA in a tall tile's place: k16 steps a stage)
                               "wide_ks": tall_wide_block_k(block_k) // 16 if tall else 0,
                               "follows_from": follows_from,
                               "release_after_loop": g.name == "gate_up" and one_token
                                                     and cols == 1,
                               "kernel": kernel})
        plans.append(g)
    if len(plans) != 2:
        raise ValueError("the CUDA MoE emitter expects a gate/up and a down grouped GEMM")
    return plans


def _one_launch(spec: Spec, gemms: list, asked: bool) -> dict | None:
    """The one-launch layer for one token (moe_one_token in the template), where the IR's
    router has `one_launch` (the tile pass checked what it needs: both first buckets on the
    K-split CTA of one moe block and warp count, SwiGLU in gate/up's epilogue): its grid at
    most (one CTA a work item: each GEMM's single-token CTAs, gate/up's first; the runtime
    launches fewer persistent CTAs: runtime.resident_grid), its state ints (the template's
    one_launch namespace says what each holds) and its split-K partial-sum bytes (both GEMMs'
    at once)."""
    if not asked:
        return None
    m = spec.moe
    vu, vd = gemms[0].variants[0], gemms[1].variants[0]
    if not (vu["col_tiles"] == vd["col_tiles"] == 1 and vu["block"] == vd["block"]
            and vu["warps"] == vd["warps"] and gemms[0].epilogue == EPILOGUES.index("swiglu")):
        raise ValueError("moe.topk_softmax has one_launch, but the first buckets' GEMMs are not "
                         "K-split CTAs of one block and warp count with SwiGLU in gate/up")
    gu_tiles, dn_tiles = gemms[0].ntiles, gemms[1].ntiles
    rows = align_up(vu["block"], 8)

    def partials(tiles: int, split: int) -> int:
        return m.top_k * tiles * split * rows * 64 * 4 if split > 1 else 0
    gate_up_items = m.top_k * gu_tiles * vu["split"]
    ctas = gate_up_items + m.top_k * dn_tiles * vd["split"]
    return {"kernel": "moe_one_token", "grid": [ctas, 1, 1], "gate_up_items": gate_up_items,
            "block": vu["warps"] * 32,
            "state_ints": 2 + m.top_k + dn_tiles + m.top_k * (gu_tiles + dn_tiles),
            "partial_bytes": partials(gu_tiles, vu["split"]) + partials(dn_tiles, vd["split"])}


def _workspace(spec: Spec, module: Module, gemms: list, summed: bool,
               one_launch: dict | None, chunked_from: int) -> tuple[dict, dict]:
    """The launch plan's workspace and state. The workspace is scratch a call fills before it
    reads it, so layers on one stream share it (runtime: workspace.py): the alloc pass's arena
    (its buffers by result name), then the split-K partial sums sized for the largest split
    bucket, then (act-order) the GEMMs' activations gathered per slot, then (where the tile pass
    chose the chunked align: chunked_from > 0) its counts. The state is the layer's
    own, zero between calls (the kernels leave it so): the split-K arrival counters, then
    (topk_sum) one arrival counter per column tile of the down GEMM, then the one-launch
    kernel's."""
    m = spec.moe
    offsets = {}
    for op in module.function().ops:
        for r, off in zip(op.results, op.attrs.get("offsets", [])):
            if off >= 0:
                offsets[r.name] = {"offset": off,
                                   "bytes": r.type.num_bytes({"?": spec.tokens.max}),
                                   "type": str(r.type)}
    arena = module.attrs["workspace"]["bytes"]
    partial_bytes, counter_ints = 0, 0
    for g in gemms:
        for v in g.variants:
            if v["split"] > 1:
                blocks = max_blocks(v["max_tokens"], m.top_k, m.num_experts, v["block"])
                rows = align_up(v["block"], 8)          # the kernel's n8 tiles of rows
                partial_bytes = max(partial_bytes,
                                    blocks * g.ntiles * v["split"] * rows * 64 * 4)
                counter_ints = max(counter_ints, blocks * g.ntiles)
    if one_launch:          # both GEMMs' partial sums at once
        partial_bytes = max(partial_bytes, one_launch["partial_bytes"])
    align = module.attrs["workspace"]["alignment"]
    partials_at = align_up(arena, align)
    total = partials_at + max(align_up(partial_bytes, align), align)
    if spec.quant.act_order:      # [T*K, H] and [T*K, I] of the activations' type, gathered
        for g in gemms:
            nbytes = spec.tokens.max * m.top_k * g.kdim * 2
            offsets[g.a] = {"offset": total, "bytes": nbytes,
                            "type": f"tensor<{spec.tokens.max * m.top_k}x{g.kdim}x"
                                    f"{ACTIVATION_TYPES[spec.dtype]}>"}
            total += align_up(nbytes, align)
    # the chunked align's counts: [chunks, E] int32 for the most slots a call has
    slots = spec.tokens.max * m.top_k
    chunks = -(-slots // ALIGN_CHUNK) if chunked_from else 0
    counts_bytes = chunks * m.num_experts * 4
    align_counts = {"offset": total, "bytes": counts_bytes}
    total += align_up(counts_bytes, align)
    # topk_sum: one arrival counter per column tile of the down GEMM, after the split-K ones
    sum_counters_at = max(align_up(counter_ints * 4, align), align)
    sum_counter_ints = gemms[1].ntiles if summed else 0
    workspace = {"bytes": total, "alignment": align, "arena_bytes": arena, "buffers": offsets,
                 "partials": {"offset": partials_at, "bytes": partial_bytes},
                 "align_counts": align_counts}
    one_at = sum_counters_at + align_up(sum_counter_ints * 4, align)
    one_ints = one_launch["state_ints"] if one_launch else 0
    state = {"bytes": one_at + align_up(one_ints * 4, align),
             "counters": {"offset": 0, "ints": counter_ints},
             **({"sum_counters": {"offset": sum_counters_at, "ints": sum_counter_ints}}
                if summed else {}),
             **({"one_launch": {"offset": one_at, "ints": one_ints}} if one_launch else {})}
    return workspace, state


def emit_moe(spec: Spec, module: Module, pipeline: str, arch: str | None = None,
             gpu: GpuTarget | None = None) -> CudaProgram:
    """The CUDA program of a lowered MoE module for `arch` (the spec's where None) on `gpu`
    (the table's entry of the arch where None: the tile pass's GPU)."""
    m = spec.moe
    fn = module.function()
    require_passes(spec.pipeline, "cuda", pipeline, [
        name for name, ran in (
            ("tile", all("tile" in op.attrs for op in fn.walk()
                         if op.NAME == "moe.grouped_gemm_w4a16")),
            ("alloc", "workspace" in module.attrs)) if not ran])
    router = fn.op("moe.topk_softmax")
    fused_tokens = router.attr("align_tokens")
    chunked_from = fn.op("moe.align").attr("chunked_from")    # 0: align in one CTA
    gemms = _gemm_plans(module, gpu or gpu_target(arch or spec.cuda_arch))
    zeros, act_order = not spec.quant.symmetric, spec.quant.act_order
    # a call of one token with router logits is routed inside every CTA of both GEMMs where
    # the tile pass says (their first bucket runs the K-split CTA): by a form of that bucket's
    # kernel of its own (route_kernel: the same arguments and the logits), so that the kernel
    # other calls of the bucket run stays as it is
    gemm_route = bool(router.attr("gemm_route"))
    if gemm_route and any(g.variants[0]["col_tiles"] > 1 for g in gemms):
        raise ValueError("moe.topk_softmax has gemm_route, but a first bucket runs a wide CTA "
                         "(the tile pass turns it off there)")
    for g in gemms:
        first = g.variants[0]["kernel"]
        for v in g.variants:
            v["route_kernel"] = f"{first}_routed" if gemm_route and v["kernel"] == first else None
    fused = gemms[0].epilogue == EPILOGUES.index("swiglu")
    summed = gemms[1].sum_topk > 0
    one_launch = _one_launch(spec, gemms, bool(router.attr("one_launch")))
    # buckets that share a block and split share a kernel: define each kernel once
    unique = [{**g.__dict__, "variants": list({v["kernel"]: v for v in g.variants}.values())}
              for g in gemms]
    header = file_header(spec, pipeline)
    source = render("cuda/moe_w4a16.cu.j2", header=header, targs=template_args,
                    E=m.num_experts, TOPK=m.top_k,
                    H=m.hidden_size, I=m.intermediate_size, G=spec.quant.group_size,
                    renormalize=m.renormalize, fuse_swiglu=fused, fuse_topk_sum=summed,
                    gemms=unique,
                    ROUTER_WARPS=ROUTER_WARPS, ALIGN_THREADS=ALIGN_THREADS,
                    ALIGN_CHUNK=ALIGN_CHUNK, ALIGN_CHUNKED_FROM=chunked_from,
                    ROUTE_ALIGN_MAX_TOKENS=fused_tokens, router=router.attr("router"),
                    gemm_route=gemm_route, RANK_MIN_EXPERTS=RANK_MIN_EXPERTS,
                    RANK_EXPERTS_PER_THREAD=RANK_EXPERTS_PER_THREAD,
                    bf16=spec.dtype == "bfloat16", zero_points=zeros,
                    act_order=act_order, one_launch=one_launch)

    workspace, state = _workspace(spec, module, gemms, summed, one_launch, chunked_from)
    first = 2 if gemm_route else 1        # the fewest tokens the router or align kernel sees
    buckets = gemms[0].variants
    plan = {
        "moegen": __version__, "spec": spec.name, "spec_hash": spec.hash, "passes": pipeline,
        "arch": arch or spec.cuda_arch,
        "sizes": {"tokens_max": spec.tokens.max, "hidden": m.hidden_size,
                  "intermediate": m.intermediate_size, "experts": m.num_experts,
                  "top_k": m.top_k, "group": spec.quant.group_size},
        "buckets": [[v["max_tokens"], v["block"]] for v in buckets],
        "kernels": [
            *([{"name": "moe_route_align", "grid": [1, 1, 1], "block": ALIGN_THREADS,
                "when": (f"router logits given, T = {first}..{fused_tokens}"
                         if fused_tokens >= first else "never: T = 1 is routed in the GEMMs")}]
              if fused_tokens else []),
            {"name": "moe_router_topk", "grid": ["ceil(T / %d)" % ROUTER_WARPS, 1, 1],
             "block": ROUTER_WARPS * 32,
             "when": f"router logits given, T >= {max(first, fused_tokens + 1)}"},
            {"name": "moe_align", "grid": [1, 1, 1], "block": ALIGN_THREADS,
             "when": f"routing given, or T >= {max(first, fused_tokens + 1)}"
                     + (f"; T*K < {chunked_from}" if chunked_from else "")},
            *[{"name": name, "grid": [f"ceil(T*K / {ALIGN_CHUNK})", 1, 1], "block": ALIGN_THREADS,
               "when": f"T*K >= {chunked_from}: {what}", **launch}
              for name, what, launch in (
                  ("moe_align_count", "each chunk's slots per expert", {}),
                  ("moe_align_chunk", "a CTA a chunk writes its slots",
                   {"launch": "programmatic dependent (sm_90 and later)"}))
              if chunked_from],
            *[{"name": v["kernel"], "bucket_max_tokens": v["max_tokens"],
               "grid": [f"max_blocks(T, block={v['block']})", g.ntiles // v["col_tiles"],
                        v["split"]],
               "block": v["warps"] * 32, "reads": g.a, "writes": g.out,
               **({"shared_bytes": v["shared_bytes"]} if v["shared_bytes"] else {}),
               **({"launch": f"programmatic dependent (sm_90 and later), T >= {v['follows_from']}"}
                  if v["follows_from"] is not None else {})}
              for g in gemms for v in g.variants],
            # (T = 1 with router logits: the gate/up one launches first, plainly)
            *[{"name": g.variants[0]["route_kernel"], "bucket_max_tokens": 1,
               "grid": [max_blocks(1, m.top_k, m.num_experts, g.variants[0]["block"]), g.ntiles,
                        g.variants[0]["split"]],
               "block": g.variants[0]["warps"] * 32, "reads": g.a, "writes": g.out,
               "when": "T = 1 with router logits: each CTA routes the token itself",
               **({"launch": "programmatic dependent (sm_90 and later)"}
                  if g.name == "down" and g.variants[0]["follows_from"] is not None else {})}
              for g in gemms if g.variants[0]["route_kernel"]],
            *([{"name": one_launch["kernel"], "grid": one_launch["grid"],
                "gate_up_items": one_launch["gate_up_items"],
                "block": one_launch["block"], "bucket_max_tokens": 1,
                "when": "T = 1 with router logits: the whole layer in one launch (gate/up, "
                        "down and the top-k sum; persistent CTAs, at most the grid's, route "
                        "the token once, then take the GEMMs' CTAs as work items)"}]
              if one_launch else []),
            *([] if fused else [{"name": "moe_swiglu", "grid": ["ceil(T*K*I / 256)", 1, 1],
                                 "block": 256}]),
            *([] if summed else [
                {"name": name, "grid": ["ceil(T*H/8 / 256)", 1, 1], "block": 256, "when": when,
                 "launch": "programmatic dependent (sm_90 and later)"}
                for name, when in (("moe_aggregate", "the layer's own routing (every slot routed)"),
                                   ("moe_aggregate_checked",
                                    "the caller's ids: slots outside [0, E) left out"))]),
            *([{"name": name, "grid": [f"ceil(T*K*{what} / 256)", 1, 1], "block": 256,
                "when": f"act-order: before the {gemm} GEMM"}
               for name, what, gemm in (("moe_permute_x", "H", "gate/up"),
                                        ("moe_permute_act", "I", "down"))]
              if act_order else []),
        ],
        "dtype": spec.dtype,
        "zero_points": zeros,
        "act_order": act_order,
        "router": router.attr("router"),
        "route_align_max_tokens": fused_tokens,
        "align_chunk": ALIGN_CHUNK,
        "align_chunked_from": chunked_from,
        "gemm_route": gemm_route,
        "one_launch": one_launch is not None,
        "max_blocks": "min(T*K, floor(T*K / block) + min(E, T*K))",
        "gemms": [{k: v for k, v in g.__dict__.items()} for g in gemms],
        "workspace": workspace,
        "state": state,
    }
    return CudaProgram(source=source, headers=device_headers(), plan=plan, ir=str(module))
