"""The deterministic multi-core simulator of the heap-ring runtime.

Every simulated core replays the whole :class:`~runtime.ring._program.Plan` (SPMD), each at its
own position, and races the others for each task with ``claim(cursor, N)``: a compare-and-swap
fetch-max that wins when ``N`` is above the cursor (cursors start at -1, sharded by ``N % 4``;
kernel tasks and ``alloc_tensors`` tasks have separate cursors). The owner of a kernel task runs
it once its producers are done and sets ``done[N]``; the frontier ``F`` is the largest id with
every id up to it done.

Time is simulated, in integer nanoseconds: replaying one submit costs ``replay_ns``, a kernel
costs its recorded time (``busy-wait`` replay: the core spins for it) or a cost modelled from
the elements it touches (``kernel`` replay: the kernel really runs, as element-wise ops of the
allocator on views of the ring), each multiplied by the core's lag factor and by a seeded jitter
in ``[1 - jitter, 1 + jitter]``. The next core to act is the one with the earliest clock (ties
in order of scheduling), so a seed fixes the whole interleaving and every verdict reproduces.

Heap-ring back-pressure (the seed's, with unsigned 64-bit arithmetic emulated): before a task's
heap slice ``[start, vend[N])`` is used, the live window ``vend[N] - boundary`` (mod 2**64) must
fit in the ring, where ``boundary`` is ``vend[F - H]`` (``reclaim="window"``) or the first
output byte of the oldest slice still live (``reclaim="exact"``: a slice dies when its task and
every task that touches it are done and its scope has closed; the alignment padding skipped
before a slice is not live). If it does not fit the core waits for progress. It is fatal, "heap
ring too small", only when waiting cannot help:

- window mode: every predecessor is already done (``F >= N - 1``). The boundary is a function of
  ``F`` alone and ``F`` cannot pass ``N - 1`` before task N itself is done, so no progress can
  ever make room (the seed's rule, exact here);
- exact mode: no core can make progress (every core is blocked on back-pressure or idle, and no
  kernel is running): the stall detector. A slice may be freed by tasks after N (a later reader
  that does not depend on N, or the end of a scope that another core replays past), so ``F >=
  N - 1`` proves nothing there. The message names the oldest live slice, which holds the ring,
  and what it still waits for.

Every fatal ends the run. The pre-fix path (below) keeps the seed's ``F >= N - 1`` rule in both
modes: it is what that path reproduces, false fatals included.

``alloc_tensors`` has two paths. The fixed one (``alloc_election=True``, the default): every core
materializes the outputs (views of the ring), then one owner is elected on the alloc cursor and
only it runs the back-pressure check and completes the task; the owner's task is not done, so
``F < N`` and the subtraction cannot wrap, and a real fatal returns the materialized outputs.
The seed's pre-fix path (``alloc_election=False``): every core runs the check before
materializing; a core replaying more than H tasks behind the frontier computes a window that
wraps to about 2**64, a false "heap ring too small", returns empty outputs, and the
orchestration's ``get_ref(0)`` fails ``always_assert(index < output_count_)``: abort (SIGABRT).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
import numbers
import operator
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .._checks import integer
from ._program import HEAP, RECLAIM_MODES, Plan, PlanLimits, gc_paused

__all__ = [
    "MASK64",
    "RECLAIM_MODES",
    "REPLAY_MODES",
    "RingConfig",
    "RunResult",
    "TaskOutputTensors",
    "simulate",
]

MASK64 = (1 << 64) - 1
"""Unsigned 64-bit wrap-around: the seed's ``uint64_t`` arithmetic."""
REPLAY_MODES = ("busy-wait", "kernel")
SHARDS = 4
"""Claim cursors are sharded by ``N % 4``, as in the seed."""
MAX_CORES = 1024
"""The most simulated cores a run may have."""
MAX_LAG = 1e6
"""The largest lag factor (a core's kernels at most a million times slower)."""

_CLAIM, _ALLOC, _START, _END, _FATAL = "claim", "alloc", "start", "end", "fatal"


class _Fit(enum.Enum):
    """A back-pressure verdict: the slice fits, the core waits for progress, or it is fatal."""

    FITS = "fits"
    WAIT = "wait"
    FATAL = "fatal"


