"""Ops of the W4A16 Mixture-of-Experts pipeline (see seeds/README.md for their semantics).

Symbols used in the types: ``?`` tokens, K top-k, E experts, H hidden, I intermediate,
G quantization group, B the largest moe block size a call may use (bounds the index buffers).
"""
from __future__ import annotations

from ..core import Attr, Op
from ..types import Dim
from ...tile_model import GemmTile


def _block_attr_ok(op: Op) -> None:
    block = op.attr("block")
    if isinstance(block, int):
        op.check(block >= 1, f"attribute block = {block} must be >= 1")
    buckets = op.attrs.get("block_buckets")
    if buckets is not None:
        op.check(all(isinstance(b, list) and len(b) == 2 for b in buckets),
                 "attribute block_buckets must be a list of [max_tokens, block] pairs")
        edges = [b[0] for b in buckets]
        op.check(edges == sorted(edges), "attribute block_buckets must ascend in max_tokens")
        if isinstance(block, int):
            op.check(all(1 <= b[1] <= block for b in buckets),
                     f"every bucket's block must be in [1, block = {block}]")


def _gemm_tile_ok(op: Op, kdim: Dim, group: Dim) -> None:
    """A grouped GEMM's tile (the tile pass's): every GemmTile field, one entry a bucket; where
    K and the group are known, each bucket's K split as its kernel can run it (the device
    headers' static_asserts): the K-split CTA's k16 steps whole over split_k x warps x
    block_k / 16 and no per-call split (its kernel has none), the wide CTA's and the tall
    tile's K ranges whole scale groups."""
    tile = op.attrs.get("tile")
    if tile is None:
        return
    try:
        tiles = GemmTile.per_bucket(tile)
    except ValueError as exc:
        op.check(False, f"attribute {exc}")
        return
    buckets = op.attrs.get("block_buckets")
    op.check(buckets is not None and len(tiles) == len(buckets),
             f"attribute tile has {len(tiles)} buckets, block_buckets "
             f"{'none' if buckets is None else len(buckets)}")
    for t in tiles:
        op.check(t.split_many <= t.split_k and t.col_tiles >= 1 and t.warps >= 1
                 and t.stages >= 1 and t.split_k >= 1,
                 f"attribute tile: a bucket's {t} must have positive warps, stages, column "
                 f"tiles and split_k, split_many <= split_k")
        if not (kdim.is_static and group.is_static) or min(t.split_k, t.warps, t.block_k) < 1:
            continue
        k, g = kdim.value, group.value
        if t.col_tiles == 1 and not t.tall:
            per = t.split_k * t.warps * (t.block_k // 16)
            op.check(k // 16 % per == 0 and t.split_many == t.split_k,
                     f"attribute tile: a K-split CTA's K = {k} must split evenly into split_k "
                     f"{t.split_k} x {t.warps} warps x {t.block_k}-deep stages, one split for "
                     f"every call (split_many {t.split_many})")
        else:
            op.check(all((k // g) % sp == 0 for sp in {t.split_k, t.split_many}),
                     f"attribute tile: a wide CTA's K = {k} must split into split_k "
                     f"{t.split_k} (and split_many {t.split_many}) ranges of whole groups of {g}")


TILE_ATTRS = {"block_buckets": Attr("any", None, choice=True),
              "tile": Attr("dict", None, choice=True)}


ROUTERS = ("redux", "shuffle")    # the first is the default


class TopkSoftmaxOp(Op):
    """softmax over experts, the k largest (ties -> lower expert id), optional renormalize.

    Kernel choices (the tile pass records them): router, how a warp finds each of the k;
    align_tokens, up to how many tokens the routing runs inside the align kernel's CTA; and
    gemm_route, whether a call of one token is routed inside the GEMMs' CTAs instead; and
    one_launch, whether that call runs both GEMMs' CTAs in one grid."""
    NAME = "moe.topk_softmax"
    OPERANDS = ("logits",)
    RESULTS = ("ids", "weights")
    ATTRS = {"k": Attr("dim"), "renormalize": Attr("bool", True),
             "router": Attr("str", ROUTERS[0], choice=True),
             "align_tokens": Attr("int", 0, choice=True),
             "gemm_route": Attr("bool", False, choice=True),
             "one_launch": Attr("bool", False, choice=True)}

    def verify(self):
        logits = self.tensor(self.operands[0], "logits", "f32", 2)
        t, e = logits.shape
        k = Dim.of(self.attr("k"))
        if k.is_static:
            self.check(k.value >= 1, f"attribute k = {k} must be >= 1")
            if e.is_static:
                self.check(k.value <= e.value, f"attribute k = {k} must be <= the number of "
                                               f"experts ({e})")
        self.expect_result(0, (t, k), "i32")
        self.expect_result(1, (t, k), "f32")
        router = self.attr("router")
        self.check(router in ROUTERS, f"attribute router = {router!r} must be one of {ROUTERS}")
        self.check(self.attr("align_tokens") >= 0, "attribute align_tokens must be >= 0")
        self.check(not self.attr("one_launch") or self.attr("gemm_route"),
                   "attribute one_launch needs gemm_route (the one launch routes in the GEMMs)")


class CountOp(Op):
    """Slots routed to each expert."""
    NAME = "moe.count"
    OPERANDS = ("ids",)
    RESULTS = ("counts",)
    ATTRS = {"num_experts": Attr("dim")}

    def verify(self):
        self.tensor(self.operands[0], "ids", "i32", 2)
        self.expect_result(0, (self.attr("num_experts"),), "i32")


class PadScanOp(Op):
    """Counts rounded up to the block, their exclusive prefix sum, and the padded total."""
    NAME = "moe.pad_scan"
    OPERANDS = ("counts",)
    RESULTS = ("padded_counts", "padded_offsets", "total")
    ATTRS = {"block": Attr("dim"), **TILE_ATTRS}

    def verify(self):
        counts = self.tensor(self.operands[0], "counts", "i32", 1)
        _block_attr_ok(self)
        self.expect_result(0, counts.shape, "i32")
        self.expect_result(1, counts.shape, "i32")
        self.expect_result(2, (1,), "i32")


class SlotListsOp(Op):
    """slots[e, j] = the j-th slot (ascending) routed to expert e; rest filled with T*K."""
    NAME = "moe.slot_lists"
    OPERANDS = ("ids",)
    RESULTS = ("slots",)
    ATTRS = {"num_experts": Attr("dim")}

    def verify(self):
        t, k = self.tensor(self.operands[0], "ids", "i32", 2).shape
        self.expect_result(0, (self.attr("num_experts"), t * k), "i32")


class MarlinIndicesOp(Op):
    """sorted_token_ids / expert_ids / topk_weights_flat from the slot lists and offsets."""
    NAME = "moe.marlin_indices"
    OPERANDS = ("slots", "counts", "padded_offsets", "weights")
    RESULTS = ("sorted_ids", "expert_ids", "weights_flat")
    ATTRS = {"block": Attr("dim"), "capacity_block": Attr("dim"), **TILE_ATTRS}

    def verify(self):
        e, s = self.tensor(self.operands[0], "slots", "i32", 2).shape
        counts = self.tensor(self.operands[1], "counts", "i32", 1)
        self.same_dim(counts.shape[0], e, "counts must have one entry per expert")
        t, k = self.tensor(self.operands[3], "weights", "f32", 2).shape
        self.same_dim(s, t * k, "slot lists must hold T*K slots per expert")
        _block_attr_ok(self)
        rows = t * k + e * Dim.of(self.attr("capacity_block"))
        self.expect_result(0, (rows,), "i32")
        self.expect_result(1, (t * k,), "i32")
        self.expect_result(2, (rows,), "f32")


class AlignOp(Op):
    """count + pad_scan + slot_lists + marlin_indices in one op (after the fuse-align pass).

    Kernel choice (the tile pass records it): chunked_from, from how many slots (T*K) the
    routing runs in chunks, a CTA each, rather than in one CTA (0: never)."""
    NAME = "moe.align"
    OPERANDS = ("ids", "weights")
    RESULTS = ("sorted_ids", "expert_ids", "weights_flat", "total")
    ATTRS = {"num_experts": Attr("dim"), "block": Attr("dim"), "capacity_block": Attr("dim"),
             "chunked_from": Attr("int", 0, choice=True), **TILE_ATTRS}

    def verify(self):
        t, k = self.tensor(self.operands[0], "ids", "i32", 2).shape
        self.check(self.attr("chunked_from") >= 0, "attribute chunked_from must be >= 0")
        w = self.tensor(self.operands[1], "weights", "f32", 2)
        self.check(w.shape == (t, k), f"weights {w} must have the shape of ids")
        _block_attr_ok(self)
        rows = t * k + Dim.of(self.attr("num_experts")) * Dim.of(self.attr("capacity_block"))
        self.expect_result(0, (rows,), "i32")
        self.expect_result(1, (t * k,), "i32")
        self.expect_result(2, (rows,), "f32")
        self.expect_result(3, (1,), "i32")


EPILOGUES = ("none", "swiglu", "topk_sum")
ACTIVATION_TYPES = ("f16", "bf16")   # of x, the scales and the outputs (one per pipeline)


def _activation(op: Op, value, what: str) -> tuple[str, tuple]:
    """(element type, shape) of an activation operand: f16 or bf16, rank 2."""
    t = op.tensor(value, what, None, 2)
    op.check(t.dtype in ACTIVATION_TYPES or t.dtype.isupper(),      # (or a symbol, unbound)
             f"{what} %{value.name} must have element type {' or '.join(ACTIVATION_TYPES)}, "
             f"got {t.dtype}")
    return t.dtype, t.shape


class GroupedGemmW4A16Op(Op):
    """out[slot] = (x[slot / topk] @ dequant(w_q[e], w_scale[e])) (* weight[slot]), per padded row.

    dequant: w[k, n] = (w_q[k, n] - w_zero[g, n]) * w_scale[g, n] with g = k / group_size, or
    g = g_idx[k] with act_order (GPTQ's desc_act: any group of each row). The extra operands
    come in that order, w_zero (i4, [E, K/G, N]) when zero_points, g_idx (i32, [E, K]) when
    act_order. Output rows are in slot order (padding rows write nothing). epilogue = swiglu
    applies silu(first half) * second half, halving the columns. epilogue = topk_sum (after the
    routing weights) also gives the second result sum[t] = out[t * sum_topk + k] summed in k
    order, as moe.aggregate does.
    """
    NAME = "moe.grouped_gemm_w4a16"
    OPERANDS = ("x", "w_q", "w_scale", "sorted_ids", "expert_ids", "total", "weights_flat",
                "extras*")
    RESULTS = ("out", "sum?")
    ATTRS = {"block": Attr("dim"), "topk": Attr("dim"), "mul_topk_weights": Attr("bool"),
             "group_size": Attr("dim"), "epilogue": Attr("str", "none"),
             "sum_topk": Attr("dim", 1), "zero_points": Attr("bool", False),
             "act_order": Attr("bool", False), **TILE_ATTRS}

    def verify(self):
        act, (rows, kdim) = _activation(self, self.operands[0], "x")
        e, kw, n = self.tensor(self.operands[1], "w_q", "i4", 3).shape
        self.same_dim(kw, kdim, "w_q's K must equal x's columns")
        g = Dim.of(self.attr("group_size"))
        if g.is_static and kdim.is_static:
            self.check(kdim.value % g.value == 0,
                       f"K = {kdim} must be a multiple of group_size = {g}")
        self.expect_operand(2, (e, kdim / g, n), act)
        extras = self.operands[7:]
        zero, order = self.attr("zero_points"), self.attr("act_order")
        self.check(len(extras) == zero + order,
                   f"takes {zero + order} extra operand(s) (w_zero when zero_points, g_idx when "
                   f"act_order), got {len(extras)}")
        if zero:
            t = self.tensor(extras[0], "w_zero", "i4", 3)
            self.check(t.shape == (e, kdim / g, n), f"w_zero %{extras[0].name} must have shape "
                                                     f"{e}x{kdim / g}x{n}, got {t}")
        if order:
            t = self.tensor(extras[-1], "g_idx", "i32", 2)
            self.check(t.shape == (e, kdim), f"g_idx %{extras[-1].name} must have shape "
                                             f"{e}x{kdim}, got {t}")
        sorted_rows = self.tensor(self.operands[3], "sorted_ids", "i32", 1).shape[0]
        self.tensor(self.operands[4], "expert_ids", "i32", 1)
        self.tensor(self.operands[5], "total", "i32", 1)
        wf = self.tensor(self.operands[6], "weights_flat", "f32", 1)
        self.same_dim(wf.shape[0], sorted_rows, "weights_flat must lie beside sorted_ids")
        _block_attr_ok(self)
        _gemm_tile_ok(self, kdim, g)
        epi = self.attr("epilogue")
        self.check(epi in EPILOGUES, f"attribute epilogue = {epi!r} must be one of {EPILOGUES}")
        self.check(not (epi == "swiglu" and self.attr("mul_topk_weights")),
                   "routing weights must not be applied before the SwiGLU non-linearity")
        out_n = n / 2 if epi == "swiglu" else n
        self.expect_result(0, (rows * Dim.of(self.attr("topk")), out_n), act)
        summed = epi == "topk_sum"
        self.check(len(self.results) == 1 + summed,
                   "epilogue = topk_sum gives two results (out, sum), other epilogues one")
        if summed:
            self.check(self.attr("mul_topk_weights"),
                       "epilogue = topk_sum sums the weighted rows: mul_topk_weights must be true")
            sum_rows = self.tensor(self.results[1], "result", act, 2).shape[0]
            self.same_dim(sum_rows * Dim.of(self.attr("sum_topk")),
                          rows * Dim.of(self.attr("topk")),
                          "rows of out must equal rows of sum x sum_topk")
            self.expect_result(1, (sum_rows, out_n), act)


class SwigluOp(Op):
    """silu(first half of the columns) * second half."""
    NAME = "moe.swiglu"
    OPERANDS = ("gate_up",)
    RESULTS = ("out",)

    def verify(self):
        act, (s, n2) = _activation(self, self.operands[0], "gate_up")
        if n2.is_static:
            self.check(n2.value % 2 == 0, f"gate_up columns ({n2}) must be even")
        self.expect_result(0, (s, n2 / 2), act)


class AggregateOp(Op):
    """out[t] = sum over k of down[t * topk + k], in k order."""
    NAME = "moe.aggregate"
    OPERANDS = ("down",)
    RESULTS = ("out",)
    ATTRS = {"topk": Attr("dim")}

    def verify(self):
        act, (s, h) = _activation(self, self.operands[0], "down")
        out = self.tensor(self.results[0], "result", act, 2)
        self.same_dim(out.shape[0] * Dim.of(self.attr("topk")), s,
                      "rows of down must equal tokens x topk")
        self.expect_result(0, (out.shape[0], h), act)
