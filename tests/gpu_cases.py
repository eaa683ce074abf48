"""Random MoE cases shared by the GPU tests and `moegen run`/`bench` (numpy, seeded per call)."""
import numpy as np


def moe_spec(h, i, e, k, tokens_max=4096, group=128, block=None, name=None, renormalize=None,
             dtype="float16", symmetric=True, act_order=False):
    moe = {"hidden_size": h, "intermediate_size": i, "num_experts": e, "top_k": k}
    if block:
        moe["block_size"] = block
    if renormalize is not None:
        moe["renormalize"] = renormalize
    return {"name": name or f"t-h{h}-i{i}-e{e}-k{k}", "pipeline": "moe_w4a16", "dtype": dtype,
            "moe": moe, "quant": {"group_size": group, "symmetric": symmetric,
                                  "act_order": act_order},
            "tokens": {"max": tokens_max},
            "targets": {"cuda": {"arch": "sm_90a"}}}


def moe_weights(rng, e, h, i, g):
    w13_q = rng.integers(-8, 8, (e, h, 2 * i), dtype=np.int8)
    w13_s = (rng.random((e, h // g, 2 * i)) * 0.02 + 0.002).astype(np.float16)
    w2_q = rng.integers(-8, 8, (e, i, h), dtype=np.int8)
    w2_s = (rng.random((e, i // g, h)) * 0.02 + 0.002).astype(np.float16)
    return w13_q, w13_s, w2_q, w2_s


_layers = {}


def layer_for(spec, **kw):
    """The compiled layer of a spec and options, one per test session (GPU tests share it)."""
    import moegen
    key = (repr(spec), tuple(sorted(kw.items())))
    if key not in _layers:
        _layers[key] = moegen.cuda.MoeW4A16(spec, **kw)
    return _layers[key]
