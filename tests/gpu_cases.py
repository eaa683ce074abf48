"""MoE specs and random weights the tests share (numpy, from the caller's generator)."""
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


def random_moe_spec(rng, name: str) -> dict:
    """A valid moe_w4a16 spec of random shape (H and I any multiple of the group up to 32 and
    16 groups, 2 to 256 experts, top-1 to top-8), quantization (groups of 32, 64 or 128, zero
    points or act-order), activation type, token limit and arch (sm_80 or sm_90a)."""
    group = int(rng.choice([32, 64, 128]))
    experts = int(rng.choice([2, 4, 8, 16, 60, 64, 128, 256]))
    data = moe_spec(group * int(rng.integers(1, 33)), group * int(rng.integers(1, 17)), experts,
                    int(rng.integers(1, min(experts, 8) + 1)), group=group,
                    tokens_max=int(rng.choice([1, 16, 64, 512, 4096])), name=name,
                    dtype=str(rng.choice(["float16", "bfloat16"])),
                    symmetric=bool(rng.random() < 0.6))
    data["quant"]["act_order"] = data["quant"]["symmetric"] and bool(rng.random() < 0.3)
    data["targets"]["cuda"]["arch"] = str(rng.choice(["sm_80", "sm_90a"]))
    return data


_layers = {}


def layer_for(spec, **kw):
    """The compiled layer of a spec and options, one per test session (GPU tests share it)."""
    import moegen
    key = (repr(spec), tuple(sorted(kw.items())))
    if key not in _layers:
        _layers[key] = moegen.cuda.MoeW4A16(spec, **kw)
    return _layers[key]
