"""One MoE layer of a Hugging Face checkpoint folder -> a moe_w4a16 spec and its weights.

    layer = moegen.checkpoint.read_moe_layer("Qwen3-30B-A3B-AWQ", layer=0)   # numpy, any host
    spec, weights = moegen.load_moe_layer("Qwen3-30B-A3B-AWQ", layer=0)      # packed on the GPU

The folder holds config.json (with its quantization_config, if quantized) and the weights as
*.safetensors (sharded with model.safetensors.index.json, or not). Naming schemes: Qwen3-MoE
(and Qwen2-MoE's routed experts), Mixtral, DeepSeek-V2/V3 (routed experts; the shared experts and
the first dense layers are not this layer's) and gpt-oss (recognized, refused: see
`GPT_OSS_REASON`). Weight formats: AutoAWQ (GEMM), GPTQ (desc_act too; gptq and gptq_v2
checkpoint formats), compressed-tensors pack-quantized W4A16, and unquantized fp16/bf16/fp32
weights, which moegen quantizes (symmetric, group_size, `moegen.quant.quantize`). Anything else
is one `CheckpointError` naming the file and the tensor or key.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .quant import (QuantFormatError, QuantizedWeight, from_awq, from_compressed_tensors,
                    from_gptq, quantize)
from .reference import activation_dtype
from .spec import Spec, SpecError, load_spec

INDEX_FILE = "model.safetensors.index.json"
GPT_OSS_REASON = ("its experts add biases to both projections and use a clamped SwiGLU "
                  "((up + 1) * gate * sigmoid(1.702 gate), clamped at swiglu_limit), and its "
                  "checkpoints hold MXFP4 weights; moe_w4a16 computes int4 weights with SwiGLU "
                  "and no biases")


class CheckpointError(ValueError):
    """A checkpoint moegen cannot read; the message names the file and the tensor or key."""


# --- the tensors ------------------------------------------------------------------------------

class Tensors:
    """The tensors of a checkpoint folder by name, read on demand (numpy; bf16 as ml_dtypes)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._handles: dict[Path, object] = {}
        index = folder / INDEX_FILE
        if index.is_file():
            try:
                self.files = {name: folder / f for name, f in
                              json.loads(index.read_text())["weight_map"].items()}
            except (ValueError, KeyError, AttributeError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
        else:
            shards = sorted(folder.glob("*.safetensors"))
            if not shards:
                raise CheckpointError(f"{folder}: no *.safetensors files and no {INDEX_FILE}")
            self.files = {name: shard for shard in shards for name in self._open(shard).keys()}

    def _open(self, path: Path):
        if path not in self._handles:
            import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for safetensors)
            from safetensors import safe_open
            try:
                self._handles[path] = safe_open(str(path), framework="numpy")
            except Exception as exc:   # missing file, bad header: the library's own message
                raise CheckpointError(f"{path}: cannot open as safetensors ({exc})") from None
        return self._handles[path]

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> np.ndarray:
        if name not in self.files:
            raise CheckpointError(f"{self.folder}: tensor {name} is not in the checkpoint "
                                  f"({self._where()})")
        path = self.files[name]
        try:
            return self._open(path).get_tensor(name)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read tensor {name} ({exc})") from None

    def _where(self) -> str:
        index = self.folder / INDEX_FILE
        return f"not in {index.name}'s weight_map" if index.is_file() else \
            f"in none of {', '.join(sorted({p.name for p in self.files.values()}))}"


# --- the model families ---------------------------------------------------------------------

def _config_value(config: dict, keys: tuple[str, ...], config_path: Path) -> int:
    """The first of `keys` the config has, as an int; else an error naming them."""
    for key in keys:
        if isinstance(config.get(key), int):
            return config[key]
    raise CheckpointError(f"{config_path}: no integer {' or '.join(keys)}")


@dataclass(frozen=True)
class Family:
    """A naming scheme: where expert e of layer N and its router are, and the config's keys."""
    name: str
    expert: str                    # prefix of expert e's projections, {layer} and {expert}
    projections: tuple[str, str, str]     # gate, up, down
    router: str                    # the router's weight [E, H]
    experts_keys: tuple[str, ...]  # config keys of the number of routed experts
    intermediate_keys: tuple[str, ...]    # config keys of an expert's intermediate size


