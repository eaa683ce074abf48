"""The MoE GEMM tile as typed values, at two levels:
- `MoeConfig`: a token bucket's choice for the layer (moe block, K splits of both GEMMs, ring
  depth, k a stage, warps, the wide CTA's shape): what autotune enumerates and times, what the
  tuning database records (`as_dict`, `from_record`), and, as a `TunedBucket` (its bucket's
  edge beside it), what the tile pass reads from a tuning entry;
- `GemmTile`: what the tile pass builds from it (or from its own defaults) for each grouped
  GEMM of the bucket, after the shared-memory and register rules of the target: how the IR
  carries it (one `tile` attribute of a grouped GEMM: block_n and one list per field, a bucket
  an index), what the IR verifier checks and the emitter reads.
Nothing reads a tile by position."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

TALL_BLOCK = 128      # the tall prefill tile's moe block (rows an expert's block holds)


@dataclass(frozen=True)
class GemmTile:
    """One token bucket's tile of a grouped W4A16 GEMM."""
    block_k: int          # k a copy-ring stage (16, 32; the wide CTA 32, the tall tile 128)
    warps: int            # warps a CTA
    stages: int           # copy-ring stages
    split_k: int          # CTAs along K in the grid
    col_tiles: int        # 64-column tiles a CTA (1: the K-split CTA; more: the wide CTA)
    warp_rows: int        # rows a warp of the wide CTA (0 elsewhere)
    wgmma: bool           # the wide CTA on warpgroup MMA
    ctas_per_sm: int      # the CTAs an SM its registers are capped for (0: uncapped)
    split_many: int       # the split calls with enough moe blocks take (< split_k: per call)
    tall: bool            # the tall tile (blocks of 128 rows)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def per_bucket(cls, attr: dict) -> list["GemmTile"]:
        """The tiles of an IR `tile` attribute, a bucket each; ValueError naming what is
        missing or uneven."""
        names = cls.field_names()
        missing = [n for n in names if n not in attr]
        if missing:
            raise ValueError(f"tile lacks {', '.join(missing)}")
        lengths = {len(attr[n]) for n in names}
        if len(lengths) != 1:
            raise ValueError(f"tile fields have {sorted(lengths)} entries; one a bucket each")
        return [cls(**{n: attr[n][i] for n in names}) for i in range(lengths.pop())]

    @staticmethod
    def attr(tiles: list["GemmTile"], block_n: int) -> dict:
        """The IR `tile` attribute of a GEMM's tiles: block_n, then one list per field."""
        rows = [asdict(t) for t in tiles]
        return {"block_n": block_n,
                **{n: [r[n] for r in rows] for n in GemmTile.field_names()}}


@dataclass(frozen=True)
class MoeConfig:
    """One point of the sweep at one token count: the moe block, the K splits of the gate/up
    and of the down GEMM, the most copy-ring stages, k per ring stage and warps per CTA
    (block_n is the packed weight tile, 64).
    - col_tiles > 1 (a prefill size's candidate): the wide CTA of that many column tiles and
      warp_rows rows a warp (its warps follow from its shape), on warpgroup MMA where wgmma is
      1 and its tile allows; split over K as split_k and split_k_down say, registers capped
      where split (wide_split_configs).
    - wide_decode 1: the wide CTA as the tile pass's default splits it (the wide decode bucket,
      and a prefill bucket whose calls leave the SMs short): registers capped, its split doubled
      in the grid for calls to pick from. Only a kept default is recorded so.
    - moe_block 128: the tall tile (its k a stage, columns, rows and warps its own; only the
      stages vary)."""
    moe_block: int
    split_k: int
    stages: int = 8
    split_k_down: int | None = None          # None: as split_k
    block_k: int = 16
    warps: int = 4
    col_tiles: int = 1
    warp_rows: int = 32                      # the wide CTA's rows per warp
    wgmma: int = 1                           # the wide CTA on warpgroup MMA (sm_90a)
    wide_decode: int = 0                     # the wide CTA split over K as the default's

    def split(self, down: bool) -> int:
        """The K split of the down GEMM (`down`) or of gate/up."""
        return self.split_k_down if down and self.split_k_down is not None else self.split_k

    def pipeline(self, fuse_swiglu: bool = True) -> str:
        """The pass pipeline that builds this config's kernels."""
        down = self.split(down=True)
        # (the wide CTA is a prefill size's candidate: its splits are the prefill buckets')
        split = "prefill-split-k" if self.col_tiles > 1 else "split-k"
        tile = (f"tile{{moe-block={TALL_BLOCK},stages={self.stages}}}"
                if self.moe_block == TALL_BLOCK else
                f"tile{{moe-block={self.moe_block},{split}={self.split_k},{split}-down={down},"
                f"stages={self.stages},block-k={self.block_k},warps={self.warps},"
                f"wide-cols={self.col_tiles},warp-rows={self.warp_rows},wgmma={self.wgmma}}}")
        return ",".join(["fuse-align"] + (["fuse-swiglu"] if fuse_swiglu else []) + [tile,
                                                                                    "alloc"])

    def as_dict(self) -> dict:
        return {"moe_block": self.moe_block, "split_k": self.split_k, "stages": self.stages,
                "split_k_down": self.split(down=True),
                "block_k": self.block_k, "warps": self.warps, "col_tiles": self.col_tiles,
                "warp_rows": self.warp_rows, "wgmma": self.wgmma,
                **({"wide_decode": 1} if self.wide_decode else {})}

    # what a recorded config lacking a field (recorded before the field existed) was measured
    # with: the tile pass's choices of then
    RECORDED_BEFORE = {"stages": 8, "block_k": 16, "warps": 4, "col_tiles": 1, "warp_rows": 32,
                       "wgmma": 0, "wide_decode": 0}

    @classmethod
    def from_record(cls, config: dict) -> "MoeConfig":
        """A config as the tuning database recorded it (`as_dict`), the fields it lacks as
        they were measured; ValueError naming a missing or unknown key."""
        names = [f.name for f in fields(cls)]
        faults = ([f"lacks {k}" for k in ("moe_block", "split_k") if k not in config]
                  + [f"has unknown key {k!r}" for k in sorted(set(config) - set(names))])
        if faults:
            raise ValueError(f"a recorded MoE config {'; '.join(faults)} (its keys: "
                             f"{', '.join(names)})")
        return cls(config["moe_block"], config["split_k"],
                   split_k_down=config.get("split_k_down", config["split_k"]),
                   **{k: config.get(k, v) for k, v in cls.RECORDED_BEFORE.items()})


@dataclass(frozen=True)
class TunedBucket:
    """One bucket of a tuning entry as the tile pass reads it (moegen.tuning): the largest token
    count it serves and the config measured for it."""
    edge: int
    config: MoeConfig
