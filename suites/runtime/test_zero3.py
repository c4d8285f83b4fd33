"""ZeRO-3's gathered-parameter release lifetime (``runtime.zero3``), on every backend.

Source: ``../shared/seeds/deepspeed-zero3-release-lifetime.txt``. DeepSpeed's own unit tests of
the fix check the storage after the release while the registry's tensor is the only one they
hold; a reviewer noted that "they already hold a reference to" the gathered buffer, so they
could not tell a freed storage from a merely dropped reference. These hold the true-shape view
*and* its storage across the release, as Inductor's wrapper holds its aliases, and check the
storage and the allocator's live bytes at once. Each check is also run against the pre-fix
release (``legacy_release=True``, the mutant probe) and must fail there.
"""

from __future__ import annotations

import numpy as np
import pytest

import harness
from allocator import Buffer, UseAfterFreeError
from harness import DeathTestFailure
from runtime.zero3 import Param, Zero3
from runtime.zero3_graph import run_graph

from . import _zero3_targets
from ._knobs import pinned_env


def check_final_release_frees(alloc, z3: Zero3, param_id, n_users: int = 1) -> None:
    """The suite's check: gather ``param_id``, release it ``n_users`` times holding the view
    and its storage: every release but the last leaves the storage and live bytes alone; the
    last frees the padded storage at once (size 0, live bytes down by the padded bytes)."""
    __tracebackhide__ = True
    param = z3.param(param_id)
    before = alloc.stats().live_bytes
    view = z3.wait(z3.allgather(param_id), param_id)
    storage = view.storage
    assert (view.size, storage.size) == (param.numel, param.padded_numel)
    assert alloc.stats().live_bytes - before == param.padded_bytes
    for _ in range(n_users - 1):
        assert z3.release(view, param_id, n_users) is view
        assert storage.size == param.padded_numel and z3.gathered(param_id) is not None
        assert alloc.stats().live_bytes - before == param.padded_bytes
    z3.release(view, param_id, n_users)
    assert z3.gathered(param_id) is None, "the registry still holds the base"
    live = alloc.stats().live_bytes
    assert (storage.size, storage.block, view.size, view.nbytes) == (0, None, 0, 0), (
        f"the final release left the padded storage allocated ({storage.nbytes} bytes, live"
        f" bytes {live - before} above the baseline) while the view is alive"
    )
    assert live == before
    assert storage.freed_reason == "released by release_param"


def test_uneven_shards_the_final_release_frees_the_padded_storage(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 2)
    param = z3.register("w", 4097)
    assert (param.shard_numel, param.padded_numel, param.padded_bytes) == (2049, 4098, 16392)
    check_final_release_frees(alloc, z3, "w")


def test_two_users_the_second_release_frees(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 2)
    assert z3.register("b", 3).padded_numel == 4
    check_final_release_frees(alloc, z3, "b", n_users=2)


@pytest.mark.parametrize("n_users", [1, 2])
def test_teeth_the_pre_fix_release_is_caught(make_alloc, n_users):
    alloc = make_alloc()
    z3 = Zero3(alloc, 2, legacy_release=True)
    z3.register("w", 4097)
    with pytest.raises(AssertionError, match="the final release left the padded storage"):
        check_final_release_frees(alloc, z3, "w", n_users)
    # dropping the check's frame dropped the view: the pre-fix path frees only then
    assert alloc.stats().live_bytes == 0


def test_a_persistent_parameter_keeps_its_own_storage(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 4)
    param = z3.register("ln", 10, persistent=True)
    view = z3.wait(z3.allgather("ln"), "ln")
    base = z3.gathered("ln")
    # the registry's own storage, not a copy: upstream's version of this check compared the
    # registry's tensor with itself
    assert view.storage is base.storage and base.size == param.padded_numel == 12
    stats = alloc.stats()
    for _ in range(3):
        assert z3.release(view, "ln", 1) is view
    assert z3.gathered("ln") is base and view.size == 10
    assert alloc.to_numpy(view).tolist() == param.values().tolist()
    again = z3.allgather("ln")  # allocates nothing: a view of the same base
    after = alloc.stats()
    assert again.storage is base.storage
    assert (after.alloc_count, after.live_bytes) == (stats.alloc_count, stats.live_bytes)
    del view, again, base
    z3 = None  # the registry's reference was the last one
    assert alloc.stats().live_bytes == 0