_QWEN = Family("qwen3_moe", "model.layers.{layer}.mlp.experts.{expert}",
               ("gate_proj", "up_proj", "down_proj"), "model.layers.{layer}.mlp.gate.weight",
               ("num_experts", "num_local_experts"), ("moe_intermediate_size",))
FAMILIES = {
    "qwen3_moe": _QWEN,
    "qwen2_moe": Family("qwen2_moe", *[getattr(_QWEN, f) for f in (
        "expert", "projections", "router", "experts_keys", "intermediate_keys")]),
    "mixtral": Family("mixtral", "model.layers.{layer}.block_sparse_moe.experts.{expert}",
                      ("w1", "w3", "w2"), "model.layers.{layer}.block_sparse_moe.gate.weight",
                      ("num_local_experts",), ("intermediate_size",)),
    "deepseek_v2": Family("deepseek_v2", "model.layers.{layer}.mlp.experts.{expert}",
                          ("gate_proj", "up_proj", "down_proj"),
                          "model.layers.{layer}.mlp.gate.weight", ("n_routed_experts",),
                          ("moe_intermediate_size",)),
    "deepseek_v3": Family("deepseek_v3", "model.layers.{layer}.mlp.experts.{expert}",
                          ("gate_proj", "up_proj", "down_proj"),
                          "model.layers.{layer}.mlp.gate.weight", ("n_routed_experts",),
                          ("moe_intermediate_size",)),
    "gpt_oss": Family("gpt_oss", "model.layers.{layer}.mlp.experts",
                      ("gate_up_proj", "gate_up_proj", "down_proj"),
                      "model.layers.{layer}.mlp.router.weight", ("num_local_experts",),
                      ("intermediate_size",)),
}


def _moe_layer_or_error(family: Family, config: dict, layer: int, config_path: Path) -> None:
    """Layer N must exist and be an MoE layer of the model."""
    layers = config.get("num_hidden_layers")
    if not isinstance(layer, int) or layer < 0 or (isinstance(layers, int) and layer >= layers):
        raise CheckpointError(f"{config_path}: layer {layer!r} is not a layer of the model "
                              f"(num_hidden_layers: {layers})")
    dense = None
    if family.name in ("qwen3_moe", "qwen2_moe"):
        step = config.get("decoder_sparse_step", 1) or 1
        if layer in (config.get("mlp_only_layers") or []):
            dense = "it is in mlp_only_layers"
        elif (layer + 1) % step:
            dense = f"decoder_sparse_step {step} makes it dense"
    elif family.name.startswith("deepseek"):
        first = config.get("first_k_dense_replace", 0) or 0
        freq = config.get("moe_layer_freq", 1) or 1
        if layer < first:
            dense = f"the first {first} layers are dense (first_k_dense_replace)"
        elif layer % freq:
            dense = f"moe_layer_freq {freq} makes it dense"
    if dense:
        raise CheckpointError(f"{config_path}: layer {layer} has no routed experts: {dense}")


def _routing(family: Family, config: dict) -> tuple[bool, str]:
    """(renormalize, how the model routes): whether the layer's own router (softmax, top-k,
    renormalized or not) is the model's, and what to do where it is not."""
    renorm = bool(config.get("norm_topk_prob", family.name == "mixtral"))
    if family.name.startswith("deepseek"):
        scoring = config.get("scoring_func", "softmax")
        method = config.get("topk_method", "greedy")
        scale = config.get("routed_scaling_factor", 1.0) or 1.0
        if scoring != "softmax" or method != "greedy":
            return renorm, (f"the model routes by {scoring} with {method} top-k (n_group "
                            f"{config.get('n_group')}, topk_group {config.get('topk_group')}): "
                            f"compute topk_ids and topk_weights with its router and pass them")
        if scale != 1.0:
            return renorm, (f"softmax top-k; the model scales the routing weights by "
                            f"routed_scaling_factor {scale}: pass weights so scaled, or scale "
                            f"the output")
    return renorm, "softmax top-k: the layer's router computes the model's routing"


