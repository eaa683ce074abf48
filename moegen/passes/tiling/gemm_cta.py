"""The tile pass's MoE rules, part two: the tile of each grouped GEMM per bucket (the K-split
CTA, the wide CTA, or the tall tile) and its K split. TilePass (tile.py) mixes this in."""
from __future__ import annotations

from ...tile_model import TALL_BLOCK, GemmTile, TunedBucket
from ..base import PipelineError
from .cta import (DECODE_CTA_STEPS, GEMM_TILE, TALL_TILE, WGMMA_TILE, WIDE_BLOCKS, WIDE_COL_TILES,
                  WIDE_TILE, decode_split_k, doubled_split, gemm_stages, one_token_routing_bytes,
                  splits_evenly, tall_block_k, tall_fits, tall_stages, wgmma_fits, wide_col_tiles,
                  wide_decode_ctas, wide_epilogue_fits, wide_resident_ctas, wide_stages)
from .moe_buckets import (DECODE_MAX_TOKENS, SINGLE_TOKEN_WARPS, bucket_floor, call_blocks,
                          prefill_short, starts_with_single_token_bucket, wide_decode_bucket)
from .msd import fit_warps


class GemmTiling:

    def _gemm_tile(self, spec, k_dim: int, n: int, down: bool, buckets: list,
                   tuned_buckets: list[TunedBucket] | None) -> dict:
        """The tile attribute of one grouped GEMM: block_n, then per bucket block_k, warps,
        ring stages and split-K (options first, then a tuning entry, then the defaults), and the
        CTA each bucket runs (_bucket_cta)."""
        tuned = tuned_buckets or [None] * len(buckets)
        pick = self._pick
        single = starts_with_single_token_bucket(buckets)
        block_k = [pick("block-k", b, "block_k", GEMM_TILE["block_k"]) for b in tuned]
        warps = [fit_warps(k_dim, pick("warps", b, "warps",
                                       SINGLE_TOKEN_WARPS if single and i == 0
                                       else GEMM_TILE["warps"]))
                 for i, b in enumerate(tuned)]
        # (a tall-tile bucket takes k a stage, warps and the whole K of its own: _bucket_cta)
        tall = [block == TALL_BLOCK for _, block in buckets]
        for bk, w, t in zip(block_k, warps, tall):
            if not t and (not splits_evenly(k_dim, 1, w, bk) or spec.quant.group_size % bk):
                raise PipelineError(f"tile{{block-k={bk}}}: K = {k_dim} over {w} warps, or the "
                                    f"group {spec.quant.group_size}, is not a whole number of "
                                    f"{bk}-deep stages")
        # the split option of each bucket: split-k for the decode buckets, prefill-split-k for
        # the prefill ones (their -down forms first for the down GEMM)
        names = [self._split_name("prefill-split-k" if edge > DECODE_MAX_TOKENS else "split-k",
                                  down) for edge, _ in buckets]
        asked = [self.option(name) for name in names]
        most = [pick("stages", b, "stages", GEMM_TILE["stages"]) for b in tuned]
        # (the first bucket's K-split CTA may hold one token's routing besides its rings; where
        # that would cost its rings stages, the calls of up to its edge would lose more than the
        # one token gains: the routing stays with align, unless route-in-gemm=1 asks)
        routed = one_token_routing_bytes(spec.moe.num_experts, spec.moe.top_k,
                                         buckets[0][1], 32 * warps[0]) \
            if self._gemm_route(spec.moe.top_k) else 0
        zeros = not spec.quant.symmetric
        stages = [gemm_stages(block, w, m, bk, routed if i == 0 else 0, zeros)
                  for i, ((_, block), m, w, bk) in enumerate(zip(buckets, most, warps, block_k))]
        plain = gemm_stages(buckets[0][1], warps[0], most[0], block_k[0], zeros=zeros)
        if routed and stages[0] != plain and self.option("route-in-gemm") is None:
            stages[0] = plain
            self._routing_costs_stages = True
        if tuned_buckets:
            splits = [b.config.split(down) for b in tuned_buckets]
        else:
            # each decode bucket's split is sized for its smallest call; the bucket after the
            # single-token one keeps the split sized for one token that it had before there was
            # one (T = 2..16 measured so)
            floors = [1 if single and i == 1 else bucket_floor(buckets, i)
                      for i in range(len(buckets))]
            # (the tall tile runs the whole K; a prefill bucket is whole unless asked, or split
            # in _bucket_cta)
            splits = [
                1 if tall[i] else asked[i] or (1 if edge > DECODE_MAX_TOKENS else decode_split_k(
                    k_dim, n, min(spec.moe.num_experts, floors[i] * spec.moe.top_k),
                    {"block_n": GEMM_TILE["block_n"], "warps": warps[i], "block_k": block_k[i]},
                    self.gpu))
                for i, (edge, _) in enumerate(buckets)]
        for name, sp, w, bk, t in zip(names, splits, warps, block_k, tall):
            if t and sp != 1:
                raise PipelineError(f"tuning entry: split-k {sp} in a bucket of block "
                                    f"{TALL_BLOCK}; the tall tile runs the whole K (split-k 1)")
            if t or splits_evenly(k_dim, sp, w, bk):
                continue
            if tuned_buckets:
                raise PipelineError(f"tuning entry: split-k {sp} does not divide K = {k_dim} "
                                    f"over {w} warps of {bk}-deep stages")
            raise PipelineError(f"tile{{{name}={sp}}}: K = {k_dim} does not split into {sp} x "
                                f"{w} warps of {bk}-deep stages")
        tiles = [GemmTile(**self._bucket_cta(spec, k_dim, n, buckets, i, b, asked[i], names[i],
                                             {"block_k": block_k[i], "warps": warps[i],
                                              "stages": stages[i], "split_k": splits[i]}))
                 for i, b in enumerate(tuned)]
        return GemmTile.attr(tiles, GEMM_TILE["block_n"])

    def _bucket_cta(self, spec, k_dim: int, n: int, buckets: list, i: int,
                    b: TunedBucket | None, split: int | None, split_name: str,
                    ksplit: dict) -> dict:
        """The CTA bucket i runs and its tile: the tall tile (block TALL_BLOCK), the wide CTA
        (col_tiles > 1: its warps tile columns and rows, one ring for the CTA; at prefill sizes
        over the whole K, in a decode bucket split over K), or the K-split CTA of `ksplit`
        (block_k, warps, stages, split_k); GemmTile's fields. `b`: the bucket's tuning entry,
        which may give col_tiles and warp_rows (and then its block_k and stages are the wide
        CTA's), wgmma and wide_decode (the wide CTA as the default builds a decode bucket's:
        registers capped, its split doubled for calls to pick from); `split`: the
        value of the bucket's split option, named `split_name` (split-k in decode buckets,
        prefill-split-k in prefill buckets, or their -down forms)."""
        edge, block = buckets[i]
        ntiles = -(-n // GEMM_TILE["block_n"])
        group = spec.quant.group_size
        cta = {**ksplit, "split_many": ksplit["split_k"], "col_tiles": 1, "warp_rows": 0,
               "wgmma": False, "ctas_per_sm": 0, "tall": block == TALL_BLOCK}
        if block == TALL_BLOCK:
            if not tall_fits(n):
                where = (f"tile{{moe-block={TALL_BLOCK}}}" if self.option("moe-block")
                         else f"tuning entry: a bucket of block {TALL_BLOCK}")
                raise PipelineError(f"{where} (the tall tile) needs the weight's {n} columns in "
                                    f"whole CTAs of {TALL_TILE['col_tiles']} tiles of 64")
            # the tall tile (grouped_gemm_wgmma_tall; where the GPU has no warpgroup MMA, the
            # wide CTA of the same block and columns, one warp per 32 rows of a column tile);
            # stages=N or the entry's is the most, as for the other tiles: fewer where the
            # shared memory would not hold them, and 3 at least
            bk = tall_block_k(group)
            stages = tall_stages(self._pick("stages", b, "stages", TALL_TILE["stages"]), bk,
                                 self.gpu, not spec.quant.symmetric)
            return {**cta, "col_tiles": TALL_TILE["col_tiles"],
                    "warp_rows": TALL_TILE["warp_rows"], "block_k": bk, "stages": stages,
                    "warps": TALL_TILE["col_tiles"] * block // TALL_TILE["warp_rows"],
                    "wgmma": True}
        fixed = self.option("moe-block")
        # (a tuning entry's config gives the wide CTA's fields; col_tiles 1: the K-split CTA)
        wide = b is not None
        cols = self._pick("wide-cols", b, "col_tiles", WIDE_COL_TILES) or 1
        rows = min(block, self._pick("warp-rows", b, "warp_rows", WIDE_TILE["warp_rows"]))
        wide_decode = wide and bool(b.config.wide_decode)
        prefill = edge > DECODE_MAX_TOKENS
        # (a tuning entry's wide CTA split over K is taken as it is, or refused)
        if wide and cols > 1 and (cta["split_k"] > 1 or not prefill or wide_decode) and (
                block not in WIDE_BLOCKS or ntiles % cols or not wide_epilogue_fits(cols, block)):
            raise PipelineError(f"tuning entry: a wide CTA of {cols} column tiles and "
                                f"block {block} does not fit {ntiles} tiles")
        # the wide CTA this GEMM can have: the column tiles asked for, halved until they divide
        # its tiles (1: none does, as gate/up's 3 tiles at I = 96: the K-split CTA)
        cols = wide_col_tiles(ntiles, block, cols)
        # the wide CTA split over K: a tuning entry's in a decode bucket (or split, or marked
        # wide_decode), or the default of a decode bucket whose experts pass WIDE_DECODE_SLOTS
        # slots, or of a prefill bucket of the wide CTA whose largest call's CTA tiles still
        # leave the SMs short (prefill_fill; the split sized for its smallest call), or a
        # prefill bucket's as prefill-split-k asks
        prefill_fill = (b is None and not fixed and not split and prefill
                        and cols > 1 and prefill_short(spec, self.gpu, edge, block, ntiles, cols,
                                                         rows))
        split_wide = cols > 1 and (
            wide and (cta["split_k"] > 1 or not prefill or wide_decode)
            or b is None and (wide_decode_bucket(spec, buckets, i, fixed) or prefill_fill
                              or prefill and cta["split_k"] > 1))
        if split_wide:
            ring = self._wide_ring(spec, b, wide, k_dim, block, cols, rows)
            # its split sized for the CTAs an SM holds (its registers capped for 16 warps an SM:
            # 2 CTAs of 8 warps capped for 4 spilled ~1 KB a thread)
            bk, stages, wg = ring
            ctas = wide_resident_ctas(self.gpu, block, cols, cols * block // rows, stages, bk,
                                      not spec.quant.symmetric, wg)
            if not wide:
                blocks = call_blocks(spec, bucket_floor(buckets, i), block)   # smallest call's
                cta["split_k"] = self._wide_decode_split(spec, k_dim, blocks * ntiles // cols,
                                                         split, ctas, not prefill_fill)
            if (k_dim // group) % cta["split_k"]:
                sp = cta["split_k"]
                where = f"tuning entry: split-k {sp}" if wide else f"tile{{{split_name}={sp}}}"
                raise PipelineError(f"{where}: the wide CTA splits K = {k_dim} into whole "
                                    f"groups of {group}")
            # a split of the bucket's own choosing may double per call (WIDE_SPLIT_FILL):
            # the grid has the doubled split, and calls with enough blocks use half of it
            cta["split_many"] = cta["split_k"]
            if (not wide or wide_decode) and not split and cta["split_k"] > 1 and (
                    k_dim // group) % (2 * cta["split_k"]) == 0:
                cta["split_k"] *= 2
        elif not (prefill and cta["split_k"] == 1):
            cols = 1
        if cols == 1:
            return cta
        if not split_wide:
            ring = self._wide_ring(spec, b, wide, k_dim, block, cols, rows)
        bk, stages, wg = ring
        # registers capped for 16 warps an SM where split over K, and on warpgroup MMA of
        # block 32 over the whole K too (whose kernel then unrolls its K loop over a turn of
        # the ring; block 64's accumulators do not fit the cap). Left whole on mma.sync it is
        # the prefill kernel, uncapped (measured on the H200, Mixtral T = 53..64 with gate/up
        # so: the layer 2.4% faster, docs/DESIGN.md).
        capped = cta["split_k"] > 1 or wg and block == min(WIDE_BLOCKS)
        return {**cta, "col_tiles": cols, "warp_rows": rows, "block_k": bk,
                "warps": cols * block // rows, "stages": stages,
                "ctas_per_sm": wide_decode_ctas(cols * block // rows) if capped else 0,
                "wgmma": wg}

    def _wide_ring(self, spec, b: TunedBucket | None, wide: bool, k_dim: int, block: int,
                   cols: int, rows: int) -> tuple[int, int, bool]:
        """The wide CTA's ring: k a stage (the option's, a tuning entry's or WIDE_TILE's), its
        stages (wide_stages) and whether it runs on the warpgroup MMA kernel (where the tile
        allows)."""
        group = spec.quant.group_size
        bk = self.option("block-k") or (b.config.block_k if wide else WIDE_TILE["block_k"])
        if (k_dim // 16) % (bk // 16) or group % bk:
            raise PipelineError(f"tile{{block-k={bk}}}: K = {k_dim}, or the group "
                                f"{group}, is not a whole number of {bk}-deep stages")
        stages = wide_stages(block, cols, self.option("stages") or (
            b.config.stages if wide else WIDE_TILE["stages"]), bk, not spec.quant.symmetric)
        wg = bool(self._pick("wgmma", b, "wgmma", WGMMA_TILE["wgmma"])) and wgmma_fits(
            cols, rows, block, bk, stages)
        return bk, stages, wg

    def _wide_decode_split(self, spec, k_dim: int, tiles: int, fixed: int | None, ctas: int,
                           short_k: bool = True) -> int:
        """K splits of a bucket's wide CTA (`tiles` of them in its smallest call): the
        option's, else doubled up to about `ctas` CTAs an SM (wide_resident_ctas), then (decode
        buckets, `short_k`) while a CTA's share of K passes DECODE_CTA_STEPS k16 steps; each CTA
        takes whole scale groups. (Measured on the H200, Mixtral T = 64, scales through the
        ring: its down GEMM split 4 301-302 us for the layer, 8 306, 2 342; gate/up, whose 896
        tiles fill the SMs already, 2 was 3% slower than 1. At T = 65..255, where prefill
        calls left the down GEMM whole before, split 4 was 4-23% faster: docs/DESIGN.md.)"""
        if fixed:
            return fixed

        def allowed(split: int) -> bool:
            return (k_dim // spec.quant.group_size) % split == 0
        split = doubled_split(tiles, ctas, allowed, self.gpu)
        while short_k and k_dim // 16 // split > DECODE_CTA_STEPS and allowed(split * 2):
            split *= 2
        return split
