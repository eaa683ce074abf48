"""The checkpoint loader and writer (CPU: numpy and safetensors): every naming scheme and weight
format read back to what moegen.quant makes of the original weights, and one clear error for
every checkpoint it cannot read."""
import json

import numpy as np
import pytest

from moegen import reference as R
from moegen.checkpoint import CheckpointError, read_moe_layer
from moegen.checkpoint_write import quantize_checkpoint
from moegen.quant import QuantizedWeight, dequantize, from_gptq, quantize, to_gptq

save_file = pytest.importorskip("safetensors.numpy").save_file
BF16 = R.activation_dtype("bfloat16")

# (model_type, config of the sizes, expert prefix, gate/up/down names, router name)
FAMILIES = {
    "qwen3_moe": ({"num_experts": 4, "moe_intermediate_size": 128, "norm_topk_prob": True,
                   "decoder_sparse_step": 1, "mlp_only_layers": []},
                  "model.layers.{l}.mlp.experts.{e}", ("gate_proj", "up_proj", "down_proj"),
                  "model.layers.{l}.mlp.gate.weight"),
    "mixtral": ({"num_local_experts": 4, "intermediate_size": 128},
                "model.layers.{l}.block_sparse_moe.experts.{e}", ("w1", "w3", "w2"),
                "model.layers.{l}.block_sparse_moe.gate.weight"),
    "deepseek_v2": ({"n_routed_experts": 4, "moe_intermediate_size": 128,
                     "first_k_dense_replace": 1, "norm_topk_prob": False,
                     "scoring_func": "softmax", "topk_method": "greedy"},
                    "model.layers.{l}.mlp.experts.{e}", ("gate_proj", "up_proj", "down_proj"),
                    "model.layers.{l}.mlp.gate.weight"),
}
H = 256


def write_model(folder, model_type="qwen3_moe", layers=2, dtype="bfloat16", shards=1,
                extra_config=None):
    """An unquantized checkpoint folder of random weights; returns {tensor name: array}."""
    sizes, expert, names, router = FAMILIES[model_type]
    rng = np.random.default_rng(7)
    inter = sizes.get("moe_intermediate_size", sizes.get("intermediate_size"))
    experts = next(v for k, v in sizes.items() if "experts" in k)
    config = {"model_type": model_type, "hidden_size": H, "num_hidden_layers": layers,
              "num_experts_per_tok": 2, "dtype": dtype, **sizes, **(extra_config or {})}
    np_dtype = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((16, H)).astype(np_dtype)}
    first = config.get("first_k_dense_replace", 0)
    for layer in range(layers):
        if layer < first:                       # a dense layer (DeepSeek): not ours
            tensors[f"model.layers.{layer}.mlp.gate_proj.weight"] = \
                rng.standard_normal((inter, H)).astype(np_dtype)
            continue
        for e in range(experts):
            prefix = expert.format(l=layer, e=e)
            for name, shape in zip(names, ((inter, H), (inter, H), (H, inter))):
                tensors[f"{prefix}.{name}.weight"] = \
                    (rng.standard_normal(shape) * 0.05).astype(np_dtype)
        tensors[router.format(l=layer)] = rng.standard_normal((experts, H)).astype(np_dtype)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    names_sorted = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
    else:
        weight_map = {}
        for s in range(shards):
            part = names_sorted[s::shards]
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: tensors[n] for n in part}, str(folder / fname))
            weight_map.update({n: fname for n in part})
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tensors


def expected(tensors, model_type, layer, group, symmetric=True, g_idx13=None, g_idx2=None):
    """What moegen.quant makes of the original weights: (w13, w2) of each expert, stacked."""
    sizes, expert, names, _ = FAMILIES[model_type]
    experts = next(v for k, v in sizes.items() if "experts" in k)
    w13, w2 = [], []
    for e in range(experts):
        prefix = expert.format(l=layer, e=e)
        lin = [np.asarray(tensors[f"{prefix}.{n}.weight"], np.float32).T for n in names]
        g13 = None if g_idx13 is None else g_idx13[e]
        g2 = None if g_idx2 is None else g_idx2[e]
        gate, up = (quantize(w, group, symmetric, g13) for w in lin[:2])
        w13.append(QuantizedWeight(np.concatenate([gate.q, up.q], -1),
                                   np.concatenate([gate.scales, up.scales], -1),
                                   None if symmetric else np.concatenate([gate.zeros, up.zeros],
                                                                         -1)))
        w2.append(quantize(lin[2], group, symmetric, g2))
    return w13, w2


