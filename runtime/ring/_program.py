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

Planning is the ring's hot path (every task of a run goes through it once), so it keeps to
plain data: a contiguous tensor is a span of bytes (:class:`Tensor` makes its
:class:`~runtime.tensormap.Region` only when asked), a task whose tensors are all spans finds
its fan-in with :func:`~runtime.tensormap.gather_spans` (the TensorMap's span path; strided
tensors take the Region path), and the plan is kept as parallel lists (:class:`Columns`), its
:class:`PlannedTask` objects made on access.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import numbers
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from .._checks import integer
from ..tensormap import FaninExceeded, Region, TensorMap, gather_fanin, gather_spans

__all__ = [
    "HEAP",
    "RECLAIM_MODES",
    "Columns",
    "Orchestrator",
    "Plan",
    "PlanLimits",
    "PlannedTask",
    "PlannedTasks",
    "TaskRefs",
    "Tensor",
    "plan",
]

HEAP = "heap"
"""The buffer name of heap-ring regions (their offsets are virtual: monotone, never reused)."""

FLOAT32 = 4
_NONE = ()
_new = object.__new__
_SPAN = operator.attrgetter("span")
"""The default of a submit's tensor arguments (the empty tuple, one object in CPython)."""
RECLAIM_MODES = ("exact", "window")
"""Reclaim rules: dependency-exact (the default), or the seed's constant span H."""


