"""A compiled graph's wrapper over ZeRO-3 parameters (``Zero3.run_graph``), and a training loop.

The seed: Inductor's generated wrapper keeps ``buf1 = buf0`` aliases of every gathered view
until the graph ends, so a release that only drops the registry's reference frees nothing
before then (``../shared/seeds/deepspeed-zero3-release-lifetime.txt``). With the fix, live
bytes drop by the padded size at each parameter's final release although the aliases are
alive; with ``legacy_release=True`` (the mutant probe) they stay up until the graph ends, and
the suite's own checks say so. The training loop runs layers x steps with prefetch depth d on
``sim`` with a cache cap and a kernel latency (and on every other backend): live bytes return
to the baseline after every step, and the peak is the model's, d + 1 gathered layers at most.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.zero3 import Zero3
from runtime.zero3_graph import GraphRun, run_graph

NUMEL, WORLD = 1001, 4  # shards of 251: padded bases of 1004 elements
PADDED_BYTES = 4 * 1004
ACTIVATION_BYTES = 4 * NUMEL


def model(z3: Zero3, n_layers: int, *, tied: bool = False) -> list[tuple]:
    """Register a chain of ``n_layers`` layers (weight, bias); with ``tied``, the last layer
    reuses the first one's weight (a parameter with two users)."""
    layers = []
    for k in range(n_layers):
        weight = "w0" if tied and k == n_layers - 1 else f"w{k}"
        if weight not in (w for w, _ in layers):
            z3.register(weight, NUMEL)
        z3.register(f"b{k}", NUMEL)
        layers.append((weight, f"b{k}"))
    return layers


def expected_output(z3: Zero3, layers: list[tuple], x: np.ndarray) -> np.ndarray:
    """The graph on the host, in float32 as the kernels compute it (a multiply, then an add)."""
    for weight, bias in layers:
        x = x * z3.param(weight).values()
        x = x + z3.param(bias).values()
    return x


def check_releases_free(z3: Zero3, run: GraphRun, baseline: int) -> None:
    """The suite's check of a graph run: every final release of a non-persistent parameter
    dropped live bytes by its padded size at once, every other release by nothing, and the
    end of the graph (its aliases dropped) freed nothing more."""
    __tracebackhide__ = True
    for release in run.releases:
        dropped = release.live_before - release.live_after
        param = z3.param(release.param_id)
        if release.final and not param.persistent:
            assert dropped == param.padded_bytes, (
                f"the final release of {release.param_id!r} (layer {release.layer}) freed"
                f" {dropped} bytes, not its {param.padded_bytes} padded bytes: the wrapper's"
                " aliases keep the gathered storage alive"
            )
        else:
            assert dropped == 0, f"a non-final release of {release.param_id!r} freed {dropped}"
    output = run.output.nbytes
    assert run.live_at_end == run.live_after == baseline + output, (
        f"live bytes {run.live_at_end - baseline - output} above the baseline while the"
        f" wrapper's aliases were alive, {run.live_after - baseline - output} after"
    )


def test_live_bytes_drop_at_each_final_release_with_the_aliases_alive(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, WORLD)
    layers = model(z3, 3, tied=True)  # w0 has two users: freed at the last layer's release
    x = np.linspace(0.5, 1.5, NUMEL, dtype=np.float32)
    buf = alloc.from_numpy(x)
    baseline = alloc.stats().live_bytes
    run = run_graph(z3, layers, buf)
    check_releases_free(z3, run, baseline)
    assert [(r.layer, r.param_id, r.final) for r in run.releases] == [
        (0, "w0", False),
        (0, "b0", True),
        (1, "w1", True),
        (1, "b1", True),
        (2, "w0", True),
        (2, "b2", True),
    ]
    np.testing.assert_array_equal(alloc.to_numpy(run.output), expected_output(z3, layers, x))
    del run
    assert alloc.stats().live_bytes == baseline
    alloc.release(buf)


def test_teeth_the_pre_fix_release_keeps_every_parameter_until_the_graph_ends(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, WORLD, legacy_release=True)
    layers = model(z3, 3, tied=True)
    buf = alloc.full(NUMEL, 1.0)
    baseline = alloc.stats().live_bytes
    run = run_graph(z3, layers, buf)
    with pytest.raises(AssertionError, match="the wrapper's aliases keep the gathered storage"):
        check_releases_free(z3, run, baseline)
    # every gathered base stayed live until the graph ended, then died with the aliases
    gathered = 5 * PADDED_BYTES
    assert run.live_at_end == baseline + ACTIVATION_BYTES + gathered
    assert run.live_after == baseline + ACTIVATION_BYTES
    del run
    alloc.release(buf)


def model_peak(n_layers: int, prefetch: int) -> int:
    """The model's peak above the baseline: before layer k's op, layers k .. k + prefetch are
    gathered (2 parameters each), and the op's output is live beside its input (from layer 1
    on, the input is the previous layer's output; at layer 0 it is the caller's, in the
    baseline)."""
    layer_bytes = 2 * PADDED_BYTES
    return max(
        min(prefetch + 1, n_layers - k) * layer_bytes + (1 if k == 0 else 2) * ACTIVATION_BYTES
        for k in range(n_layers)
    )


