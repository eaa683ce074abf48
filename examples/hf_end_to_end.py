"""A Hugging Face MoE model end to end on moegen's kernels (needs a CUDA GPU, CuPy, PyTorch,
transformers, safetensors and ml_dtypes):

1. build a small Qwen3-MoE or Mixtral with transformers (random init from a config, the real
   architecture code) and save it;
2. quantize its routed experts with moegen into a real checkpoint format (AWQ, GPTQ with
   act-order, or compressed-tensors pack-quantized) and save that;
3. load the quantized checkpoint back twice: as transformers runs it with the dequantized
   expert weights (the reference), and with every MoE layer's experts on moegen's kernels
   (moegen.torch.replace_experts);
4. greedy-generate from the same prompts with both and compare: the tokens must be identical,
   every step's logits within 2e-2 (relative, L2 over the batch; both models run on the
   reference's tokens, each MoE layer's experts given the reference's routing, so that the
   figure is the kernels' own error), and every decision the same in both models' logits. A
   random-init model's next-token logits and routers can hold near ties, which the kernels'
   own rounding (bf16: 8 bits) may break the other way (a token routed to another expert
   moves its logits by far more than 2e-2); the sequences may then part, but only at such a
   tie (`compare` says how near).

The models run in float32 and the moegen experts in the checkpoint's activation type (bf16 or
fp16), so the comparison sees the kernels' own rounding and nothing else.

    python examples/hf_end_to_end.py --family qwen3_moe --format awq --dtype bfloat16
    python examples/hf_end_to_end.py --family mixtral --format gptq --dtype float16
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import moegen.torch
from moegen.checkpoint import read_moe_layer
from moegen.checkpoint_write import quantize_checkpoint
from moegen.quant import dequantize

FORMATS = {"awq": dict(fmt="awq"), "gptq": dict(fmt="gptq", act_order=True),
           "compressed-tensors": dict(fmt="compressed-tensors", symmetric=False)}


def small_model(family: str, dtype: str, seed: int):
    """A 2-layer model of the family, random init (seeded), in float32."""
    import transformers
    torch.manual_seed(seed)
    common = dict(vocab_size=2048, hidden_size=1024, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                  max_position_embeddings=512, num_experts_per_tok=2, dtype=dtype)
    if family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(intermediate_size=2048, moe_intermediate_size=512,
                                             num_experts=16, norm_topk_prob=True, **common)
        return transformers.Qwen3MoeForCausalLM(config).float()
    config = transformers.MixtralConfig(intermediate_size=768, num_local_experts=8, **common)
    return transformers.MixtralForCausalLM(config).float()


def dequantized_experts(model, checkpoint: Path) -> None:
    """The reference: each MoE layer's expert weights set to the checkpoint's dequantized
    int4 weights (what the quantized model computes), in transformers' own experts."""
    for i, block in moegen.torch.moe_blocks(model):
        layer = read_moe_layer(checkpoint, i)
        g = layer.spec.quant.group_size
        experts = block.experts
        with torch.no_grad():      # transformers: gate_up_proj [E, 2I, H], down_proj [E, H, I]
            experts.gate_up_proj.copy_(torch.from_numpy(dequantize(layer.w13, g)).transpose(1, 2))
            experts.down_proj.copy_(torch.from_numpy(dequantize(layer.w2, g)).transpose(1, 2))


def run(family: str, fmt: str, dtype: str, steps: int = 32, seed: int = 0,
        folder: Path | None = None, log=print) -> dict:
    """The whole check; returns {"same_tokens", "max_logit_error", ...}."""
    import transformers
    folder = Path(folder or tempfile.mkdtemp(prefix="moegen-e2e-"))
    model = small_model(family, dtype, seed)
    model.to(getattr(torch, dtype)).save_pretrained(folder / "model")
    quantized = quantize_checkpoint(folder / "model", folder / f"model-{fmt}", group_size=128,
                                    **FORMATS[fmt])
    log(f"{family}: wrote {quantized} ({fmt}); activations {dtype}")
    auto = transformers.AutoModelForCausalLM
    reference = auto.from_pretrained(folder / "model", dtype=torch.float32).cuda().eval()
    dequantized_experts(reference, quantized)
    ours = auto.from_pretrained(folder / "model", dtype=torch.float32).cuda().eval()
    replaced = moegen.torch.replace_experts(ours, quantized, tokens_max=1024)
    log(f"{family}: {replaced} MoE layers on moegen's kernels: "
        f"{ours.model.layers[0].mlp.experts}")
    prompts = torch.randint(0, model.config.vocab_size, (4, 24),
                            generator=torch.Generator().manual_seed(seed)).cuda()
    kw = dict(max_new_tokens=steps, do_sample=False, return_dict_in_generate=True,
              output_logits=True, pad_token_id=0)
    with torch.no_grad():
        want = reference.generate(prompts, **kw)
        got = ours.generate(prompts, **kw)
        # both models on the reference's tokens: each step's logits side by side, ours with
        # its own routing and with the reference's
        start = prompts.shape[1] - 1
        ref_routing, our_routing = [], []
        ref_logits = routed_forward(reference, want.sequences, ref_routing)[:, start:-1]
        our_logits = routed_forward(ours, want.sequences, our_routing)[:, start:-1]
        pinned = routed_forward(ours, want.sequences, ref_routing, pin=True)[:, start:-1]
    result = {"family": family, "format": fmt, "dtype": dtype,
              **compare(want.sequences[:, prompts.shape[1]:], got.sequences[:, prompts.shape[1]:],
                        ref_logits, our_logits, steps, pinned),
              **routing_differences(ref_routing, our_routing)}
    tokens = ("identical" if result["same_tokens"] else
              f"parting at step {result['first_difference']}, a near tie" if result["ok"] else
              "DIFFER")
    log(f"{family} {fmt} {dtype}: {steps} greedy tokens {tokens}; logits' largest relative "
        f"error {result['max_logit_error']:.2e} (limit {LOGIT_LIMIT}), {result['near_ties']} "
        f"near ties of {result['decisions']} decisions, {result['routing_differences']} of "
        f"{result['routed']} routing decisions taken otherwise: "
        f"{'ok' if result['ok'] else 'FAILED'}")
    return result


