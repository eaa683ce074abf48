"""Write a quantized checkpoint: an unquantized Hugging Face folder's routed experts quantized
by moegen into one of the public formats, everything else copied as it is.

    moegen.checkpoint_write.quantize_checkpoint("Qwen3-tiny", "Qwen3-tiny-awq", "awq")

Formats: "awq" (AutoAWQ GEMM: zero points), "gptq" (original checkpoint format; `act_order`
gives each expert's rows a desc_act-style order), "compressed-tensors" (pack-quantized W4A16;
`symmetric` and `act_order` as asked). Without calibration data the act-order is the rows'
descending weight norm (gate and up share it: one order of their common input), which is what
a data-free desc_act can go by; the checkpoint it writes is the real format either way.
config.json gains the format's quantization_config. The folder `moegen.checkpoint` reads back.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from .checkpoint import INDEX_FILE, CheckpointError, Tensors, _config, _family
from .quant import quantize, to_awq, to_compressed_tensors, to_gptq

FORMATS = ("awq", "gptq", "compressed-tensors")


def _quantization_config(fmt: str, group: int, symmetric: bool, act_order: bool) -> dict:
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                "version": "gemm"}
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order,
                "sym": symmetric, "checkpoint_format": "gptq"}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "format": "pack-quantized", "input_activations": None,
                "weights": {"num_bits": 4, "type": "int", "symmetric": symmetric,
                            "strategy": "group", "group_size": group,
                            "actorder": "group" if act_order else None}}},
            "ignore": ["lm_head"]}


def _row_order_g_idx(weights: list[np.ndarray], group: int) -> np.ndarray:
    """g_idx [K] of a desc_act-style order: rows by descending norm over `weights` ([K, N]
    each), group j / G of that order."""
    norm = sum(np.square(w.astype(np.float64)).sum(axis=1) for w in weights)
    order = np.argsort(-norm, kind="stable")
    return (np.argsort(order, kind="stable") // group).astype(np.int32)


def _encode(fmt: str, prefix: str, w: np.ndarray, group: int, symmetric: bool,
            g_idx) -> dict[str, np.ndarray]:
    """One Linear's weight [K, N] quantized and written in the format's tensors."""
    qw = quantize(w, group, symmetric=symmetric, g_idx=g_idx)
    if fmt == "awq":
        qweight, qzeros, scales = to_awq(qw)
        return {f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros,
                f"{prefix}.scales": scales}
    if fmt == "gptq":
        qweight, qzeros, scales, gi = to_gptq(qw, group)
        return {f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros,
                f"{prefix}.scales": scales, f"{prefix}.g_idx": gi}
    return {f"{prefix}.{name}": t for name, t in to_compressed_tensors(qw).items()}


def quantize_checkpoint(src, dst, fmt: str, group_size: int = 128,
                        symmetric: bool | None = None, act_order: bool = False) -> Path:
    """Write `dst`: `src` with every routed expert's projections quantized in format `fmt`.
    symmetric: default False for awq (its zero points), True otherwise."""
    from safetensors.numpy import save_file
    src, dst = Path(src), Path(dst)
    if fmt not in FORMATS:
        raise ValueError(f"fmt: {fmt!r}; one of {', '.join(FORMATS)}")
    symmetric = (fmt != "awq") if symmetric is None else symmetric
    if fmt == "awq" and (symmetric or act_order):
        raise ValueError("awq: asymmetric (zero points) and without act-order")
    config, config_path = _config(src)
    if config.get("quantization_config"):
        raise CheckpointError(f"{config_path}: already quantized "
                              f"({config['quantization_config'].get('quant_method')})")
    family = _family(config, config_path)
    if family.name == "gpt_oss":
        raise CheckpointError(f"{config_path}: gpt-oss experts are not moe_w4a16 experts")
    tensors = Tensors(src)
    gate, up, down = family.projections
    expert_linears = {}                 # prefix of an expert -> its three Linear prefixes
    for name in tensors.files:
        for proj in (gate, up, down):
            suffix = f".{proj}.weight"
            if name.endswith(suffix) and ".experts." in name:
                expert_linears.setdefault(name[:-len(suffix)], set()).add(proj)
    if not expert_linears:
        raise CheckpointError(f"{src}: no routed expert weights named as {family.name} names "
                              f"them ({family.expert}.{gate}.weight)")
    dst.mkdir(parents=True, exist_ok=True)
    out: dict[str, np.ndarray] = {}
    quantized = set()
    for prefix in sorted(expert_linears):
        w = {p: np.ascontiguousarray(np.asarray(tensors.get(f"{prefix}.{p}.weight"),
                                                np.float32).T)
             for p in (gate, up, down)}                    # [K, N] each
        g13 = _row_order_g_idx([w[gate], w[up]], group_size) if act_order else None
        g2 = _row_order_g_idx([w[down]], group_size) if act_order else None
        for proj, g_idx in ((gate, g13), (up, g13), (down, g2)):
            out.update(_encode(fmt, f"{prefix}.{proj}", w[proj], group_size, symmetric, g_idx))
            quantized.add(f"{prefix}.{proj}.weight")
    for name in tensors.files:
        if name not in quantized:
            out[name] = tensors.get(name)
    # (safetensors writes an array's memory as it lies: C order it must be)
    save_file({name: np.ascontiguousarray(t) for name, t in out.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    for extra in src.iterdir():              # generation_config.json, tokenizer files, ...
        if extra.is_file() and not extra.name.endswith(".safetensors") and \
                extra.name not in ("config.json", INDEX_FILE):
            shutil.copy2(extra, dst / extra.name)
    config = dict(config, quantization_config=_quantization_config(
        fmt, group_size, symmetric, act_order))
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dst