def check_step(run: GraphRun, baseline: int, n_layers: int, prefetch: int) -> None:
    """The training loop's check of one step: the peak is the model's (``prefetch + 1``
    gathered layers at most)."""
    __tracebackhide__ = True
    peak, expected = run.peak_bytes - baseline, model_peak(n_layers, prefetch)
    gathered = (peak - 2 * ACTIVATION_BYTES) / (2 * PADDED_BYTES)
    assert peak == expected, (
        f"peak {peak} bytes above the baseline, the model's is {expected}: about"
        f" {gathered:.1f} layers gathered at once, at most {prefetch + 1} expected"
    )


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_a_training_loop_returns_to_the_baseline_every_step(make_alloc, prefetch, stress_scale):
    n_layers, steps = 6, 4 * stress_scale
    # a cap that holds two layers' bases (the rest is evicted, after waiting on its events),
    # and kernels that take time, so that released blocks wait on the compute stream's events
    alloc = make_alloc(cache_cap_bytes=4 * PADDED_BYTES, sim_latency_us=5)
    z3 = Zero3(alloc, WORLD)
    layers = model(z3, n_layers)
    x = np.full(NUMEL, 0.75, dtype=np.float32)
    buf = alloc.from_numpy(x)
    expected = expected_output(z3, layers, x)
    baseline = alloc.stats().live_bytes
    for step in range(steps):
        run = run_graph(z3, layers, buf, prefetch=prefetch)
        check_releases_free(z3, run, baseline)
        check_step(run, baseline, n_layers, prefetch)
        np.testing.assert_array_equal(alloc.to_numpy(run.output), expected)
        del run
        assert alloc.stats().live_bytes == baseline, f"step {step} left bytes live"
    stats = alloc.stats()
    if stats.backend != "cpu":
        assert stats.cache_bytes <= 4 * PADDED_BYTES and stats.cache_hits > 0
    alloc.release(buf)


def test_teeth_the_pre_fix_release_passes_the_models_peak(make_alloc):
    alloc = make_alloc(sim_latency_us=5)
    z3 = Zero3(alloc, WORLD, legacy_release=True)
    layers = model(z3, 6)
    buf = alloc.full(NUMEL, 0.75)
    baseline = alloc.stats().live_bytes
    run = run_graph(z3, layers, buf, prefetch=1)
    with pytest.raises(AssertionError, match=r"about 6\.0 layers gathered at once, at most 2"):
        check_step(run, baseline, 6, 1)
    del run
    assert alloc.stats().live_bytes == baseline
    alloc.release(buf)


class _LayerFailed(Exception):
    pass


def test_a_graph_that_raises_restores_the_registry_and_a_retry_runs_clean(make_alloc):
    # an OOM (any exception) in layer 1 of a graph whose last layer reuses w0: before the fix
    # the gathered bases leaked and w0's countdown stayed armed, so the retry's first release
    # of w0 was final and freed the tied weight early
    alloc = make_alloc()
    z3 = Zero3(alloc, WORLD)
    layers = model(z3, 3, tied=True)
    z3.register("kept", NUMEL, persistent=True)
    z3.allgather("kept")  # gathered before the graph: the failure leaves it alone
    buf = alloc.full(NUMEL, 1.0)
    baseline = alloc.stats().live_bytes
    gather = z3.allgather

    def failing(param_id):
        if param_id == "w1":
            raise _LayerFailed("out of device memory in layer 1")
        return gather(param_id)

    z3.allgather = failing
    with pytest.raises(_LayerFailed):
        run_graph(z3, layers, buf)
    del z3.allgather
    assert [z3.gathered(p) is None for p in ("w0", "b0", "w1", "b1", "b2")] == [True] * 5
    assert z3.gathered("kept") is not None
    assert [z3.countdown(p) for p in ("w0", "b0", "w1", "b1", "b2")] == [0] * 5
    assert alloc.stats().live_bytes == baseline  # w0's base (gathered, not released) freed
    run = run_graph(z3, layers, buf)  # the retry
    check_releases_free(z3, run, baseline)
    assert [(r.param_id, r.final) for r in run.releases if r.param_id == "w0"] == [
        ("w0", False),
        ("w0", True),
    ]
    del run
    alloc.release(buf)


def test_reset_drops_the_gathered_parameters_and_disarms_the_countdowns(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, WORLD)
    layers = model(z3, 2)
    z3.register("kept", NUMEL, persistent=True)
    baseline = alloc.stats().live_bytes
    views = [z3.allgather(p) for p in ("w0", "b0", "kept")]
    z3.release(views[0], "w0", 2)  # armed at 2, one release to go
    assert z3.countdown("w0") == 1
    z3.reset()
    assert [z3.gathered(p) is None for p in ("w0", "b0", "kept")] == [True, True, False]
    assert z3.countdown("w0") == 0 and views[0].size == views[1].size == 0
    assert alloc.stats().live_bytes == baseline + z3.param("kept").padded_bytes
    with pytest.raises(ValueError, match=r"^release: param_id='w0' was already released"):
        z3.release(views[0], "w0", 2)
    run = run_graph(z3, layers, alloc.full(NUMEL, 1.0))  # runs clean after the reset
    check_releases_free(z3, run, baseline + z3.param("kept").padded_bytes + ACTIVATION_BYTES)