def assert_weights_match(got: QuantizedWeight, want: list[QuantizedWeight], dtype):
    for e, w in enumerate(want):
        assert np.array_equal(got.q[e], w.q), e
        assert np.array_equal(got.scales[e], np.asarray(w.scales).astype(dtype)), e
        if w.zeros is None:
            assert got.zeros is None
        else:
            assert np.array_equal(got.zeros[e], w.zeros), e


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("fmt,symmetric,act_order", [
    ("awq", False, False), ("gptq", True, False), ("gptq", True, True),
    ("compressed-tensors", True, False), ("compressed-tensors", False, True),
    ("unquantized", True, False)])
def test_formats_and_families_read_back(tmp_path, model_type, fmt, symmetric, act_order):
    src = tmp_path / "model"
    tensors = write_model(src, model_type, layers=2)
    folder = src if fmt == "unquantized" else quantize_checkpoint(
        src, tmp_path / "q", fmt, group_size=64, symmetric=symmetric, act_order=act_order)
    group = 128 if fmt == "unquantized" else 64          # unquantized: read_moe_layer's default
    layer = read_moe_layer(folder, 1, tokens_max=512)
    spec = layer.spec
    assert (spec.moe.hidden_size, spec.moe.intermediate_size, spec.moe.num_experts,
            spec.moe.top_k) == (H, 128, 4, 2)
    assert (spec.quant.group_size, spec.quant.symmetric, spec.quant.act_order) == (
        group, symmetric, act_order)
    assert spec.dtype == "bfloat16" and spec.tokens.max == 512
    assert spec.moe.renormalize == (model_type != "deepseek_v2")
    assert layer.source == fmt and layer.family == model_type
    g13 = g2 = None
    if act_order:
        assert layer.w13.g_idx.shape == (4, H) and layer.w2.g_idx.shape == (4, 128)
        g13, g2 = layer.w13.g_idx, layer.w2.g_idx
        assert not np.array_equal(g13[0], np.arange(H) // group)      # a real reordering
    else:
        assert layer.w13.g_idx is None and layer.w2.g_idx is None
    want13, want2 = expected(tensors, model_type, 1, group, symmetric, g13, g2)
    assert_weights_match(layer.w13, want13, BF16)
    assert_weights_match(layer.w2, want2, BF16)
    router = FAMILIES[model_type][3].format(l=1)
    assert np.array_equal(layer.router, np.asarray(tensors[router], np.float32))


def test_the_layer_computes_the_dequantized_model(tmp_path, rng):
    """The read weights in the reference equal the dense float computation with the
    dequantized weights: what a model with those weights computes."""
    src = tmp_path / "model"
    write_model(src, "qwen3_moe", layers=1)
    layer = read_moe_layer(quantize_checkpoint(src, tmp_path / "q", "gptq", group_size=64,
                                               act_order=True), 0)
    x = rng.standard_normal((5, H)).astype(BF16)
    logits = x.astype(np.float32) @ layer.router.T
    ids, w = R.topk_softmax(logits, 2, layer.spec.moe.renormalize)
    got = R.moe_w4a16_weights(x, ids, w, layer.w13, layer.w2, 64)
    d13, d2 = dequantize(layer.w13, 64), dequantize(layer.w2, 64)
    xf = x.astype(np.float32)
    want = np.zeros((5, H), np.float32)
    for t in range(5):
        for k in range(2):
            gu = xf[t] @ d13[ids[t, k]]
            act = gu[:128] / (1 + np.exp(-gu[:128])) * gu[128:]
            want[t] += w[t, k] * (act @ d2[ids[t, k]])
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_sharded_checkpoint_with_index(tmp_path):
    tensors = write_model(tmp_path / "m", "mixtral", layers=2, dtype="float16", shards=3)
    layer = read_moe_layer(tmp_path / "m", 1, group_size=64)
    want13, want2 = expected(tensors, "mixtral", 1, 64)
    assert layer.spec.dtype == "float16"
    assert_weights_match(layer.w13, want13, np.float16)
    assert_weights_match(layer.w2, want2, np.float16)


def test_deepseek_routing_notes(tmp_path):
    write_model(tmp_path / "v3", "deepseek_v2", layers=2, extra_config={
        "model_type": "deepseek_v3", "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "n_group": 2, "topk_group": 1, "norm_topk_prob": True})
    layer = read_moe_layer(tmp_path / "v3", 1)
    assert "sigmoid" in layer.routing and "pass them" in layer.routing
    write_model(tmp_path / "v2", "deepseek_v2", layers=2,
                extra_config={"routed_scaling_factor": 16.0})
    assert "routed_scaling_factor 16.0" in read_moe_layer(tmp_path / "v2", 1).routing


def quantized(tmp_path, fmt="gptq", **kw):
    src = tmp_path / "model"
    write_model(src, "qwen3_moe", layers=2)
    return quantize_checkpoint(src, tmp_path / fmt, fmt, group_size=64, **kw)


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def rewrite(folder, fn):
    """Apply fn to the tensors dict of model.safetensors and write it back."""
    from safetensors.numpy import load_file
    tensors = load_file(str(folder / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_errors_name_the_file_and_the_tensor(tmp_path):
    folder = quantized(tmp_path, "awq")
    name = "model.layers.1.mlp.experts.3.up_proj.qzeros"
    rewrite(folder, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"tensor {name} is not in the checkpoint "
                                              rf"\(in none of model.safetensors\)"):
        read_moe_layer(folder, 1)
    rewrite(folder, lambda t: t.update({name: np.zeros((3, 5), np.int32)}))
    with pytest.raises(CheckpointError, match=r"experts.3.up_proj: AWQ: qzeros has shape"):
        read_moe_layer(folder, 1)


@pytest.mark.parametrize("change,message", [
    ({"quantization_config": {"quant_method": "fp8"}}, r"quant_method: 'fp8'; moegen reads awq"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 64}},
     r"quantization_config.bits: 8; moe_w4a16 takes 4-bit"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4, "version": "gemv"}},
     r"version: 'gemv'; moegen reads AutoAWQ's \"gemm\""),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "g": {"format": "float-quantized", "weights": {"num_bits": 8}}}}},
     r"config_groups.g.format: 'float-quantized'"),
    ({"model_type": "llama"}, r"model_type 'llama'; moegen reads deepseek_v2"),
    ({"num_experts": None}, r"no integer num_experts or num_local_experts"),
    ({"mlp_only_layers": [1]}, r"layer 1 has no routed experts: it is in mlp_only_layers"),
    ({"dtype": "int8"}, r"dtype 'int8'; give dtype="),
])
def test_config_errors(tmp_path, change, message):
    src = tmp_path / "model"
    write_model(src, "qwen3_moe", layers=2)
    edit_config(src, **change)
    with pytest.raises(CheckpointError, match=message) as info:
        read_moe_layer(src, 1)
    assert "config.json" in str(info.value)


