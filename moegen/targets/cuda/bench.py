"""`moegen run` and `moegen bench` for MoE specs on a GPU.

Timing: the layer call is captured in a CUDA graph; each repetition flushes the L2 (a 256 MiB
memset), then replays the graph between two CUDA events; the median is reported. The memset
leaves L2 dirty, so a call also pays for writing back the lines its misses displace (docs/DESIGN.md
says what that costs a bare read of the weights). The memory floor is the int4 weight and
scale bytes of the experts the call actually routes to, over the device-to-device copy
bandwidth measured in the same process. Beside it, a bare read of those same bytes timed the
same way (bare_read.py): what the harness lets any kernel reach. The baseline is PyTorch bf16:
`torch._grouped_mm` over the expert-sorted tokens (gate/up, SwiGLU, down, weighted sum), timed
with CUDA events on PyTorch's stream, L2 flushed the same way (its launches are not captured
in a graph: PyTorch's sort and bincount sizes are data-dependent). The tensor-core time is
the layer's FLOPs at the fastest fp16 cuBLAS rate measured in the process (TensorCoreGemm): what
the tensor cores need for the call's arithmetic at dense-GEMM speed. `% bound` holds the layer
against the larger of the bare read and the tensor-core time.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace

import numpy as np

from ...spec import SpecError, load_spec
from .bare_read import BareRead, array_region, expert_regions
from .device import get_cupy, host_activation, to_activation
from .runtime import MoeW4A16

FLUSH_BYTES = 256 << 20


def copy_bandwidth(cp, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read plus bytes written."""
    src = cp.empty(nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    dst[...] = src
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        dst[...] = src
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return 2 * nbytes / statistics.median(times)


_TIMING_STREAMS: dict[int, object] = {}


def timing_stream(cp):
    """One stream per device for all timing (a layer's workspace is per stream: a new stream
    per timed call would hold a new workspace each)."""
    device = cp.cuda.Device().id
    if device not in _TIMING_STREAMS:
        _TIMING_STREAMS[device] = cp.cuda.Stream(non_blocking=True)
    return _TIMING_STREAMS[device]


def time_call(cp, fn, reps: int = 30, graph: bool = True) -> float:
    """Median microseconds of fn(), L2 flushed before each repetition."""
    flush = cp.empty(FLUSH_BYTES, dtype=cp.uint8)
    stream = timing_stream(cp)
    with stream:
        fn()
        stream.synchronize()
        if graph:
            stream.begin_capture()
            fn()
            g = stream.end_capture()
            run = lambda: g.launch(stream)  # noqa: E731
        else:
            run = fn
        times = []
        for _ in range(reps):
            flush.fill(1)
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            run()
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return statistics.median(times)


def torch_time(torch, fn, reps: int) -> float:
    """Median microseconds of fn() on PyTorch's stream (CUDA events, L2 flushed before each)."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.fill_(1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def random_packed(cp, layer: MoeW4A16, seed: int = 0):
    """Random weights directly in the packed layout (any words are valid int4 weights; zero
    points and act-order row orders where the spec has them)."""
    from .packing import PackedMoeWeights
    spec = layer.spec
    m, g = spec.moe, spec.quant.group_size
    rs = cp.random.RandomState(seed)

    def words(k, n):
        return rs.randint(0, 2**31, size=(m.num_experts, k // 16, -(-n // 64), 32, 4),
                          dtype=cp.int64).astype(cp.uint32)

    def per_group(k, n):
        return (m.num_experts, k // g, -(-n // 64), 8, 8)

    def scales(k, n):
        return to_activation(cp, rs.random_sample(per_group(k, n)) * 0.01,
                             spec.dtype).view(cp.uint16)

    def zeros(k, n):
        if spec.quant.symmetric:
            return None
        return to_activation(cp, rs.randint(-8, 8, per_group(k, n)).astype(cp.float32),
                             spec.dtype).view(cp.uint16)

    def rows(k):
        if not spec.quant.act_order:
            return None
        return cp.argsort(rs.random_sample((m.num_experts, k)), axis=-1).astype(cp.int32)
    h, i = m.hidden_size, m.intermediate_size
    return PackedMoeWeights(words(h, 2 * i), scales(h, 2 * i), words(i, h), scales(i, h),
                            zeros(h, 2 * i), zeros(i, h), rows(h), rows(i), spec.dtype)


def expert_bytes(layer: MoeW4A16, weights) -> int:
    """int4 weight + scale (+ zero point) bytes of one expert in the packed layout."""
    return sum(a.nbytes // layer.spec.moe.num_experts
               for a in (weights.w13, weights.w13_scales, weights.w2, weights.w2_scales,
                         weights.w13_zeros, weights.w2_zeros) if a is not None)


class TorchBaseline:
    """PyTorch bf16 grouped GEMM MoE layer with the same shapes."""

    def __init__(self, spec, seed: int = 0):
        import torch
        self.torch = torch
        m = spec.moe
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.k, self.i = m.top_k, m.intermediate_size
        self.w13 = torch.randn(m.num_experts, m.hidden_size, 2 * m.intermediate_size,
                               device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
        self.w2 = torch.randn(m.num_experts, m.intermediate_size, m.hidden_size, device="cuda",
                              dtype=torch.bfloat16, generator=gen) * 0.02
        self.e = m.num_experts
        self.grouped = hasattr(torch, "_grouped_mm")

    def time(self, x, ids, w, reps: int) -> float:
        """Median microseconds on PyTorch's stream (CUDA events, L2 flushed before each)."""
        return torch_time(self.torch, lambda: self(x, ids, w), reps)

    def __call__(self, x, ids, w):
        torch = self.torch
        flat = ids.flatten().long()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.e)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xs = x[order // self.k]
        h = torch._grouped_mm(xs, self.w13, offs=offs)
        act = torch.nn.functional.silu(h[:, :self.i]) * h[:, self.i:]
        o = torch._grouped_mm(act, self.w2, offs=offs) * w.flatten()[order, None].to(act.dtype)
        out = torch.zeros_like(x)
        out.index_add_(0, order // self.k, o)
        return out


class TensorCoreGemm:
    """The tensor-core time of the MoE layer's FLOPs at T tokens (6 T k H I: gate/up 2 T k H I
    multiply-adds, down T k I H): those FLOPs at the fastest fp16 rate cuBLAS (PyTorch) reaches
    in this process, of a GEMM of the same FLOPs ([T k, H] x [H, 3 I]) and of a square 8192
    GEMM. At small T the same-FLOPs GEMM is bound by reading its fp16 weights, not by the
    tensor cores: the square GEMM's rate stands in there."""

    SQUARE = 8192

    def __init__(self, torch, spec, reps: int = 10, seed: int = 0):
        m = spec.moe
        self.torch, self.k, self.h, self.i = torch, m.top_k, m.hidden_size, m.intermediate_size
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.w = self._randn(m.hidden_size, 3 * m.intermediate_size)
        n = self.SQUARE
        a, b = self._randn(n, n), self._randn(n, n)
        self.square_rate = 2 * n ** 3 / torch_time(torch, lambda: torch.matmul(a, b), reps)

    def _randn(self, *shape):
        return self.torch.randn(*shape, device="cuda", dtype=self.torch.float16,
                                generator=self.gen)

    def flops(self, t: int) -> int:
        return 6 * t * self.k * self.h * self.i

    def time(self, t: int, reps: int) -> float:
        """Microseconds of the layer's FLOPs at the fastest measured rate."""
        a = self._randn(t * self.k, self.h)
        same_us = torch_time(self.torch, lambda: self.torch.matmul(a, self.w), reps)
        return self.flops(t) / max(self.flops(t) / same_us, self.square_rate)


def confine_routing(logits, experts: int | None):
    """Router logits that route every token among experts 0 .. experts - 1 (the others' logits
    lowered by 30: their softmax weight is below 1e-13 of the picked ones'); all experts
    where `experts` is None."""
    if experts is not None:
        logits[:, experts:] -= 30.0
    return logits


def device_name(cp) -> str:
    """The current GPU's name, as the bench's reports give it."""
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()


def call_inputs(cp, spec, rng, tokens: int, experts: int | None):
    """A call's random activations (the spec's dtype) and router logits (routing among the
    first `experts` experts where given), on the device."""
    m = spec.moe
    x = to_activation(cp, cp.asarray(rng.standard_normal((tokens, m.hidden_size))), spec.dtype)
    logits = cp.asarray(confine_routing(
        rng.standard_normal((tokens, m.num_experts)).astype(np.float32), experts))
    return x, logits


def check_experts(spec, experts: int | None) -> None:
    """`experts` (bench --experts) must hold the top-k picks and be at most the spec's."""
    m = spec.moe
    if experts is not None and not m.top_k <= experts <= m.num_experts:
        raise ValueError(f"experts {experts}: routing among the first N experts needs "
                         f"top_k <= N <= num_experts ({m.top_k} .. {m.num_experts})")


def bench_moe(spec, tokens: list[int], json_path: str | None = None, reps: int = 30,
              baseline: bool = True, log=print, tuning="auto",
              pipeline: str | None = None, experts: int | None = None) -> list[dict]:
    """Time the layer per token count (see `moegen bench`); `experts`: route every token among
    the first that many experts instead of all of them (a skewed router)."""
    cp = get_cupy()
    spec = load_spec(spec)
    check_experts(spec, experts)
    layer = MoeW4A16(spec, pipeline=pipeline, tuning=tuning)
    m = spec.moe
    weights = random_packed(cp, layer)
    per_expert = expert_bytes(layer, weights)
    bw = copy_bandwidth(cp)
    base = tensor_core = None
    if baseline:
        try:
            base = TorchBaseline(spec)
            tensor_core = TensorCoreGemm(base.torch, spec)
        except Exception as exc:  # no torch, or no room for the bf16 weights
            log(f"(no PyTorch baseline: {exc})")
    rng = np.random.default_rng(0)
    rows = []
    device = device_name(cp)
    log(f"{spec.name} on {device}; copy bandwidth {bw / 1e12:.2f} TB/s; "
        f"{per_expert / 1e6:.2f} MB int4 weights + scales per expert"
        + (f"; routing among the first {experts} experts" if experts is not None else ""))
    log(f"{'T':>6} {'experts':>7} {'moegen us':>10} {'floor us':>9} {'% floor':>8} "
        f"{'read us':>8} {'% read':>7} {'tc us':>8} {'% bound':>8} {'bf16 us':>9} "
        f"{'vs bf16':>8}")
    packed = (weights.w13, weights.w13_scales, weights.w2, weights.w2_scales)
    for t in tokens:
        if t > spec.tokens.max:
            log(f"{t:>6} skipped: above tokens.max ({spec.tokens.max})")
            continue
        x, logits = call_inputs(cp, spec, rng, t, experts)
        ids, wts = (a.copy() for a in layer.route(logits))   # the workspace is reused later
        experts_used = cp.unique(ids).get()
        routed = len(experts_used)
        floor_us = routed * per_expert / bw * 1e6
        ours = time_call(cp, lambda: layer(x, logits, weights), reps)
        read_us = time_call(cp, BareRead(expert_regions(packed, experts_used, m.num_experts)),
                            reps)
        row = {"tokens": t, "experts": routed, "moegen_us": ours, "floor_us": floor_us,
               "pct_of_floor": 100 * floor_us / ours, "read_us": read_us,
               "pct_of_read": 100 * read_us / ours}
        if base is not None:
            torch = base.torch
            cp.cuda.runtime.deviceSynchronize()
            xt = (torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
                  if spec.dtype == "bfloat16" else torch.from_dlpack(x).to(torch.bfloat16))
            it = torch.from_dlpack(ids).long()
            wt = torch.from_dlpack(wts)
            torch.cuda.synchronize()
            row["bf16_us"] = base.time(xt, it, wt, reps)
            # the larger of the two bounds: bytes (the bare read) or FLOPs (tensor cores)
            row["tensor_core_us"] = tensor_core.time(t, reps)
            row["pct_of_bound"] = 100 * max(read_us, row["tensor_core_us"]) / ours
        rows.append(row)
        b, tc = row.get("bf16_us"), row.get("tensor_core_us")
        log(f"{t:>6} {routed:>7} {ours:>10.1f} {floor_us:>9.1f} {row['pct_of_floor']:>7.0f}% "
            f"{read_us:>8.1f} {row['pct_of_read']:>6.0f}% "
            + (f"{tc:>8.1f} {row['pct_of_bound']:>7.0f}% " if tc else f"{'-':>8} {'-':>8} ")
            + (f"{b:>9.1f} {b / ours:>7.2f}x" if b else f"{'-':>9} {'-':>8}"))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"spec": spec.name, "device": device, "copy_bandwidth": bw,
                       "routed_among": experts or m.num_experts, "rows": rows}, f, indent=2)
    return rows