# --- weight formats -------------------------------------------------------------------------

def _quant_format(config: dict, config_path: Path) -> dict:
    """The checkpoint's weight format: {"method", "group_size", ...}, from quantization_config
    (none: unquantized)."""
    qc = config.get("quantization_config")
    if not qc:
        return {"method": "unquantized"}
    method = str(qc.get("quant_method", "")).lower()
    where = f"{config_path}: quantization_config"
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(f"{where}.version: {version!r}; moegen reads AutoAWQ's "
                                  f"\"gemm\" layout")
        _four_bits(qc.get("bits", qc.get("w_bit")), f"{where}.bits")
        return {"method": "awq", "group_size": qc.get("group_size", qc.get("q_group_size"))}
    if method == "gptq":
        _four_bits(qc.get("bits"), f"{where}.bits")
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise CheckpointError(f"{where}.checkpoint_format: {fmt!r}; moegen reads gptq and "
                                  f"gptq_v2")
        return {"method": "gptq", "group_size": qc.get("group_size"),
                "zero_offset": 1 if fmt == "gptq" else 0}
    if method == "compressed-tensors":
        fmt = qc.get("format")
        groups = qc.get("config_groups") or {}
        for name, group in groups.items():
            weights = (group or {}).get("weights") or {}
            gfmt = group.get("format", fmt)
            if gfmt != "pack-quantized":
                raise CheckpointError(f"{where}.config_groups.{name}.format: {gfmt!r}; moegen "
                                      f"reads pack-quantized (W4A16)")
            _four_bits(weights.get("num_bits"), f"{where}.config_groups.{name}.weights.num_bits")
            if weights.get("type", "int") != "int" or weights.get("strategy") != "group":
                raise CheckpointError(f"{where}.config_groups.{name}.weights: type "
                                      f"{weights.get('type')!r}, strategy "
                                      f"{weights.get('strategy')!r}; moegen reads int "
                                      f"weights in groups")
            if group.get("input_activations"):
                raise CheckpointError(f"{where}.config_groups.{name}.input_activations: "
                                      f"quantized activations; moegen reads W4A16 (fp16/bf16 "
                                      f"activations)")
            return {"method": "compressed-tensors", "group_size": weights.get("group_size")}
        raise CheckpointError(f"{where}.config_groups: none given")
    raise CheckpointError(f"{where}.quant_method: {method!r}; moegen reads awq, gptq, "
                          f"compressed-tensors (pack-quantized) and unquantized checkpoints")


def _four_bits(bits, where: str) -> None:
    if bits != 4:
        raise CheckpointError(f"{where}: {bits!r}; moe_w4a16 takes 4-bit weights")


def _projection(tensors: Tensors, prefix: str, fmt: dict, group: int) -> QuantizedWeight:
    """One projection [K, N] (K: its input) in the reference layout."""
    def get(suffix):
        return tensors.get(f"{prefix}.{suffix}")

    def optional(suffix):
        name = f"{prefix}.{suffix}"
        return tensors.get(name) if name in tensors else None

    try:
        method = fmt["method"]
        if method == "awq":
            return from_awq(get("qweight"), get("qzeros"), get("scales"), group)
        if method == "gptq":
            return from_gptq(get("qweight"), get("qzeros"), get("scales"), group,
                             optional("g_idx"), zero_offset=fmt["zero_offset"])
        if method == "compressed-tensors" and f"{prefix}.weight_packed" in tensors:
            return from_compressed_tensors(get("weight_packed"), get("weight_scale"), group,
                                           optional("weight_shape"),
                                           optional("weight_zero_point"),
                                           optional("weight_g_idx"))
        weight = get("weight")                          # [N, K], as torch's Linear holds it
        return quantize(np.asarray(weight, np.float32).T, group)
    except QuantFormatError as exc:
        raise CheckpointError(f"{tensors.folder}: {prefix}: {exc}") from None


