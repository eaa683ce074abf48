import copy
import dataclasses

import pytest

import moegen
from moegen import SpecError, load_spec
from conftest import EXAMPLES

MOE = {"name": "t", "pipeline": "moe_w4a16",
       "moe": {"hidden_size": 256, "intermediate_size": 128, "num_experts": 8, "top_k": 2},
       "quant": {"group_size": 128}, "targets": {"cuda": {"arch": "sm_90"}}}
MSD = {"name": "t", "pipeline": "msd_matmul", "msd": {"m": 1, "n": 64, "k": 256, "steps": 3},
       "targets": {"ascend": {}}}


def with_(base, path, value):
    data = copy.deepcopy(base)
    *head, last = path.split(".")
    node = data
    for key in head:
        node = node.setdefault(key, {})
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load(path):
    spec = load_spec(path)
    assert spec.name == path.stem
    assert spec.hash == load_spec(path).hash


def test_example_shapes():
    by_name = {p.stem: load_spec(p) for p in EXAMPLES}
    assert set(by_name) == {"moe-seed", "msd-seed", "mixtral-8x7b", "qwen3-30b-a3b",
                            "deepseek-v2-lite", "qwen3-30b-a3b-awq", "mixtral-8x7b-gptq"}
    awq, gptq = by_name["qwen3-30b-a3b-awq"], by_name["mixtral-8x7b-gptq"]
    assert (awq.dtype, awq.quant.symmetric, awq.quant.act_order) == ("bfloat16", False, False)
    assert (gptq.dtype, gptq.quant.symmetric, gptq.quant.act_order) == ("float16", True, True)
    assert awq.moe == by_name["qwen3-30b-a3b"].moe and gptq.moe == by_name["mixtral-8x7b"].moe
    m = by_name["mixtral-8x7b"].moe
    assert (m.hidden_size, m.intermediate_size, m.num_experts, m.top_k) == (4096, 14336, 8, 2)
    m = by_name["qwen3-30b-a3b"].moe
    assert (m.hidden_size, m.intermediate_size, m.num_experts, m.top_k) == (2048, 768, 128, 8)
    m = by_name["deepseek-v2-lite"].moe
    assert (m.hidden_size, m.intermediate_size, m.num_experts, m.top_k) == (2048, 1408, 64, 6)
    m = by_name["moe-seed"].moe
    assert (m.num_experts, m.top_k, m.block_size) == (3, 2, 4)
    s = by_name["msd-seed"]
    assert (s.msd.m, s.msd.n, s.msd.k, s.quant.group_size) == (1, 12288, 8192, 128)


def test_spec_is_frozen_and_hash_tracks_content():
    spec = load_spec(MOE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "x"
    other = load_spec(with_(MOE, "moe.top_k", 4))
    assert other.hash != spec.hash
    assert load_spec(copy.deepcopy(MOE)).hash == spec.hash


def test_defaults():
    spec = load_spec(MSD)
    assert spec.schedule == "preload" and spec.lowering == "msd" and spec.quant.group_size == 128
    assert spec.targets.ascend.aic_cores == 24 and spec.targets.cuda is None


# one case per rule: (base, key path, value, words the message must contain)
RULES = [
    (MOE, "extra", 1, ["extra", "unknown key"]),
    (MOE, "moe.hiden_size", 1, ["moe.hiden_size", "unknown key", "hidden_size"]),
    (MOE, "moe.hidden_size", "256", ["moe.hidden_size", "'256'", "integer"]),
    (MOE, "moe.hidden_size", True, ["moe.hidden_size", "integer"]),
    (MOE, "moe.top_k", 0, ["moe.top_k", "0", ">= 1"]),
    (MOE, "moe.num_experts", -4, ["moe.num_experts", "-4", ">= 1"]),
    (MOE, "moe.hidden_size", 200, ["moe.hidden_size", "200", "multiple of quant.group_size"]),
    (MOE, "moe.intermediate_size", 100, ["moe.intermediate_size", "100", "multiple"]),
    (MOE, "moe.top_k", 9, ["moe.top_k", "9", "<= moe.num_experts (8)"]),
    (MOE, "moe.num_experts", 513, ["moe.num_experts", "513", "<= 512"]),
    (MOE, "moe.renormalize", "yes", ["moe.renormalize", "true or false"]),
    (MOE, "moe.block_size", 12, ["moe.block_size", "12", "one of"]),
    (MOE, "quant.group_size", 96, ["quant.group_size", "96", "32, 64, 128"]),
    (MOE, "quant.bits", 8, ["quant.bits", "8"]),
    (MSD, "quant.symmetric", False, ["quant.symmetric", "only supported by pipeline: moe_w4a16"]),
    (MSD, "quant.act_order", True, ["quant.act_order", "only supported by pipeline: moe_w4a16"]),
    (MOE, "quant.act_order", "yes", ["quant.act_order", "true or false"]),
    (MSD, "dtype", "bfloat16", ["dtype", "float16 for pipeline: msd_matmul"]),
    (MOE, "tokens.max", 0, ["tokens.max", ">= 1"]),
    (MOE, "moe", ..., ["moe", "required"]),
    (MOE, "moe.top_k", ..., ["moe.top_k", "required"]),
    (MOE, "msd", {"m": 1, "n": 1, "k": 128}, ["msd", "only allowed"]),
    (MOE, "pipeline", "dense", ["pipeline", "'dense'", "moe_w4a16, msd_matmul"]),
    (MOE, "dtype", "float8", ["dtype", "float8"]),
    (MOE, "schedule", "eager", ["schedule", "'eager'", "basic, preload"]),
    (MOE, "lowering", "fp8", ["lowering", "msd, dequant"]),
    (MOE, "targets.rocm", {}, ["targets.rocm", "unknown key", "cuda, ascend"]),
    (MOE, "targets.cuda.arch", "sm_70", ["targets.cuda.arch", "sm_70", "sm_90"]),
    (MOE, "targets", {}, ["targets", "at least one"]),
    (MOE, "name", "", ["name", "non-empty"]),
    (MSD, "msd.steps", 4, ["msd.steps", "4", "1, 2, 3"]),
    (MSD, "msd.k", 200, ["msd.k", "200", "multiple of quant.group_size (128)"]),
    (MSD, "msd.n", 0, ["msd.n", ">= 1"]),
    (MSD, "msd.m", 1.5, ["msd.m", "integer"]),
    (MSD, "msd", ..., ["msd", "required"]),
    (MSD, "targets.ascend.soc", "ascend310", ["targets.ascend.soc", "ascend910b"]),
    (MSD, "targets.ascend.aiv_cores", 24, ["aiv_cores", "2 x"]),
]


@pytest.mark.parametrize("base,path,value,words", RULES,
                         ids=[f"{r[1]}={r[2]!r}" for r in RULES])
def test_spec_rule(base, path, value, words):
    with pytest.raises(SpecError) as err:
        load_spec(with_(base, path, value))
    message = str(err.value)
    for word in words:
        assert word in message, message


def test_spec_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad.write_text("- a list\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(bad)


def test_build_binds_sizes():
    module = moegen.build(MOE)
    text = str(module)
    assert "tensor<?x256xf16>" in text and "tensor<8x256x256xi4>" in text
