"""The tile pass's MSD rules: TCubeTiling numbers on Ascend, the dequant lowering's tile, and
the CUDA MSD kernel's tile. TilePass (tile.py) mixes this in."""
from __future__ import annotations

from ...ir import Module
from ..ascend_tiling import msd_tiling
from ..base import Context, PipelineError
from .cta import align_up, gemm_stages, splits_evenly
from .msd import (DENSE_MAX_BLOCK, MSD_CTAS_PER_SM, MSD_CUDA_TILE, MSD_MAX_BARRIERS, MSD_MAX_SLOTS,
                  dense_split_k, fit_warps, msd_occupancy, msd_shared_bytes, msd_split_k,
                  msd_warp_layout, msd_x_stages)


class MsdTiling:

    def _msd(self, module: Module, ctx: Context, tuned: dict) -> None:
        spec = ctx.spec
        loop = module.function().op("msd.group_loop")
        for key, value in tuned.items():
            if key != "schedule":
                self._check_entry_value("tuning entry", key.replace("_", "-"), value)
        if ctx.target == "ascend":
            a = spec.targets.ascend
            cores = a.aic_cores if a else 24
            s = spec.msd
            loop.attrs["tile"] = msd_tiling(s.m, s.n, s.k, spec.quant.group_size, s.steps, cores)
        elif spec.lowering == "dequant":
            s = spec.msd
            block = 8 if s.m <= 8 else min(DENSE_MAX_BLOCK, align_up(s.m, 16))
            warps = fit_warps(s.k, self.option("warps", 4))
            tiles = -(-s.m // block) * -(-s.n // 64)
            split = self.option("split-k", tuned.get("split_k") or dense_split_k(s.k, tiles, warps,
                                                                                 self.gpu))
            if not splits_evenly(s.k, split, warps):
                raise PipelineError(f"tile{{split-k={split}}}: K = {s.k} does not split into "
                                    f"{split} x {warps} warps of k16 steps")
            loop.attrs["tile"] = {"block": block, "block_n": 64, "warps": warps,
                                  "stages": gemm_stages(block, warps, self.option("stages", 8)),
                                  "split_k": split}
        else:
            loop.attrs["tile"] = self._msd_cuda_tile(spec, tuned)

    def _msd_cuda_tile(self, spec, tuned: dict) -> dict:
        """The CUDA MSD kernel's tile: options first, then a tuning entry, then the defaults;
        columns (and with them matrix warps) halved while shared memory would not hold it."""
        s = spec.msd
        base = {**MSD_CUDA_TILE, **msd_warp_layout(s.m)}
        if tuned and "occupancy" not in tuned:
            # an entry without stages and occupancy was measured before they were recorded
            base.update(stages=MSD_CUDA_TILE["stages"], occupancy=MSD_CUDA_TILE["occupancy"])
        tile = {k: self.option(k.replace("_", "-"), tuned.get(k, v)) for k, v in base.items()}
        g = spec.quant.group_size
        groups = s.k // g
        vec, fixed_n = tile["vec_warps"], self.option("block-n") is not None or "block_n" in tuned
        fixed_cube = self.option("cube-warps") is not None or "cube_warps" in tuned

        def full(block_n: int, cube: int) -> dict:
            return {"block_n": block_n, "w_stages": max(2, tile["stages"]),
                    "x_stages": msd_x_stages(s.m, g, vec), "mma": tile["mma"],
                    "vec_warps": vec, "cube_warps": cube}

        def shared(t: dict) -> int:
            return msd_shared_bytes(s.m, g, s.steps, t, MSD_MAX_SLOTS, MSD_MAX_BARRIERS)

        t = full(tile["block_n"], tile["cube_warps"])
        fixed_stages = self.option("stages") is not None
        most = self.gpu.shared_per_cta
        while not fixed_n and t["block_n"] > 16 and shared(t) > most:
            if t["block_n"] == 64 and t["w_stages"] > 2 and not fixed_stages:
                t = {**t, "w_stages": 2}         # M = 64: 64 columns, 2 stages beat 32 x 4 (1.8x)
                continue
            bn = t["block_n"] // 2               # large M x steps: fewer columns per CTA
            t = full(bn, t["cube_warps"] if fixed_cube else max(1, t["cube_warps"] // 2))
        if t["block_n"] < 8 * t["cube_warps"]:
            raise PipelineError(f"tile{{cube-warps={t['cube_warps']}}}: {t['block_n']} columns "
                                f"per CTA (block-n) give each matrix warp less than one n8 "
                                f"tile: at most {t['block_n'] // 8} matrix warps")
        if shared(t) > most:
            # name what the user set: the columns where an option or entry fixed them, else
            # the rows; and say whether 2 weight stages would fit
            two = {**t, "w_stages": 2}
            hint = ("2 weight ring stages fit (tile{stages=2})"
                    if t["w_stages"] > 2 and shared(two) <= most else
                    "fewer columns per CTA" if fixed_n and t["block_n"] > 16 else
                    "fewer rows a call")
            where = (f"tile{{block-n={t['block_n']}}}" if self.option("block-n") is not None
                     else f"tuning entry: block_n {t['block_n']}" if fixed_n
                     else f"msd.m = {s.m}")
            raise PipelineError(f"{where}: the CUDA MSD kernel of msd.m = {s.m}, msd.steps = "
                                f"{s.steps} at {t['block_n']} columns a CTA and "
                                f"{t['w_stages']} weight ring stages would need {shared(t)} "
                                f"bytes of shared memory (at most {most} on {self.gpu.arch}): "
                                f"{hint}")
        threads = 32 * (t["vec_warps"] + t["cube_warps"])
        occupancy = msd_occupancy(tile["occupancy"], threads, shared(t), self.gpu)
        split = self.option("split-k", tuned.get("split_k") or msd_split_k(
            groups, -(-s.n // t["block_n"]), self.gpu, max(occupancy, MSD_CTAS_PER_SM)))
        if groups % split:
            raise PipelineError(f"tile{{split-k={split}}}: the {groups} groups of K do not "
                                f"split evenly")
        return {**t, "split_k": split, "occupancy": occupancy}