def _stack(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Experts' weights [K, N] -> [E, K, N]; zero points and g_idx filled in where only some
    experts have them (z = 8, rows in order)."""
    q = np.stack([p.q for p in parts])
    scales = np.stack([np.asarray(p.scales) for p in parts])
    zeros = g_idx = None
    if any(p.zeros is not None for p in parts):
        zeros = np.stack([np.zeros(p.scales.shape, np.int8) if p.zeros is None else p.zeros
                          for p in parts])
    if any(p.g_idx is not None for p in parts):
        k, groups = q.shape[1], scales.shape[1]
        g_idx = np.stack([np.arange(k, dtype=np.int32) // (k // groups) if p.g_idx is None
                          else p.g_idx for p in parts])
    return QuantizedWeight(q, scales, zeros, g_idx)


def _gate_up(gate: QuantizedWeight, up: QuantizedWeight, where: str) -> QuantizedWeight:
    """gate | up along N: the w13 of one expert."""
    if (gate.g_idx is None) != (up.g_idx is None) or (
            gate.g_idx is not None and not np.array_equal(gate.g_idx, up.g_idx)):
        raise CheckpointError(f"{where}: the gate and up projections have different g_idx; "
                              f"the layer gathers one activation order for both")
    def cat(a, b):
        if a is None and b is None:
            return None
        return np.concatenate([np.zeros(b.shape, np.int8) if a is None else a,
                               np.zeros(a.shape, np.int8) if b is None else b], axis=-1)
    return QuantizedWeight(np.concatenate([gate.q, up.q], axis=-1),
                           np.concatenate([np.asarray(gate.scales), np.asarray(up.scales)],
                                          axis=-1),
                           cat(gate.zeros, up.zeros), gate.g_idx)


# --- the layer ------------------------------------------------------------------------------

@dataclass
class CheckpointMoeLayer:
    """One MoE layer as read from a checkpoint: the spec, both weights in the reference layout
    (scales in the spec's dtype: exactly what the kernels compute with) and the router."""
    spec: Spec
    w13: QuantizedWeight          # [E, H, 2I]: gate columns, then up
    w2: QuantizedWeight           # [E, I, H]
    router: np.ndarray            # float32 [E, H]: logits = x @ router.T
    family: str
    source: str                   # the weight format read ("awq", ..., "unquantized")
    routing: str                  # how the model routes, and what to do where the layer's
    #                               own router is not it


class LoadedMoeLayer(NamedTuple):
    spec: Spec
    weights: object               # moegen.cuda.PackedMoeWeights


def _config(folder: Path) -> tuple[dict, Path]:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json (a Hugging Face model folder has one)")
    try:
        return json.loads(path.read_text()), path
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None


def _family(config: dict, config_path: Path) -> Family:
    model_type = config.get("model_type")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    raise CheckpointError(f"{config_path}: model_type {model_type!r}; moegen reads "
                          f"{', '.join(sorted(FAMILIES))}")


def _dtype(config: dict, dtype: str | None, config_path: Path) -> str:
    if dtype is not None:
        return dtype
    torch_dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    torch_dtype = torch_dtype.removeprefix("torch.")
    if torch_dtype in ("float16", "bfloat16"):
        return torch_dtype
    if torch_dtype == "float32":
        return "bfloat16"           # fp32 checkpoints: their models run in bf16
    raise CheckpointError(f"{config_path}: dtype {torch_dtype!r}; give dtype= (float16 or "
                          f"bfloat16) for the activations")


def read_moe_layer(path, layer: int, *, tokens_max: int = 4096, dtype: str | None = None,
                   group_size: int = 128, arch: str = "sm_90a") -> CheckpointMoeLayer:
    """Layer `layer`'s routed experts from a Hugging Face folder, in the reference layout.

    dtype: the activations' type (default: the config's dtype; float32 models run bf16);
    group_size: for unquantized checkpoints, the group moegen quantizes in (quantized ones
    give their own); tokens_max and arch: the spec's tokens.max and targets.cuda.arch."""
    folder = Path(path)
    config, config_path = _config(folder)
    family = _family(config, config_path)
    _moe_layer_or_error(family, config, layer, config_path)
    if family.name == "gpt_oss":
        raise CheckpointError(f"{config_path}: gpt-oss layer {layer}: {GPT_OSS_REASON}")
    fmt = _quant_format(config, config_path)
    group = fmt.get("group_size") or group_size
    if not isinstance(group, int) or group <= 0:
        raise CheckpointError(f"{config_path}: quantization_config group_size {group!r}: "
                              f"moe_w4a16 takes groups of 32, 64 or 128 rows")
    experts = _config_value(config, family.experts_keys, config_path)
    top_k = _config_value(config, ("num_experts_per_tok", "experts_per_token"), config_path)
    hidden = _config_value(config, ("hidden_size",), config_path)
    inter = _config_value(config, family.intermediate_keys, config_path)
    renormalize, routing = _routing(family, config)
    act = _dtype(config, dtype, config_path)
    tensors = Tensors(folder)
    w13, w2 = [], []
    gate_name, up_name, down_name = family.projections
    for e in range(experts):
        prefix = family.expert.format(layer=layer, expert=e)
        gate = _projection(tensors, f"{prefix}.{gate_name}", fmt, group)
        up = _projection(tensors, f"{prefix}.{up_name}", fmt, group)
        w13.append(_gate_up(gate, up, prefix))
        w2.append(_projection(tensors, f"{prefix}.{down_name}", fmt, group))
    w13, w2 = _stack(w13), _stack(w2)
    want13, want2 = (experts, hidden, 2 * inter), (experts, inter, hidden)
    for name, w, want in (("gate/up", w13, want13), ("down", w2, want2)):
        if w.q.shape != want:
            raise CheckpointError(f"{folder}: layer {layer}'s {name} weights are "
                                  f"{list(w.q.shape)} (experts, in, out), the config gives "
                                  f"{list(want)}")
    router = np.asarray(tensors.get(family.router.format(layer=layer)), np.float32)
    if router.shape != (experts, hidden):
        raise CheckpointError(f"{folder}: {family.router.format(layer=layer)} is "
                              f"{list(router.shape)}, expected [{experts}, {hidden}]")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", folder.resolve().name) + f"-layer{layer}"
    try:
        spec = load_spec({
            "name": name, "pipeline": "moe_w4a16", "dtype": act,
            "moe": {"hidden_size": hidden, "intermediate_size": inter, "num_experts": experts,
                    "top_k": top_k, "renormalize": renormalize},
            "quant": {"bits": 4, "group_size": group, "symmetric": w13.zeros is None,
                      "act_order": w13.g_idx is not None or w2.g_idx is not None},
            "tokens": {"max": tokens_max}, "targets": {"cuda": {"arch": arch}}})
    except SpecError as exc:
        raise CheckpointError(f"{config_path}: layer {layer} is not a moe_w4a16 layer moegen "
                              f"can compile: {exc}") from None
    fill = _fill_missing(spec)
    w13, w2 = fill(w13), fill(w2)
    cast = activation_dtype(act)
    w13, w2 = (w._replace(scales=np.asarray(w.scales).astype(cast)) for w in (w13, w2))
    return CheckpointMoeLayer(spec, w13, w2, router, family.name, fmt["method"], routing)


def _fill_missing(spec: Spec):
    """Give both weights zero points and g_idx where the spec has them and one lacks them."""
    def fill(w: QuantizedWeight) -> QuantizedWeight:
        zeros, g_idx = w.zeros, w.g_idx
        if not spec.quant.symmetric and zeros is None:
            zeros = np.zeros(w.scales.shape, np.int8)
        if spec.quant.act_order and g_idx is None:
            e, k = w.q.shape[:2]
            g_idx = np.broadcast_to(np.arange(k, dtype=np.int32) // spec.quant.group_size,
                                    (e, k)).copy()
        return QuantizedWeight(w.q, w.scales, zeros, g_idx)
    return fill


def load_moe_layer(path, layer: int, **kw) -> LoadedMoeLayer:
    """`read_moe_layer`, packed on the current GPU: (spec, PackedMoeWeights) for
    moegen.cuda.MoeW4A16(spec)."""
    from .targets.cuda.packing import pack_moe_weights
    read = read_moe_layer(path, layer, **kw)
    return LoadedMoeLayer(read.spec, pack_moe_weights(read.spec, read.w13, read.w2))
