"""The CUDA MoE layer on the weights real checkpoints hold (run with -m gpu): bf16 activations,
zero points (AWQ), act-order (GPTQ desc_act), expert ids outside [0, E) skipped, weights packed
on the GPU bit for bit as the numpy packer does, one workspace shared by the layers."""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import moegen
from moegen import reference as R
from moegen.targets.cuda import packing, workspace
from moegen.targets.cuda.device import host_activation
from gpu_cases import layer_for, moe_spec

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

FORMS = [("float16", True, False), ("bfloat16", True, False), ("float16", False, False),
         ("bfloat16", False, False), ("float16", True, True), ("bfloat16", False, True)]
FORM_IDS = [f"{d[0][0]}f16" + ("" if s else "-zeros") + ("-actorder" if a else "")
            for d, s, a in FORMS]


def call(layer, x, packed, ids=None, w=None, logits=None):
    """One call from host arrays (poisoned output); the result as float64 numpy."""
    layer.out.view(cp.uint16).fill(0xFFFF)               # NaN in fp16 and bf16
    xd = cp.asarray(host_activation(x))
    if logits is not None:
        y = layer(xd, cp.asarray(logits), packed)
    else:
        y = layer(xd, packed, topk_ids=cp.asarray(ids), topk_weights=cp.asarray(w))
    out = cp.asnumpy(y).view(np.uint16).view(x.dtype).astype(np.float64)
    assert not np.isnan(out).any(), "NaN in the output (unwritten or poisoned)"
    return out


def rel_err(a, b):
    """Relative L2 error; against an all-zero reference the error's own norm."""
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny)


@pytest.mark.parametrize("dtype,symmetric,act_order", FORMS, ids=FORM_IDS)
def test_forms_against_reference(rng, dtype, symmetric, act_order):
    """Every bucket (K-split, wide, tall) of a Qwen3-like shape and a small one with padded
    columns, against the float32 reference with the same zero points and g_idx."""
    for h, i, e, k, tokens in ((2048, 768, 128, 8, (1, 3, 16, 33, 64, 300, 1500)),
                               (320, 192, 8, 2, (1, 7, 100))):
        spec = moegen.load_spec(moe_spec(h, i, e, k, tokens_max=2048, group=64 if h == 320
                                         else 128, dtype=dtype, symmetric=symmetric,
                                         act_order=act_order))
        layer = layer_for(spec)
        w13, w2 = R.random_moe_weights(rng, spec)
        packed = layer.pack(w13, w2)
        for t in tokens:
            x = rng.standard_normal((t, h)).astype(R.activation_dtype(dtype))
            logits = rng.standard_normal((t, e)).astype(np.float32)
            ids, w = R.topk_softmax(logits, k, spec.moe.renormalize)
            got = (call(layer, x, packed, logits=logits) if t % 2 else
                   call(layer, x, packed, ids, w))
            want = R.moe_w4a16_weights(x, ids, w, w13, w2, spec.quant.group_size)
            err = rel_err(got, want)
            assert err <= R.MOE_REL_TOLERANCE[dtype], f"{h}x{i} T={t}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype,symmetric,act_order", FORMS, ids=FORM_IDS)
def test_gpu_packer_is_bitwise_the_numpy_packer(rng, dtype, symmetric, act_order):
    """Padded columns (H = 1056: 16 tiles and a half), the gate/up interleave, act-order rows,
    zero points; the inputs as numpy, CuPy and PyTorch arrays."""
    spec = moegen.load_spec(moe_spec(1056, 160, 6, 2, group=32, dtype=dtype,
                                     symmetric=symmetric, act_order=act_order))
    w13, w2 = R.random_moe_weights(rng, spec)
    want = packing.pack_moe_weights_host(spec, w13, w2)
    got = packing.pack_moe_weights(spec, w13, w2)
    for field, value in want.items():
        have = getattr(got, field)
        assert (value is None) == (have is None), field
        if value is not None:
            assert np.array_equal(cp.asnumpy(have), value), field
    torch = pytest.importorskip("torch")
    on_gpu = [type(w13)(*(None if a is None else torch.from_numpy(
        a.view(np.int16) if a.dtype.name == "bfloat16" else a).cuda() for a in w))
        for w in (w13, w2)]
    on_gpu = [type(w)(w.q, w.scales.view(torch.bfloat16) if dtype == "bfloat16" else w.scales,
                      w.zeros, w.g_idx) for w in on_gpu]
    again = packing.pack_moe_weights(spec, *on_gpu)
    for field, value in want.items():
        if value is not None:
            assert np.array_equal(cp.asnumpy(getattr(again, field)), value), field


