"""A CUDA launch plan as a table for people (`moegen inspect --launches`): which kernel each
token bucket runs, with its CTA, K split, copy ring, threads and launch."""
from __future__ import annotations

from ...passes.tiling.cta import WGMMA_ARCHS
from .launch import arch_has_pdl


def _cta(v: dict, arch: str) -> str:
    # (a kernel whose tile asks for warpgroup MMA builds the mma.sync form on other archs)
    wgmma = v["wgmma"] and arch in WGMMA_ARCHS
    if v["tall"]:
        return "tall tile" if wgmma else f"wide, block {v['block']} (the tall tile's, no wgmma)"
    if v["col_tiles"] > 1:
        return (f"wide, {v['col_tiles']} col tiles x {v['warp_rows']} rows a warp"
                + (", wgmma" if wgmma else ""))
    return f"K-split, {v['warps']} warps"


def _split(v: dict) -> str:
    if v["split_many"] != v["split"]:
        return f"{v['split_many']} or {v['split']}, per call"
    return str(v["split"])


def _launch(v: dict, arch: str) -> str:
    if v["follows_from"] is None or not arch_has_pdl(arch):
        return "plain"
    return (f"PDL from T = {v['follows_from']}"
            + ("; releases down after its K loop" if v["release_after_loop"] else ""))


def table_rows(head: list[str], rows: list[list[str]]) -> list[str]:
    """A header, its rule and the rows, each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head).rstrip(), fmt.format(*("-" * w for w in widths))] + [
        fmt.format(*r).rstrip() for r in rows]


def _one_token_lines(plan: dict) -> list[str]:
    """A line for a plan whose call of one token with router logits is one launch
    (tile{one-launch=1})."""
    return (["T = 1 with router logits: one launch, moe_one_token (persistent CTAs take both "
             "GEMMs' CTAs as work items, the top-k sum in the down GEMM's)"]
            if plan.get("one_launch") else [])


def _align_line(plan: dict) -> str:
    """How a call's routing is aligned: one CTA, or from align_chunked_from slots a CTA per
    chunk."""
    frm, k = plan["align_chunked_from"], plan["sizes"]["top_k"]
    if not frm:
        return "align: one CTA"
    return (f"align: one CTA; from {frm} slots (T >= {-(-frm // k)}) a CTA per "
            f"{plan['align_chunk']} slots, counts then chunks"
            + (" (PDL)" if arch_has_pdl(plan["arch"]) else ""))


def moe_launch_table(plan: dict) -> str:
    """Per token bucket and GEMM of an MoE plan: the calls it serves, the moe block, the CTA,
    the K split, the copy ring, the threads (and the register cap), the launch, the kernel."""
    lines = [f"{plan['spec']}: plan for {plan['arch']}, passes {plan['passes']}",
             f"router {plan['router']}"
             + (f", routed inside the align kernel up to T = {plan['route_align_max_tokens']}"
                if plan["route_align_max_tokens"] else "")
             + ("; T = 1 with router logits: the first bucket's kernels in their routing form "
                "(*_routed: each CTA routes the token; gate/up launched plainly)"
                if plan["gemm_route"] else "")
             + f"; workspace {plan['workspace']['bytes'] / 2 ** 20:.1f} MiB",
             "top-k sum: " + ("in the down GEMM's epilogue" if plan["gemms"][-1]["sum_topk"]
                              else "its own kernel, after the down GEMM"
                              + (" (PDL)" if arch_has_pdl(plan["arch"]) else "")),
             _align_line(plan), *_one_token_lines(plan), ""]
    head = ["calls", "block", "GEMM", "CTA", "K split", "ring", "threads", "launch", "kernel"]
    rows = []
    floor = 1
    for i, (edge, block) in enumerate(plan["buckets"]):
        calls = f"T = {floor}" if floor == edge else f"T = {floor}..{edge}"
        for g in plan["gemms"]:
            v = g["variants"][i]
            threads = str(v["warps"] * 32) + (f", capped for {v['ctas_per_sm']} an SM"
                                              if v["ctas_per_sm"] else "")
            if v["resident_ctas"] and v["resident_ctas"] < v["ctas_per_sm"]:
                threads += f" ({v['resident_ctas']} fit its shared memory)"
            # (the tall tile built without warpgroup MMA stages wide_ks k16 steps)
            ks = v["wide_ks"] if v["tall"] and plan["arch"] not in WGMMA_ARCHS else v["ks"]
            rows.append([calls, str(block), g["name"], _cta(v, plan["arch"]), _split(v),
                         f"{v['stages']} x {16 * ks} k", threads, _launch(v, plan["arch"]),
                         v["kernel"]])
            calls = ""
        floor = edge + 1
    return "\n".join(lines + table_rows(head, rows))


def msd_launch_table(plan: dict) -> str:
    """Per kernel of an MSD plan: grid, threads, shared memory and, for the msd lowering, the
    rotating slots of its buffers."""
    lines = [f"{plan['spec']}: plan for {plan['arch']}, passes {plan['passes']}, lowering "
             f"{plan['lowering']} (the spec's schedule: {plan['default']})", ""]
    head = ["kernel", "grid", "threads", "shared bytes", "slots"]
    rows = [[k["name"], " x ".join(map(str, k["grid"])), str(k["block"]),
             str(k.get("shared_bytes", 0)),
             ", ".join(f"{name} {n}" for name, n in k.get("slots", {}).items())]
            for k in plan["kernels"]]
    return "\n".join(lines + table_rows(head, rows))