@dataclass(frozen=True)
class RingConfig:
    """Every knob of one simulated run.

    Attributes:
        cores: simulated cores, 1 to :data:`MAX_CORES` (default 4).
        seed: the interleaving's seed (jitter of every duration).
        replay: ``"busy-wait"`` (kernels replayed as spins of their recorded times) or
            ``"kernel"`` (kernels run on the allocator, cost modelled from their elements).
        lag: ``(core, factor)`` pairs, at most one per core: that core's kernels take
            ``factor`` (1 to :data:`MAX_LAG`) times longer (a throttled core; its replay of the
            orchestration runs at the common speed).
        reclaim: ``"exact"`` (default: dependency-exact reclaim) or ``"window"`` (the seed's
            constant-span rule, ``R = F - H``).
        h: the window rule's span H in tasks, >= 0 (default 64, the seed's ``kHDefault``).
        ring_bytes: the heap ring's size in bytes, a multiple of ``align`` (default 1 MiB).
        align: output alignment in bytes, a multiple of 4 (default 64).
        alloc_election: ``True`` (default): the seed's fix; ``False``: its pre-fix path.
        max_fanin: a cap on a task's producers (exceeding it is fatal); ``None``: no cap.
        replay_ns: simulated cost of replaying one submit on one core, >= 1 (default 1000).
        launch_ns, ns_per_element: the ``kernel`` replay's cost model: a launch plus a cost
            per element touched (defaults 200 ns and 0.5 ns).
        jitter: every duration is scaled by a seeded uniform factor in
            ``[1 - jitter, 1 + jitter]``, 0 <= jitter < 1 (default 0.25).

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field is out of range (the message names it and the accepted values).
    """

    cores: int = 4
    seed: int = 0
    replay: str = "busy-wait"
    lag: tuple[tuple[int, float], ...] = ()
    reclaim: str = "exact"
    h: int = 64
    ring_bytes: int = 1 << 20
    align: int = 64
    alloc_election: bool = True
    max_fanin: int | None = None
    replay_ns: int = 1000
    launch_ns: int = 200
    ns_per_element: float = 0.5
    jitter: float = 0.25

    def __post_init__(self) -> None:
        integer(self.cores, "cores", 1)
        if self.cores > MAX_CORES:
            raise ValueError(f"cores must be <= {MAX_CORES}, got {self.cores}")
        integer(self.seed, "seed", 0)
        if self.replay not in REPLAY_MODES:
            raise ValueError(f"replay={self.replay!r}: expected one of {', '.join(REPLAY_MODES)}")
        self.limits()  # ring_bytes, align, reclaim, h, max_fanin
        if not isinstance(self.alloc_election, bool):
            raise TypeError(f"alloc_election must be a bool, got {self.alloc_election!r}")
        integer(self.replay_ns, "replay_ns", 1)
        integer(self.launch_ns, "launch_ns", 0)
        for name in ("ns_per_element", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a real number, got {value!r}")
        if not self.ns_per_element >= 0 or not math.isfinite(self.ns_per_element):
            raise ValueError(f"ns_per_element must be >= 0, got {self.ns_per_element}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        lag = tuple(tuple(pair) for pair in self.lag)
        for pair in lag:
            if len(pair) != 2:
                raise ValueError(f"lag entries must be (core, factor) pairs, got {pair!r}")
            core, factor = pair
            integer(core, "lag core", 0)
            if core >= self.cores:
                raise ValueError(f"lag core {core} does not exist: cores are 0..{self.cores - 1}")
            if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
                raise TypeError(f"lag factor must be a real number, got {factor!r}")
            if not 1 <= factor <= MAX_LAG:
                raise ValueError(f"lag factor must be between 1 and {MAX_LAG:g}, got {factor}")
        cores = [core for core, _ in lag]
        for core in cores:
            if cores.count(core) > 1:
                raise ValueError(f"lag gives core {core} more than one factor: {lag}")
        object.__setattr__(self, "lag", lag)

    def limits(self) -> PlanLimits:
        """What planning needs of this configuration."""
        return PlanLimits(self.ring_bytes, self.align, self.reclaim, self.h, self.max_fanin)

    def speeds(self) -> list[float]:
        """Each core's kernel-time factor (1.0 unless lagged)."""
        speeds = [1.0] * self.cores
        for core, factor in self.lag:
            speeds[core] = float(factor)
        return speeds


def _always_assert_fail(condition: str, detail: str) -> None:
    """The seed's ``always_assert``: print the failed condition, then abort (SIGABRT)."""
    sys.stdout.flush()
    sys.stderr.write(f"always_assert({condition}) failed: {detail}\n")
    sys.stderr.flush()
    os.abort()


class TaskOutputTensors:
    """An ``alloc_tensors`` result on one core: the task's outputs, as views of the ring.

    The seed's pre-fix path returns an empty one after its false fatal; ``get_ref`` on it then
    fails the seed's ``always_assert(index < output_count_)`` and aborts the process.

    Attributes:
        task: the alloc task's id.
        outputs: the outputs, float32 :class:`~allocator.Buffer` views of the ring.
    """

    __slots__ = ("outputs", "task")

    def __init__(self, task: int, outputs: tuple = ()) -> None:
        self.task = task
        self.outputs = tuple(outputs)

    @property
    def output_count(self) -> int:
        """The number of outputs (0 for the pre-fix path's empty result)."""
        return len(self.outputs)

    def __repr__(self) -> str:
        return f"<TaskOutputTensors task {self.task}, {self.output_count} outputs>"

    def get_ref(self, index: int):
        """The ``index``-th output; aborts the process (SIGABRT) unless ``index <
        output_count``, as the seed's runtime does."""
        if not index < self.output_count:
            _always_assert_fail(
                "index < output_count_",
                f"get_ref({index}) on the result of task {self.task} with"
                f" {self.output_count} outputs",
            )
        return self.outputs[index]


@dataclass(frozen=True)
class RunResult:
    """The outcome of one simulated run.

    Attributes:
        workload: the plan's name.
        config: the :class:`RingConfig` it ran with.
        tasks: tasks in the program (the planned ones, plus the one a planning fatal stops at).
        completed: tasks done.
        fatal: the fatal message, or ``None`` when the run completed.
        fatal_task: the task the fatal is about, or ``None``.
        fatal_outputs: for a fatal on an ``alloc_tensors`` task, the owner's result (its
            materialized outputs, as the seed's fix returns them); else ``None``.
        max_live_window_bytes: the largest live window an allocation needed (bytes).
        sim_time_ns: simulated time when the run ended.
        claims: tasks owned, per core.
        waits: back-pressure waits (a core found the window full and waited for progress).
        trace: ``(time_ns, core, event, task)`` tuples in time order; events are ``claim``,
            ``alloc`` (the owner's back-pressure check passed), ``start``, ``end`` and
            ``fatal`` (the last event, on core -1: the runtime ends the run, not a core).
        plan: the plan it replayed.
        ring: the heap ring (one allocator storage); outputs are views of it. It lives as long
            as this result or one of its views.
    """

    workload: str
    config: RingConfig
    tasks: int
    completed: int
    fatal: str | None
    fatal_task: int | None
    fatal_outputs: TaskOutputTensors | None
    max_live_window_bytes: int
    sim_time_ns: int
    claims: tuple[int, ...]
    waits: int
    trace: tuple[tuple[int, int, str, int], ...] = field(repr=False)
    plan: Plan = field(repr=False)
    ring: object = field(repr=False)

    def summary(self) -> dict:
        """The run as JSON-ready plain data (what the CLI prints)."""
        c = self.config
        return {
            "workload": self.workload,
            "cores": c.cores,
            "seed": c.seed,
            "replay": c.replay,
            "lag": [list(pair) for pair in c.lag],
            "reclaim": c.reclaim,
            "h": c.h,
            "ring_bytes": c.ring_bytes,
            "alloc_election": c.alloc_election,
            "tasks": self.tasks,
            "completed": self.completed,
            "fatal": self.fatal,
            "max_live_window_bytes": self.max_live_window_bytes,
            "sim_time_us": round(self.sim_time_ns / 1000, 3),
            "claims_per_core": list(self.claims),
            "backpressure_waits": self.waits,
        }


class _Core:
    __slots__ = (
        "blocked",
        "held",
        "id",
        "pos",
        "ready",
        "running",
        "scheduled",
        "speed",
    )

    def __init__(self, core_id: int, speed: float) -> None:
        self.id = core_id
        self.speed = speed
        self.pos = 0  # the next task this core replays
        self.ready: list[int] = []  # owned tasks whose producers are done (a heap)
        self.running: int | None = None
        self.blocked: bool | None = None  # waiting on back-pressure: whether it owns the task
        self.held: TaskOutputTensors | None = None  # a blocked alloc owner's materialized result
        self.scheduled = False


class _Stop(Exception):
    pass


class _Dependents:
    """``dependents[task]``: the tasks that list ``task`` among their deps, in increasing
    order (CSR: one flat list and each task's start in it, built by NumPy)."""

    __slots__ = ("flat", "starts")

    def __init__(self, flat: list[int], starts: list[int]) -> None:
        self.flat, self.starts = flat, starts

    def __getitem__(self, task: int) -> list[int]:
        starts = self.starts
        return self.flat[starts[task] : starts[task + 1]]


def _dependents(deps: list[tuple[int, ...]]) -> tuple[list[int], _Dependents]:
    """Each task's number of deps, and every task's dependents (:class:`_Dependents`)."""
    n = len(deps)
    counts = np.fromiter(map(len, deps), dtype=np.int64, count=n)
    edges = int(counts.sum())
    on = np.fromiter(itertools.chain.from_iterable(deps), dtype=np.int64, count=edges)
    of = np.repeat(np.arange(n, dtype=np.int64), counts)  # the dependent task of each edge
    order = np.argsort(on, kind="stable")  # by dep, then by dependent (stable: increasing)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(on, minlength=n), out=starts[1:])
    return counts.tolist(), _Dependents(of[order].tolist(), starts.tolist())


def _factors(state: tuple, jitter: float) -> Iterator[list[float]]:
    """The jitter factors ``1 + jitter * (2 * u - 1)`` of the draws u that
    ``random.Random.random()`` makes from ``state`` (its ``getstate()``), in order, in lists
    made by NumPy: its MT19937 set to that state draws the same doubles (the same two 32-bit
    words per double, the same formula), and the factor's float64 operations round as
    Python's do. (A function, not a method: the engine holds it, and must not be held by it.)"""
    _, words, _ = state
    gen = np.random.RandomState()
    gen.set_state(("MT19937", np.array(words[:-1], dtype=np.uint32), words[-1]))
    size = 256
    while True:
        yield (1.0 + jitter * (2.0 * gen.random_sample(size) - 1.0)).tolist()
        size = min(2 * size, 1 << 16)


class _Engine:
    def __init__(self, plan: Plan, alloc, config: RingConfig) -> None:
        if plan.limits != config.limits():
            raise ValueError(
                f"the plan was made for {plan.limits}, not for this config's {config.limits()}"
            )
        self.plan, self.alloc, self.cfg = plan, alloc, config
        self.tasks = plan.tasks
        cols = plan.columns
        self.n = len(cols.kind)
        self.positions = self.n + (1 if plan.fatal else 0)
        self.vend = cols.end
        self.outputs, self.refs, self.cost = cols.outputs, cols.refs, cols.cost_ns
        self.touches = cols.touches
        if config.replay == "kernel":
            self.accesses = [r or w for r, w in zip(cols.reads, cols.writes, strict=True)]
        self.is_kernel = [k == "kernel" for k in cols.kind]
        self.heap_bytes = list(map(operator.sub, cols.end, cols.start))
        self.start = cols.start
        self.done = bytearray(self.n)
        self.frontier = -1
        self.remaining, self.dependents = _dependents(cols.deps)
        self.materialized: dict[int, list] = {}  # alloc task -> [views, cores still to take]
        self.owner = [-1] * self.n
        self.granted = bytearray(self.n)  # kernel tasks whose owner passed back-pressure
        self.kernel_cursor = [-1] * SHARDS
        self.alloc_cursor = [-1] * SHARDS
        consumers = plan.consumers
        self.users_left = dict(zip(consumers, map(len, consumers.values()), strict=True))
        self.heap_owners = sorted(plan.consumers)
        self.tail = 0
        self.close = plan.close_pos
        self.closes = set(plan.close_pos)
        self.max_pos = 0
        self.rng = random.Random(config.seed)
        # the jitter factors ``1 + jitter * (2 * u - 1)`` of rng's draws u, in order
        self.factor = itertools.chain.from_iterable(
            _factors(self.rng.getstate(), config.jitter)
        ).__next__
        self.cores = [_Core(i, s) for i, s in enumerate(config.speeds())]
        self.queue: list[tuple[int, int, int]] = []
        self.seq = 0
        self.blocked: list[_Core] = []
        self.trace: list[tuple[int, int, str, int]] = []
        self.now = 0
        self.max_window = 0
        self.waits = 0
        self.completed = 0
        self.fatal: str | None = None
        self.fatal_task: int | None = None
        self.fatal_outputs: TaskOutputTensors | None = None
        ring_elems = config.ring_bytes // 4
        self.ring = alloc.zeros(ring_elems)
        self.externals = {name: alloc.zeros(n) for name, n in plan.externals.items()}

    # -- scheduling --------------------------------------------------------------------------

    def _jitter(self, ns: float) -> int:
        return max(1, int(ns * self.factor())) if ns else 0

    def _schedule(self, core: _Core, at: int) -> None:
        core.scheduled = True
        self.seq += 1
        heapq.heappush(self.queue, (at, self.seq, core.id))

    def _wake(self, core: _Core) -> None:
        if not core.scheduled and core.running is None:
            self._schedule(core, self.now)

    def _event(self, core: int, kind: str, task: int) -> None:
        self.trace.append((self.now, core, kind, task))

    # -- shared state ------------------------------------------------------------------------

    @staticmethod
    def _claim(cursors: list[int], n: int) -> bool:
        """The seed's claim: CAS fetch-max on the shard's cursor; ``n <= cursor`` loses."""
        shard = n % SHARDS
        if n <= cursors[shard]:
            return False
        cursors[shard] = n
        return True

    def _complete(self, core: _Core, task: int) -> None:
        self.done[task] = 1
        self.completed += 1
        self._event(core.id, _END, task)
        done, f = self.done, self.frontier
        while f + 1 < self.n and done[f + 1]:
            f += 1
        self.frontier = f
        for d in self.dependents[task]:
            self.remaining[d] -= 1
            if not self.remaining[d] and self.granted[d]:
                owner = self.cores[self.owner[d]]
                heapq.heappush(owner.ready, d)
                self._wake(owner)
        users_left = self.users_left
        for p in self.touches[task]:
            users_left[p] -= 1
        self._wake_blocked()

    def _wake_blocked(self) -> None:
        if self.blocked:
            blocked, self.blocked = self.blocked, []
            for core in blocked:
                self._wake(core)

    def _boundary(self) -> int:
        """Everything below this virtual byte is dead."""
        if self.cfg.reclaim == "window":
            r = self.frontier - self.cfg.h
            return self.vend[r] if r >= 0 else 0
        owners = self.heap_owners
        while self.tail < len(owners) and self._dead(owners[self.tail]):
            self.tail += 1
        if self.tail < len(owners):  # _first_byte, inline
            p = owners[self.tail]
            outputs = self.outputs[p]
            return outputs[0].lo if outputs else self.start[p]
        return self.vend[owners[-1]] if owners else 0

    def _first_byte(self, p: int) -> int:
        """Exact reclaim's boundary while task p's slice is the oldest live one: its first
        output byte (the padding before it is not live)."""
        outputs = self.outputs[p]
        return outputs[0].lo if outputs else self.start[p]

    def _dead(self, p: int) -> bool:
        """Exact reclaim: task p's slice is dead when p and every task touching it are done
        and its scope has closed (a core replayed past its end)."""
        return bool(self.done[p]) and not self.users_left[p] and self.max_pos >= self.close[p]

    def _window(self, task: int) -> int:
        """The live window task ``task``'s slice needs, in bytes (uint64_t, as in the seed)."""
        return (self.vend[task] - self._boundary()) & MASK64

    def _backpressure(self, task: int, seed_rule: bool) -> _Fit:
        """Whether task ``task``'s slice fits now; ``seed_rule``: fatal once every predecessor
        is done (window mode, and the pre-fix path), else wait (the stall detector decides)."""
        window = self._window(task)
        ring = self.cfg.ring_bytes
        if window <= ring:
            self.max_window = max(self.max_window, window)
            return _Fit.FITS
        if seed_rule and self.frontier >= task - 1:
            self._set_fatal(
                task,
                f"heap ring too small: task {task} needs a live window of {window} bytes, more"
                f" than the ring's {ring} (frontier F={self.frontier})",
            )
            return _Fit.FATAL
        return _Fit.WAIT

    def _holder(self) -> str:
        """Exact reclaim: what holds the ring (the oldest live slice and what it waits for)."""
        owners = self.heap_owners
        if self.tail >= len(owners):
            return "no slice is live"
        p = owners[self.tail]
        waits = []
        if not self.done[p]:
            waits.append(f"task {p} itself")
        users = [u for u in self.plan.consumers[p] if not self.done[u]]
        if users:
            shown = ", ".join(map(str, users[:8])) + (", ..." if len(users) > 8 else "")
            waits.append(f"its reader{'s' if len(users) > 1 else ''} (task {shown})")
        if self.close[p] > self.n:  # the root scope's close position lies beyond every task
            waits.append("the root scope to close, which it never does")
        elif self.max_pos < self.close[p]:
            waits.append(f"its scope to close (after task {self.close[p] - 1})")
        return (
            f"the ring is held by task {p}'s slice [{self._first_byte(p)}, {self.vend[p]}),"
            f" waiting for {' and '.join(waits)}"
        )

    def _set_fatal(self, task: int, message: str) -> None:
        if self.fatal is None:
            self.fatal, self.fatal_task = message, task
            self._event(-1, _FATAL, task)

    # -- materializing -----------------------------------------------------------------------

    def _view(self, tensor):
        lo, hi = tensor.lo, tensor.hi
        if tensor.buffer == HEAP:
            ring = self.cfg.ring_bytes
            return self.ring.view((lo % ring) // 4, (hi - lo) // 4)
        return self.externals[tensor.buffer].view(lo // 4, (hi - lo) // 4)

    def _materialize(self, task: int) -> TaskOutputTensors:
        """Task ``task``'s outputs as views of the ring: every core computes the same views,
        so the first core's are handed to the others."""
        cached = self.materialized.get(task)
        if cached is None:
            views = tuple(self._view(t) for t in self.outputs[task])
            if len(self.cores) > 1:
                self.materialized[task] = [views, len(self.cores) - 1]
        else:
            views = cached[0]
            cached[1] -= 1
            if not cached[1]:
                del self.materialized[task]
        return TaskOutputTensors(task, views)

    def _take_refs(self, result: TaskOutputTensors) -> None:
        """The orchestration's ``get_ref(0)`` .. ``get_ref(refs - 1)`` on ``result``: all
        succeed when there are as many outputs, else the first index past them aborts."""
        refs, count = self.refs[result.task], result.output_count
        if refs > count:
            result.get_ref(count)

    # -- a core's step ---------------------------------------------------------------------

    def _start(self, core: _Core, task: int) -> None:
        self._event(core.id, _START, task)
        if self.cfg.replay == "kernel":
            alloc = self.alloc
            elems = 0
            for tensor in self.accesses[task]:
                view = self._view(tensor)
                alloc.release(alloc.mul(view, view))
                elems += view.size
            cost = self.cfg.launch_ns + self.cfg.ns_per_element * elems
        else:
            cost = self.cost[task]
        core.running = task
        self._schedule(core, self.now + self._jitter(cost * core.speed))

    def _advance(self, core: _Core) -> None:
        core.pos += 1
        self.max_pos = max(self.max_pos, core.pos)
        if core.pos in self.closes:  # the first core past a scope's end: exact reclaim may move
            self.closes.remove(core.pos)
            self._wake_blocked()

    def _replay(self, core: _Core) -> bool:
        """Replay the core's next task; False when it must wait for progress."""
        n = core.pos
        if n == self.n:  # the planning fatal (heap span exceeded, a task too large, fan-in)
            task, message = self.plan.fatal
            self._set_fatal(task, message)
            raise _Stop
        seed_rule = self.cfg.reclaim == "window"
        if self.is_kernel[n]:
            owns = core.blocked
            if owns is None:
                owns = self._claim(self.kernel_cursor, n)
                if owns:
                    self.owner[n] = core.id
                    self._event(core.id, _CLAIM, n)
            if owns and self.heap_bytes[n]:
                fit = self._fits(core, n, owns, seed_rule)
                if fit is _Fit.WAIT:
                    return False
                if fit is _Fit.FATAL:
                    raise _Stop
            if owns:  # only now may it run: its slice is granted
                self.granted[n] = 1
                if not self.remaining[n]:
                    heapq.heappush(core.ready, n)
        elif self.cfg.alloc_election:
            owns = core.blocked
            if owns is None:
                result = self._materialize(n)  # every core: outputs and vend[N]
                owns = self._claim(self.alloc_cursor, n)
                if owns:
                    self.owner[n] = core.id
                    self._event(core.id, _CLAIM, n)
            else:  # blocked on this task before: its outputs were materialized then
                result = core.held
            if owns:
                fit = self._fits(core, n, owns, seed_rule)
                if fit is _Fit.WAIT:
                    core.held = result
                    return False
                core.held = None
                if fit is _Fit.FATAL:
                    self._fatal_outputs(result)
                self._complete(core, n)
            self._take_refs(result)
        else:  # the seed's pre-fix path: every core checks before materializing
            fit = self._fits(core, n, False, True)
            if fit is _Fit.WAIT:
                return False
            if fit is _Fit.FATAL:
                self._seed_crash(n)
            result = self._materialize(n)
            if not self.done[n]:
                self.owner[n] = core.id
                self._event(core.id, _CLAIM, n)
                self._complete(core, n)
            self._take_refs(result)
        core.blocked = None
        self._advance(core)
        return True

    def _fatal_outputs(self, result: TaskOutputTensors) -> None:
        """A fatal on an elected ``alloc_tensors`` owner: the fix returns the materialized
        outputs (the orchestration's ``get_ref`` calls succeed), and the run ends."""
        self.fatal_outputs = result
        self._take_refs(result)
        raise _Stop

    def _seed_crash(self, task: int) -> None:
        """The pre-fix path's fatal: the seed logs it, returns ``{}``, and the caller's
        ``get_ref`` aborts the process."""
        sys.stderr.write(f"set_fatal: {self.fatal}\n")
        self._take_refs(TaskOutputTensors(task))
        raise _Stop

    def _fits(self, core: _Core, task: int, owns: bool, seed_rule: bool) -> _Fit:
        fit = self._backpressure(task, seed_rule)
        if fit is _Fit.WAIT:
            if core.blocked is None:
                self.waits += 1
            core.blocked = owns
            self.blocked.append(core)
        elif fit is _Fit.FITS:
            core.blocked = None
            if owns or not self.done[task]:
                self._event(core.id, _ALLOC, task)
        return fit

    def _stalled(self) -> None:
        """No core can make progress: with a core blocked on back-pressure, the ring is too
        small (exact reclaim's fatal); the blocked core with the oldest task reports it."""
        core = min(self.blocked, key=lambda c: c.pos)
        n = core.pos
        self._set_fatal(
            n,
            f"heap ring too small: task {n} needs a live window of {self._window(n)} bytes,"
            f" more than the ring's {self.cfg.ring_bytes}, and no core can make progress"
            f" (frontier F={self.frontier}): {self._holder()}",
        )
        if not self.is_kernel[n]:
            if self.cfg.alloc_election:
                result, core.held = core.held, None
                self._fatal_outputs(result)
            self._seed_crash(n)

    def _loop(self) -> None:
        """Step the cores in time order (ties in order of scheduling). A core completes its
        running task, then starts a ready task, else replays its next task (and acts again
        after ``replay_ns``), else stops until woken (blocked on back-pressure, or idle until
        one of its tasks becomes ready). While a core steps, wakes aimed at it are no-ops: the
        step itself decides when it acts next. The common cases are inline (a busy-wait
        start; the replay of a kernel task: claim, back-pressure, grant, advance); the rest
        goes through the methods above."""
        queue, cores, trace = self.queue, self.cores, self.trace
        heappop, heappush = heapq.heappop, heapq.heappush
        is_kernel, heap_bytes, cost = self.is_kernel, self.heap_bytes, self.cost
        remaining, granted, owner = self.remaining, self.granted, self.owner
        done, touches = self.done, self.touches
        dep_flat, dep_starts = self.dependents.flat, self.dependents.starts
        users_left, vend = self.users_left, self.vend
        cursors, closes = self.kernel_cursor, self.closes
        factor, ring_bytes = self.factor, self.cfg.ring_bytes
        replay_ns, positions = self.cfg.replay_ns, self.positions
        n_tasks, busy_wait = self.n, self.cfg.replay == "busy-wait"
        seed_rule = self.cfg.reclaim == "window"
        core, at = None, 0  # a core that acts next without a trip through the queue, and when
        while True:
            if core is None:
                if not queue:
                    break
                now, _, core_id = heappop(queue)
                core = cores[core_id]
            else:
                now = at
                core_id = core.id
            self.now = now
            task = core.running
            if task is not None:  # _complete, inline
                core.running = None
                done[task] = 1
                self.completed += 1
                trace.append((now, core_id, _END, task))
                f = self.frontier
                while f + 1 < n_tasks and done[f + 1]:
                    f += 1
                self.frontier = f
                for d in dep_flat[dep_starts[task] : dep_starts[task + 1]]:  # dependents
                    remaining[d] -= 1
                    if not remaining[d] and granted[d]:
                        other = cores[owner[d]]
                        heappush(other.ready, d)
                        self._wake(other)
                for p in touches[task]:
                    users_left[p] -= 1
                if self.blocked:
                    self._wake_blocked()
            if core.ready:
                task = heappop(core.ready)
                if not busy_wait:
                    self._start(core, task)
                    core = None
                    continue
                trace.append((now, core_id, _START, task))
                ns = cost[task] * core.speed  # _jitter, inline
                at = now + (int(ns * factor()) or 1 if ns else 0)
                core.running = task
            else:
                n = core.pos
                if n >= positions:
                    core.scheduled = False
                    core = None
                    continue
                if n == n_tasks or not is_kernel[n] or core.blocked is not None:
                    if not self._replay(core):
                        core.scheduled = False
                        core = None
                        continue
                    at = now + (int(replay_ns * factor()) or 1)  # _jitter(replay_ns), inline
                    if queue and queue[0][0] <= at:  # another core acts first
                        self.seq += 1
                        heappush(queue, (at, self.seq, core_id))
                        core = None
                    continue
                shard = n % SHARDS  # the claim: a fetch-max on the shard's cursor
                if n > cursors[shard]:
                    cursors[shard] = n
                    owner[n] = core_id
                    trace.append((now, core_id, _CLAIM, n))
                    if heap_bytes[n]:  # _fits, inline while the slice fits
                        window = (vend[n] - self._boundary()) & MASK64
                        if window <= ring_bytes:
                            if window > self.max_window:
                                self.max_window = window
                            core.blocked = None
                            trace.append((now, core_id, _ALLOC, n))
                        else:
                            fit = self._fits(core, n, True, seed_rule)
                            if fit is _Fit.WAIT:
                                core.scheduled = False
                                core = None
                                continue
                            raise _Stop  # _Fit.FATAL: the window cannot shrink meanwhile
                    granted[n] = 1
                    if not remaining[n]:
                        heappush(core.ready, n)
                core.pos = pos = n + 1
                if pos > self.max_pos:
                    self.max_pos = pos
                if pos in closes:  # the first core past a scope's end: exact reclaim may move
                    closes.remove(pos)
                    self._wake_blocked()
                at = now + (int(replay_ns * factor()) or 1)
            if queue and queue[0][0] <= at:  # another core acts first
                self.seq += 1
                heappush(queue, (at, self.seq, core_id))
                core = None
            # else: this core is the next to act (a tie goes to the core already queued)

    def run(self) -> RunResult:
        for core in self.cores:
            self._schedule(core, 0)
        try:
            self._loop()
            if self.blocked and self.completed < self.n:
                self._stalled()
        except _Stop:
            pass
        if self.fatal is None and self.completed < self.n:
            raise RuntimeError(
                f"simulation stalled at {self.now} ns with {self.completed}/{self.n} tasks done"
                " and no core able to move (a bug in the simulator)"
            )
        return RunResult(
            workload=self.plan.name,
            config=self.cfg,
            tasks=self.positions,
            completed=self.completed,
            fatal=self.fatal,
            fatal_task=self.fatal_task,
            fatal_outputs=self.fatal_outputs,
            max_live_window_bytes=self.max_window,
            sim_time_ns=self.now,
            claims=tuple(self.owner.count(c.id) for c in self.cores),
            waits=self.waits,
            trace=tuple(self.trace),
            plan=self.plan,
            ring=self.ring,
        )


def simulate(plan: Plan, alloc, config: RingConfig) -> RunResult:
    """Replay ``plan`` on ``config.cores`` simulated cores over a heap ring from ``alloc``.

    Args:
        plan: the program, planned for ``config.limits()``.
        alloc: an :class:`~allocator.Allocator`; the ring is one storage of
            ``config.ring_bytes`` bytes from it, outputs are views of it, and in ``kernel``
            replay every kernel runs element-wise ops on views of it.
        config: the run's knobs.

    Returns:
        A :class:`RunResult`; a fatal (heap ring too small, heap span exceeded, a fan-in over
        its cap, a task larger than the ring) ends the run and is reported in it.

    Raises:
        ValueError: ``plan`` was planned for other limits.
        RuntimeError: the simulation stalled (a bug in the simulator, never a verdict).

    The pre-fix path (``alloc_election=False``) aborts the process (SIGABRT) where the seed's
    runtime did: run it in a death-test child.
    """
    with gc_paused():
        return _Engine(plan, alloc, config).run()
