"""The sweep's ahead-of-time compiles: order, window, failures left to the sweep."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import moegen
from moegen import autotune as at
from moegen.targets.cuda.compile_ahead import AheadCompiler, compile_pool
from moegen.targets.cuda.emitter import emit_moe
from moegen.passes.pipelines import lower
from moegen.targets.cuda.runtime import nvrtc_input
from conftest import ROOT

QWEN = moegen.load_spec(ROOT / "examples" / "qwen3-30b-a3b.yaml")


def test_compiles_ahead_in_order_within_the_window():
    started, lock = [], threading.Lock()
    gate = threading.Event()

    def fake_compile(code, options):
        with lock:
            started.append(code)
        gate.wait(5)
        if code == "bad":
            raise RuntimeError("nvrtc says no")

    inputs = [("a", ()), None, ("bad", ()), ("c", ()), ("d", ()), ("e", ()), ("f", ())]
    ahead = AheadCompiler(inputs, ThreadPoolExecutor(1), window=4, compile_fn=fake_compile)
    assert len(ahead.pending) == 4               # the window in flight, None included
    gate.set()
    for _ in inputs:
        ahead.next()
    ahead.close()
    assert started == ["a", "bad", "c", "d", "e", "f"] and ahead.failed == 1
    ahead.next()                                 # past the end: nothing to wait for


def test_a_broken_pool_leaves_the_compiles_to_the_sweep():
    pool = ThreadPoolExecutor(1)
    pool.shutdown()                              # submit raises from now on
    with AheadCompiler([("a", ()), ("b", ())], pool, window=2,
                       compile_fn=lambda *a: None) as ahead:
        assert ahead.broken and list(ahead.pending) == [None, None]
        ahead.next()


def test_inputs_are_what_the_layer_compiles():
    space = at.config_space(QWEN, 1)[:3]
    bad = at.MoeConfig(8, 64, 8, 1)              # split-K 64 does not divide K: no module
    inputs = list(at._nvrtc_inputs(QWEN, space + [bad], "sm_90"))
    assert inputs[-1] is None and all(inputs[:-1])
    for cfg, (code, options) in zip(space, inputs):
        module, _, pm = lower(QWEN, "cuda", cfg.pipeline(), tuning=None)
        assert (code, options) == nvrtc_input(emit_moe(QWEN, module, pm.pipeline, "sm_90"),
                                              "sm_90")
        assert "--gpu-architecture=sm_90" in options
    with pytest.raises(Exception):
        lower(QWEN, "cuda", bad.pipeline(), tuning=None)


def test_worker_processes_start_and_failures_are_counted():
    """The real pool (spawned processes, the real worker function): code NVRTC rejects, or a
    machine without CuPy, is a counted failure, never an exception in the sweep."""
    pool = compile_pool(1)
    try:
        with AheadCompiler([("not C++", ("--std=c++17",))], pool, window=2) as ahead:
            ahead.next()
            assert ahead.failed == 1 and not ahead.pending
    finally:
        pool.shutdown()


def test_a_stuck_compile_is_not_waited_for_past_the_timeout():
    release = threading.Event()
    pool = ThreadPoolExecutor(1)
    with AheadCompiler([("slow", ())], pool, window=2, timeout_s=0.05,
                       compile_fn=lambda *a: release.wait(5)) as ahead:
        ahead.next()
        assert ahead.failed == 1
    release.set()


def test_close_drops_the_compiles_not_started_and_leaves_the_pool_to_its_owner():
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    ran = []
    ahead = AheadCompiler([("a", ()), ("b", ()), ("c", ())], pool, window=3,
                          compile_fn=lambda code, options: (gate.wait(5), ran.append(code)))
    ahead.close()                                # "a" may be running; "b", "c" are dropped
    gate.set()
    pool.submit(lambda: None).result()           # the pool still takes work
    pool.shutdown()
    assert ran in (["a"], []) and not ahead.pending


def test_inputs_skip_the_candidates_already_built():
    space = at.config_space(QWEN, 1)[:2]
    inputs = list(at._nvrtc_inputs(QWEN, space, "sm_90", built={space[0]: object()}))
    assert inputs[0] is None and inputs[1] is not None
