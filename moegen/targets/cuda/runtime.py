"""Run generated kernels through CuPy: compile, own the workspace and the weight layout, launch.

A layer call launches the kernels of the launch plan on the current stream (PyTorch's current
stream when the inputs are PyTorch tensors), never reads device memory back to the host and
allocates nothing: grids are sized from the token count for the worst case and kernels exit
early, so a call can be captured in a CUDA graph and replayed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ...passes.pipelines import DEFAULT_PIPELINES, lower
from ...passes.tiling.cta import SHARED_PER_CTA
from ...quant import QuantizedWeight
from ...resources import data_dir
from ...spec import load_spec
from . import workspace as shared_workspace
from .device import (CudaUnavailable, activation_storage, as_activation, as_device, device_arch,
                     device_gpu, get_cupy, is_torch, result_for, stream_for)
from .emitter import HEADER_FILE, CudaProgram, emit_moe, max_blocks
from .launch import NULL, launch_after_previous, supported as pdl_supported
from .occupancy import KernelUse, ctas_per_sm
from .packing import PackedMoeWeights, pack_moe_weights

__all__ = ["CudaUnavailable", "MoeW4A16", "MsdMatmul", "PackedMoeWeights", "device_arch"]


# Compiled modules of this process, by a hash of source, options and arch: a second layer of the
# same spec reuses the module. Across processes CuPy's on-disk kernel cache (CUPY_CACHE_DIR, keyed
# by source, options and NVRTC version) spares the compile.
_MODULES: dict[str, object] = {}


def resolve_tuning(tuning):
    """A layer's `tuning=`: "auto" is the database at its default place, if there is one."""
    if tuning != "auto":
        return tuning
    from ...tuning import tuning_for
    return tuning_for()


def module_source(program: CudaProgram) -> str:
    """The code handed to NVRTC: the program's source with the hash of the device headers it
    includes on its first line. CuPy's on-disk kernel cache keys on the code and options only,
    not on included files, so without this line a changed header would load a stale binary."""
    digest = hashlib.sha256(program.header_text.encode()).hexdigest()[:16]
    return f"// {HEADER_FILE} sha256 {digest}\n{program.source}"


def nvrtc_input(program: CudaProgram, arch: str) -> tuple[str, tuple[str, ...]]:
    """(code, options) NVRTC compiles for the program; CuPy's disk cache keys on exactly these
    (with the NVRTC version), so a module compiled from them elsewhere is found here."""
    include = data_dir("templates") / "cuda"
    return module_source(program), ("--std=c++17", f"--gpu-architecture={arch}", f"-I{include}")


def compile_program(program: CudaProgram, arch: str, stem: str):
    """CuPy RawModule of the program's source, for `arch`; failures name the source and options.
    Cached in this process (by code and options) and across processes by CuPy's disk cache."""
    cp = get_cupy()
    code, options = nvrtc_input(program, arch)
    key = hashlib.sha256("\0".join((code, *options)).encode()).hexdigest()
    if key in _MODULES:
        return _MODULES[key]
    try:
        module = cp.RawModule(code=code, options=options)
        for k in program.plan["kernels"]:      # compile now, inside the try
            module.get_function(k["name"])
        _MODULES[key] = module
        return module
    except cp.cuda.compiler.CompileException as exc:
        dump = Path.cwd() / f"{stem}.failed.cu"
        dump.write_text(program.source)
        raise RuntimeError(f"NVRTC failed to compile {dump} with options {' '.join(options)}:\n"
                           f"{exc}") from None


def load_kernel(cp, module, name: str, shared_bytes: int, hint: str):
    """The module's kernel `name`, allowed `shared_bytes` of dynamic shared memory (past the
    48 KB of SHARED_PER_CTA a kernel must opt in); an error naming the kernel, the bytes and
    `hint` where this GPU gives a CTA less."""
    most = cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if shared_bytes > most:
        raise ValueError(f"{name}: needs {shared_bytes} bytes of shared memory, this GPU gives a "
                         f"CTA at most {most} ({hint})")
    fn = module.get_function(name)
    if shared_bytes > SHARED_PER_CTA:
        fn.max_dynamic_shared_size_bytes = shared_bytes
    return fn