def skipped_routing(rng, t, k, e):
    """Distinct experts per token with about a quarter of the slots outside [0, E) (-1, E, or
    a large id), and random weights."""
    ids = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int32)
    off = rng.random((t, k)) < 0.25
    ids[off] = rng.choice(np.array([-1, e, 1 << 20, -7], np.int32), off.sum())
    return ids, rng.random((t, k), dtype=np.float32)


@pytest.mark.parametrize("pipeline", [None, "fuse-align,fuse-swiglu,tile,alloc"],
                         ids=["topk-sum", "aggregate"])
def test_expert_ids_outside_the_range_are_skipped(rng, pipeline):
    """A slot routed outside [0, E) adds nothing: the result is the reference's, which leaves
    those slots out, in every bucket, with the top-k sum in the down GEMM or in its kernel."""
    spec = moegen.load_spec(moe_spec(1024, 512, 16, 4, tokens_max=1024))
    layer = layer_for(spec, pipeline=pipeline)
    w13, w2 = R.random_moe_weights(rng, spec)
    packed = layer.pack(w13, w2)
    for t in (1, 5, 40, 700):
        x = rng.standard_normal((t, 1024)).astype(np.float16)
        ids, w = skipped_routing(rng, t, 4, 16)
        if t > 1:
            ids[0, :] = -1                                # a token with no expert: zeros
        got = call(layer, x, packed, ids, w)
        want = R.moe_w4a16_weights(x, ids, w, w13, w2, 128)
        assert t == 1 or np.all(got[0] == 0), f"T={t}"
        assert rel_err(got, want) <= 2e-3, f"T={t}"