def bench_versus(spec, tokens: list[int], versus: str, json_path: str | None = None,
                 reps: int = 30, rounds: int = 3, log=print, tuning="auto",
                 pipeline: str | None = None, experts: int | None = None) -> list[dict]:
    """Two builds of one spec's layer side by side: A, built by `pipeline` (the target's where
    None), and B, built by `versus`, on the same weights and inputs; per token count each is
    timed `rounds` times in turns (A, B, A, B, ...: a drift of the GPU's clock or temperature
    falls on both), each a median of `reps` as `bench_moe` times it. Reports the medians, B's
    median of them over A's, and whether the two outputs are the same bits."""
    cp = get_cupy()
    spec = load_spec(spec)
    check_experts(spec, experts)
    layers = [MoeW4A16(spec, pipeline=p, tuning=tuning) for p in (pipeline, versus)]
    weights = random_packed(cp, layers[0])
    rng = np.random.default_rng(0)
    device = device_name(cp)
    names = [layer.plan["passes"] for layer in layers]
    log(f"{spec.name} on {device}; A: {names[0]}; B: {names[1]}; {rounds} rounds in turns, "
        f"each the median of {reps}")
    log(f"{'T':>6} {'A us':>24} {'B us':>24} {'B / A':>6} {'bits':>6}")
    rows = []
    for t in tokens:
        if t > spec.tokens.max:
            log(f"{t:>6} skipped: above tokens.max ({spec.tokens.max})")
            continue
        x, logits = call_inputs(cp, spec, rng, t, experts)
        outs = [cp.asnumpy(layer(x, logits, weights)).view(np.uint16) for layer in layers]
        same = bool(np.array_equal(outs[0], outs[1]))
        times = [[], []]
        for _ in range(rounds):
            for taken, layer in zip(times, layers):
                taken.append(time_call(cp, lambda lay=layer: lay(x, logits, weights), reps))
        a, b = (statistics.median(taken) for taken in times)
        rows.append({"tokens": t, "a_us": times[0], "b_us": times[1], "b_over_a": b / a,
                     "same_bits": same})
        log(f"{t:>6} {' '.join(f'{v:.1f}' for v in times[0]):>24} "
            f"{' '.join(f'{v:.1f}' for v in times[1]):>24} {b / a:>6.3f} "
            f"{'same' if same else 'differ':>6}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"spec": spec.name, "device": device, "a": names[0], "b": names[1],
                       "routed_among": experts or spec.moe.num_experts, "rows": rows}, f,
                      indent=2)
    return rows