def test_the_gathered_view_reads_every_ranks_shard(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 3)
    param = z3.register("w", 7)  # shards of 3, 3 and 1 (+2 zeros)
    shards = [z3.shard("w", rank).tolist() for rank in range(3)]
    values = param.values().tolist()
    assert shards == [values[0:3], values[3:6], [*values[6:7], 0.0, 0.0]]
    # the consumer waits for the parameter's all-gather (wait_allgather) before it reads: the
    # first H200 run read zeros here without the wait, and sim's race check aborts without it
    view = z3.wait(z3.allgather("w"), "w")
    assert alloc.to_numpy(view).tolist() == values
    assert alloc.to_numpy(z3.gathered("w")).tolist() == [x for shard in shards for x in shard]
    assert z3.allgather("w").storage is view.storage  # gathered already: the same base
    assert z3.register("v", 7).values().tolist() != values  # parameters differ
    z3.release(view, "w", 1)


def test_one_rank_holds_the_whole_parameter(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 1)
    param = z3.register("w", 5)
    assert (param.shard_numel, param.padded_numel) == (5, 5)
    check_final_release_frees(alloc, z3, "w")


def test_bad_construction_and_registration(make_alloc):
    alloc = make_alloc()
    with pytest.raises(TypeError, match=r"^alloc must be an allocator.Allocator, got str$"):
        Zero3("sim", 2)
    with pytest.raises(ValueError, match=r"^world_size must be >= 1, got 0$"):
        Zero3(alloc, 0)
    with pytest.raises(TypeError, match=r"^world_size must be an integer, got float 2.0$"):
        Zero3(alloc, 2.0)
    with pytest.raises(TypeError, match=r"^legacy_release must be a bool, got int$"):
        Zero3(alloc, 2, legacy_release=1)
    z3 = Zero3(alloc, 2)
    z3.register("w", 8)
    with pytest.raises(ValueError, match=r"^param_id='w' is already registered$"):
        z3.register("w", 8)
    with pytest.raises(ValueError, match=r"^numel must be >= 1, got 0$"):
        z3.register("x", 0)
    with pytest.raises(TypeError, match=r"^numel must be an integer, got bool True$"):
        z3.register("x", True)
    with pytest.raises(TypeError, match=r"^persistent must be a bool, got str$"):
        z3.register("x", 4, persistent="yes")
    with pytest.raises(TypeError, match=r"^param_id must be hashable, got list \['x'\]$"):
        z3.register(["x"], 4)
    with pytest.raises(TypeError, match=r"^param_id must be hashable, got tuple \(\[1\],\)$"):
        z3.register(([1],), 4)  # a tuple is a Hashable, but this one does not hash
    with pytest.raises(ValueError, match=r"^rank must be < world_size=2, got 2$"):
        z3.shard("w", 2)
    assert z3.param("w") == Param("w", 0, 8, 4, 8, False)


