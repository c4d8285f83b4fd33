"""DeepSpeed ZeRO-3's gathered parameters and their release lifetime, on the allocator.

Source: ``../shared/seeds/deepspeed-zero3-release-lifetime.txt`` (DeepSpeed PR #8032, fixing
what #7489 broke) and DeepCompile's ZeRO-3 custom ops (``allgather_param``, ``wait_allgather``,
``release_param`` in ``csrc/compile/z3.cpp``).

ZeRO-3 shards every parameter over ``world_size`` ranks; before an op uses a parameter it is
all-gathered into a full buffer, and released after its last use. :class:`Zero3` simulates the
ranks in one process: every rank's shard is host memory (the other ranks' memory, which the
all-gather reaches over the network), the gathered parameter is device memory of this rank,
allocated from an :class:`~allocator.Allocator` and gathered on a gather stream of its own.

The seed's bug. PR #7489 made the all-gather write a *padded* base of ``world_size *
ceil(numel / world_size)`` elements and return a true-shape **view** (``numel`` elements) of it;
the registry keeps the base. The release path only dropped the registry's reference
(``set_data(empty)``), which frees nothing while a view of the storage is alive, and Inductor's
generated wrapper keeps ``buf1 = buf0`` aliases of the gathered views until the graph ends (its
fallback ops are marked ``never_reuse_output``): every gathered parameter stayed live until the
end of the graph. The fix (#8032): the final ``release_param`` of a non-persistent parameter
records the current stream on the storage (``record_stream``, so the caching allocator does not
hand the block to other work before the consumer's queued kernels finish) and resizes the
storage to 0 bytes (``resize_(0)``), freeing it with the views still alive; using such a view
afterwards is a use-after-release, which the allocator's detector reports. ``legacy_release=True``
keeps the pre-fix path for the suites' mutant probe.

Order of operations, per parameter:

- ``allgather``: if the registry holds a gathered base, a view of it (nothing is allocated:
  DeepSpeed's ``isValid``); else the gather stream waits for the current stream (DeepSpeed's
  ``ag_comp_done`` event), the padded base is allocated and filled on the gather stream (one
  upload: the all-gather kernel), an event recorded on the gather stream after it (DeepSpeed's
  ``ag_comm_done_events_[ds_id]``), the base registered, and a view of its first ``numel``
  elements returned.
- ``wait``: the current stream waits for the parameter's own event (``wait_allgather``), not
  for the whole gather stream: gathers prefetched after it overlap the compute.
- ``release``: a countdown armed at ``n_users`` when it is 0, then decremented; when it reaches
  0 on a non-persistent parameter, the base is unregistered, the current stream recorded on it
  and its storage freed by ``resize_(0, "release_param")`` (legacy: unregistered only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np

from allocator import Allocator, Buffer, Event
from allocator._buffer import MAX_ELEMENTS

from ._checks import integer

__all__ = ["RELEASE_REASON", "Param", "Zero3"]

RELEASE_REASON = "release_param"
"""The reason the final release gives ``resize_``: what the detector says about a later use
(``use-after-release: buffer_sum arg was released by release_param``)."""


@dataclasses.dataclass(frozen=True)
class Param:
    """A registered parameter's shape.

    Attributes:
        param_id: its id.
        index: its registration order (0, 1, ...), which sets its values.
        numel: elements of the full parameter (its true shape).
        shard_numel: elements per rank, ``ceil(numel / world_size)``.
        padded_numel: elements of the gathered base, ``world_size * shard_numel``.
        persistent: whether it keeps its gathered base for good (never released).
    """

    param_id: Hashable
    index: int
    numel: int
    shard_numel: int
    padded_numel: int
    persistent: bool

    @property
    def padded_bytes(self) -> int:
        """Bytes of the gathered base (4 per float32 element): what each gather allocates."""
        return 4 * self.padded_numel

    def values(self) -> np.ndarray:
        """The full parameter (``numel`` float32 elements): ``(1 + (i + index) % 251) / 256``
        for element ``i`` (exact in float32, in (0, 1): a chain of layers neither overflows
        nor vanishes fast), so that neighbouring parameters and shards differ."""
        return ((1 + (np.arange(self.numel) + self.index) % 251) / 256).astype(np.float32)


@dataclasses.dataclass(eq=False)
class _Entry:
    """A parameter's state: its shape, its padded host data (every rank's shard, in rank
    order) and its release countdown."""

    param: Param
    padded: np.ndarray
    gathered: Event  # recorded on the gather stream after its last all-gather
    countdown: int = 0
    released: bool = False  # its last gather was released for good (until the next gather)


class Zero3:
    """ZeRO-3 parameters of ``world_size`` simulated ranks over ``alloc``.

    Args:
        alloc: the allocator gathered parameters come from.
        world_size: the number of ranks, >= 1.
        legacy_release: ``True`` for the pre-fix release path (drop the registry's reference
            only), kept for the suites' mutant probe.

    Attributes:
        alloc: the allocator.
        world_size: the number of ranks.
        legacy_release: whether the pre-fix release path is used.
        gather_stream: the stream the all-gathers run on (``"zero3.gather"``).

    Raises:
        TypeError: ``alloc`` is not an Allocator, ``world_size`` not an integer, or
            ``legacy_release`` not a bool.
        ValueError: ``world_size`` < 1, or more than a device can hold float32 elements
            (``MAX_ELEMENTS``, the allocator's bound: each rank adds at least one to every
            gathered base).
    """

    def __init__(self, alloc: Allocator, world_size: int, *, legacy_release: bool = False):
        if not isinstance(alloc, Allocator):
            raise TypeError(f"alloc must be an allocator.Allocator, got {type(alloc).__name__}")
        self.world_size = integer(world_size, "world_size", 1, MAX_ELEMENTS)
        if not isinstance(legacy_release, bool):
            raise TypeError(f"legacy_release must be a bool, got {type(legacy_release).__name__}")
        self.alloc = alloc
        self.legacy_release = legacy_release
        self.gather_stream = alloc.new_stream("zero3.gather")
        self._entries: dict[Hashable, _Entry] = {}
        self._gathered: dict[Hashable, Buffer] = {}  # DeepSpeed's registry of gathered params

    # -- registration ------------------------------------------------------------------------

    def register(self, param_id: Hashable, numel: int, *, persistent: bool = False) -> Param:
        """Register a parameter of ``numel`` elements, sharded over the ranks: rank r holds
        elements ``r * shard .. (r + 1) * shard - 1`` of it, zero padded, where ``shard =
        ceil(numel / world_size)``.

        Returns:
            Its :class:`Param`.

        Raises:
            TypeError: ``param_id`` is not hashable (a tuple holding a list included),
                ``numel`` not an integer, ``persistent`` not a bool.
            ValueError: ``param_id`` is already registered, ``numel`` < 1, or the padded base
                (``world_size * ceil(numel / world_size)`` elements) is more than a device
                can address (``MAX_ELEMENTS`` float32 elements).
            MemoryError: the host cannot hold the shards (the message names ``numel``).
        """
        try:
            hash(param_id)
        except TypeError:
            raise TypeError(
                f"param_id must be hashable, got {type(param_id).__name__} {param_id!r}"
            ) from None
        numel = integer(numel, "numel", 1, MAX_ELEMENTS)
        if not isinstance(persistent, bool):
            raise TypeError(f"persistent must be a bool, got {type(persistent).__name__}")
        if param_id in self._entries:
            raise ValueError(f"param_id={param_id!r} is already registered")
        shard = -(-numel // self.world_size)  # ceil, exact for huge integers
        index, padded_numel = len(self._entries), shard * self.world_size
        if padded_numel > MAX_ELEMENTS:
            raise ValueError(
                f"numel={numel} over world_size={self.world_size} ranks pads to {padded_numel}"
                f" elements, more than a device can address (at most {MAX_ELEMENTS})"
            )
        param = Param(param_id, index, numel, shard, padded_numel, persistent)
        try:
            padded = np.zeros(param.padded_numel, dtype=np.float32)
            padded[:numel] = param.values()
        except MemoryError:
            raise MemoryError(
                f"numel={numel}: the host cannot hold its shards ({param.padded_bytes} bytes)"
            ) from None
        self._entries[param_id] = _Entry(param, padded, self.alloc.new_event())
        return param

    def param(self, param_id: Hashable) -> Param:
        """The :class:`Param` registered as ``param_id``.

        Raises:
            KeyError: ``param_id`` is not registered.
        """
        return self._entry(param_id).param

    def shard(self, param_id: Hashable, rank: int) -> np.ndarray:
        """Rank ``rank``'s shard of the parameter (``shard_numel`` elements, a host copy).

        Raises:
            KeyError: ``param_id`` is not registered.
            ValueError: ``rank`` is not in ``0 .. world_size - 1``.
        """
        entry = self._entry(param_id)
        rank = integer(rank, "rank", 0)
        if rank >= self.world_size:
            raise ValueError(f"rank must be < world_size={self.world_size}, got {rank}")
        shard = entry.param.shard_numel
        return entry.padded[rank * shard : (rank + 1) * shard].copy()

    def _entry(self, param_id: Hashable) -> _Entry:
        try:
            return self._entries[param_id]
        except (KeyError, TypeError):  # TypeError: an unhashable id is not registered either
            raise KeyError(f"param_id={param_id!r} is not registered") from None

    # -- the custom ops ----------------------------------------------------------------------

    def allgather(self, param_id: Hashable) -> Buffer:
        """All-gather the parameter (DeepCompile's ``allgather_param``).

        If its base is gathered already (a persistent parameter, or one whose countdown has
        not reached 0), returns a view of it and allocates nothing. Otherwise the gather stream
        first waits for the current stream, then a padded base of ``padded_numel`` elements is
        allocated on the gather stream and filled there with every rank's shard, the
        parameter's event is recorded there (what :meth:`wait` waits for), and the base is
        kept in the registry.

        Returns:
            A true-shape view: the base's first ``numel`` elements, sharing its storage.

        Raises:
            KeyError: ``param_id`` is not registered.
            DeviceOutOfMemory: the device has no room for the base.
        """
        entry = self._entry(param_id)
        base = self._gathered.get(param_id)
        if base is None:
            alloc = self.alloc
            self.gather_stream.wait_stream(alloc.current_stream())
            with alloc.use_stream(self.gather_stream):
                base = alloc.from_numpy(entry.padded)
            self.gather_stream.record_event(entry.gathered)  # its all-gather is done there
            self._gathered[param_id] = base
            entry.released = False
        return base.view(0, entry.param.numel)

    def wait(self, view: Buffer, param_id: Hashable) -> Buffer:
        """Make the current stream wait for the parameter's own all-gather (DeepCompile's
        ``wait_allgather``, which waits on ``ag_comm_done_events_[ds_id]``): the event recorded
        after it, not the whole gather stream, so that the gathers queued after it (a
        prefetch) overlap the current stream's next kernels.

        Returns:
            ``view``, unchanged.

        Raises:
            KeyError: ``param_id`` is not registered.
            TypeError: ``view`` is not a Buffer.
            ValueError: the parameter is not gathered, or ``view`` is not a view of its
                gathered storage.
        """
        self._check_view(view, param_id, "wait")
        self.alloc.current_stream().wait_event(self._entries[param_id].gathered)
        return view

    def release(self, view: Buffer, param_id: Hashable, n_users: int) -> Buffer:
        """One use of the parameter is over (DeepCompile's ``release_param``).

        The countdown is armed at ``n_users`` when it is 0, then decremented. When it reaches 0
        on a non-persistent parameter, the base leaves the registry, the current stream is
        recorded on it and its storage freed by ``resize_(0, "release_param")``: the block is
        freed now, although ``view`` and every other view of it are still alive (each then has
        size 0; using one is a use-after-release). With ``legacy_release`` the base only leaves
        the registry: the block lives as long as a view does. A persistent parameter keeps its
        base.

        Returns:
            ``view`` (the op passes its input through, for the graph's ordering).

        Raises:
            KeyError: ``param_id`` is not registered.
            TypeError: ``view`` is not a Buffer, or ``n_users`` not an integer.
            ValueError: ``n_users`` < 1, the parameter is not gathered, or ``view`` is not a
                view of its gathered storage (e.g. a view of another parameter).
        """
        entry = self._entry(param_id)
        n_users = integer(n_users, "n_users")
        self._check_view(view, param_id, "release")
        if entry.countdown == 0:
            entry.countdown = n_users
        entry.countdown -= 1
        if entry.countdown == 0 and not entry.param.persistent:
            base = self._unregister(param_id)  # clear and unregister the registry's entry
            if not self.legacy_release:
                self._free(base)
        return view

    def _free(self, base: Buffer) -> None:
        """The fix: record the current stream, then free the storage with its views alive."""
        base.record_stream(self.alloc.current_stream())
        base.storage.resize_(0, RELEASE_REASON)

    def _check_view(self, view: object, param_id: Hashable, op: str) -> Buffer:
        """The gathered base of ``param_id``, after checking that ``view`` is a view of it."""
        entry = self._entry(param_id)
        if not isinstance(view, Buffer):
            raise TypeError(f"{op}: view must be a Buffer, got {type(view).__name__}")
        base = self._gathered.get(param_id)
        if base is None:
            if entry.released:
                raise ValueError(
                    f"{op}: param_id={param_id!r} was already released (its countdown reached"
                    " 0); allgather it again first"
                )
            raise ValueError(f"{op}: param_id={param_id!r} is not gathered; allgather it first")
        if view.storage is not base.storage:
            owner = next((p for p, b in self._gathered.items() if b.storage is view.storage), None)
            whose = "no gathered parameter" if owner is None else f"param_id={owner!r}"
            raise ValueError(
                f"{op}: view is not a view of param_id={param_id!r}'s gathered storage (it views"
                f" {whose})"
            )
        return base

    def gathered(self, param_id: Hashable) -> Buffer | None:
        """The registry's gathered base of the parameter (``padded_numel`` elements), or
        ``None`` while it is not gathered.

        Raises:
            KeyError: ``param_id`` is not registered.
        """
        self._entry(param_id)
        return self._gathered.get(param_id)

    def countdown(self, param_id: Hashable) -> int:
        """The parameter's release countdown: 0 when no release is pending (between graphs),
        else the releases still to come before its final one.

        Raises:
            KeyError: ``param_id`` is not registered.
        """
        return self._entry(param_id).countdown

    def reset(self) -> None:
        """Drop every gathered non-persistent parameter and disarm every countdown: the state
        between two graphs, restored after a graph that failed half-way (DeepSpeed's
        ``reset`` of its registry at the end of a step).

        Each non-persistent base still gathered leaves the registry and its storage is freed
        as a final release frees it (the current stream recorded, ``resize_(0,
        "release_param")``; with ``legacy_release``, unregistered only). Persistent
        parameters keep their base.
        """
        for param_id in [p for p in self._gathered if not self._entries[p].param.persistent]:
            self._drop(param_id)
        for entry in self._entries.values():
            entry.countdown = 0

    def _unregister(self, param_id: Hashable) -> Buffer:
        """Take ``param_id``'s base out of the registry as its final release does; return
        it."""
        self._entries[param_id].released = True
        return self._gathered.pop(param_id)

    def _drop(self, param_id: Hashable) -> None:
        """Unregister ``param_id``'s base and free it as a final release does."""
        base = self._unregister(param_id)
        if not self.legacy_release:
            self._free(base)

    def _restore(self, gathered: frozenset, countdowns: dict[Hashable, int]) -> None:
        """Undo what a failed graph did: unregister (and free) the non-persistent bases
        gathered since the registry held ``gathered``, and set the countdowns back."""
        for param_id in [p for p in self._gathered if p not in gathered]:
            if not self._entries[param_id].param.persistent:
                self._drop(param_id)
        for param_id, entry in self._entries.items():
            entry.countdown = countdowns[param_id]

    def _countdowns(self) -> dict[Hashable, int]:
        return {param_id: entry.countdown for param_id, entry in self._entries.items()}
