"""`build(spec)`: the spec's pipeline (ir/<pipeline>.mir) with its sizes bound, verified."""
from __future__ import annotations

from .ir import Module, parse
from .ir.core import Value
from .ir.types import TensorType
from .resources import pipeline_file
from .spec import Spec, load_spec
from .tile_model import TALL_BLOCK

# Block sizes of the K-split and wide CTAs that a MoE layer may pick per token bucket (the tile
# pass and autotune choose among them); the tall prefill tile's block (TALL_BLOCK: the tile pass
# gives it to calls whose average expert gets many slots) is larger and bounds the routing index
# buffers.
MOE_BLOCK_CHOICES = (8, 16, 32, 64)
ACTIVATION_TYPES = {"float16": "f16", "bfloat16": "bf16"}      # spec dtype -> IR element type


def capacity_block(spec: Spec) -> int:
    """The largest moe block size a call of this spec's layer may use."""
    return spec.moe.block_size or TALL_BLOCK


def symbols(spec: Spec) -> dict[str, int]:
    """The values of the symbols the pipeline files use (see the comments at their top)."""
    g = spec.quant.group_size
    if spec.pipeline == "moe_w4a16":
        m = spec.moe
        return {"H": m.hidden_size, "I": m.intermediate_size, "E": m.num_experts, "K": m.top_k,
                "G": g, "B": capacity_block(spec), "A": ACTIVATION_TYPES[spec.dtype]}
    s = spec.msd
    return {"M": s.m, "N": s.n, "K": s.k, "G": g, "S": s.steps}


def _attr_dict(d: dict) -> dict:
    """The spec as an IR attribute (unset entries left out: parsing fills the same defaults)."""
    return {k: _attr_dict(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


def spec_of(module: Module) -> Spec | None:
    """The spec a built module carries in its attributes (None for a raw pipeline file)."""
    data = module.attrs.get("spec")
    return load_spec(data) if isinstance(data, dict) else None


def build(spec) -> Module:
    """Instantiate the spec's pipeline with its sizes, verified."""
    spec = load_spec(spec)
    path = pipeline_file(spec.pipeline)
    module = parse(path.read_text(), source=str(path), env=symbols(spec))
    module.name = spec.name
    module.attrs = {"pipeline": spec.pipeline, "spec": _attr_dict(spec.to_dict()),
                    "spec_hash": spec.hash, "tokens_max": spec.tokens.max}
    if spec.pipeline == "moe_w4a16":
        for op in module.function().ops:
            if op.NAME == "moe.topk_softmax":
                op.attrs["renormalize"] = spec.moe.renormalize
        _quantized_weight_operands(module, spec)
    module.verify()
    return module


def _quantized_weight_operands(module: Module, spec: Spec) -> None:
    """Zero points (quant.symmetric: false) and act-order (quant.act_order): for each grouped
    GEMM's weight, a function argument %<w>_zero (i4 [E, K/G, N], z - 8) and / or %<w>_g_idx
    (i32 [E, K], the group of each weight row), passed to the GEMM as its extra operands."""
    zero, order = not spec.quant.symmetric, spec.quant.act_order
    if not (zero or order):
        return
    fn = module.function()
    for op in [op for op in fn.ops if op.NAME == "moe.grouped_gemm_w4a16"]:
        w_q, w_scale = op.operands[1], op.operands[2]
        stem = w_q.name.removesuffix("_q")
        extras = []
        if zero:
            extras.append(Value(f"{stem}_zero", TensorType(w_scale.type.shape, "i4"), fn.body))
        if order:
            e, k, _ = w_q.type.shape
            extras.append(Value(f"{stem}_g_idx", TensorType((e, k), "i32"), fn.body))
        fn.body.args.extend(extras)
        op.operands.extend(extras)
        op.attrs["zero_points"], op.attrs["act_order"] = zero, order