def test_huge_sizes_are_refused_naming_the_argument(make_alloc):
    alloc = make_alloc()
    top = (2**63 - 1) // 4  # the allocator's bound: float32 elements whose bytes fit 63 bits
    with pytest.raises(ValueError, match=rf"^world_size must be <= {top}, got {2**64}$"):
        Zero3(alloc, 2**64)
    z3 = Zero3(alloc, 3)
    with pytest.raises(ValueError, match=rf"^numel must be <= {top}, got {2**70}$"):
        z3.register("w", 2**70)
    with pytest.raises(ValueError) as info:
        z3.register("w", top)  # pads to a multiple of 3 past the bound
    assert str(info.value) == (
        f"numel={top} over world_size=3 ranks pads to {top + 2} elements, more than a device"
        f" can address (at most {top})"
    )
    with pytest.raises(MemoryError, match=rf"^numel={top - 1}: the host cannot hold its shards"):
        z3.register("w", top - 1)
    wide = Zero3(alloc, top)
    with pytest.raises(MemoryError, match=r"^numel=1: the host cannot hold its shards"):
        wide.register("w", 1)  # one element, padded to one per rank
    assert z3.register("w", 4).padded_numel == 6  # nothing was left half-registered


def test_a_double_release_says_already_released(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 2)
    z3.register("w", 8)
    view = z3.allgather("w")
    z3.release(view, "w", 1)
    for op, call in (("release", z3.release), ("wait", lambda v, p, _=1: z3.wait(v, p))):
        with pytest.raises(ValueError) as info:
            call(view, "w", 1)
        assert str(info.value) == (
            f"{op}: param_id='w' was already released (its countdown reached 0); allgather it"
            " again first"
        )
    again = z3.allgather("w")  # gathered again: released no more
    z3.release(again, "w", 1)


def test_a_parameters_values_follow_the_documented_pattern(make_alloc):
    """``(1 + (i + index) % 251) / 256`` for element ``i``: pinned, since the gathers are
    checked against ``values()`` itself."""
    z3 = Zero3(make_alloc(), 2)
    first = z3.register("a", 253)
    second = z3.register("b", 3)
    i = np.arange(253)
    np.testing.assert_array_equal(first.values(), ((1 + i % 251) / 256).astype(np.float32))
    assert first.values()[[0, 250, 251]].tolist() == [1 / 256, 251 / 256, 1 / 256]
    assert second.values().tolist() == [2 / 256, 3 / 256, 4 / 256]  # index 1 shifts by one


def test_a_bad_rank_is_named(make_alloc):
    z3 = Zero3(make_alloc(), 2)
    z3.register("w", 8)
    with pytest.raises(ValueError, match=r"^rank must be >= 0, got -1"):
        z3.shard("w", -1)
    with pytest.raises(TypeError, match=r"^rank must be an integer"):
        z3.shard("w", 1.0)
    with pytest.raises(ValueError, match=r"^rank must be < world_size=2, got 2"):
        z3.shard("w", 2)


def test_unknown_ids_and_bad_releases(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 2)
    z3.register("w", 8)
    z3.register("b", 8)
    for call in (
        lambda: z3.allgather("nope"),
        lambda: z3.gathered("nope"),
        lambda: z3.param(["unhashable"]),
        lambda: z3.release(Buffer, "nope", 1),
        lambda: z3.wait(None, "nope"),
    ):
        with pytest.raises(KeyError, match=r"param_id=.* is not registered"):
            call()
    w = z3.allgather("w")
    with pytest.raises(ValueError, match=r"^release: param_id='b' is not gathered; allgather"):
        z3.release(w, "b", 1)
    b = z3.allgather("b")
    with pytest.raises(ValueError) as info:
        z3.release(b, "w", 1)
    assert str(info.value) == (
        "release: view is not a view of param_id='w''s gathered storage (it views param_id='b')"
    )
    stray = alloc.full(8, 1.0)
    with pytest.raises(ValueError, match=r"\(it views no gathered parameter\)$"):
        z3.wait(stray, "w")
    with pytest.raises(TypeError, match=r"^release: view must be a Buffer, got ndarray$"):
        z3.release(np.zeros(8, np.float32), "w", 1)
    with pytest.raises(ValueError, match=r"^n_users must be >= 1, got 0$"):
        z3.release(w, "w", 0)
    with pytest.raises(TypeError, match=r"^n_users must be an integer, got float 1.0$"):
        z3.release(w, "w", 1.0)
    # nothing was counted down by the refused calls: one release frees each
    z3.release(w, "w", 1)
    z3.release(b, "b", 1)
    assert w.size == b.size == 0
    alloc.release(stray)


