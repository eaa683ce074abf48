"""The tile pass's MoE rules, part one: the token buckets a plan has, the routing paths (in the
align kernel, in the GEMMs, or through memory for act-order) and the checks of a tuning entry.
TilePass (tile.py) mixes this in; part two, each GEMM's CTA per bucket, is gemm_cta.py."""
from __future__ import annotations

from ...build import MOE_BLOCK_CHOICES
from ...ir import Module
from ..base import Context, PipelineError
from .cta import (ALIGN_CHUNKED_FROM, ALIGN_WARPS, GEMM_ROUTE_MAX_TOPK, PREFILL_SPLITS,
                  ROUTE_ALIGN_MAX_TOKENS, ROUTE_ALIGN_SLOTS)
from ...tile_model import TALL_BLOCK, TunedBucket
from .moe_buckets import moe_buckets


class MoeTiling:

    def _moe(self, module: Module, ctx: Context, tuned: dict) -> None:
        spec = ctx.spec
        self._routing_costs_stages = False
        fixed = self.option("moe-block")
        if fixed == TALL_BLOCK:
            # the tall tile for every call: it sets its own k a stage, columns, rows and warps,
            # and runs the whole K in one CTA
            pinned = [name for name in ("block-k", "wide-cols", "warp-rows", "wgmma", "warps",
                                        "split-k", "split-k-down", *PREFILL_SPLITS, "tall")
                      if self.option(name) is not None]
            if pinned:
                raise PipelineError(f"tile{{moe-block={TALL_BLOCK}}} is the tall tile, whose "
                                    f"tile is its own (only stages=N applies); drop "
                                    f"{', '.join(pinned)}")
        elif fixed is not None and fixed > max(MOE_BLOCK_CHOICES):
            raise PipelineError(f"tile{{moe-block={fixed}}}: the K-split and wide CTAs take "
                                f"blocks of up to {max(MOE_BLOCK_CHOICES)} rows ({TALL_BLOCK}: "
                                f"the tall tile)")
        # a tuning entry gives the tile per bucket, unless options fixing block or split say
        # otherwise
        tuned_buckets = (tuned.get("buckets") if not (fixed or any(
            self.option(name) for name in ("split-k", "split-k-down", *PREFILL_SPLITS)))
            else None)
        # the tall tile where the arch has warpgroup MMA (or tall=1 asks for it), unless an
        # option pins the prefill tile (its block, k a stage, columns a CTA, a split, or
        # mma.sync)
        tall_wanted = self.option("tall")
        if tall_wanted is None:
            tall_wanted = self.gpu.wgmma
        tall = bool(tall_wanted) and all(
            self.option(name) is None
            for name in ("block-k", "wide-cols", "warp-rows", *PREFILL_SPLITS)) and \
            self.option("wgmma") != 0
        buckets = ([[b.edge, b.config.moe_block] for b in tuned_buckets] if tuned_buckets
                   else moe_buckets(spec, self.gpu, fixed, tall))
        for op in module.function().walk():
            if "block" in op.ATTRS and "block_buckets" in op.ATTRS:
                if fixed is not None and fixed > op.attr("block"):
                    raise PipelineError(f"tile{{moe-block={fixed}}}: larger than the routing "
                                     f"buffers allow (block = {op.attr('block')})")
                if tuned_buckets:
                    self._check_entry(spec, tuned_buckets, op.attr("block"))
                op.attrs["block_buckets"] = [list(b) for b in buckets]
            if op.NAME == "moe.align":
                op.attrs["chunked_from"] = self._align_chunked_from(spec)
            if op.NAME == "moe.topk_softmax":
                op.attrs["router"] = self.option("router")
                op.attrs["align_tokens"] = self._align_tokens(spec.moe.top_k)
                op.attrs["gemm_route"] = self._gemm_route(spec.moe.top_k)
                if spec.quant.act_order:
                    self._routing_in_memory(op)
            if op.NAME == "moe.grouped_gemm_w4a16":
                for name in ("mma", "vec-warps", "cube-warps"):
                    if self.option(name) is not None:
                        raise PipelineError(f"tile{{{name}=...}}: an MSD option; this is an MoE "
                                            "spec")
                if self.option("block-n") not in (None, 64):
                    raise PipelineError(f"tile{{block-n={self.option('block-n')}}}: the MoE GEMM "
                                        "reads 64-column packed tiles (block-n=64)")
                k_dim = op.operands[0].type.shape[1].value
                n = op.operands[1].type.shape[2].value
                down = bool(op.attr("mul_topk_weights"))
                op.attrs["tile"] = self._gemm_tile(spec, k_dim, n, down, buckets,
                                                   tuned_buckets)
        self._first_bucket_routes(module)
        self._one_launch(module, spec)

    def _first_bucket_routes(self, module: Module) -> None:
        """One token is routed inside the GEMMs only where both run the K-split CTA in their
        first bucket (the wide CTA and the tall tile take no routing of their own): off
        elsewhere, and an error where route-in-gemm=1 asks for it; and by default not where
        the routing's shared memory would cost a first bucket's ring stages."""
        fn = module.function()
        router = next((op for op in fn.walk() if op.NAME == "moe.topk_softmax"), None)
        if router is None or not router.attr("gemm_route"):
            return
        if self._routing_costs_stages:          # (_gemm_tile: off by default there)
            router.attrs["gemm_route"] = False
            return
        if all(op.attrs["tile"]["col_tiles"][0] == 1 for op in fn.walk()
               if op.NAME == "moe.grouped_gemm_w4a16"):
            return
        if self.option("route-in-gemm"):
            raise PipelineError("tile{route-in-gemm=1}: the first bucket's GEMMs run the wide "
                                "CTA or the tall tile, which do not route a token themselves "
                                "(the K-split CTA does)")
        router.attrs["gemm_route"] = False

    def _one_launch(self, module: Module, spec) -> None:
        """one-launch=1: a call of one token with router logits runs both GEMMs' first-bucket
        CTAs in one grid, where that call is routed in the GEMMs, both are K-split CTAs of one
        moe block and warp count (one CTA shape serves either) and gate/up ends in SwiGLU
        (nothing runs between the GEMMs); an error naming the rule elsewhere."""
        fn = module.function()
        router = next((op for op in fn.walk() if op.NAME == "moe.topk_softmax"), None)
        if router is None or not self.option("one-launch"):
            return
        gemms = [op for op in fn.walk() if op.NAME == "moe.grouped_gemm_w4a16"]
        shapes = {(op.attrs["block_buckets"][0][1], op.attrs["tile"]["col_tiles"][0],
                   op.attrs["tile"]["warps"][0]) for op in gemms}
        rule = ("a call of one token is not routed in the GEMMs here (route-in-gemm)"
                if not router.attr("gemm_route") else
                "the first bucket's GEMMs must both run the K-split CTA with one moe block "
                f"and warp count, not (block, column tiles, warps) {sorted(shapes)}"
                if len(shapes) != 1 or next(iter(shapes))[1] != 1 else
                "gate/up must end in SwiGLU (the fuse-swiglu pass)"
                if not any(op.attr("epilogue") == "swiglu" for op in gemms) else None)
        if rule:
            raise PipelineError(f"tile{{one-launch=1}}: {rule}")
        router.attrs["one_launch"] = True

    # a tuning entry's config (MoeConfig): the option whose values each field must take
    # (wide_decode takes wgmma's, 0 or 1)
    ENTRY_OPTIONS = {"moe_block": "moe-block", "split_k": "split-k", "stages": "stages",
                     "split_k_down": "split-k-down", "block_k": "block-k", "warps": "warps",
                     "col_tiles": "wide-cols", "warp_rows": "warp-rows", "wgmma": "wgmma",
                     "wide_decode": "wgmma"}
    # the fields a tall bucket's tile sets itself, whatever the entry says
    TALL_OWN = ("block_k", "warps", "col_tiles", "warp_rows", "wgmma", "wide_decode")

    def _check_entry(self, spec, tuned_buckets: list[TunedBucket], routing_block: int) -> None:
        """A tuning entry (a database file, maybe edited by hand) takes the values the options
        take, its buckets end in ascending order, and its blocks fit the routing buffers (the
        spec's moe.block_size where it fixes one)."""
        edge = 0
        for b in tuned_buckets:
            where = f"tuning entry: the bucket up to T = {b.edge}"
            if not (type(b.edge) is int and b.edge > edge):
                raise PipelineError(f"{where}: bucket ends must be integers that ascend")
            edge = b.edge
            block = b.config.moe_block
            for field, option in self.ENTRY_OPTIONS.items():
                value = getattr(b.config, field)
                if (block == TALL_BLOCK and field in self.TALL_OWN
                        or field == "split_k_down" and value is None):    # None: as split_k
                    continue
                self._check_entry_value(where, option, value,
                                        field if field == "wide_decode" else option)
            if block > routing_block or spec.moe.block_size not in (None, block):
                rule = (f"the spec's moe.block_size, {spec.moe.block_size}"
                        if spec.moe.block_size else f"at most {routing_block}, as the routing "
                        f"buffers allow")
                raise PipelineError(f"{where} has moe-block {block}: must be {rule}")

    def _align_chunked_from(self, spec) -> int:
        """From how many slots a call aligns chunked: as asked, else ALIGN_CHUNKED_FROM; 0
        (never) where the spec's largest call has fewer slots (no chunked kernels built)."""
        n = self.option("align-chunked-from")
        n = ALIGN_CHUNKED_FROM if n is None else n
        return n if n <= spec.tokens.max * spec.moe.top_k else 0

    def _align_tokens(self, top_k: int) -> int:
        """Up to how many tokens the router runs in the align kernel's CTA: one per warp of it
        by default (measured: 4 tokens per warp lose at T = 64 with either router), at most
        what its shared-memory slots hold."""
        most = min(ROUTE_ALIGN_MAX_TOKENS, ROUTE_ALIGN_SLOTS // top_k)
        n = self.option("route-align-tokens")
        if n is None:
            return min(ALIGN_WARPS, most)
        if not 0 <= n <= most:
            raise PipelineError(f"tile{{route-align-tokens={n}}}: must be 0..{most} (at most "
                                f"{ROUTE_ALIGN_MAX_TOKENS} tokens and {ROUTE_ALIGN_SLOTS} "
                                f"slots of top-k {top_k})")
        return n

    def _routing_in_memory(self, router) -> None:
        """Act-order: the activations are gathered per slot by its expert's row order, which
        reads the routing from memory: the router never runs inside the align kernel or the
        GEMMs (an error where an option asks it to)."""
        for option in ("route-align-tokens", "route-in-gemm", "one-launch"):
            if self.option(option):
                raise PipelineError(f"tile{{{option}={self.option(option)}}}: an act-order spec "
                                    "(quant.act_order) routes through the router kernel: its "
                                    "activations are gathered by the slots' experts")
        router.attrs["align_tokens"], router.attrs["gemm_route"] = 0, False

    def _gemm_route(self, top_k: int) -> bool:
        """Whether a call of one token with router logits is routed inside the GEMMs' CTAs
        (the first bucket's kernels, where they are K-split CTAs: the emitter): by default
        where top_k fits a warp's lanes."""
        asked = self.option("route-in-gemm")
        if asked and top_k > GEMM_ROUTE_MAX_TOPK:
            raise PipelineError(f"tile{{route-in-gemm=1}}: top_k {top_k} must be <= "
                                f"{GEMM_ROUTE_MAX_TOPK} (a lane of one warp routes each slot)")
        return top_k <= GEMM_ROUTE_MAX_TOPK if asked is None else bool(asked)

    def _pick(self, option: str, b: TunedBucket | None, field: str, default):
        """The option's value, else a tuning entry bucket's `field`, else the default."""
        if self.option(option) is not None:
            return self.option(option)
        return default if b is None else getattr(b.config, field)

    def _split_name(self, name: str, down: bool) -> str:
        """The split option a GEMM takes: the down GEMM's own (`name`-down) where given."""
        return f"{name}-down" if down and self.option(f"{name}-down") else name