def test_skipped_ids_are_clean_under_memcheck(tmp_path):
    """compute-sanitizer memcheck over calls with ids outside [0, E): no invalid access."""
    sanitizer = "compute-sanitizer"
    if subprocess.run(["which", sanitizer], capture_output=True).returncode:
        pytest.skip("compute-sanitizer not installed")
    script = tmp_path / "skipped.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(Path(__file__).parents[1])!r}, {str(Path(__file__).parent)!r}]
        import numpy as np, cupy as cp, moegen
        from moegen import reference as R
        from gpu_cases import layer_for, moe_spec
        from test_cuda_quant_forms import skipped_routing
        rng = np.random.default_rng(1)
        for symmetric in (True, False):
            spec = moegen.load_spec(moe_spec(512, 256, 8, 2, tokens_max=256,
                                             symmetric=symmetric))
            layer = moegen.cuda.MoeW4A16(spec, tuning=None)
            w13, w2 = R.random_moe_weights(rng, spec)
            packed = layer.pack(w13, w2)
            for t in (1, 9, 200):
                ids, w = skipped_routing(rng, t, 2, 8)
                x = cp.asarray(rng.standard_normal((t, 512)).astype(np.float16))
                layer(x, packed, topk_ids=cp.asarray(ids), topk_weights=cp.asarray(w))
        cp.cuda.runtime.deviceSynchronize()
        print("done")
    """))
    proc = subprocess.run([sanitizer, "--tool", "memcheck", "--error-exitcode", "7",
                           sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stdout[-4000:] + proc.stderr
    assert "ERROR SUMMARY: 0 errors" in proc.stdout, proc.stdout[-4000:]


def test_layers_share_one_workspace(rng):
    """Three layers of two specs on one stream: one buffer (of the largest plan's bytes), and
    calls interleaved across the layers each match the reference."""
    specs = [moegen.load_spec(moe_spec(1024, 512, 16, 4, tokens_max=512, name=f"share{j}"))
             for j in range(2)] + [moegen.load_spec(moe_spec(512, 256, 8, 2, tokens_max=64,
                                                             name="share-small"))]
    before = workspace.held_bytes()
    layers = [moegen.cuda.MoeW4A16(s, tuning=None) for s in specs]
    weights = [R.random_moe_weights(rng, s) for s in specs]
    packed = [lay.pack(*w) for lay, w in zip(layers, weights)]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for t in (3, 300, 64, 1):
            for lay, w, p in zip(layers, weights, packed):
                t_here = min(t, lay.spec.tokens.max)
                m = lay.spec.moe
                x = rng.standard_normal((t_here, m.hidden_size)).astype(np.float16)
                logits = rng.standard_normal((t_here, m.num_experts)).astype(np.float32)
                ids, wts = R.topk_softmax(logits, m.top_k, m.renormalize)
                got = call(lay, x, p, logits=logits)
                want = R.moe_w4a16_weights(x, ids, wts, *w, lay.spec.quant.group_size)
                assert rel_err(got, want) <= 2e-3, (lay.spec.name, t_here)
        assert len({lay.workspace.data.ptr for lay in layers}) == 1
    # the stream's one buffer: the largest plan built in this process (earlier tests' too)
    most = max(lay.plan["workspace"]["bytes"] for lay in layers)
    one = workspace.reserved_bytes(cp.cuda.Device().id)
    assert most <= one and workspace.held_bytes() - before <= one, \
        "more than one workspace for one stream"


def test_bf16_pytorch_tensors_and_graphs(rng):
    """bf16 PyTorch tensors in and out (DLPack), and a CUDA graph replay of a bf16 call."""
    torch = pytest.importorskip("torch")
    spec = moegen.load_spec(moe_spec(1024, 512, 60, 6, dtype="bfloat16", symmetric=False))
    layer = layer_for(spec)
    w13, w2 = R.random_moe_weights(rng, spec)
    packed = layer.pack(w13, w2)
    x = torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(33, 60, device="cuda", dtype=torch.float32)
    out = torch.full((33, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert layer(x, logits, packed, out=out) is out
    y = layer(x, logits, packed)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    torch.cuda.synchronize()
    xn = x.float().cpu().numpy().astype(R.activation_dtype("bfloat16"))
    ids, w = R.topk_softmax(logits.cpu().numpy(), 6, True)
    want = R.moe_w4a16_weights(xn, ids, w, w13, w2, 128)
    assert rel_err(out.float().cpu().numpy(), want) <= R.MOE_REL_TOLERANCE["bfloat16"]
    assert torch.equal(out, y)
    with pytest.raises(TypeError, match="x: dtype float16, expected bfloat16"):
        layer(x.half(), logits, packed)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        layer(x, logits, packed, out=out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            layer(x, logits, packed, out=out)
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    xn = x.float().cpu().numpy().astype(R.activation_dtype("bfloat16"))
    want = R.moe_w4a16_weights(xn, ids, w, w13, w2, 128)
    assert rel_err(out.float().cpu().numpy(), want) <= R.MOE_REL_TOLERANCE["bfloat16"]


def test_weights_must_match_the_spec(rng):
    sym = moegen.load_spec(moe_spec(256, 128, 8, 2, tokens_max=64))
    asym = moegen.load_spec(moe_spec(256, 128, 8, 2, tokens_max=64, symmetric=False))
    layer = layer_for(sym)
    with pytest.raises(ValueError, match="quant.symmetric: true, the weight has zero points"):
        layer.pack(*R.random_moe_weights(rng, asym))
    other = layer_for(asym).pack(*R.random_moe_weights(rng, asym))
    x = cp.ones((2, 256), cp.float16)
    with pytest.raises(ValueError, match="weights: packed for dtype float16, zero points True"):
        layer(x, cp.ones((2, 8), cp.float32), other)