def test_layer_and_folder_errors(tmp_path):
    src = tmp_path / "model"
    write_model(src, "deepseek_v2", layers=2)
    with pytest.raises(CheckpointError, match=r"layer 0 has no routed experts: the first 1 "
                                              r"layers are dense"):
        read_moe_layer(src, 0)
    with pytest.raises(CheckpointError, match=r"layer 2 is not a layer of the model "
                                              r"\(num_hidden_layers: 2\)"):
        read_moe_layer(src, 2)
    with pytest.raises(CheckpointError, match=r"no config.json"):
        read_moe_layer(tmp_path / "nowhere", 0)
    (src / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"index.json: not a safetensors index"):
        read_moe_layer(src, 1)


def test_gpt_oss_is_recognized_and_refused(tmp_path):
    folder = tmp_path / "gpt-oss"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "gpt_oss", "num_hidden_layers": 2, "num_local_experts": 4,
        "num_experts_per_tok": 2, "hidden_size": H, "intermediate_size": 128}))
    with pytest.raises(CheckpointError, match=r"gpt-oss layer 1: its experts add biases"):
        read_moe_layer(folder, 1)


def test_gate_and_up_must_share_g_idx(tmp_path):
    folder = quantized(tmp_path, "gptq", act_order=True)
    name = "model.layers.1.mlp.experts.2.up_proj.g_idx"
    rewrite(folder, lambda t: t.update({name: t[name][::-1].copy()}))
    with pytest.raises(CheckpointError, match=r"experts.2: the gate and up projections have "
                                              r"different g_idx"):
        read_moe_layer(folder, 1)


def test_gptq_v2_zero_points(tmp_path, rng):
    """gptq_v2 stores the zero point itself, gptq (v1) the zero point less one."""
    w = rng.standard_normal((128, 64)).astype(np.float32)
    qw = quantize(w, 64, symmetric=False)
    qweight, qzeros_v1, scales, g_idx = to_gptq(qw, 64)
    v1 = from_gptq(qweight, qzeros_v1, scales, 64, g_idx)
    zeros_v2 = qw.zeros.astype(np.int16) + 8
    from moegen.quant import _pack_columns
    v2 = from_gptq(qweight, _pack_columns(zeros_v2.astype(np.uint8)), scales, 64, g_idx,
                   zero_offset=0)
    assert np.array_equal(v1.zeros, qw.zeros) and np.array_equal(v2.zeros, qw.zeros)
