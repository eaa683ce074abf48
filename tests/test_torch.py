"""moegen.torch on the GPU: the custom ops against the reference, under torch.compile
(fullgraph) and in CUDA graphs; the experts module in a transformers model end to end
(examples/hf_end_to_end.py)."""
import sys

import numpy as np
import pytest

import moegen
from moegen import reference as R
from conftest import ROOT
from gpu_cases import moe_spec

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu
mt = pytest.importorskip("moegen.torch")


def experts_module(rng, dtype="bfloat16", symmetric=False, act_order=False, tokens_max=256):
    spec = moegen.load_spec(moe_spec(1024, 512, 16, 4, tokens_max=tokens_max, dtype=dtype,
                                     symmetric=symmetric, act_order=act_order))
    w13, w2 = R.random_moe_weights(rng, spec)
    module = mt.MoeW4A16Experts(spec, moegen.cuda.MoeW4A16(spec).pack(w13, w2))
    return spec, module, (w13, w2)


def routing(t, k=4, e=16):
    gen = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    return ids.cuda(), torch.rand(t, k, generator=gen).cuda()


def want(spec, weights, x, ids, w):
    xn = x.float().cpu().numpy().astype(R.activation_dtype(spec.dtype))
    return R.moe_w4a16_weights(xn, ids.cpu().numpy().astype(np.int32), w.cpu().numpy(),
                               *weights, spec.quant.group_size)


def rel_err(got, ref):
    got = got.float().cpu().numpy().astype(np.float64)
    assert not np.isnan(got).any()
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("dtype,symmetric,act_order", [("bfloat16", False, False),
                                                       ("float16", True, True)])
def test_module_matches_reference_with_chunks(rng, dtype, symmetric, act_order):
    """int64 ids and weights of the model's dtype as transformers gives them; 600 tokens run
    in chunks of tokens.max (256)."""
    spec, module, weights = experts_module(rng, dtype, symmetric, act_order)
    for t in (1, 37, 600):
        x = torch.randn(t, 1024, device="cuda", dtype=getattr(torch, dtype))
        ids, w = routing(t)
        y = module(x, ids, w.to(x.dtype))
        assert y.dtype == x.dtype and y.shape == x.shape
        err = rel_err(y, want(spec, weights, x, ids, w.to(x.dtype).float()))
        assert err <= R.MOE_REL_TOLERANCE[dtype], (t, err)


def test_router_op(rng):
    spec, module, weights = experts_module(rng, "float16", True)
    x = torch.randn(9, 1024, device="cuda", dtype=torch.float16)
    logits = torch.randn(9, 16, device="cuda")
    y = torch.ops.moegen.moe_w4a16_router(x, logits, module.handle)
    ids, w = R.topk_softmax(logits.cpu().numpy(), 4, spec.moe.renormalize)
    assert rel_err(y, want(spec, weights, x, torch.from_numpy(ids), torch.from_numpy(w))) <= 2e-3


def test_torch_compile_fullgraph_and_cuda_graphs(rng):
    """A block (router in PyTorch, experts on moegen) under torch.compile(fullgraph=True)
    against the reference, then captured in a CUDA graph and replayed with new inputs: each
    replay bit for bit the compiled block's eager call."""
    spec, module, weights = experts_module(rng, "bfloat16", False)
    gate = torch.nn.Linear(1024, 16, bias=False).cuda().requires_grad_(False)

    def block(x):
        probs = torch.softmax(gate(x.float()), dim=-1)
        w, ids = torch.topk(probs, 4, dim=-1)
        return module(x, ids, (w / w.sum(-1, keepdim=True)).to(x.dtype))

    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16)
    w, ids = torch.topk(torch.softmax(gate(x.float()), dim=-1), 4, dim=-1)
    ref = want(spec, weights, x, ids, (w / w.sum(-1, keepdim=True)).to(x.dtype).float())
    # (the compiled router may differ from eager in the last bits of its weights)
    assert rel_err(compiled(x), ref) <= R.MOE_REL_TOLERANCE["bfloat16"]
    assert rel_err(block(x), ref) <= R.MOE_REL_TOLERANCE["bfloat16"]
    with torch._subclasses.fake_tensor.FakeTensorMode():       # the fake kernel
        fake = torch.ops.moegen.moe_w4a16(torch.empty(5, 1024, dtype=torch.bfloat16),
                                          torch.empty(5, 4, dtype=torch.int32),
                                          torch.empty(5, 4), module.handle)
        assert fake.shape == (5, 1024) and fake.dtype == torch.bfloat16
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            compiled(static_x)                 # warm up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = compiled(static_x)
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, compiled(static_x))


def test_end_to_end_transformers_models(tmp_path):
    """Qwen3-MoE (AWQ, bf16) and Mixtral (GPTQ act-order, fp16; compressed-tensors, bf16)
    quantized, saved in the real format, loaded back and generated from: 32 greedy tokens as
    transformers gives with the dequantized weights (or parting only at a near tie), logits
    within 2e-2 and every decision the same (examples/hf_end_to_end.compare)."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "examples"))
    import hf_end_to_end
    for family, fmt, dtype in (("qwen3_moe", "awq", "bfloat16"), ("mixtral", "gptq", "float16"),
                               ("mixtral", "compressed-tensors", "bfloat16")):
        result = hf_end_to_end.run(family, fmt, dtype, steps=32, folder=tmp_path / fmt)
        assert result["ok"], result


def test_end_to_end_comparison_tells_ties_from_differences():
    """hf_end_to_end.compare: identical tokens pass; a parting at a near tie passes; a parting
    at a clear margin, or one step's logits off by more than 2e-2 with the reference's
    routing, fails."""
    sys.path.insert(0, str(ROOT / "examples"))
    import hf_end_to_end
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(4, 32, 100, generator=gen)
    ours = ref + 1e-4 * torch.randn(ref.shape, generator=gen)
    tokens = ref.argmax(-1)
    assert hf_end_to_end.compare(tokens, tokens.clone(), ref, ours, 32)["ok"]
    tied, near = ref.clone(), ours.clone()
    top = tied[2, 5].topk(2)
    tied[2, 5, top.indices[1]] = top.values[0] - 1e-5         # a near tie at step 5 ...
    near[2, 5] = tied[2, 5]
    near[2, 5, top.indices[1]] = top.values[0] + 1e-4         # ... which ours breaks the other way
    parted = tied.argmax(-1).clone()
    parted[2, 5:] = 7
    result = hf_end_to_end.compare(tied.argmax(-1), parted, tied, near, 32)
    assert result["ok"] and result["first_difference"] == 5 and not result["same_tokens"]
    clear = tokens.clone()
    clear[1, 3:] = (tokens[1, 3] + 1) % 100
    assert not hf_end_to_end.compare(tokens, clear, ref, ours, 32)["ok"]
    off = ours.clone()
    off[:, 9] *= 1.05
    assert not hf_end_to_end.compare(tokens, tokens, ref, off, 32)["ok"]
    # the error is the pinned logits' (a routing decision taken otherwise moves the others)
    assert hf_end_to_end.compare(tokens, tokens, ref, off, 32, pinned_logits=ours)["ok"]
    assert not hf_end_to_end.compare(tokens, tokens, ref, ours, 32, pinned_logits=off)["ok"]