def routed_forward(model, tokens, routing: list, pin: bool = False):
    """The model's logits (float32) on `tokens`, teacher-forced. Each MoE layer's routing (the
    top-k ids and weights its experts are called with) is appended to `routing`, or, with
    `pin`, taken from it instead (layer by layer, in the order they run)."""
    handles = []
    for n, (_, block) in enumerate(moegen.torch.moe_blocks(model)):
        def hook(module, args, n=n):
            if pin:
                return (args[0], *routing[n])
            routing.append((args[1].clone(), args[2].clone()))
            return None
        handles.append(block.experts.register_forward_pre_hook(hook))
    try:
        return model(tokens).logits.float()
    finally:
        for h in handles:
            h.remove()


def routing_differences(a: list, b: list) -> dict:
    """Routing decisions (a token in a layer) of two recorded routings: how many, and in how
    many the set of experts differs."""
    differ = sum(int((ia.sort(-1).values != ib.sort(-1).values).any(-1).sum())
                 for (ia, _), (ib, _) in zip(a, b))
    return {"routing_differences": differ, "routed": sum(int(ia.shape[0]) for ia, _ in a)}


LOGIT_LIMIT = 2e-2
TIE_MARGIN = 4      # a decision is a near tie where the reference's top two logits lie within
                    # this many times the step's largest logit difference of each other


def compare(want_tokens, got_tokens, ref_logits, our_logits, steps: int,
            pinned_logits=None) -> dict:
    """Greedy tokens and logits of the two models. Logits ([B, steps, V], both models on the
    reference's tokens; `pinned_logits`: ours given the reference's routing, else our_logits):
    each step's relative L2 error of the pinned logits over the batch within LOGIT_LIMIT.
    Tokens: identical; where they are not, the first difference must fall on a near tie (the
    reference's top two logits closer than TIE_MARGIN x that row's largest difference from
    our_logits, which holds a routing decision taken otherwise too: the kernels' own rounding
    may pick either, and the sequences part there), and every other decision of the
    reference's tokens must be the same in both models' logits."""
    pinned = our_logits if pinned_logits is None else pinned_logits
    errors = [float((ref_logits[:, s] - pinned[:, s]).norm() / ref_logits[:, s].norm())
              for s in range(ref_logits.shape[1])]
    top2 = ref_logits.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    noise = (ref_logits - our_logits).abs().amax(dim=-1)
    tie = margin <= TIE_MARGIN * noise                          # [B, steps]
    agree = ref_logits.argmax(-1) == our_logits.argmax(-1)
    same = torch.equal(want_tokens, got_tokens)
    first = None
    if not same:
        differs = (want_tokens != got_tokens).any(dim=0).nonzero()
        first = int(differs[0])
    parted_at_tie = same or bool(tie[(want_tokens[:, first] != got_tokens[:, first]), first].all())
    decisive_agree = bool((agree | tie).all())
    return {"same_tokens": same, "first_difference": first, "steps": len(errors),
            "max_logit_error": max(errors), "near_ties": int(tie.sum()),
            "decisions": int(tie.numel()),
            "ok": (len(errors) == steps and max(errors) <= LOGIT_LIMIT and decisive_agree
                   and parted_at_tie)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=["qwen3_moe", "mixtral"], default="qwen3_moe")
    parser.add_argument("--format", choices=sorted(FORMATS), default="awq")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, help="where to write the checkpoints (default: a "
                                                 "temporary folder)")
    args = parser.parse_args(argv)
    np.random.seed(args.seed)
    result = run(args.family, args.format, args.dtype, args.steps, args.seed, args.dir)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
