"""The orchestration program of the heap-ring runtime, and its plan.

In the seed's runtime (``../shared/seeds/pto-ring-heap-and-tensormap.txt``) every core runs the
whole orchestration program (SPMD replay), so every core computes the same task ids, the same
heap addresses and the same dependencies; only ownership differs. That computation is a pure
function of the program, so it is done once here: :func:`plan` runs a workload function against
an :class:`Orchestrator`, which

- numbers tasks in submit order (``alloc_tensors`` tasks and kernel tasks alike);
- places each task's heap outputs on a virtual bump pointer ``heap_next``: each output aligned,
  the task's outputs packed, a task never straddling the ring's end (its base moves to the next
  multiple of the ring size); ``vend[N]`` is ``heap_next`` after task N;
- finds each task's dependencies with the :class:`~runtime.tensormap.TensorMap`, per byte and
  exactly: the last writer of every byte it reads or writes, and every task that read a byte it
  overwrites since that byte's last write (:func:`~runtime.tensormap.gather_fanin`), plus the
  task that allocated each heap tensor it touches;
- records, per heap-owning task, the tasks that touch its region and where its scope closes
  (for exact reclaim), and checks window mode's span rule.

A fatal found while planning (a task larger than the ring, a span beyond H in window mode, a
fan-in over the cap) ends the plan there: the simulated runtime raises it when the first core
replays that task.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from .._checks import integer
from ..tensormap import FaninExceeded, Region, TensorMap, gather_fanin

__all__ = [
    "HEAP",
    "RECLAIM_MODES",
    "Orchestrator",
    "Plan",
    "PlanLimits",
    "PlannedTask",
    "TaskRefs",
    "Tensor",
    "plan",
]

HEAP = "heap"
"""The buffer name of heap-ring regions (their offsets are virtual: monotone, never reused)."""

FLOAT32 = 4
RECLAIM_MODES = ("exact", "window")
"""Reclaim rules: dependency-exact (the default), or the seed's constant span H."""


@dataclass(frozen=True)
class Tensor:
    """A tensor the program names: a heap output of a task, or an external (global-memory)
    buffer.

    Attributes:
        region: its bytes (``buffer`` is :data:`HEAP` for heap tensors, with virtual offsets).
        owner: the id of the task whose heap slice holds it; ``None`` for external tensors.
        scope: the id of the scope it was allocated in: 0 for the root scope, then 1, 2, ... in
            the order scopes open (``None`` for external tensors).
    """

    region: Region
    owner: int | None = None
    scope: int | None = None

    def view(self, offset: int, shape: Sequence[int], strides: Sequence[int] | None = None):
        """A view of this tensor: ``shape`` elements from ``offset`` (elements from this
        tensor's start), with ``strides`` in elements (default row-major contiguous).

        Raises:
            ValueError: the view reaches outside this tensor's bounding range.
        """
        region = Region(
            self.region.buffer, self.region.start_offset + offset, shape, strides, FLOAT32
        )
        lo, hi = self.region.byte_range
        vlo, vhi = region.byte_range
        if vlo < lo or vhi > hi:
            raise ValueError(
                f"view (offset {offset}, shape {tuple(region.shape)}, strides"
                f" {tuple(region.strides)}) reaches outside its tensor's {(hi - lo) // 4} elements"
            )
        return Tensor(region, self.owner, self.scope)


class TaskRefs:
    """What a submit returns while planning: the task id and its output tensors.

    Attributes:
        task: the task's id.
        outputs: its heap output tensors, in order.
    """

    __slots__ = ("_counts", "outputs", "task")

    def __init__(self, task: int, outputs: tuple[Tensor, ...], counts: list[int]) -> None:
        self.task = task
        self.outputs = outputs
        self._counts = counts

    def __repr__(self) -> str:
        return f"<TaskRefs task {self.task}, {len(self.outputs)} outputs>"

    def get_ref(self, index: int) -> Tensor:
        """The ``index``-th output tensor (the runtime replays this call on every core).

        Raises:
            IndexError: ``index`` is not below the number of outputs.
        """
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"index must be an integer, got {type(index).__name__}")
        if not 0 <= index < len(self.outputs):
            raise IndexError(
                f"task {self.task} has {len(self.outputs)} outputs; get_ref({index}) is out of"
                " range"
            )
        self._counts[self.task] = max(self._counts[self.task], index + 1)
        return self.outputs[index]


