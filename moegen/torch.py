"""PyTorch: the MoE layer as `torch.library` custom ops, and an nn.Module in the place of a
transformers MoE block's experts.

    import moegen.torch
    moegen.torch.replace_experts(model, "Qwen3-tiny-awq")      # every MoE layer of the model
    model.generate(...)                                        # eager, torch.compile, graphs

Ops (each with a fake kernel, so `torch.compile(fullgraph=True)` traces through them, and
capturable in CUDA graphs: they launch on PyTorch's current stream, allocate their output with
PyTorch and read nothing back to the host):

    torch.ops.moegen.moe_w4a16(x, topk_ids, topk_weights, handle)    # routing given
    torch.ops.moegen.moe_w4a16_router(x, router_logits, handle)      # the layer's own router

x [T, H] of the spec's dtype; topk_ids int32 [T, k] (ids outside [0, E) skipped), topk_weights
float32 [T, k]; router_logits float32 [T, E]. `handle` names a compiled layer and its packed
weights (`register`); a module holds its own.
"""
from __future__ import annotations

import itertools

import torch

from .checkpoint import load_moe_layer
from .spec import load_spec

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
_REGISTERED: dict[int, tuple] = {}        # handle -> (MoeW4A16, PackedMoeWeights)
_LAYERS: dict[tuple, object] = {}         # (spec hash, arch, options) -> compiled MoeW4A16
_HANDLES = itertools.count(1)


def compiled_layer(spec, **layer_kw):
    """The compiled MoeW4A16 of a spec, one per (spec, options) in this process: the layers of
    a model share it (and, on one stream, its workspace)."""
    from .targets.cuda.runtime import MoeW4A16
    spec = load_spec(spec)
    key = (spec.hash, tuple(sorted(layer_kw.items())))
    if key not in _LAYERS:
        _LAYERS[key] = MoeW4A16(spec, **layer_kw)
    return _LAYERS[key]


def register(spec, weights, **layer_kw) -> int:
    """A handle for the ops: the spec's compiled layer and packed weights (PackedMoeWeights)."""
    handle = next(_HANDLES)
    _REGISTERED[handle] = (compiled_layer(spec, **layer_kw), weights)
    return handle


def _layer(handle: int):
    try:
        return _REGISTERED[handle]
    except KeyError:
        raise ValueError(f"handle {handle}: no layer registered (moegen.torch.register)") from None


@torch.library.custom_op("moegen::moe_w4a16", mutates_args=())
def moe_w4a16(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              handle: int) -> torch.Tensor:
    layer, weights = _layer(handle)
    out = torch.empty_like(x)
    layer(x, weights, topk_ids=topk_ids, topk_weights=topk_weights, out=out)
    return out


@moe_w4a16.register_fake
def _moe_w4a16_fake(x, topk_ids, topk_weights, handle):
    return torch.empty_like(x)


@torch.library.custom_op("moegen::moe_w4a16_router", mutates_args=())
def moe_w4a16_router(x: torch.Tensor, router_logits: torch.Tensor,
                     handle: int) -> torch.Tensor:
    layer, weights = _layer(handle)
    out = torch.empty_like(x)
    layer(x, router_logits, weights, out=out)
    return out


@moe_w4a16_router.register_fake
def _moe_w4a16_router_fake(x, router_logits, handle):
    return torch.empty_like(x)


class MoeW4A16Experts(torch.nn.Module):
    """The routed experts of one MoE layer on moegen's kernels, called as transformers calls a
    MoE block's experts: forward(hidden_states [T, H], top_k_index [T, k], top_k_weights
    [T, k]) -> [T, H]. Calls of more than the spec's tokens.max tokens run in chunks."""

    def __init__(self, spec, weights, **layer_kw):
        super().__init__()
        self.spec = load_spec(spec)
        self.weights = weights
        self.handle = register(self.spec, weights, **layer_kw)
        self.hidden_size = self.spec.moe.hidden_size
        self.chunk = self.spec.tokens.max
        self.dtype = _TORCH_DTYPES[self.spec.dtype]

    @classmethod
    def from_checkpoint(cls, path, layer: int, **kw) -> "MoeW4A16Experts":
        """Layer `layer` of a Hugging Face checkpoint folder (moegen.load_moe_layer's kw)."""
        spec, weights = load_moe_layer(path, layer, **kw)
        return cls(spec, weights)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden_size).to(self.dtype).contiguous()
        ids = top_k_index.reshape(x.shape[0], -1).to(torch.int32).contiguous()
        w = top_k_weights.reshape(x.shape[0], -1).to(torch.float32).contiguous()
        if x.shape[0] <= self.chunk:
            out = torch.ops.moegen.moe_w4a16(x, ids, w, self.handle)
        else:
            out = torch.cat([torch.ops.moegen.moe_w4a16(x[i:i + self.chunk],
                                                        ids[i:i + self.chunk],
                                                        w[i:i + self.chunk], self.handle)
                             for i in range(0, x.shape[0], self.chunk)])
        return out.to(hidden_states.dtype).reshape(shape)

    def extra_repr(self) -> str:
        q = self.spec.quant
        return (f"spec={self.spec.name}, experts={self.spec.moe.num_experts}, "
                f"dtype={self.spec.dtype}, group={q.group_size}, symmetric={q.symmetric}, "
                f"act_order={q.act_order}")


def moe_blocks(model) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, MoE block) of a transformers decoder: the layers' `mlp` (or Mixtral's
    `block_sparse_moe`) that have `experts`."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers (a transformers decoder "
                         f"has them)")
    found = []
    for i, layer in enumerate(layers):
        for name in ("mlp", "block_sparse_moe"):
            block = getattr(layer, name, None)
            if block is not None and hasattr(block, "experts"):
                found.append((i, block))
                break
    return found


def replace_experts(model, path, **kw) -> int:
    """Put MoeW4A16Experts from the checkpoint folder `path` in the place of the experts of
    every MoE layer of `model`; returns how many. kw: moegen.load_moe_layer's (tokens_max,
    dtype, group_size, arch)."""
    blocks = moe_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no MoE layer (a layer's mlp with experts)")
    for i, block in blocks:
        block.experts = MoeW4A16Experts.from_checkpoint(path, i, **kw)
    return len(blocks)
