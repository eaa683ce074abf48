"""numpy semantics of every op, and an interpreter that runs a function with them.

This is the golden model every generated kernel is checked against; it never calls generated
code. The semantic functions compute in float32 (or float64 where the caller passes float64
data); `run` stores each result in its IR element type (f16 results are rounded to fp16, i4
values are held in int8), as a kernel would.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .core import PASS_ATTRS, Function, Op
from .ops.msd import DEFAULT_FACTORS
from .types import IndexType, TensorType, numpy_dtype

SEMANTICS: dict[str, Callable] = {}


def semantics(name: str):
    def register(fn):
        SEMANTICS[name] = fn
        return fn
    return register


def _float(a: np.ndarray) -> np.ndarray:
    """fp16/bf16 data widened to float32; float64 data kept (for float64 references)."""
    return a if a.dtype == np.float64 else a.astype(np.float32)


# --- MoE routing -------------------------------------------------------------------------------

@semantics("moe.topk_softmax")
def topk_softmax(logits: np.ndarray, k: int, renormalize: bool = True):
    """Top-k of softmax(logits) per row, by descending logit; ties go to the lower expert id."""
    logits = np.asarray(logits, dtype=np.float32)
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int32)
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    probs = e / e.sum(axis=1, keepdims=True)
    weights = np.take_along_axis(probs, ids, axis=1).astype(np.float32)
    if renormalize:
        weights = (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)
    return ids, weights


def routed(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Which slots are routed: an expert id outside [0, E) (vLLM marks the experts of other
    ranks -1) means the slot is skipped, and contributes 0 to its token."""
    flat = np.asarray(ids).ravel()
    return (flat >= 0) & (flat < num_experts)


@semantics("moe.count")
def count(ids: np.ndarray, num_experts: int):
    flat = np.asarray(ids).ravel()
    return np.bincount(flat[routed(flat, num_experts)], minlength=num_experts).astype(np.int32)


@semantics("moe.pad_scan")
def pad_scan(counts: np.ndarray, block: int):
    counts = np.asarray(counts, dtype=np.int64)
    padded = (counts + block - 1) // block * block
    offsets = np.concatenate([[0], np.cumsum(padded)[:-1]])
    total = np.array([padded.sum()], dtype=np.int32)
    return padded.astype(np.int32), offsets.astype(np.int32), total


