"""Runtime mechanisms from the seeds, built on the allocator's public API.

Each module reproduces one seed's mechanism and its fix, runs on every backend (``cpu``, ``sim``,
``cuda``) and has a suite under ``suites/runtime/`` whose mutant probe patches the seed's bug back
in (``../shared/DESIGN.md`` section 5):

- :mod:`runtime.zero3`: DeepSpeed ZeRO-3's gathered-parameter release lifetime;
- :mod:`runtime.pipeline` and :mod:`runtime.checkpoint`: the ANE pipeline planner and its
  activation-checkpoint policies;
- :mod:`runtime.ring` and :mod:`runtime.tensormap`: a task runtime's heap ring and TensorMap.

Imports point one way: ``runtime -> allocator``; nothing here imports the harness or pytest.
"""
