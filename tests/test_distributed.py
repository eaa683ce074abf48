"""Expert parallelism: the expert map and each rank's share (numpy, CI), both combine modes over
gloo in processes on the CPU (where PyTorch is installed), and on one GPU the sum of the shard
layers against the whole layer."""
import numpy as np
import pytest

import moegen
from moegen import reference as R
from moegen.expert_map import ExpertMap, local_routing, shard_spec, shard_weight
from gpu_cases import moe_spec

SPEC = moe_spec(256, 128, 8, 2, tokens_max=256)


def test_expert_maps():
    m = ExpertMap.contiguous(8, 3)                       # ceil(8 / 3) = 3 experts a rank
    assert m.rank_of == (0, 0, 0, 1, 1, 1, 2, 2)
    assert m.experts_of(2) == [6, 7]
    assert m.local_ids(1).tolist() == [-1, -1, -1, 0, 1, 2, -1, -1]
    m = ExpertMap.of([1, 0, 1, 0], 2)
    assert m.experts_of(0) == [1, 3] and m.local_ids(0).tolist() == [-1, 0, -1, 1]
    with pytest.raises(ValueError, match="rank 2 is not a rank of the group"):
        ExpertMap.of([0, 2], 2)
    with pytest.raises(ValueError, match="rank 1 holds no expert"):
        ExpertMap.of([0, 0], 2)
    ids = np.array([[3, -1], [8, 5], [0, 1 << 20]], np.int32)
    assert local_routing(ids, ExpertMap.contiguous(8, 2).local_ids(1)).tolist() == [
        [-1, -1], [-1, 1], [-1, -1]]


@pytest.mark.parametrize("world,assignment", [(2, None), (3, None), (3, [2, 0, 1, 2, 0, 1, 0, 2])])
def test_the_shares_add_up_to_the_layer(rng, world, assignment):
    """Each rank's share (its experts, the others' slots skipped) summed over the ranks is the
    whole layer: the all-reduce combine's arithmetic."""
    spec = moegen.load_spec({**SPEC, "quant": {"group_size": 64, "symmetric": False,
                                               "act_order": True}})
    w13, w2 = R.random_moe_weights(rng, spec)
    x = rng.standard_normal((7, 256)).astype(np.float16)
    ids, w = R.topk_softmax(rng.standard_normal((7, 8)).astype(np.float32), 2)
    emap = ExpertMap.contiguous(8, world) if assignment is None else ExpertMap.of(assignment,
                                                                                  world)
    total = np.zeros((7, 256))
    for r in range(world):
        experts = emap.experts_of(r)
        share = R.moe_w4a16_weights(x, local_routing(ids, emap.local_ids(r)), w,
                                    shard_weight(w13, experts), shard_weight(w2, experts), 64)
        total += share
        assert shard_spec(spec, len(experts)).moe.num_experts == len(experts)
    want = R.moe_w4a16_weights(x, ids, w, w13, w2, 64)
    assert np.allclose(total, want, rtol=1e-5, atol=1e-5)


def _reference_experts(spec, w13, w2, experts):
    """A rank's experts on the numpy reference, as ExpertParallelMoe calls them."""
    import torch
    a13, a2 = shard_weight(w13, experts), shard_weight(w2, experts)

    def run(x, local_ids, weights):
        y = R.moe_w4a16_weights(x.numpy(), local_ids.numpy(), weights.numpy(), a13, a2,
                                spec.quant.group_size)
        return torch.from_numpy(y.astype(np.float16))
    return run


def _rank(rank, world, port, combine, seed, results):
    import torch
    import torch.distributed as dist
    from moegen.distributed import ExpertParallelMoe
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        spec = moegen.load_spec(SPEC)
        rng = np.random.default_rng(seed)                 # the same draws on every rank
        w13, w2 = R.random_moe_weights(rng, spec)
        x = rng.standard_normal((world, 5, 256)).astype(np.float16)
        logits = rng.standard_normal((world, 5, 8)).astype(np.float32)
        experts = ExpertMap.contiguous(8, world).experts_of(rank)
        moe = ExpertParallelMoe(spec, combine=combine,
                                local_experts=_reference_experts(spec, w13, w2, experts))
        # all_reduce: every rank all tokens; all_to_all: rank r its own five
        mine = x.reshape(-1, 256) if combine == "all_reduce" else x[rank]
        mine_logits = logits.reshape(-1, 8) if combine == "all_reduce" else logits[rank]
        ids, w = moe.route(torch.from_numpy(mine_logits))
        y1 = moe(torch.from_numpy(mine), ids, w)
        y2 = moe(torch.from_numpy(mine), ids, w)
        want = R.moe_w4a16_weights(mine, ids.numpy(), w.numpy(), w13, w2, 128)
        err = np.linalg.norm(y1.float().numpy() - want) / np.linalg.norm(want)
        results.put((rank, float(err), bool(torch.equal(y1, y2))))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("combine", ["all_reduce", "all_to_all"])
@pytest.mark.parametrize("world", [2, 3])
def test_both_combines_over_gloo(combine, world):
    """Ranks in processes on the CPU over gloo, their experts on the reference: every rank's
    output within 2e-3 of the whole layer, and two calls the same bits."""
    torch = pytest.importorskip("torch")
    import socket
    mp = torch.multiprocessing.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Queue()
    procs = [mp.Process(target=_rank, args=(r, world, port, combine, 11, results))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    got = sorted(results.get(timeout=5) for _ in range(world))
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    for rank, err, same in got:
        assert err <= 2e-3 and same, (rank, err, same)


@pytest.mark.gpu
def test_shard_layers_on_one_gpu_add_up_to_the_layer(rng):
    """On one GPU: the layers of N ranks' shards, run in one process, summed (in fp32, as the
    all-reduce adds them), equal the whole layer within 2e-3."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    from moegen.distributed import _cuda_experts
    for spec_dict, world in ((moe_spec(2048, 768, 128, 8, tokens_max=2048), 4),
                             (moe_spec(4096, 1024, 8, 2, tokens_max=2048), 2)):
        spec = moegen.load_spec(spec_dict)
        w13, w2 = R.random_moe_weights(rng, spec)
        emap = ExpertMap.contiguous(spec.moe.num_experts, world)
        shards = [(emap.local_ids(r), _cuda_experts(
            shard_spec(spec, len(emap.experts_of(r))),
            shard_weight(w13, emap.experts_of(r)), shard_weight(w2, emap.experts_of(r))))
            for r in range(world)]
        for t in (1, 64, 2048):
            x = rng.standard_normal((t, spec.moe.hidden_size)).astype(np.float16)
            ids, w = R.topk_softmax(rng.standard_normal((t, spec.moe.num_experts))
                                    .astype(np.float32), spec.moe.top_k)
            total = torch.zeros((t, spec.moe.hidden_size), dtype=torch.float32, device="cuda")
            for table, run in shards:
                local = torch.from_numpy(local_routing(ids, table)).cuda()
                total += run(torch.from_numpy(x).cuda(), local,
                             torch.from_numpy(w).cuda()).float()
            want = R.moe_w4a16_weights(x, ids, w, w13, w2, 128)
            got = total.half().float().cpu().numpy()
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert err <= 2e-3, (spec.name, t, err)