def test_run_graph_refuses_bad_graphs(make_alloc):
    alloc = make_alloc()
    z3 = Zero3(alloc, 2)
    z3.register("w", 8)
    z3.register("small", 4)
    x = alloc.full(8, 1.0)
    with pytest.raises(ValueError, match=r"^layers must name at least one layer$"):
        run_graph(z3, [], x)
    with pytest.raises(ValueError, match=r"^layers\[0\] must name 1 or 2 parameters, got 3$"):
        run_graph(z3, [("w", "w", "w")], x)
    with pytest.raises(ValueError, match=r"^layers\[1\]: param_id='small' has 4 elements, x"):
        run_graph(z3, [("w",), ("small",)], x)
    with pytest.raises(KeyError, match="param_id='nope' is not registered"):
        run_graph(z3, [("nope",)], x)
    with pytest.raises(TypeError, match=r"^x must be a Buffer, got list$"):
        run_graph(z3, [("w",)], [1.0])
    with pytest.raises(ValueError, match=r"^prefetch must be >= 0, got -1$"):
        run_graph(z3, [("w",)], x, prefetch=-1)
    with pytest.raises(TypeError, match=r"^zero3 must be a runtime.zero3.Zero3, got Allocator$"):
        run_graph(alloc, [("w",)], x)
    alloc.release(x)
    with pytest.raises(ValueError, match=r"^x was freed \(released by release\(\)\)$"):
        run_graph(z3, [("w",)], x)
    assert z3.gathered("w") is None  # nothing was gathered by a refused graph


LINE = r"use-after-release: buffer_sum arg was released by release_param"
DETECTOR = [
    harness.Config("abort", {"DEVMEM_ARENA_DEBUG": "1"}),
    harness.Config("raise", {"DEVMEM_ARENA_DEBUG": "raise"}),
    harness.Config("off", {}),
]


@harness.matrix(DETECTOR)
def test_a_view_used_after_the_final_release(death, backend, config):
    env = pinned_env(backend) | {
        "DEVMEM_ARENA_DEBUG": config.env.get("DEVMEM_ARENA_DEBUG"),
    }
    outcome = death.run(_zero3_targets.use_after_release, env=env)
    if config.id == "abort":
        outcome.assert_aborted(LINE)
    elif config.id == "raise":
        outcome.assert_raised(UseAfterFreeError, match=LINE)
    else:  # detector off: the view has size 0, and reads as nothing
        assert outcome.assert_clean().returned == {"size": 0, "sum": 0.0, "live": 0}


def test_teeth_after_the_pre_fix_release_the_view_still_reads_the_parameter(death, backend):
    env = pinned_env(backend) | {"DEVMEM_ARENA_DEBUG": "1"}
    outcome = death.run(_zero3_targets.use_after_release, True, env=env)
    with pytest.raises(DeathTestFailure, match="exited with status 0"):
        outcome.assert_aborted(LINE)
    report = outcome.returned
    assert report["size"] == 4097 and report["live"] == 16392 and report["sum"] > 0


@pytest.mark.backends("sim")
def test_a_gather_waits_for_the_kernels_queued_on_the_current_stream(make_alloc):
    # DeepSpeed's ag_comp_done: the gather stream waits for the current stream first, so the
    # gather's upload is queued after the default stream's fill (t=100), completing at t=200
    alloc = make_alloc(sim_latency_us=100)
    z3 = Zero3(alloc, 2)
    z3.register("w", 5)
    x = alloc.full(8, 1.0)  # a kernel on the default stream, until t=100
    view = z3.allgather("w")
    assert z3.gather_stream.handle.tail_us == 200
    z3.release(z3.wait(view, "w"), "w", 1)
    alloc.release(x)
    alloc.device.advance(200)