@dataclass(frozen=True)
class PlannedTask:
    """One task of the plan.

    Attributes:
        id: its task id (submit order).
        kind: ``"alloc"`` (kernel-less ``alloc_tensors``, completes inline) or ``"kernel"``.
        name: the kernel's name (``"alloc_tensors"`` for alloc tasks).
        start, end: its heap slice in virtual bytes, ``[start, end)``; ``start`` is
            ``heap_next`` before it (alignment padding included), ``end`` is ``vend[id]``.
            Equal when it has no heap outputs.
        outputs: its heap output regions (virtual).
        reads: regions it reads (inputs and inouts). writes: regions it writes (inouts, writes
            into existing tensors, new outputs).
        deps: the tasks it waits for (the TensorMap's fan-in: the writers of the live bytes it
            reads or writes and the readers of the live bytes it overwrites; plus the owners of
            the heap tensors it touches), newest first.
        touches: owners of the heap slices it reads or writes, newest first.
        cost_ns: its recorded execution time (what busy-wait replay spins for).
        refs: how many ``get_ref`` calls the orchestration makes on its result.
    """

    id: int
    kind: str
    name: str
    start: int
    end: int
    outputs: tuple[Region, ...]
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    deps: tuple[int, ...]
    touches: tuple[int, ...]
    cost_ns: int
    refs: int = 0

    @property
    def heap_bytes(self) -> int:
        """Bytes of its heap slice, padding included."""
        return self.end - self.start


@dataclass(frozen=True)
class PlanLimits:
    """What the plan needs to know of the runtime: ring size, alignment, reclaim rule.

    Raises:
        TypeError, ValueError: a field is out of range (the message names it).

    Attributes:
        ring_bytes: the heap ring's size in bytes (a multiple of ``align``).
        align: output alignment in bytes (a multiple of 4).
        reclaim: ``"exact"`` or ``"window"`` (window mode checks every access's span against
            ``h``).
        h: the window rule's dependency span H, in tasks.
        max_fanin: the fan-in cap (``None``: no cap).
    """

    ring_bytes: int
    align: int = 64
    reclaim: str = "exact"
    h: int = 64
    max_fanin: int | None = None

    def __post_init__(self) -> None:
        align = integer(self.align, "align", 4)
        if align % 4:
            raise ValueError(f"align must be a multiple of 4 bytes, got {align}")
        ring = integer(self.ring_bytes, "ring_bytes", align)
        if ring % align:
            raise ValueError(f"ring_bytes={ring} must be a multiple of align={align}")
        if self.reclaim not in RECLAIM_MODES:
            raise ValueError(
                f"reclaim={self.reclaim!r}: expected one of {', '.join(RECLAIM_MODES)}"
            )
        integer(self.h, "h", 0)
        if self.max_fanin is not None:
            integer(self.max_fanin, "max_fanin", 1)


@dataclass(frozen=True)
class Plan:
    """The planned program: every core replays it.

    Attributes:
        name: the workload's name.
        tasks: the planned tasks, by id (up to the fatal one, if any).
        fatal: ``(task id, message)`` of a fatal found while planning, else ``None``; the
            runtime raises it when the first core replays that task.
        close_pos: per task id, the number of tasks submitted when its scope closed (its
            region may be reclaimed in exact mode only once a core has replayed that far);
            beyond every replay position for the root scope, which never closes.
        consumers: per heap-owning task id, the ids of the later tasks that touch its slice.
        externals: external buffers, name -> elements.
        limits: the :class:`PlanLimits` it was planned for.
    """

    name: str
    tasks: tuple[PlannedTask, ...]
    fatal: tuple[int, str] | None
    close_pos: tuple[int, ...]
    consumers: dict[int, tuple[int, ...]]
    externals: dict[str, int]
    limits: PlanLimits

    @property
    def vend(self) -> list[int]:
        """``vend[N]``: ``heap_next`` after task N (virtual bytes)."""
        return [t.end for t in self.tasks]


@dataclass
class _Scope:
    id: int
    owners: list[int] = field(default_factory=list)


class _PlanFatal(Exception):
    def __init__(self, task: int, message: str) -> None:
        super().__init__(message)
        self.task = task