def bench_dtypes(spec, tokens: list[int], json_path: str | None = None, reps: int = 30,
                 log=print, **kw) -> dict[str, list[dict]]:
    """`bench_moe` with fp16 activations, then bf16 (the spec's other keys as they are), then
    the two side by side: the bf16 time over the fp16 time per token count."""
    spec = load_spec(spec)
    rows = {}
    for dtype in ("float16", "bfloat16"):
        log(f"--- activations {dtype}")
        rows[dtype] = bench_moe(replace(spec, dtype=dtype), tokens, None, reps,
                                baseline=False, log=log, **kw)
    log(f"{'T':>6} {'fp16 us':>9} {'bf16 us':>9} {'bf16/fp16':>10}")
    for a, b in zip(rows["float16"], rows["bfloat16"]):
        log(f"{a['tokens']:>6} {a['moegen_us']:>9.1f} {b['moegen_us']:>9.1f} "
            f"{b['moegen_us'] / a['moegen_us']:>10.3f}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"spec": spec.name, "rows": rows}, f, indent=2)
    return rows


def bench_pack(spec, layers: int, json_path: str | None = None, log=print) -> dict:
    """Pack `layers` layers of random weights of the spec on the GPU (pack_moe_weights: the
    reference layout in device memory -> the kernels' layout); the weights of each are drawn
    on the device first, untimed. Returns (and with `json_path` writes) the seconds in all and
    per layer."""
    import time

    from ...quant import QuantizedWeight
    from .packing import pack_moe_weights, weight_shapes
    cp = get_cupy()
    spec = load_spec(spec)
    g, q = spec.quant.group_size, spec.quant
    rs = cp.random.RandomState(0)

    def draw(shape):
        e, k, n = shape
        return QuantizedWeight(
            rs.randint(-8, 8, shape, dtype=cp.int32).astype(cp.int8),
            to_activation(cp, rs.random_sample((e, k // g, n)) * 0.01, spec.dtype),
            None if q.symmetric else rs.randint(-8, 8, (e, k // g, n),
                                                dtype=cp.int32).astype(cp.int8),
            None if not q.act_order else (cp.argsort(cp.argsort(
                rs.random_sample((e, k)), axis=-1), axis=-1) // g).astype(cp.int32).get())
    seconds = 0.0
    packed_bytes = 0
    for _ in range(layers):
        w13, w2 = (draw(shape) for shape in weight_shapes(spec).values())
        cp.cuda.get_current_stream().synchronize()
        start = time.perf_counter()
        packed = pack_moe_weights(spec, w13, w2)
        cp.cuda.get_current_stream().synchronize()
        seconds += time.perf_counter() - start
        packed_bytes = packed.nbytes()
        del w13, w2, packed
    log(f"{spec.name}: packed {layers} layers on the GPU in {seconds:.2f} s "
        f"({seconds / layers * 1e3:.1f} ms a layer, {packed_bytes / 1e6:.0f} MB packed each)")
    result = {"spec": spec.name, "device": device_name(cp), "dtype": spec.dtype,
              "layers": layers, "seconds": seconds, "per_layer_s": seconds / layers,
              "packed_bytes_a_layer": packed_bytes}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return result


def run_moe(spec, tokens: int, seed: int | None = None, log=print, tuning="auto") -> float:
    """One layer call on random data against the reference; returns the relative error."""
    from ... import reference
    cp = get_cupy()
    spec = load_spec(spec)
    m, g = spec.moe, spec.quant.group_size
    rng = np.random.default_rng(seed)
    layer = MoeW4A16(spec, tuning=tuning)
    w13, w2 = reference.random_moe_weights(rng, spec)
    weights = layer.pack(w13, w2)
    x = rng.standard_normal((tokens, m.hidden_size)).astype(reference.activation_dtype(spec.dtype))
    logits = rng.standard_normal((tokens, m.num_experts)).astype(np.float32)
    y = layer(cp.asarray(host_activation(x)), cp.asarray(logits), weights)
    y = cp.asnumpy(y).view(x.dtype).astype(np.float64)
    ids, w = reference.topk_softmax(logits, m.top_k, m.renormalize)
    want = reference.moe_w4a16_weights(x, ids, w, w13, w2, g)
    err = float(np.linalg.norm(y - want) / np.linalg.norm(want))
    limit = reference.MOE_REL_TOLERANCE[spec.dtype]
    ok = err <= limit and not np.isnan(y).any()
    log(f"{spec.name}: T = {tokens}, relative error {err:.2e} against moegen.reference "
        f"({'ok' if ok else 'FAILED'}, limit {limit:g})")
    return err


S4_PIPELINE = "tile{mma=s4},schedule,alloc"


def msd_variants(spec) -> dict:
    """What `moegen bench` and `moegen run` compare for an MSD spec: name -> (spec, pipeline,
    schedule). The dequant lowering is left out (with the reason) where its shape rule fails."""
    from .msd_emitter import check_shape
    msd = replace(spec, lowering="msd")
    out = {"basic": (msd, None, "basic"), "preload": (msd, None, "preload"),
           "preload_s4": (msd, S4_PIPELINE, "preload")}
    dq = replace(spec, lowering="dequant")
    try:
        check_shape(dq)
        out["dequant"] = (dq, None, "dequant")
    except SpecError as exc:
        out["dequant"] = str(exc)
    return out


def _msd_ops(spec, log, tuning="auto") -> dict:
    from .runtime import MsdMatmul
    ops, built = {}, {}
    for name, v in msd_variants(spec).items():
        if isinstance(v, str):
            log(f"(no {name}: {v})")
            continue
        sp, pipeline, schedule = v
        key = (sp.lowering, pipeline)
        if key not in built:
            built[key] = MsdMatmul(sp, pipeline=pipeline, tuning=tuning)
        ops[name] = (built[key], schedule)
    return ops


def bench_msd(spec, json_path: str | None = None, reps: int = 30, rows: list[int] | None = None,
              log=print, tuning="auto", baseline: bool = True) -> list[dict]:
    """Per M in `rows` (default: the spec's): basic, preload (s8 and s4 MMA) and the dequant
    lowering against the int4 floor and (`baseline`) fp16 cuBLAS (PyTorch), in one process on
    the same inputs."""
    cp = get_cupy()
    spec = load_spec(spec)
    s, g = spec.msd, spec.quant.group_size
    bw = copy_bandwidth(cp)
    rng = np.random.default_rng(0)
    w = rng.integers(-7, 8, (s.k, s.n), dtype=np.int8)
    scale = cp.asarray(rng.uniform(-3, 3, (s.k // g, s.n)).astype(np.float16))
    floor_us = (s.k * s.n / 2 + scale.nbytes) / bw * 1e6
    results, read_us = [], None
    for m in rows or [s.m]:
        # another M is another spec: named apart, so a tuning entry of the spec's own M is
        # neither applied to it nor reported as stale
        sp = spec if m == s.m else replace(spec, name=f"{spec.name}-m{m}", msd=replace(s, m=m))
        ops = _msd_ops(sp, log, tuning)
        x = cp.asarray(rng.uniform(-3, 3, (m, s.k)).astype(np.float16))
        row = {"m": m, "n": s.n, "k": s.k, "floor_us": floor_us, "copy_gbps": bw / 1e9}
        packed = {}
        for name, (op, schedule) in ops.items():
            if id(op) not in packed:
                packed[id(op)] = op.pack(w)
            pw = packed[id(op)]
            row[f"{name}_us"] = time_call(cp, lambda: op(x, pw, scale, schedule=schedule), reps)
        if read_us is None:      # the same bytes at every M: read once
            msd_weights = packed[id(ops["preload"][0])]
            read_us = time_call(cp, BareRead([array_region(msd_weights), array_region(scale)]),
                                reps)
        row["read_us"] = read_us
        if baseline:
            try:
                import torch
                wt = torch.randn(s.k, s.n, device="cuda", dtype=torch.float16)
                xt = torch.from_dlpack(x)
                row["cublas_fp16_us"] = torch_time(torch, lambda: torch.matmul(xt, wt), reps)
            except Exception as exc:
                log(f"(no PyTorch baseline: {exc})")
        parts = ", ".join(f"{name} {row[name + '_us']:.1f} us" for name in ops)
        cublas = (f", fp16 cuBLAS {row['cublas_fp16_us']:.1f} us" if "cublas_fp16_us" in row
                  else "")
        log(f"{spec.name} M={m} N={s.n} K={s.k}: floor {floor_us:.1f} us, bare read "
            f"{row['read_us']:.1f} us, {parts} (preload "
            f"{100 * floor_us / row['preload_us']:.0f}% of floor, "
            f"{100 * row['read_us'] / row['preload_us']:.0f}% of the read){cublas}")
        results.append(row)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
    return results


def run_msd(spec, seed: int | None = None, log=print, tuning="auto") -> float:
    """Every variant on random data (drawn as the sample's generator draws) against its
    reference: `reference.msd_matmul` for MSD, `reference.dequant_matmul` for dequant."""
    from ... import reference
    cp = get_cupy()
    spec = load_spec(spec)
    s, g = spec.msd, spec.quant.group_size
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, (s.m, s.k)).astype(np.float16)
    w = rng.integers(-6, 7, (s.k, s.n), dtype=np.int8)
    scale = rng.uniform(-3, 3, (s.k // g, s.n)).astype(np.float16)
    wants = {"msd": reference.msd_matmul(x, w, scale, g, s.steps, accumulate=np.float64),
             "dequant": reference.dequant_matmul(x, w, scale, g)}
    worst = 0.0
    for name, (op, schedule) in _msd_ops(spec, log, tuning).items():
        want = wants[op.spec.lowering]
        y = cp.asnumpy(op(cp.asarray(x), op.pack(w), cp.asarray(scale), schedule=schedule))
        err = float(np.linalg.norm(y.astype(np.float64) - want) / np.linalg.norm(want))
        worst = max(worst, err if not np.isnan(y).any() else float("inf"))
        log(f"{spec.name} {name}: relative error {err:.2e} against moegen.reference."
            f"{'msd_matmul' if op.spec.lowering == 'msd' else 'dequant_matmul'}")
    return worst
