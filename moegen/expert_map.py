"""Which rank holds which experts of a MoE layer, and each rank's share of the layer (numpy:
moegen.distributed runs it over torch.distributed)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .quant import QuantizedWeight
from .spec import Spec


@dataclass(frozen=True)
class ExpertMap:
    """Which rank holds each of E experts, and its index among that rank's experts."""
    rank_of: tuple[int, ...]

    @classmethod
    def contiguous(cls, num_experts: int, world: int) -> "ExpertMap":
        """Rank r holds experts [r * ceil(E / W), (r + 1) * ceil(E / W))."""
        per = -(-num_experts // world)
        return cls(tuple(e // per for e in range(num_experts)))

    @classmethod
    def of(cls, assignment, world: int) -> "ExpertMap":
        """From rank_of[e] (any sequence of ints in [0, world)); every rank holds one at least."""
        rank_of = tuple(int(r) for r in assignment)
        bad = [r for r in rank_of if not 0 <= r < world]
        if bad:
            raise ValueError(f"expert_map: rank {bad[0]} is not a rank of the group "
                             f"(0..{world - 1})")
        empty = sorted(set(range(world)) - set(rank_of))
        if empty:
            raise ValueError(f"expert_map: rank {empty[0]} holds no expert")
        return cls(rank_of)

    @property
    def num_experts(self) -> int:
        return len(self.rank_of)

    def experts_of(self, rank: int) -> list[int]:
        return [e for e, r in enumerate(self.rank_of) if r == rank]

    def local_ids(self, rank: int) -> np.ndarray:
        """int32 [E]: expert e's index on `rank`, -1 where another rank holds it."""
        out = np.full(self.num_experts, -1, np.int32)
        out[self.experts_of(rank)] = np.arange(len(self.experts_of(rank)), dtype=np.int32)
        return out


def shard_spec(spec: Spec, experts: int) -> Spec:
    """The spec of a rank's layer: the same layer with `experts` experts (its top-k slots stay,
    most of them pointing at other ranks' experts)."""
    return replace(spec, name=f"{spec.name}-ep{experts}",
                   moe=replace(spec.moe, num_experts=experts))


def shard_weight(w: QuantizedWeight, experts: list[int]) -> QuantizedWeight:
    """The experts `experts` of a weight [E, ...] (every field indexed on its first axis)."""
    return QuantizedWeight(*(None if a is None else np.ascontiguousarray(np.asarray(a)[experts])
                             for a in w))


def local_routing(topk_ids, table: np.ndarray) -> np.ndarray:
    """Global expert ids [T, k] -> a rank's local ids by its `local_ids` table (-1: another
    rank's expert, or an id outside [0, E))."""
    ids = np.asarray(topk_ids).astype(np.int64)
    valid = (ids >= 0) & (ids < len(table))
    return np.where(valid, table[np.clip(ids, 0, len(table) - 1)], -1).astype(np.int32)