def resident_grid(gpu, kernel, block: int, items: int, first_items: int) -> int:
    """The grid of a kernel of persistent CTAs that take `items` work items between them, the
    first `first_items` of which (the one-launch layer's gate/up items) stream while the rest
    wait on them: two CTAs an SM where those hold the first items, else as many as the SMs
    hold at once (by the compiled kernel's registers and shared memory); at most one an item.
    Two an SM spread the first items over every SM, where the GPU fills an SM with 3-4 CTAs of
    a larger grid before the next. Measured on the H100 at T = 1: Qwen3 21.7 us at two an SM,
    23.2 at three, 24.2 at four; Mixtral (896 gate/up items) 83.9 us at the 8 an SM it holds,
    89.3 at 7."""
    held = ctas_per_sm(gpu, KernelUse(block, kernel.num_regs, kernel.shared_size_bytes))[0]
    per_sm = min(held, 2) if first_items <= 2 * gpu.sms else held
    return max(1, min(items, gpu.sms * per_sm))


class MoeW4A16:
    """The W4A16 MoE layer of a spec, compiled for the current GPU.

    layer = MoeW4A16("examples/qwen3-30b-a3b.yaml")
    weights = layer.pack(w13, w2)               # QuantizedWeight (reference layout), once
    y = layer(x, router_logits, weights)        # [T, H] of the spec's dtype (fp16 or bf16)
    y = layer(x, weights, topk_ids=ids, topk_weights=w)           # routing given

    The result is a view of the layer's output buffer (allocated by the first call without
    `out=`), valid until the next call; pass `out=` ([T, H] of the spec's dtype) to write
    elsewhere. Routing given with expert ids outside [0, E) (another rank's experts) skips
    those slots: they add nothing to their token's sum. Scratch memory is shared by every layer
    on the same device and stream (workspace.py); a layer owns only its arrival counters.
    On sm_90 and later the down GEMM's K-split kernels (decode buckets, but not the wide CTA of
    one) are launched with programmatic dependent launch (moegen/targets/cuda/launch.py) where
    the launch plan says (`follows_from`: calls of PDL_MIN_TOKENS tokens or more, and the
    single-token bucket): they stream their first weight stages while the gate/up GEMM
    finishes. The gate/up GEMM's K-split kernels follow the align kernel so (from
    GATE_UP_PDL_MIN_TOKENS tokens, and the single-token bucket), waiting for it before they
    read anything, and the top-k sum follows the down GEMM so at every T (its launch overlaps
    that kernel). `pdl=False` launches each kernel after the one before (the same output, bit
    for bit). A call of one token with router logits runs the whole layer in one launch where
    the plan has it (`tile{one-launch=1}`: moe_one_token; the same output, bit for bit).
    """

    def __init__(self, spec, fuse_swiglu: bool = True, pipeline: str | None = None,
                 arch: str | None = None, tuning="auto", pdl: bool = True):
        cp = get_cupy()
        tuning = resolve_tuning(tuning)
        self.spec = load_spec(spec)
        if self.spec.pipeline != "moe_w4a16":
            raise ValueError(f"MoeW4A16 needs pipeline moe_w4a16, the spec has "
                             f"{self.spec.pipeline}")
        if pipeline is None:
            passes = DEFAULT_PIPELINES[("moe_w4a16", "cuda")]
            pipeline = ",".join(p for p in passes if fuse_swiglu or p != "fuse-swiglu")
        self.gpu = device_gpu(arch)
        self.arch = self.gpu.arch
        module, _, pm = lower(self.spec, "cuda", pipeline, tuning=tuning, gpu=self.gpu)
        self.program = emit_moe(self.spec, module, pm.pipeline, self.arch, self.gpu)
        self.plan = self.program.plan
        self.module = compile_program(self.program, self.arch, self.spec.name)
        self.kernels = {k["name"]: load_kernel(cp, self.module, k["name"],
                                               k.get("shared_bytes", 0), "tile{tall=0} keeps "
                                               "the wide CTA, which needs less")
                        for k in self.plan["kernels"]}
        self.threads = {k["name"]: k["block"] for k in self.plan["kernels"]}   # per CTA
        shared_workspace.reserve(cp, self.plan["workspace"]["bytes"])
        self.state = cp.zeros(self.plan["state"]["bytes"], dtype=cp.uint8)   # counters at 0
        self.dtype = self.spec.dtype
        self._out = None
        self.gemms = self.plan["gemms"]
        self.route_align_max_tokens = self.plan["route_align_max_tokens"]
        self.align_chunked_from = self.plan["align_chunked_from"]   # 0: align in one CTA
        self.gemm_route = self.plan["gemm_route"]    # T = 1 with logits: routed in the GEMMs
        if self.plan["act_order"] and (self.gemm_route or self.route_align_max_tokens):
            raise ValueError("act-order gathers rows by the top-k ids in memory: the plan must "
                             "route with the router and align kernels")
        self.pdl = pdl and pdl_supported(self.arch)
        # a call of one token with router logits in one launch, where the plan has it: its
        # launch plan entry, and its grid of persistent CTAs (resident_grid)
        self.one_launch = next((k for k in self.plan["kernels"]
                                if k["name"] == "moe_one_token"), None)
        if self.one_launch is not None:
            self.one_launch_grid = resident_grid(self.gpu, self.kernels["moe_one_token"],
                                                 self.one_launch["block"],
                                                 self.one_launch["grid"][0],
                                                 self.one_launch["gate_up_items"])
        # the top-k sum kernel after the down GEMM with programmatic dependent launch
        self.aggregate_follows = any("launch" in k for k in self.plan["kernels"]
                                     if k["name"] == "moe_aggregate")

    @property
    def out(self):
        """The layer's own output buffer [tokens.max, H] (allocated on first use)."""
        if self._out is None:
            cp = get_cupy()
            self._out = cp.empty((self.spec.tokens.max, self.spec.moe.hidden_size),
                                 dtype=activation_storage(self.dtype))
        return self._out

    @property
    def workspace(self):
        """The shared workspace of the current stream (uint8)."""
        cp = get_cupy()
        return shared_workspace.scratch(cp, cp.cuda.get_current_stream())

    # --- workspace views --------------------------------------------------------------------
    def _view(self, cp, ws, name: str, dtype, count: int):
        b = self.plan["workspace"]["buffers"][name]
        return cp.ndarray((count,), dtype=dtype, memptr=ws.data + b["offset"])

    def _partials(self, cp, ws):
        s = self.plan["workspace"]["partials"]
        return cp.ndarray((max(s["bytes"] // 4, 1),), dtype=cp.float32,
                          memptr=ws.data + s["offset"])

    def _counters(self, cp, which: str):
        s = self.plan["state"][which]
        return cp.ndarray((max(s["ints"], 1),), dtype=cp.int32,
                          memptr=self.state.data + s["offset"])

    # --- weights ----------------------------------------------------------------------------
    def pack(self, *weights) -> PackedMoeWeights:
        """Weights in the reference layout -> the kernels' layout, packed on the GPU (once).

        `pack(w13, w2)` with two moegen.quant.QuantizedWeight (zero points and g_idx as the
        spec asks), or `pack(w13_q, w13_scale, w2_q, w2_scale)` for symmetric weights (numpy,
        CuPy or PyTorch arrays)."""
        if len(weights) == 4 and not any(isinstance(w, QuantizedWeight) for w in weights):
            weights = (QuantizedWeight(*weights[:2]), QuantizedWeight(*weights[2:]))
        if len(weights) != 2 or not all(isinstance(w, QuantizedWeight) for w in weights):
            raise TypeError("pack(w13, w2): two QuantizedWeight, or pack(w13_q, w13_scale, "
                            "w2_q, w2_scale)")
        return pack_moe_weights(self.spec, *weights)

    def _check_weights(self, weights) -> None:
        if not isinstance(weights, PackedMoeWeights):
            raise TypeError("weights: expected the PackedMoeWeights that layer.pack returned")
        q = self.spec.quant
        if weights.dtype != self.dtype or (weights.w13_zeros is None) != q.symmetric or \
                (weights.w13_rows is None) == q.act_order:
            raise ValueError(f"weights: packed for dtype {weights.dtype}, zero points "
                             f"{weights.w13_zeros is not None}, act-order "
                             f"{weights.w13_rows is not None}; the layer's spec has "
                             f"{self.dtype}, {not q.symmetric}, {q.act_order}")

    # --- the layer ---------------------------------------------------------------------------
    def route(self, router_logits):
        """Only the router: (topk_ids int32 [T, k], topk_weights float32 [T, k]) views of the
        workspace, valid until the next call."""
        cp = get_cupy()
        t = int(router_logits.shape[0])
        stream = stream_for(cp, router_logits)
        with stream:
            ws = shared_workspace.scratch(cp, stream, is_torch(router_logits))
            ids, wts = self._route(cp, ws, router_logits, t)
        k = self.spec.moe.top_k
        return ids.reshape(t, k), wts.reshape(t, k)

    def _route(self, cp, ws, logits, t: int):
        m = self.spec.moe
        la = as_device(cp, logits, "router_logits", np.float32, (t, m.num_experts))
        ids = self._view(cp, ws, "topk_ids", cp.int32, t * m.top_k)
        wts = self._view(cp, ws, "topk_weights", cp.float32, t * m.top_k)
        threads = self.threads["moe_router_topk"]        # one warp per token
        self.kernels["moe_router_topk"]((-(-t // (threads // 32)),), (threads,),
                                        (la, np.int32(t), ids, wts))
        return ids, wts

    # --- the layer call --------------------------------------------------------------------------
    def __call__(self, x, logits_or_weights, weights: PackedMoeWeights | None = None, *,
                 topk_ids=None, topk_weights=None, out=None):
        cp = get_cupy()
        m = self.spec.moe
        if isinstance(logits_or_weights, PackedMoeWeights):
            logits, weights = None, logits_or_weights
        else:
            logits = logits_or_weights
        self._check_weights(weights)
        if logits is not None and (topk_ids is not None or topk_weights is not None):
            raise ValueError("give router logits or topk_ids/topk_weights, not both")
        if logits is None and (topk_ids is None or topk_weights is None):
            raise ValueError("without router logits, give topk_ids and topk_weights")
        stream = stream_for(cp, x, logits, topk_ids, out)
        with stream:        # (DLPack views taken on the stream the call runs on: no sync)
            xa = as_activation(cp, x, "x", self.dtype)
            if xa.ndim != 2 or xa.shape[1] != m.hidden_size:
                raise ValueError(f"x: shape {tuple(xa.shape)}, expected [T, {m.hidden_size}]")
            t = xa.shape[0]
            if t > self.spec.tokens.max:
                raise ValueError(f"x: {t} tokens exceed the spec's tokens.max "
                                 f"({self.spec.tokens.max})")
            y = (self.out[:t] if out is None else
                 as_activation(cp, out, "out", self.dtype, (t, m.hidden_size)))
            if t > 0:
                self._launch(cp, stream, shared_workspace.scratch(cp, stream, is_torch(x)), xa,
                             y, logits, topk_ids, topk_weights, weights)
        return result_for(x, y, out, self.dtype)

    def _launch(self, cp, stream, ws, xa, y, logits, topk_ids, topk_weights,
                weights: PackedMoeWeights) -> None:
        """The call's launches on `stream` (current), reading and writing the workspace `ws`."""
        m = self.spec.moe
        t = xa.shape[0]
        if logits is not None and t == 1 and self.one_launch is not None:
            self._launch_one_token(cp, ws, xa, y, logits, weights)
            return
        k, slots = m.top_k, t * m.top_k
        bucket = next((i for i, (edge, _) in enumerate(self.plan["buckets"]) if t <= edge),
                      len(self.plan["buckets"]) - 1)
        block = self.plan["buckets"][bucket][1]
        rows = slots + m.num_experts * max(b for _, b in self.plan["buckets"])
        sorted_ids = self._view(cp, ws, "sorted_token_ids", cp.int32, rows)
        expert_ids = self._view(cp, ws, "expert_ids", cp.int32, slots)
        wflat = self._view(cp, ws, "topk_weights_flat", cp.float32, rows)
        total = self._view(cp, ws, "num_tokens_post_padded", cp.int32, 1)
        aligned = (sorted_ids, expert_ids, wflat, total)
        # the caller's expert ids, where some may lie outside [0, E) (skipped slots):
        # the top-k sum leaves those out (null: every slot routed, as the router routes)
        routed_ids = NULL
        ids = None                 # the slots' expert ids in memory (act-order reads them)
        # one token with router logits: every CTA of both GEMMs routes it (no launch here)
        in_gemm = logits is not None and t == 1 and self.gemm_route
        if in_gemm:
            one_token = (as_device(cp, logits, "router_logits", np.float32,
                                   (t, m.num_experts)),)
        elif logits is not None and t <= self.route_align_max_tokens:   # one CTA does both
            la = as_device(cp, logits, "router_logits", np.float32, (t, m.num_experts))
            self.kernels["moe_route_align"]((1,), (self.threads["moe_route_align"],),
                                            (la, np.int32(t), np.int32(block), *aligned))
        else:
            if logits is not None:
                ids, wts = self._route(cp, ws, logits, t)
            else:
                ids = as_device(cp, topk_ids, "topk_ids", np.int32, (t, k))
                wts = as_device(cp, topk_weights, "topk_weights", np.float32, (t, k))
                routed_ids = ids
            self._align(cp, ws, stream, ids, wts, slots, block, aligned)
        partials = self._partials(cp, ws)
        counters = self._counters(cp, "counters")
        blocks = max_blocks(t, k, m.num_experts, block)
        act = activation_storage(self.dtype)
        src = xa
        for g in self.gemms:
            v = g["variants"][bucket]
            up = g["weights"] == "w13"
            w, s, z, order = ((weights.w13, weights.w13_scales, weights.w13_zeros,
                               weights.w13_rows) if up else
                              (weights.w2, weights.w2_scales, weights.w2_zeros,
                               weights.w2_rows))
            if order is not None:      # act-order: the rows gathered in the weight's order
                permuted = self._view(cp, ws, g["a"], act, slots * g["kdim"])
                n = slots * g["kdim"]
                self.kernels["moe_permute_x" if up else "moe_permute_act"](
                    (min(-(-n // 256), 65535),), (256,),
                    (src, ids, order, np.int32(slots), permuted))
                src = permuted
            dst = self._view(cp, ws, g["out"], act, slots * g["nout"])
            summed = ((y, self._counters(cp, "sum_counters"), routed_ids)
                      if g["sum_topk"] else ())
            grid = (blocks, g["ntiles"] // v["col_tiles"], v["split"])
            args = (src, w, s, z if z is not None else NULL, sorted_ids, expert_ids,
                    total, wflat, np.int32(slots), dst, partials, counters, *summed,
                    *(one_token if in_gemm else ()))
            # routed in the GEMMs: the bucket's kernels in their routing form, gate/up the
            # call's first launch (plain: it reads the logits before anything could wait)
            kernel = self.kernels[v["route_kernel"] if in_gemm else v["kernel"]]
            if (v["follows_from"] is not None and self.pdl and t >= v["follows_from"]
                    and not (in_gemm and up) and order is None):
                launch_after_previous(kernel, grid, v["warps"] * 32, args, stream)
            else:
                kernel(grid, (v["warps"] * 32,), args, shared_mem=v["shared_bytes"])
            if up and g["epilogue"] == 0:
                swiglu = self._view(cp, ws, "activation", act, slots * m.intermediate_size)
                n = slots * m.intermediate_size
                self.kernels["moe_swiglu"]((min(-(-n // 256), 65535),), (256,),
                                           (dst, np.int32(slots), swiglu))
                dst = swiglu
            src = dst
        if not self.gemms[-1]["sum_topk"]:      # else the down GEMM summed into y
            n8 = t * m.hidden_size // 8
            grid, args = (min(-(-n8 // 256), 65535),), (src, np.int32(t), y)
            if routed_ids is NULL:      # every slot routed: the kernel with no check
                kernel = self.kernels["moe_aggregate"]
            else:
                kernel, args = self.kernels["moe_aggregate_checked"], (*args, routed_ids)
            if self.pdl and self.aggregate_follows:
                launch_after_previous(kernel, grid, 256, args, stream)
            else:
                kernel(grid, (256,), args)

    def _align(self, cp, ws, stream, ids, wts, slots: int, block: int, aligned: tuple) -> None:
        """The align launches: one CTA, or from align_chunked_from slots (where the plan has
        it) a CTA a chunk in two launches (counts, then each chunk's slots in place)."""
        if not 0 < self.align_chunked_from <= slots:
            self.kernels["moe_align"]((1,), (self.threads["moe_align"],),
                                      (ids, wts, np.int32(slots), np.int32(block), *aligned))
            return
        chunks = -(-slots // self.plan["align_chunk"])
        at = self.plan["workspace"]["align_counts"]["offset"]
        counts = cp.ndarray((chunks * self.spec.moe.num_experts,), dtype=cp.int32,
                            memptr=ws.data + at)
        threads = self.threads["moe_align_chunk"]
        self.kernels["moe_align_count"]((chunks,), (threads,), (ids, np.int32(slots), counts))
        args = (ids, wts, np.int32(slots), np.int32(block), counts, *aligned)
        if self.pdl:
            launch_after_previous(self.kernels["moe_align_chunk"], (chunks,), threads, args,
                                  stream)
        else:
            self.kernels["moe_align_chunk"]((chunks,), (threads,), args)

    def _launch_one_token(self, cp, ws, xa, y, logits, weights: PackedMoeWeights) -> None:
        """T = 1 with router logits: the whole layer in the one-launch kernel (moe_one_token)."""
        m = self.spec.moe
        act = activation_storage(self.dtype)
        up, down = self.gemms
        la = as_device(cp, logits, "router_logits", np.float32, (1, m.num_experts))
        zeros = [z if z is not None else NULL for z in (weights.w13_zeros, weights.w2_zeros)]
        self.kernels["moe_one_token"](
            (self.one_launch_grid,), (self.one_launch["block"],),
            (xa, weights.w13, weights.w13_scales, zeros[0], weights.w2, weights.w2_scales,
             zeros[1], self._view(cp, ws, up["out"], act, m.top_k * up["nout"]),
             self._view(cp, ws, down["out"], act, m.top_k * down["nout"]), y,
             self._partials(cp, ws), self._counters(cp, "one_launch"), la))


class MsdMatmul:
    """The MSD matmul of a spec on the GPU: y = MsdMatmul(spec)(x, packed_w, scale).

    x fp16 [M, K], packed_w from `pack` (int4 values [K, N] in the kernel's layout), scale fp16
    [K/G, N]; returns fp16 [M, N] (a view of the layer's output buffer unless `out=` is given).
    With `lowering: msd` both schedules are compiled and `schedule=` runs the other one ("basic"
    or "preload"; default: the spec's); with `lowering: dequant` the one kernel is the
    dequantizing W4A16 GEMM. The split-K workspace is allocated here, once.
    """

    def __init__(self, spec, arch: str | None = None, pipeline: str | None = None,
                 tuning="auto"):
        from .msd_emitter import emit_msd
        cp = get_cupy()
        self.spec = load_spec(spec)
        if self.spec.pipeline != "msd_matmul":
            raise ValueError(f"MsdMatmul needs pipeline msd_matmul, the spec has "
                             f"{self.spec.pipeline}")
        self.gpu = device_gpu(arch)
        self.arch = self.gpu.arch
        module, _, pm = lower(self.spec, "cuda", pipeline, tuning=resolve_tuning(tuning),
                              gpu=self.gpu)
        self.program = emit_msd(self.spec, module, pm.pipeline, self.arch)
        self.plan = self.program.plan
        self.module = compile_program(self.program, self.arch, self.spec.name)
        self.kernels = {}
        for k in self.plan["kernels"]:
            fn = load_kernel(cp, self.module, k["name"], k["shared_bytes"],
                             "tile{block-n=...} with fewer columns needs less")
            self.kernels[k["name"].rsplit("_", 1)[1]] = (fn, k)
        s = self.spec.msd
        self.out = cp.empty((s.m, s.n), dtype=cp.float16)
        ws = self.plan.get("workspace", {})
        self.partials = cp.empty(max(1, ws.get("partials_floats", 0)), dtype=cp.float32)
        self.counters = cp.zeros(max(1, ws.get("counters", 0)), dtype=cp.int32)

    @property
    def schedules(self) -> list[str]:
        """What `schedule=` accepts: basic and preload, or dequant."""
        return list(self.kernels)

    def pack(self, w_q):
        """int4 values int8 [K, N] (numpy or device) -> the kernel's layout on the GPU."""
        from .layout import pack_dense_weights, pack_msd_weights
        cp = get_cupy()
        s = self.spec.msd
        host = cp.asnumpy(w_q) if isinstance(w_q, cp.ndarray) else np.asarray(w_q)
        if host.shape != (s.k, s.n):
            raise ValueError(f"w_q: shape {host.shape}, expected {(s.k, s.n)}")
        if self.spec.lowering == "dequant":
            return cp.asarray(pack_dense_weights(host))
        return cp.asarray(pack_msd_weights(host))

    def __call__(self, x, packed_w, scale, out=None, schedule: str | None = None):
        cp = get_cupy()
        s, g = self.spec.msd, self.spec.quant.group_size
        which = schedule or self.plan["default"]
        if which not in self.kernels:
            raise ValueError(f"schedule: {which!r} is not compiled for lowering "
                             f"{self.spec.lowering!r} (choose from {', '.join(self.kernels)})")
        fn, k = self.kernels[which]
        stream = stream_for(cp, x, scale, out)
        xa = as_device(cp, x, "x", np.float16, (s.m, s.k))
        sa = as_device(cp, scale, "scale", np.float16, (s.k // g, s.n))
        y = self.out if out is None else as_device(cp, out, "out", np.float16, (s.m, s.n))
        args = (xa, packed_w, sa, y, self.partials, self.counters)
        with stream:
            fn(tuple(k["grid"]), (k["block"],), args, shared_mem=k["shared_bytes"])
        return result_for(x, y, out)
