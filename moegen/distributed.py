"""Expert parallelism: one MoE layer whose experts are spread over the ranks of a
torch.distributed group (NCCL on GPUs; gloo works too, for tests on the CPU).

    import torch.distributed as dist, moegen.distributed as md
    dist.init_process_group("nccl")                        # launched by torchrun
    moe = md.ExpertParallelMoe(spec, w13, w2)              # this rank's shard of the weights
    y = moe(x, topk_ids, topk_weights)                     # or moe.route(router_logits) first

Rank r holds the experts the `ExpertMap` gives it (contiguous blocks by default, or any
assignment) and runs them with moegen's layer, the other ranks' experts given as ids outside
its [0, E_local) so the kernels skip them. The partial results meet in one of two ways:

- `combine="all_reduce"`: every rank has every token (x replicated); each computes its experts'
  share of every token's sum, and one all-reduce in fp32 adds the shares.
- `combine="all_to_all"`: each rank has its own tokens; a token's row goes once to each rank
  holding one of its experts (only routed tokens move), comes back as that rank's share, and
  the shares are added in fp32 in rank order. The row counts are exchanged first, so this mode
  waits on the host once per call for them (uneven all-to-all splits are host-side sizes).

Both are deterministic: the same inputs give the same bits, run after run.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .expert_map import ExpertMap, shard_spec, shard_weight
from .quant import QuantizedWeight
from .spec import Spec, load_spec

COMBINES = ("all_reduce", "all_to_all")


def map_ids(topk_ids: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """Global expert ids [T, k] -> this rank's local ids (-1: another rank's, or none)."""
    ids = topk_ids.long()
    valid = (ids >= 0) & (ids < local.numel())
    return torch.where(valid, local[ids.clamp(0, local.numel() - 1)], -1).to(torch.int32)


class ExpertParallelMoe:
    """One MoE layer over the ranks of `group` (default: the world). w13 and w2 are the whole
    layer's weights (QuantizedWeight, reference layout: each rank keeps its shard) or, with
    `sharded=True`, this rank's experts already. `local_experts` replaces the CUDA layer (a
    callable (x, local_ids, weights) -> [T, H]), e.g. the numpy reference on the CPU."""

    def __init__(self, spec, w13: QuantizedWeight | None = None,
                 w2: QuantizedWeight | None = None, group=None, expert_map=None,
                 combine: str = "all_reduce", sharded: bool = False, local_experts=None,
                 **layer_kw):
        self.spec = load_spec(spec)
        if combine not in COMBINES:
            raise ValueError(f"combine: {combine!r}; one of {', '.join(COMBINES)}")
        self.group, self.combine = group, combine
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        e = self.spec.moe.num_experts
        self.map = (ExpertMap.contiguous(e, self.world) if expert_map is None else
                    expert_map if isinstance(expert_map, ExpertMap) else
                    ExpertMap.of(expert_map, self.world))
        if self.map.num_experts != e:
            raise ValueError(f"expert_map: {self.map.num_experts} experts, the spec has {e}")
        self.experts = self.map.experts_of(self.rank)
        self.local_spec = shard_spec(self.spec, len(self.experts))
        self._local_np = self.map.local_ids(self.rank)
        self._local = {}                       # device -> the local-id table there
        if local_experts is None:
            if w13 is None or w2 is None:
                raise ValueError("w13, w2: the layer's weights (or local_experts) are needed")
            if not sharded:
                w13, w2 = shard_weight(w13, self.experts), shard_weight(w2, self.experts)
            local_experts = _cuda_experts(self.local_spec, w13, w2, **layer_kw)
        self.local_experts = local_experts

    def local_table(self, device) -> torch.Tensor:
        if device not in self._local:
            self._local[device] = torch.from_numpy(self._local_np).to(device)
        return self._local[device]

    def route(self, router_logits: torch.Tensor):
        """(topk_ids, topk_weights) of the spec's router in PyTorch: softmax, top-k
        (torch.topk), renormalized as the spec says; float32."""
        probs = torch.softmax(router_logits.float(), dim=-1)
        w, ids = torch.topk(probs, self.spec.moe.top_k, dim=-1, sorted=True)
        if self.spec.moe.renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
        return ids.to(torch.int32), w

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor:
        """x [T, H] (all_reduce: every rank the same tokens; all_to_all: this rank's own),
        global expert ids and weights [T, k] -> [T, H] of x's type."""
        if self.combine == "all_reduce":
            return self._all_reduce(x, topk_ids, topk_weights)
        return self._all_to_all(x, topk_ids, topk_weights)

    def _all_reduce(self, x, topk_ids, topk_weights):
        local = map_ids(topk_ids, self.local_table(x.device))
        share = self.local_experts(x, local, topk_weights.float()).float()
        dist.all_reduce(share, group=self.group)
        return share.to(x.dtype)

    def _all_to_all(self, x, topk_ids, topk_weights):
        world, k = self.world, topk_ids.shape[1]
        ids = topk_ids.long()
        rank_of = torch.tensor(self.map.rank_of + (-1,), device=x.device)
        dest = rank_of[torch.where((ids >= 0) & (ids < self.map.num_experts), ids, -1)]
        # the tokens each rank receives from this one: those with a slot on it, in token order
        masks = [(dest == d).any(dim=1) for d in range(world)]
        send_counts = torch.stack([m.sum() for m in masks])
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()   # (the host waits here)
        order = torch.cat([torch.nonzero(m).flatten() for m in masks])
        rows = x[order].contiguous()
        slot_ids = ids[order].to(torch.int32).contiguous()
        weights = topk_weights[order].float().contiguous()
        got_rows = x.new_empty((sum(recv), x.shape[1]))
        got_ids = slot_ids.new_empty((sum(recv), k))
        got_weights = weights.new_empty((sum(recv), k))
        for out, inp in ((got_rows, rows), (got_ids, slot_ids), (got_weights, weights)):
            dist.all_to_all_single(out, inp, recv, send, group=self.group)
        local = map_ids(got_ids, self.local_table(x.device))
        share = self.local_experts(got_rows, local, got_weights).float()
        back = share.new_empty((sum(send), x.shape[1]))
        dist.all_to_all_single(back, share.contiguous(), send, recv, group=self.group)
        out = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
        start = 0
        for d in range(world):                 # in rank order: the same sum every run
            out[order[start:start + send[d]]] += back[start:start + send[d]]
            start += send[d]
        return out.to(x.dtype)


def _cuda_experts(spec: Spec, w13: QuantizedWeight, w2: QuantizedWeight, **layer_kw):
    """This rank's experts on moegen's CUDA layer, as a callable (x, local_ids, weights)."""
    from .torch import compiled_layer
    layer = compiled_layer(spec, **layer_kw)
    packed = layer.pack(w13, w2)
    chunk = spec.tokens.max

    def run(x, local_ids, weights):     # (all_to_all may bring more rows than tokens.max)
        out = torch.empty_like(x)
        for i in range(0, x.shape[0], chunk):
            layer(x[i:i + chunk], packed, topk_ids=local_ids[i:i + chunk],
                  topk_weights=weights[i:i + chunk], out=out[i:i + chunk])
        return out
    return run
