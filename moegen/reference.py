"""The numpy golden model of both pipelines: the public face of `moegen.ir.interp`.

These names and meanings are a contract other tools call. Every function takes numpy arrays;
integer weights are int8 arrays of int4 values in [-8, 7] (the reference layout, unpacked).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import interp
from .ir.types import numpy_dtype
from .quant import QuantizedWeight


def topk_softmax(logits, k: int, renormalize: bool = True):
    """(ids int32 [T, k], weights float32 [T, k]): descending probability, ties to lower id."""
    return interp.topk_softmax(np.asarray(logits), k, renormalize)


@dataclass
class Alignment:
    counts: np.ndarray              # int32 [E]: slots per expert
    padded_counts: np.ndarray       # int32 [E]: counts rounded up to the block
    padded_offsets: np.ndarray      # int32 [E]: exclusive prefix sum of padded_counts
    num_tokens_post_padded: int     # rows of the padded, expert-sorted list
    sorted_token_ids: np.ndarray    # int32 [num_tokens_post_padded]: slot ids, sentinel T*k
    expert_ids: np.ndarray          # int32 [num_tokens_post_padded / block]: expert of each block
    topk_weights_flat: np.ndarray | None  # float32 beside sorted_token_ids, 0 at padding


def align_block_size(topk_ids, num_experts: int, block_size: int, topk_weights=None) -> Alignment:
    """Group the routed slots (slot = token * k + j) by expert and pad each run to the block.

    Slots ascend within each expert; an expert with no slot gets no block.
    """
    ids = np.asarray(topk_ids, dtype=np.int32)
    if ids.ndim == 1:
        ids = ids[:, None]
    weights = np.ones(ids.shape, np.float32) if topk_weights is None else np.asarray(topk_weights)
    counts = interp.count(ids, num_experts)
    padded, offsets, total = interp.pad_scan(counts, block_size)
    slots = interp.slot_lists(ids, num_experts)
    sorted_ids, expert_ids, weights_flat = interp.marlin_indices(slots, counts, offsets, weights,
                                                                 block_size)
    n = int(total[0])
    return Alignment(counts=counts, padded_counts=padded, padded_offsets=offsets,
                     num_tokens_post_padded=n, sorted_token_ids=sorted_ids[:n],
                     expert_ids=expert_ids[:n // block_size],
                     topk_weights_flat=None if topk_weights is None else weights_flat[:n])


def moe_w4a16(x, topk_ids, topk_weights, w13_q, w13_scale, w2_q, w2_scale, group_size: int,
              block_size: int = 8, *, w13_zero=None, w2_zero=None, w13_g_idx=None,
              w2_g_idx=None) -> np.ndarray:
    """float32 [T, H]: out[t] = sum_k w[t,k] * (silu(g) * u) @ W2[e], g | u = x[t] @ W13[e].

    w13_q int8 [E, H, 2I] (columns [0, I) gate, [I, 2I) up), w13_scale [E, H/G, 2I];
    w2_q int8 [E, I, H], w2_scale [E, I/G, H]; weight = (q - zero) * scale of the row's group:
    zeros (int8 [E, K/G, N], z - 8 in [-8, 7]; None = 0, symmetric) and g_idx (int [E, K], the
    group of each row, GPTQ act-order; None = row // group_size) are optional. x may be fp16,
    bf16 (ml_dtypes) or float32. A slot whose expert id lies outside [0, E) is skipped (adds 0).
    Computed in float32 without rounding intermediates (the block size does not change the
    result).
    """
    x = np.asarray(x)
    ids = np.asarray(topk_ids, dtype=np.int32)
    k = ids.shape[1]
    num_experts = w13_q.shape[0]
    sorted_ids, expert_ids, weights_flat, total = interp.align(ids, topk_weights, num_experts,
                                                               block_size)
    route = dict(sorted_ids=sorted_ids, expert_ids=expert_ids, total=total,
                 weights_flat=weights_flat, block=block_size, group_size=group_size)

    def gemm(a, w_q, w_scale, zero, g_idx, **kw):
        extras = [e for e in (zero, g_idx) if e is not None]
        return interp.grouped_gemm_w4a16(a, w_q, w_scale, route["sorted_ids"],
                                         route["expert_ids"], route["total"],
                                         route["weights_flat"], *extras, block=block_size,
                                         group_size=group_size, zero_points=zero is not None,
                                         act_order=g_idx is not None, **kw)

    gate_up = gemm(x.astype(np.float32), w13_q, w13_scale, w13_zero, w13_g_idx, topk=k,
                   mul_topk_weights=False)
    act = interp.swiglu(gate_up)
    down = gemm(act, w2_q, w2_scale, w2_zero, w2_g_idx, topk=1, mul_topk_weights=True)
    return interp.aggregate(down, k).astype(np.float32)


# The relative error a kernel's [T, H] output may have against `moe_w4a16` (float32, nothing
# rounded on the way): the kernels round the GEMMs' rows and the output to the activations'
# type, so the limit is the same multiple of each type's unit roundoff (2^-11 fp16, 2^-8 bf16).
MOE_REL_TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2}


def activation_dtype(dtype: str) -> np.dtype:
    """numpy's type for a spec's dtype ("float16" or "bfloat16", the latter from ml_dtypes)."""
    return numpy_dtype("bf16" if dtype == "bfloat16" else "f16")


def random_quantized(rng, shape: tuple[int, int, int], group_size: int, dtype: str = "float16",
                     zero_points: bool = False, act_order: bool = False) -> QuantizedWeight:
    """A random int4 weight [E, K, N] in the reference layout: q uniform in [-8, 7], scales in
    [0.002, 0.022) of `dtype`, and as asked zero points uniform in [-8, 7] and a GPTQ act-order
    g_idx (each expert's rows in a random order, group j / G of that order)."""
    e, k, n = shape
    q = rng.integers(-8, 8, shape, dtype=np.int8)
    scales = (rng.random((e, k // group_size, n)) * 0.02 + 0.002).astype(activation_dtype(dtype))
    zeros = rng.integers(-8, 8, (e, k // group_size, n), dtype=np.int8) if zero_points else None
    g_idx = None
    if act_order:
        order = np.argsort(rng.random((e, k)), axis=-1)          # the rows of group j / G
        g_idx = (np.argsort(order, axis=-1) // group_size).astype(np.int32)
    return QuantizedWeight(q, scales, zeros, g_idx)


def random_moe_weights(rng, spec) -> tuple[QuantizedWeight, QuantizedWeight]:
    """(w13 [E, H, 2I], w2 [E, I, H]) drawn by `random_quantized` as a moe_w4a16 spec asks."""
    m, q = spec.moe, spec.quant
    kw = dict(group_size=q.group_size, dtype=spec.dtype, zero_points=not q.symmetric,
              act_order=q.act_order)
    return (random_quantized(rng, (m.num_experts, m.hidden_size, 2 * m.intermediate_size), **kw),
            random_quantized(rng, (m.num_experts, m.intermediate_size, m.hidden_size), **kw))


def moe_w4a16_weights(x, topk_ids, topk_weights, w13: QuantizedWeight, w2: QuantizedWeight,
                      group_size: int) -> np.ndarray:
    """`moe_w4a16` with the weights as QuantizedWeight."""
    return moe_w4a16(x, topk_ids, topk_weights, w13.q, w13.scales, w2.q, w2.scales, group_size,
                     w13_zero=w13.zeros, w2_zero=w2.zeros, w13_g_idx=w13.g_idx,
                     w2_g_idx=w2.g_idx)


def msd_unfold(x, group_size: int = 128, steps: int = 3):
    """The MSD intermediates: A_max float32 [M, K/G] and the int4 slices int8 [steps, M, K]."""
    x = np.asarray(x)
    m, kdim = x.shape
    groups = x.reshape(m, kdim // group_size, group_size)
    amax, slices = interp.unfold(groups, steps)
    return amax, slices.reshape(steps, m, kdim)


def msd_matmul(x, w_q, scale, group_size: int = 128, steps: int = 3, accumulate=np.float32):
    """float32 [M, N] (float64 with accumulate=np.float64): the seed's MSD golden, for any M.

    Per row and group: A_max = max|a|, slices by 7.49 then 14.98 with round-half-even, int32
    products, merged as (Y1/7.49 + Y2/(7.49*14.98) + ...) * A_max * scale. A group whose A_max
    is 0 contributes 0.
    """
    x = np.asarray(x)
    w_q = np.asarray(w_q)
    scale = np.asarray(scale)
    m, kdim = x.shape
    if kdim % group_size or w_q.shape[0] != kdim or scale.shape != (kdim // group_size,
                                                                     w_q.shape[1]):
        raise ValueError(f"shapes x {x.shape}, w_q {w_q.shape}, scale {scale.shape} do not fit "
                         f"group_size {group_size}")
    amax, slices = msd_unfold(x, group_size, steps)
    acc = np.zeros((m, w_q.shape[1]), dtype=accumulate)
    for g in range(kdim // group_size):
        cols = slice(g * group_size, (g + 1) * group_size)
        y = interp.int_matmul(slices[:, :, cols], w_q[cols])
        acc = interp.merge(acc, y, amax[:, g], scale[g:g + 1])
    return acc if accumulate == np.float64 else acc.astype(np.float32)


def dequant_matmul(x, w_q, scale, group_size: int = 128):
    """float64 [M, N] = x @ (w_q * scale): the product the `dequant` lowering computes (and that
    MSD approximates), with each group's scale row applied to its K rows."""
    x = np.asarray(x, dtype=np.float64)
    w_q = np.asarray(w_q)
    scale = np.asarray(scale, dtype=np.float64)
    kdim = x.shape[1]
    if kdim % group_size or w_q.shape[0] != kdim or scale.shape != (kdim // group_size,
                                                                     w_q.shape[1]):
        raise ValueError(f"shapes x {x.shape}, w_q {w_q.shape}, scale {scale.shape} do not fit "
                         f"group_size {group_size}")
    return x @ (w_q.astype(np.float64) * np.repeat(scale, group_size, axis=0))