class Orchestrator:
    """What a workload function sees: scopes, ``alloc_tensors``, kernel submits.

    Every core of the seed's runtime runs the same orchestration; this object runs it once
    and records the plan (see the module docstring). Workload functions take it as their
    first argument. Heap tensors allocated outside every :meth:`scope` belong to the root
    scope, which never closes: exact reclaim keeps them to the end of the run.
    """

    def __init__(self, limits: PlanLimits) -> None:
        self.limits = limits
        self._tmap = TensorMap()
        self._tasks: list[PlannedTask] = []
        self._refs: list[int] = []
        self._heap_next = 0
        self._scopes: list[_Scope] = [_Scope(0)]  # the root scope: never closes
        self._scope_ids = 1
        self._closed_scopes: set[int] = set()
        self._close_pos: dict[int, int] = {}
        self._consumers: dict[int, list[int]] = {}
        self._externals: dict[str, int] = {}

    # -- the program's API -------------------------------------------------------------------

    def external(self, name: str, n: int) -> Tensor:
        """An external tensor of ``n`` float32 elements in global memory (not on the heap):
        reading it needs no producer.

        Raises:
            ValueError: ``name`` is empty, is :data:`HEAP`, or was declared before.
        """
        if not isinstance(name, str) or not name or name == HEAP:
            raise ValueError(f"external tensor name must be a non-empty str other than {HEAP!r}")
        if name in self._externals:
            raise ValueError(f"external tensor {name!r} declared twice")
        self._externals[name] = n = integer(n, "n")
        return Tensor(Region.contiguous(name, 0, n, FLOAT32))

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """A scope: heap tensors allocated in it may be reclaimed (exact mode) only after it
        closes, and may not be used after it closes."""
        scope = _Scope(self._scope_ids)
        self._scope_ids += 1
        self._scopes.append(scope)
        try:
            yield
        finally:
            self._scopes.pop()
            self._closed_scopes.add(scope.id)
            for owner in scope.owners:
                self._close_pos[owner] = len(self._tasks)
                # no later task may use the slice: its writers and readers leave the map
                task = self._tasks[owner]
                self._tmap.forget(HEAP, task.start, task.end)

    def alloc_tensors(self, *sizes: int) -> TaskRefs:
        """A kernel-less task that allocates heap tensors of ``sizes`` float32 elements and
        completes inline (the seed's ``alloc_tensors``)."""
        if not sizes:
            raise ValueError("alloc_tensors needs at least one size")
        return self._submit("alloc", "alloc_tensors", (), (), (), sizes, 0)

    def submit(
        self,
        name: str,
        *,
        inputs: Sequence[Tensor] = (),
        inouts: Sequence[Tensor] = (),
        writes: Sequence[Tensor] = (),
        outputs: Sequence[int] = (),
        cost_ns: int = 1000,
    ) -> TaskRefs:
        """A kernel task.

        Args:
            name: the kernel's name.
            inputs: tensors it reads. inouts: tensors it reads and writes. writes: existing
                tensors it overwrites without reading.
            outputs: sizes (float32 elements) of new heap outputs.
            cost_ns: its recorded execution time in nanoseconds (busy-wait replay), >= 0.

        Raises:
            TypeError: an argument is not a :class:`Tensor`.
            ValueError: a tensor is used after its scope closed, or a size is < 1.
        """
        return self._submit(
            "kernel", name, inputs, inouts, writes, outputs, integer(cost_ns, "cost_ns", 0)
        )

    # -- planning ------------------------------------------------------------------------------

    def _check_tensor(self, tensor: object, role: str) -> Tensor:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{role} must be Tensors, got {type(tensor).__name__}")
        if tensor.scope is not None and tensor.scope in self._closed_scopes:
            raise ValueError(
                f"task {len(self._tasks)} uses a tensor of task {tensor.owner} after its scope"
                " closed"
            )
        return tensor

    def _check_span(self, task_id: int, owners: Sequence[int]) -> None:
        """Window mode's rule made explicit: every consumer of task P must be at most H tasks
        after P, or P's slice may be reclaimed before it reads. The seed promised this fatal in
        a comment but had no check (its TensorMap had retired P's entry: a silent external
        input)."""
        for owner in owners:
            if task_id - owner > self.limits.h:
                raise _PlanFatal(
                    task_id,
                    f"heap span exceeded: task {task_id} reads task {owner}'s output"
                    f" (span {task_id - owner} > H={self.limits.h})",
                )

    def _place(self, task_id: int, sizes: Sequence[int]) -> tuple[int, int, list[Region]]:
        limits = self.limits
        align, ring = limits.align, limits.ring_bytes
        start = self._heap_next
        offsets, cursor = [], 0
        for size in sizes:
            offsets.append(cursor)
            cursor += -(-size * FLOAT32 // align) * align
        total = cursor
        if total > ring:
            raise _PlanFatal(
                task_id,
                f"task {task_id} needs {total} heap bytes, more than the heap ring's {ring}",
            )
        base = -(-start // align) * align
        if total and base // ring != (base + total - 1) // ring:  # never straddle the end
            base = (base // ring + 1) * ring
        end = base + total
        regions = [
            Region.contiguous(HEAP, (base + off) // FLOAT32, size, FLOAT32)
            for off, size in zip(offsets, sizes, strict=True)
        ]
        return start, (end if total else start), regions

    def _submit(self, kind, name, inputs, inouts, writes, outputs, cost_ns) -> TaskRefs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a kernel's name must be a non-empty str, got {name!r}")
        if isinstance(outputs, (int, str)) or not hasattr(outputs, "__iter__"):
            raise TypeError(f"outputs must be a sequence of sizes, got {outputs!r}")
        task_id = len(self._tasks)
        args = {"inputs": inputs, "inouts": inouts, "writes": writes}
        for role, tensors in args.items():
            if isinstance(tensors, Tensor):
                raise TypeError(f"{role} must be a sequence of Tensors, got one Tensor")
            args[role] = [self._check_tensor(t, role) for t in tensors]
        sizes = [integer(n, "output size") for n in outputs]
        touched = args["inputs"] + args["inouts"] + args["writes"]
        owners = sorted({t.owner for t in touched if t.owner is not None}, reverse=True)
        if self.limits.reclaim == "window":
            self._check_span(task_id, owners)
        start, end, regions = self._place(task_id, sizes)
        try:
            fanin = gather_fanin(
                self._tmap,
                task_id,
                inputs=[t.region for t in args["inputs"]],
                inouts=[t.region for t in args["inouts"]],
                writes=[t.region for t in args["writes"]],
                max_fanin=self.limits.max_fanin,
            )
        except FaninExceeded as exc:
            raise _PlanFatal(task_id, str(exc)) from None
        for tensor in args["inouts"] + args["writes"]:
            self._tmap.insert(tensor.region, task_id)
        for region in regions:
            self._tmap.insert(region, task_id)
        self._heap_next = end
        scope = self._scopes[-1]
        if regions:
            scope.owners.append(task_id)
            self._consumers[task_id] = []
        for owner in owners:
            self._consumers[owner].append(task_id)
        deps = tuple(sorted(set(fanin) | set(owners), reverse=True))
        self._tasks.append(
            PlannedTask(
                id=task_id,
                kind=kind,
                name=name,
                start=start,
                end=end,
                outputs=tuple(regions),
                reads=tuple(t.region for t in args["inputs"] + args["inouts"]),
                writes=tuple(t.region for t in args["inouts"] + args["writes"]) + tuple(regions),
                deps=deps,
                touches=tuple(owners),
                cost_ns=cost_ns,
            )
        )
        self._refs.append(0)
        outs = tuple(Tensor(r, task_id, scope.id) for r in regions)
        return TaskRefs(task_id, outs, self._refs)

    def _finish(self, name: str, fatal: tuple[int, str] | None) -> Plan:
        n = len(self._tasks)
        tasks = tuple(
            t if not self._refs[t.id] else _with_refs(t, self._refs[t.id]) for t in self._tasks
        )
        close_pos = tuple(self._close_pos.get(t.id, n + 1) for t in tasks)
        return Plan(
            name=name,
            tasks=tasks,
            fatal=fatal,
            close_pos=close_pos,
            consumers={k: tuple(v) for k, v in self._consumers.items()},
            externals=dict(self._externals),
            limits=self.limits,
        )


def _with_refs(task: PlannedTask, refs: int) -> PlannedTask:
    return PlannedTask(**{**task.__dict__, "refs": refs})


def plan(workload: Callable[..., None], limits: PlanLimits, name: str = "", **params) -> Plan:
    """Run ``workload(orchestrator, **params)`` once and return its :class:`Plan`.

    Raises:
        TypeError, ValueError: the workload misused the orchestrator (a bad argument, a tensor
            used after its scope closed).
    """
    orch = Orchestrator(limits)
    fatal = None
    try:
        workload(orch, **params)
    except _PlanFatal as exc:
        fatal = (exc.task, str(exc))
    return orch._finish(name or getattr(workload, "__name__", "workload"), fatal)