@semantics("moe.slot_lists")
def slot_lists(ids: np.ndarray, num_experts: int):
    flat = np.asarray(ids).ravel()
    sentinel = flat.size
    slots = np.full((num_experts, flat.size), sentinel, dtype=np.int32)
    keep = np.nonzero(routed(flat, num_experts))[0]
    order = keep[np.argsort(flat[keep], kind="stable")]  # by expert, ascending within each
    counts = np.bincount(flat[keep], minlength=num_experts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for e in np.nonzero(counts)[0]:
        slots[e, :counts[e]] = order[starts[e]:starts[e] + counts[e]]
    return slots


@semantics("moe.marlin_indices")
def marlin_indices(slots: np.ndarray, counts: np.ndarray, padded_offsets: np.ndarray,
                   weights: np.ndarray, block: int, capacity_block: int | None = None):
    num_experts, num_slots = slots.shape
    rows = num_slots + num_experts * (capacity_block or block)
    sorted_ids = np.full(rows, num_slots, dtype=np.int32)
    weights_flat = np.zeros(rows, dtype=np.float32)
    expert_ids = np.full(num_slots, -1, dtype=np.int32)  # one per block; -1 past the last
    wflat = np.asarray(weights, dtype=np.float32).ravel()
    for e in range(num_experts):
        c = int(counts[e])
        if not c:
            continue
        off = int(padded_offsets[e])
        sorted_ids[off:off + c] = slots[e, :c]
        weights_flat[off:off + c] = wflat[slots[e, :c]]
        first, nblocks = off // block, -(-c // block)
        expert_ids[first:first + nblocks] = e
    return sorted_ids, expert_ids, weights_flat


@semantics("moe.align")
def align(ids: np.ndarray, weights: np.ndarray, num_experts: int, block: int,
          capacity_block: int | None = None):
    counts = count(ids, num_experts)
    _, offsets, total = pad_scan(counts, block)
    slots = slot_lists(ids, num_experts)
    sorted_ids, expert_ids, weights_flat = marlin_indices(slots, counts, offsets, weights, block,
                                                          capacity_block)
    return sorted_ids, expert_ids, weights_flat, total


# --- MoE compute -------------------------------------------------------------------------------

def dequant(w_q: np.ndarray, scale: np.ndarray, group_size: int, dtype=np.float32,
            zero: np.ndarray | None = None, g_idx: np.ndarray | None = None) -> np.ndarray:
    """w [..., K, N] = (int4 values - zero) times the scale of each row's group: the group of
    row k is k / group_size, or g_idx[k] (act-order); zero [..., K/G, N] (z - 8, in [-8, 7])
    defaults to 0 (symmetric)."""
    k = w_q.shape[-2]
    groups = np.arange(k) // group_size if g_idx is None else np.asarray(g_idx)
    q = w_q.astype(dtype)
    if zero is not None:
        q = q - np.take(zero.astype(dtype), groups, axis=-2)
    return q * np.take(scale.astype(dtype), groups, axis=-2)


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    g = _float(gate_up)
    n = g.shape[-1] // 2
    gate, up = g[..., :n], g[..., n:]
    return gate / (1 + np.exp(-gate)) * up


@semantics("moe.grouped_gemm_w4a16")
def grouped_gemm_w4a16(x, w_q, w_scale, sorted_ids, expert_ids, total, weights_flat, *extras,
                       block: int, topk: int, mul_topk_weights: bool, group_size: int,
                       epilogue: str = "none", sum_topk: int = 1, zero_points: bool = False,
                       act_order: bool = False, store=np.float16):
    """`extras`: w_zero [E, K/G, N] when zero_points, g_idx [E, K] when act_order (after it).
    `store`: the type the kernel stores the rows in before a topk_sum epilogue sums them."""
    if len(extras) != zero_points + act_order:
        raise ValueError(f"grouped_gemm_w4a16 takes {zero_points + act_order} extra operands "
                         f"(w_zero, g_idx), got {len(extras)}")
    w_zero = extras[0] if zero_points else None
    g_idx = extras[-1] if act_order else None
    x = _float(np.asarray(x))
    rows_out = x.shape[0] * topk
    n = w_q.shape[-1] // (2 if epilogue == "swiglu" else 1)
    out = np.zeros((rows_out, n), dtype=x.dtype)
    used = int(np.asarray(total).ravel()[0])
    sorted_ids = np.asarray(sorted_ids)[:used]
    valid = sorted_ids != rows_out
    rows = np.nonzero(valid)[0]
    experts = np.asarray(expert_ids)[rows // block]
    for e in np.unique(experts):
        r = rows[experts == e]
        slots = sorted_ids[r]
        w = dequant(w_q[e], w_scale[e], group_size, x.dtype,
                    None if w_zero is None else w_zero[e], None if g_idx is None else g_idx[e])
        y = x[slots // topk] @ w
        if epilogue == "swiglu":
            y = silu_mul(y)
        if mul_topk_weights:
            y = y * np.asarray(weights_flat)[r][:, None].astype(x.dtype)
        out[slots] = y
    if epilogue == "topk_sum":      # the rows as stored (fp16), then summed as moe.aggregate
        return out, aggregate(out.astype(store), sum_topk)
    return out


@semantics("moe.swiglu")
def swiglu(gate_up):
    return silu_mul(np.asarray(gate_up))


@semantics("moe.aggregate")
def aggregate(down, topk: int):
    down = _float(np.asarray(down))
    t = down.shape[0] // topk
    parts = down.reshape(t, topk, -1)
    out = parts[:, 0].copy()
    for k in range(1, topk):  # in k order, as the kernel sums
        out += parts[:, k]
    return out


# --- MSD ---------------------------------------------------------------------------------------

@semantics("msd.unfold")
def unfold(x, steps: int, factors=None):
    """A_max per row and `steps` int4 slices; float32 arithmetic, round half to even."""
    factors = DEFAULT_FACTORS if factors is None else factors
    a = np.asarray(x).astype(np.float32)
    amax = np.abs(a).max(axis=-1)
    safe = np.where(amax > 0, amax, np.float32(1))
    t = a / safe[..., None] * np.float32(factors[0])
    slices = []
    for i in range(steps):
        if i:
            t = (t - slices[-1]) * np.float32(factors[i])
        slices.append(np.round(t).astype(np.float32))
    return amax.astype(np.float32), np.stack(slices).astype(np.int8)


@semantics("msd.int_matmul")
def int_matmul(slices, w):
    # float64 products of int4 values are exact (|sum| <= K * 64 << 2**53) and use BLAS
    y = np.asarray(slices).astype(np.float64) @ np.asarray(w).astype(np.float64)
    return y.astype(np.int32)


def merge_divisors(factors, steps: int) -> list[float]:
    """d_i = f_1 * ... * f_i: slice i's int32 product is divided by d_i in the merge."""
    out, prod = [], 1.0
    for f in factors[:steps]:
        prod *= f
        out.append(prod)
    return out


@semantics("msd.merge")
def merge(acc, y, amax, scale, factors=None):
    acc = np.asarray(acc)
    ft = acc.dtype
    y = np.asarray(y).astype(ft)
    divisors = merge_divisors(DEFAULT_FACTORS if factors is None else factors, y.shape[0])
    combined = sum(y[i] / ft.type(d) for i, d in enumerate(divisors))
    return acc + combined * np.asarray(amax).astype(ft)[:, None] * np.asarray(scale).astype(ft)


@semantics("tensor.zeros")
def zeros(shape, dtype):
    return np.zeros(shape, dtype=dtype)


@semantics("tensor.group_slice")
def group_slice(src, index: int, axis: int, size: int):
    sl = [slice(None)] * src.ndim
    sl[axis] = slice(index * size, (index + 1) * size)
    return src[tuple(sl)]


@semantics("tensor.cast")
def cast(src):
    return np.asarray(src)


# --- the interpreter ---------------------------------------------------------------------------

def _store(value: np.ndarray, t) -> np.ndarray:
    if isinstance(t, IndexType):
        return value
    np_dtype = numpy_dtype(t.dtype)
    if t.dtype == "i4":
        v = np.asarray(value)
        if v.size and (v.min() < -8 or v.max() > 7):
            raise ValueError(f"i4 value out of [-8, 7]: {v.min()}..{v.max()}")
    return np.asarray(value).astype(np_dtype)


def _attrs_for(op: Op, env: dict) -> dict:
    attrs = {k: v for k, v in op.attrs.items()
             if not (op.ATTRS.get(k) or PASS_ATTRS[k]).choice}   # kernel choices: not semantics
    buckets = op.attrs.get("block_buckets")
    if buckets:  # the tile pass chose a block per token bucket: use the one for this call
        tokens = env["?"]
        block = next((b for edge, b in buckets if tokens <= edge), buckets[-1][1])
        attrs["block"] = block
    return attrs


def run(fn: Function, inputs: list | dict) -> list[np.ndarray]:
    """Run `fn` (a bound function) on numpy inputs; returns its results."""
    if isinstance(inputs, dict):
        inputs = [inputs[a.name] for a in fn.args]
    if len(inputs) != len(fn.args):
        raise ValueError(f"{fn.name} takes {len(fn.args)} inputs, got {len(inputs)}")
    env: dict = {}
    values: dict[int, np.ndarray] = {}
    for a, x in zip(fn.args, inputs):
        x = np.asarray(x)
        t = a.type
        for d, n in zip(t.shape, x.shape):
            if not d.is_static:
                if d.symbols != {"?"}:
                    raise ValueError(f"%{a.name}: unbound dimension {d}; build the module first")
                env.setdefault("?", n)
        want = tuple(d.eval(env) for d in t.shape)
        if x.shape != want:
            raise ValueError(f"input %{a.name} has shape {x.shape}, expected {want} ({t})")
        values[id(a)] = _store(x, t)
    return _run_block(fn.body, values, env)


def _run_block(block, values: dict, env: dict) -> list[np.ndarray]:
    for op in block.ops:
        args = [values[id(v)] for v in op.operands]
        if op.NAME in ("return", "msd.yield"):
            return args
        if op.NAME == "msd.group_loop":
            acc = args[0]
            groups = int(op.attr("groups"))
            g_arg, acc_arg = op.region.args
            for g in range(groups):
                inner = dict(values)
                inner[id(g_arg)], inner[id(acc_arg)] = g, acc
                acc, = _run_block(op.region, inner, env)
            outs = [acc]
        elif op.NAME == "tensor.zeros":
            t: TensorType = op.results[0].type
            outs = [zeros(tuple(d.eval(env) for d in t.shape), numpy_dtype(t.dtype))]
        else:
            attrs = _attrs_for(op, env)
            if op.NAME == "moe.grouped_gemm_w4a16":       # rows stored in the output's type
                attrs["store"] = numpy_dtype(op.results[0].type.dtype)
            result = SEMANTICS[op.NAME](*args, **attrs)
            outs = list(result) if isinstance(result, tuple) else [result]
        for r, v in zip(op.results, outs):
            values[id(r)] = _store(v, r.type)
    raise ValueError("block has no terminator")
