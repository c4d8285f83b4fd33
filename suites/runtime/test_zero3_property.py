"""Random ZeRO-3 programs against a reference model (hypothesis), on every backend.

World sizes 1..8; parameters of 1..10,000 elements, each with 1..4 users, persistent or not;
each parameter's script (gather, maybe gather again while it is gathered, one release per user)
interleaved at random with the others', every gathered view held to the end as the wrapper's
aliases are. Checked after every step: a gather of a parameter not gathered allocates exactly
its padded bytes (one allocation), any other gather allocates nothing; nothing is freed before
a countdown reaches 0, and a non-persistent parameter's final release frees its padded bytes at
once (its views then have size 0); after every parameter's final release only the persistent
bases are live.
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from allocator import Allocator, AllocatorConfig
from runtime.zero3 import Zero3


@dataclasses.dataclass(frozen=True)
class Spec:
    numel: int
    n_users: int
    persistent: bool


@st.composite
def programs(draw) -> tuple[int, list[Spec], list[tuple[str, int]]]:
    """``(world_size, specs, steps)``: ``steps`` is an interleaving of every parameter's script,
    as ``("gather" | "release", index)`` pairs."""
    world = draw(st.integers(1, 8))
    specs = draw(
        st.lists(
            st.builds(Spec, st.integers(1, 10_000), st.integers(1, 4), st.booleans()),
            min_size=1,
            max_size=5,
        )
    )
    scripts = []
    for index, spec in enumerate(specs):
        script = [("gather", index)] + [("release", index)] * spec.n_users
        if draw(st.booleans()):  # gather again: while gathered (persistent: at any point)
            last = len(script) if spec.persistent else spec.n_users
            script.insert(draw(st.integers(1, last)), ("gather", index))
        scripts.append(script)
    steps = []
    while any(scripts):
        pending = [script for script in scripts if script]
        steps.append(draw(st.sampled_from(pending)).pop(0))
    return world, specs, steps


def check_program(backend: str, program, *, legacy: bool = False) -> None:
    """The property: run ``program`` step by step against the reference model."""
    __tracebackhide__ = True
    world, specs, steps = program
    alloc = Allocator(AllocatorConfig(backend=backend))
    z3 = Zero3(alloc, world, legacy_release=legacy)
    params = [
        z3.register(f"p{i}", spec.numel, persistent=spec.persistent) for i, spec in enumerate(specs)
    ]
    gathered: set[int] = set()
    countdown = [0] * len(specs)
    views: list[list] = [[] for _ in specs]  # the wrapper's aliases, held to the end
    for op, i in steps:
        param, spec = params[i], specs[i]
        before = alloc.stats()
        if op == "gather":
            views[i].append(z3.allgather(param.param_id))
            after = alloc.stats()
            fresh = i not in gathered
            assert after.live_bytes - before.live_bytes == (param.padded_bytes if fresh else 0)
            assert after.alloc_count - before.alloc_count == int(fresh)
            assert (views[i][-1].size, views[i][-1].storage.size) == (
                spec.numel,
                param.padded_numel,
            )
            gathered.add(i)
            continue
        z3.release(views[i][-1], param.param_id, spec.n_users)
        if countdown[i] == 0:
            countdown[i] = spec.n_users
        countdown[i] -= 1
        freed = countdown[i] == 0 and not spec.persistent
        delta = alloc.stats().live_bytes - before.live_bytes
        assert delta == (-param.padded_bytes if freed else 0), (
            f"release {spec.n_users - countdown[i]} of {spec.n_users} of p{i} changed live bytes"
            f" by {delta}"
        )
        assert all(v.size == (0 if freed else spec.numel) for v in views[i])
        if freed:
            gathered.discard(i)
    persistent = sum(p.padded_bytes for p, s in zip(params, specs, strict=True) if s.persistent)
    assert alloc.stats().live_bytes == persistent
    assert {i for i, s in enumerate(specs) if s.persistent} == gathered
    del z3, views
    assert alloc.stats().live_bytes == 0  # the registry held the persistent bases


@settings(
    max_examples=200,
    deadline=None,
    # the backend fixture is a constant name per test item
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(program=programs())
def test_random_interleavings_keep_every_gather_and_release_exact(backend, program):
    check_program(backend, program)


def test_teeth_the_pre_fix_release_breaks_the_property(backend):
    program = (
        2,
        [Spec(4097, 2, False), Spec(3, 1, True)],
        [
            ("gather", 0),
            ("gather", 1),
            ("release", 0),
            ("release", 1),
            ("release", 0),
        ],
    )
    check_program(backend, program)
    with pytest.raises(AssertionError, match=r"release 2 of 2 of p0 changed live bytes by 0"):
        check_program(backend, program, legacy=True)
