"""A MoE layer with its experts spread over the GPUs of one host (NCCL), both combine modes
checked against the whole layer on one GPU and timed:

    torchrun --nproc-per-node 2 examples/expert_parallel.py examples/qwen3-30b-a3b.yaml \\
        --tokens 1,64,2048

Every rank draws the same random weights and inputs (seeded); rank r keeps its experts
(contiguous blocks). all_reduce: each rank has all T tokens; all_to_all: each rank has T / N of
them (T rounded up to a multiple of N). Each rank also runs the whole layer on its GPU for the
reference (the single-GPU layer); rank 0 prints, per mode and T, the largest relative error
over the ranks, whether two calls gave the same bits, the time per call, and the
single-GPU layer's time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import moegen
from moegen import reference
from moegen.distributed import ExpertParallelMoe
from moegen.torch import compiled_layer


def timed(fn, reps: int = 20) -> float:
    """Median microseconds of fn() (synchronized across the ranks before each)."""
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec")
    parser.add_argument("--tokens", default="1,64,2048")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = moegen.load_spec(args.spec)
    m = spec.moe
    rng = np.random.default_rng(0)                   # the same weights on every rank
    w13, w2 = reference.random_moe_weights(rng, spec)
    whole = compiled_layer(spec)
    packed = whole.pack(w13, w2)
    modes = {c: ExpertParallelMoe(spec, w13, w2, combine=c) for c in ("all_reduce", "all_to_all")}
    ok = True
    for t in [int(v) for v in args.tokens.split(",")]:
        t = -(-t // world) * world
        gen = torch.Generator().manual_seed(t)
        x = torch.randn(t, m.hidden_size, generator=gen).to(torch.float16).cuda()
        logits = torch.randn(t, m.num_experts, generator=gen).cuda()
        ids, w = modes["all_reduce"].route(logits)
        want = torch.empty_like(x)
        whole(x, packed, topk_ids=ids, topk_weights=w, out=want)
        single_us = timed(lambda: whole(x, packed, topk_ids=ids, topk_weights=w, out=want),
                          args.reps)
        for mode, moe in modes.items():
            part = slice(None) if mode == "all_reduce" else slice(rank * t // world,
                                                                  (rank + 1) * t // world)
            a = moe(x[part], ids[part], w[part])
            b = moe(x[part], ids[part], w[part])
            err = ((a.float() - want[part].float()).norm() / want[part].float().norm()).item()
            stats = torch.tensor([err, float(torch.equal(a, b))], device="cuda")
            gathered = [torch.empty_like(stats) for _ in range(world)]
            dist.all_gather(gathered, stats)
            us = timed(lambda: moe(x[part], ids[part], w[part]), args.reps)
            worst = max(g[0].item() for g in gathered)
            same = all(g[1].item() == 1.0 for g in gathered)
            ok = ok and worst <= 2e-3 and same
            if rank == 0:
                print(f"{spec.name} x{world} {mode:>10} T={t:>5}: error {worst:.2e} "
                      f"({'ok' if worst <= 2e-3 else 'FAILED'}, limit 2e-3), "
                      f"{'deterministic' if same else 'NOT deterministic'}, {us:8.1f} us "
                      f"(one GPU, whole layer: {single_us:8.1f} us)", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
