"""The MoE GEMM tile as typed values: what the tile pass chooses per token bucket
(`GemmTile`), how the IR carries it (one `tile` attribute of a grouped GEMM: block_n and one
list per field, a bucket an index), and a tuning entry's bucket as the tile pass reads it
(`TunedBucket`). The IR verifier, the emitter and autotune read tiles through these, never by
position."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import NamedTuple


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


class TunedBucket(NamedTuple):
    """One bucket of a tuning entry (moegen.tuning: a list in the database file), by name.
    Entries recorded before a field existed stop before it: it reads None, and the tile pass
    takes its default."""
    edge: int                      # the bucket's largest token count
    moe_block: int
    split_k: int
    stages: int | None = None
    split_k_down: int | None = None
    block_k: int | None = None
    warps: int | None = None
    col_tiles: int | None = None   # present: the entry was measured on the wide CTA's fields
    warp_rows: int | None = None
    wgmma: int | None = None
    wide_decode: int | None = None

    @classmethod
    def of(cls, values) -> "TunedBucket":
        return values if isinstance(values, cls) else cls(*values)
