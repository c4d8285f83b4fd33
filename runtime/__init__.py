"""Runtime mechanisms from the seeds, built on the allocator's public API.

Each module reproduces one seed's mechanism and its fix, runs on every backend (``cpu``, ``sim``,
``cuda``) and has a suite under ``suites/runtime/`` whose mutant probe patches the seed's bug back
in (``../shared/DESIGN.md`` section 5):

- :mod:`runtime.zero3` (and :mod:`runtime.zero3_graph`, its graph driver): DeepSpeed ZeRO-3's
  gathered-parameter release lifetime;
- :mod:`runtime.pipeline` (package) and :mod:`runtime.checkpoint` (package, below it): the ANE
  pipeline planner and its activation-checkpoint policies;
- :mod:`runtime.ring` (package) and :mod:`runtime.tensormap` (package, below it): a task
  runtime's heap ring and TensorMap.

Each package's ``__init__`` re-exports its public names from private modules and says what each
adds; ``python -m runtime.ring`` and ``python -m runtime.pipeline`` run their ``__main__``.
:mod:`runtime._checks` (argument checks) is shared by all of them and imports none.

Imports point one way: ``runtime -> allocator``; nothing here imports the harness or pytest
(``suites/allocator/test_layering.py`` checks it, with no cycle between modules).
"""