class Tensor:
    """A tensor the program names: a heap output of a task, or an external (global-memory)
    buffer.

    Attributes:
        region: its bytes (``buffer`` is :data:`HEAP` for heap tensors, with virtual offsets).
        owner: the id of the task whose heap slice holds it; ``None`` for external tensors.
        scope: the id of the scope it was allocated in: 0 for the root scope, then 1, 2, ... in
            the order scopes open (``None`` for external tensors).
        buffer, lo, hi: its buffer and bounding byte range ``[lo, hi)``; span: the three as a
            tuple.
        flat: whether its bytes are the one run ``[lo, hi)`` (planning then tracks it as a
            span, without a :class:`Region`).

    Tensors compare by ``(region, owner, scope)``. A contiguous view of a contiguous tensor
    makes its :class:`Region` only when asked for (planning does not need it).
    """

    __slots__ = ("_region", "buffer", "flat", "hi", "lo", "owner", "scope", "span")

    def __init__(self, region: Region, owner: int | None = None, scope: int | None = None):
        if not isinstance(region, Region):
            raise TypeError(f"region must be a Region, got {type(region).__name__}")
        self._region = region
        self.buffer = region.buffer
        self.lo, self.hi = region.byte_range
        self.span = (self.buffer, self.lo, self.hi)
        self.flat = not region._bytes.dims
        self.owner, self.scope = owner, scope

    @classmethod
    def _span(cls, buffer, lo: int, hi: int, owner: int | None, scope: int | None) -> Tensor:
        """The float32 elements of bytes ``[lo, hi)`` (multiples of 4): ``Region(buffer,
        lo // 4, ((hi - lo) // 4,), None, 4)``, made when asked for."""
        tensor = object.__new__(cls)
        tensor._region = None
        tensor.buffer, tensor.lo, tensor.hi, tensor.flat = buffer, lo, hi, True
        tensor.span = (buffer, lo, hi)
        tensor.owner, tensor.scope = owner, scope
        return tensor

    @property
    def region(self) -> Region:
        """Its bytes, as a :class:`Region`."""
        region = self._region
        if region is None:
            region = Region(self.buffer, self.lo // FLOAT32, ((self.hi - self.lo) // FLOAT32,))
            self._region = region
        return region

    def __eq__(self, other: object) -> bool:
        if type(other) is not Tensor:
            return NotImplemented
        return (self.region, self.owner, self.scope) == (other.region, other.owner, other.scope)

    def __hash__(self) -> int:
        return hash((self.region, self.owner, self.scope))

    def __repr__(self) -> str:
        return f"Tensor(region={self.region!r}, owner={self.owner!r}, scope={self.scope!r})"

    def view(self, offset: int, shape: Sequence[int], strides: Sequence[int] | None = None):
        """A view of this tensor: ``shape`` elements from ``offset`` (elements from this
        tensor's start), with ``strides`` in elements (default row-major contiguous).

        Raises:
            ValueError: the view reaches outside this tensor's bounding range.
        """
        if (
            strides is None
            and type(offset) is int
            and type(shape) is tuple
            and len(shape) == 1
            and type(shape[0]) is int
            and shape[0] >= 1
            and self.flat
            and (self._region is None or self._region.elem_size == FLOAT32)
        ):  # a run of a run: no Region needed
            lo = self.lo + offset * FLOAT32
            hi = lo + shape[0] * FLOAT32
            if self.lo <= lo and hi <= self.hi:
                view = _new(Tensor)  # Tensor._span(self.buffer, lo, hi, ...), inline
                view._region, view.flat, view.owner, view.scope = None, True, self.owner, self.scope
                buffer = view.buffer = self.buffer
                view.lo, view.hi, view.span = lo, hi, (buffer, lo, hi)
                return view
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
        if type(index) is not int and (
            isinstance(index, bool) or not isinstance(index, numbers.Integral)
        ):
            raise TypeError(f"index must be an integer, got {type(index).__name__}")
        if not 0 <= index < len(self.outputs):
            raise IndexError(
                f"task {self.task} has {len(self.outputs)} outputs; get_ref({index}) is out of"
                " range"
            )
        counts, task = self._counts, self.task
        if counts[task] <= index:
            counts[task] = index + 1
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


class Columns:
    """The plan's tasks as parallel lists indexed by task id (what the simulator and the trace
    checker read; :class:`PlannedTask` objects are made from them only when asked for).

    Attributes:
        kind, name, start, end, deps, touches, cost_ns, refs: as :class:`PlannedTask`'s.
        outputs: per task, its heap output :class:`Tensor` objects. reads: its inputs and
            inouts. writes: its inouts, the tensors it overwrites and its outputs (Tensors,
            whose ``region`` is the PlannedTask's region).
    """

    __slots__ = (
        "cost_ns",
        "deps",
        "end",
        "kind",
        "name",
        "outputs",
        "reads",
        "refs",
        "start",
        "touches",
        "writes",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, [])

    def task(self, i: int) -> PlannedTask:
        """Task ``i`` as a :class:`PlannedTask`."""
        return PlannedTask(
            id=i,
            kind=self.kind[i],
            name=self.name[i],
            start=self.start[i],
            end=self.end[i],
            outputs=tuple(t.region for t in self.outputs[i]),
            reads=tuple(t.region for t in self.reads[i]),
            writes=tuple(t.region for t in self.writes[i]),
            deps=self.deps[i],
            touches=self.touches[i],
            cost_ns=self.cost_ns[i],
            refs=self.refs[i],
        )


class PlannedTasks(Sequence):
    """The plan's tasks by id, a read-only sequence of :class:`PlannedTask` made from the
    plan's :class:`Columns` on first access (and kept)."""

    __slots__ = ("_columns", "_made")

    def __init__(self, columns: Columns) -> None:
        self._columns = columns
        self._made: list[PlannedTask | None] = [None] * len(columns.kind)

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self._made))[index])
        task = self._made[index]
        if task is None:
            i = range(len(self._made))[index]
            task = self._made[i] = self._columns.task(i)
        return task

    def __iter__(self) -> Iterator[PlannedTask]:
        for i in range(len(self._made)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of the same tasks (a tuple of :class:`PlannedTask` included)."""
        if not isinstance(other, (PlannedTasks, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable cache, compared by value

    def __repr__(self) -> str:
        return f"<{len(self)} planned tasks>"


@dataclass(frozen=True)
class Plan:
    """The planned program: every core replays it.

    Attributes:
        name: the workload's name.
        tasks: the planned tasks, by id (up to the fatal one, if any): a sequence of
            :class:`PlannedTask` (:class:`PlannedTasks`, made on access from ``columns``).
        fatal: ``(task id, message)`` of a fatal found while planning, else ``None``; the
            runtime raises it when the first core replays that task.
        close_pos: per task id, the number of tasks submitted when its scope closed (its
            region may be reclaimed in exact mode only once a core has replayed that far);
            beyond every replay position for the root scope, which never closes.
        consumers: per heap-owning task id, the ids of the later tasks that touch its slice.
        externals: external buffers, name -> elements.
        limits: the :class:`PlanLimits` it was planned for.
        columns: the same tasks as parallel lists (:class:`Columns`).
    """

    name: str
    tasks: Sequence[PlannedTask]
    fatal: tuple[int, str] | None
    close_pos: tuple[int, ...]
    consumers: dict[int, tuple[int, ...]]
    externals: dict[str, int]
    limits: PlanLimits
    columns: Columns = field(repr=False, compare=False)

    @property
    def vend(self) -> list[int]:
        """``vend[N]``: ``heap_next`` after task N (virtual bytes)."""
        return list(self.columns.end)


@dataclass
class _Scope:
    id: int
    owners: list[int] = field(default_factory=list)


class _ScopeBlock:
    """What :meth:`Orchestrator.scope` returns: the scope opens on entry and closes on exit
    (an exception included)."""

    __slots__ = ("_entered", "_orch")

    def __init__(self, orch: Orchestrator) -> None:
        self._orch, self._entered = orch, False

    def __enter__(self) -> None:
        if self._entered:
            raise RuntimeError("a scope is entered once: call rt.scope() for another")
        self._entered = True
        self._orch._open()

    def __exit__(self, *exc_info) -> None:
        self._orch._close()


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
        self._cols = cols = Columns()
        self._appends = tuple(
            getattr(cols, column).append
            for column in (
                "kind",
                "name",
                "start",
                "end",
                "outputs",
                "reads",
                "writes",
                "deps",
                "touches",
                "cost_ns",
                "refs",
            )
        )
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

    def scope(self) -> _ScopeBlock:
        """A scope (a context manager, entered once): heap tensors allocated in it may be
        reclaimed (exact mode) only after it closes, and may not be used after it closes."""
        return _ScopeBlock(self)

    def _open(self) -> _Scope:
        scope = _Scope(self._scope_ids)
        self._scope_ids += 1
        self._scopes.append(scope)
        return scope

    def _close(self) -> None:
        scope = self._scopes.pop()
        self._closed_scopes.add(scope.id)
        if scope.owners:
            n, cols = len(self._cols.kind), self._cols
            for owner in scope.owners:
                self._close_pos[owner] = n
            # no later task may use the scope's slices: their writers and readers leave the
            # map (the slices are consecutive on the heap: a nested scope's, between them,
            # closed first)
            self._tmap.forget(HEAP, cols.start[scope.owners[0]], cols.end[scope.owners[-1]])

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
        if type(cost_ns) is not int or cost_ns < 0:
            cost_ns = integer(cost_ns, "cost_ns", 0)
        return self._submit("kernel", name, inputs, inouts, writes, outputs, cost_ns)

    # -- planning ------------------------------------------------------------------------------

    def _check_tensor(self, tensor: object, role: str) -> Tensor:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{role} must be Tensors, got {type(tensor).__name__}")
        if tensor.scope is not None and tensor.scope in self._closed_scopes:
            raise ValueError(
                f"task {len(self._cols.kind)} uses a tensor of task {tensor.owner} after its"
                " scope closed"
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

    def _place(self, task_id: int, sizes: Sequence[int], scope: int) -> tuple[int, int, list]:
        """Task ``task_id``'s heap slice ``[start, end)`` and its outputs (Tensors of scope
        ``scope``)."""
        start = self._heap_next
        if not sizes:
            return start, start, []
        limits = self.limits
        align, ring = limits.align, limits.ring_bytes
        if len(sizes) == 1:  # one output: the slice is its rounded size
            size = sizes[0]
            total = -(-size * FLOAT32 // align) * align
            if total <= ring:
                base = -(-start // align) * align
                if base // ring != (base + total - 1) // ring:  # never straddle the end
                    base = (base // ring + 1) * ring
                out = _new(Tensor)  # Tensor._span(HEAP, base, ..., task_id, scope), inline
                out._region, out.flat, out.owner, out.scope = None, True, task_id, scope
                hi = base + size * FLOAT32
                out.buffer, out.lo, out.hi, out.span = HEAP, base, hi, (HEAP, base, hi)
                return start, base + total, [out]
        ends, total = [], 0  # each output's end, from the slice's base
        for size in sizes:
            total += -(-size * FLOAT32 // align) * align
            ends.append(total)
        if total > ring:
            raise _PlanFatal(
                task_id,
                f"task {task_id} needs {total} heap bytes, more than the heap ring's {ring}",
            )
        base = -(-start // align) * align
        if base // ring != (base + total - 1) // ring:  # never straddle the end
            base = (base // ring + 1) * ring
        span, outputs, lo = Tensor._span, [], base
        for size, end in zip(sizes, ends):  # noqa: B905 (as long by construction)
            outputs.append(span(HEAP, lo, lo + size * FLOAT32, task_id, scope))
            lo = base + end
        return start, base + total, outputs

    def _tensors(self, tensors, role: str) -> list[Tensor]:
        if isinstance(tensors, Tensor):
            raise TypeError(f"{role} must be a sequence of Tensors, got one Tensor")
        closed = self._closed_scopes
        out = list(tensors)
        for t in out:
            if type(t) is not Tensor or (t.scope is not None and t.scope in closed):
                self._check_tensor(t, role)
        return out

    def _submit(self, kind, name, inputs, inouts, writes, outputs, cost_ns) -> TaskRefs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a kernel's name must be a non-empty str, got {name!r}")
        if type(outputs) not in (tuple, list) and (
            isinstance(outputs, (int, str)) or not hasattr(outputs, "__iter__")
        ):
            raise TypeError(f"outputs must be a sequence of sizes, got {outputs!r}")
        cols = self._cols
        task_id = len(cols.kind)
        # the arguments left out are the empty tuple: no copy or check for them
        if inputs is _NONE:
            inputs = []
        else:  # self._tensors(inputs, "inputs"), inline
            if isinstance(inputs, Tensor):
                raise TypeError("inputs must be a sequence of Tensors, got one Tensor")
            inputs, closed = list(inputs), self._closed_scopes
            for t in inputs:
                if type(t) is not Tensor or (t.scope is not None and t.scope in closed):
                    self._check_tensor(t, "inputs")
        inouts = [] if inouts is _NONE else self._tensors(inouts, "inouts")
        writes = [] if writes is _NONE else self._tensors(writes, "writes")
        sizes = []
        for n in outputs:
            sizes.append(n if type(n) is int and n >= 1 else integer(n, "output size"))
        written = inouts + writes if writes else inouts
        touched = inputs + written if written else inputs
        owners, flat = [], True
        for t in touched:
            owner = t.owner
            if owner is not None and owner not in owners:
                owners.append(owner)
            if not t.flat:
                flat = False
        if len(owners) > 1:
            owners.sort(reverse=True)
        limits = self.limits
        if limits.reclaim == "window":
            self._check_span(task_id, owners)
        scope = self._scopes[-1]
        start, end, outs = self._place(task_id, sizes, scope.id)
        tmap = self._tmap
        try:
            if not touched:
                fanin = ()
            elif flat:  # contiguous accesses: spans, no Regions
                fanin = gather_spans(
                    tmap,
                    task_id,
                    inputs=list(map(_SPAN, inputs)) if inputs else _NONE,
                    inouts=list(map(_SPAN, inouts)) if inouts else _NONE,
                    writes=list(map(_SPAN, writes)) if writes else _NONE,
                    max_fanin=limits.max_fanin,
                )
            else:
                fanin = gather_fanin(
                    tmap,
                    task_id,
                    inputs=[t.region for t in inputs],
                    inouts=[t.region for t in inouts],
                    writes=[t.region for t in writes],
                    max_fanin=limits.max_fanin,
                )
        except FaninExceeded as exc:
            raise _PlanFatal(task_id, str(exc)) from None
        if flat:
            if written or outs:
                tmap.insert_spans(map(_SPAN, written + outs), task_id)
        else:
            for t in written:
                if t.flat:
                    tmap.insert_span(t.buffer, t.lo, t.hi, task_id)
                else:
                    tmap.insert(t.region, task_id)
            for t in outs:
                tmap.insert_span(HEAP, t.lo, t.hi, task_id)
        self._heap_next = end
        consumers = self._consumers
        if outs:
            scope.owners.append(task_id)
            consumers[task_id] = []
            written = written + outs
        if owners:
            for owner in owners:
                consumers[owner].append(task_id)
            for owner in owners:  # most often each owner is a producer already
                if owner not in fanin:
                    deps = tuple(sorted({*fanin, *owners}, reverse=True))
                    break
            else:
                deps = fanin
            owners = tuple(owners)
        else:
            deps, owners = fanin, ()
        (  # the columns' bound append methods
            add_kind,
            add_name,
            add_start,
            add_end,
            add_outputs,
            add_reads,
            add_writes,
            add_deps,
            add_touches,
            add_cost,
            add_refs,
        ) = self._appends
        add_kind(kind)
        add_name(name)
        add_start(start)
        add_end(end)
        add_outputs(outs)
        add_reads(inputs + inouts if inouts else inputs)
        add_writes(written)
        add_deps(deps)
        add_touches(owners)
        add_cost(cost_ns)
        add_refs(0)
        refs = _new(TaskRefs)  # TaskRefs(task_id, tuple(outs), cols.refs), inline
        refs.task, refs.outputs, refs._counts = task_id, tuple(outs), cols.refs
        return refs

    def _finish(self, name: str, fatal: tuple[int, str] | None) -> Plan:
        cols = self._cols
        n = len(cols.kind)
        close_pos = tuple(map(self._close_pos.get, range(n), itertools.repeat(n + 1, n)))
        return Plan(
            name=name,
            tasks=PlannedTasks(cols),
            fatal=fatal,
            close_pos=close_pos,
            consumers=dict(zip(self._consumers, map(tuple, self._consumers.values()), strict=True)),
            externals=dict(self._externals),
            limits=self.limits,
            columns=cols,
        )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (back on after it, if it was on).

    Planning, simulating and checking allocate many small objects that live to the end, so
    each collection would walk them all again for nothing (about half of a simulation's time);
    what they allocate is freed by reference counting. On the way out, what the block left
    alive joins the oldest generation (``gc.freeze`` then ``gc.unfreeze``: a splice of the
    collector's lists, no walk): re-enabled as it was, the collector's next young collection
    would otherwise walk every object the block made (a plan's 750,000 at 100,000 tasks:
    0.4 s) to find none to free. Process-wide: other threads' objects wait for the next
    collection after the block too, and a cycle left over from before or during the block
    waits for the next full one. Not where the process keeps objects frozen (``gc.freeze``,
    as the forkserver zygote does with what it preloaded): ``gc.unfreeze`` would hand them
    back to the collector, so there the next young collection walks the block's objects."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def plan(workload: Callable[..., None], limits: PlanLimits, name: str = "", **params) -> Plan:
    """Run ``workload(orchestrator, **params)`` once and return its :class:`Plan`.

    Raises:
        TypeError, ValueError: the workload misused the orchestrator (a bad argument, a tensor
            used after its scope closed).
    """
    orch = Orchestrator(limits)
    fatal = None
    with gc_paused():
        try:
            workload(orch, **params)
        except _PlanFatal as exc:
            fatal = (exc.task, str(exc))
        return orch._finish(name or getattr(workload, "__name__", "workload"), fatal)
