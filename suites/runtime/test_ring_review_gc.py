"""Review of issue 39 item 4 (the ring's speed round): ``gc_paused`` (planning, simulation and
``check_trace`` run inside it) must leave the process's collector as it found it.

Since b7d1c2d it calls ``gc.freeze()`` then ``gc.unfreeze()`` on the way out, to move what the
block left alive into the oldest generation. ``gc.unfreeze()`` empties the whole permanent
generation, so the objects a caller froze before the block (a fork server's preloaded modules:
``harness._zygote`` freezes them so that its children's collections never touch, and copy,
those pages) are handed back to the collector by any ring run in that process. Checked in a
fresh interpreter: freezing in this one would change what other tests see.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import gc

    from runtime.ring._program import gc_paused

    mine = [[i] for i in range(1000)]  # the caller's objects, frozen before the block
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    before = (gc.isenabled(), gc.get_threshold())


    def still_frozen():
        # the permanent generation is outside the three that gc.get_objects() lists
        return not any(o is mine for o in gc.get_objects())


    assert still_frozen()
    with gc_paused():
        made = [[i] for i in range(100)]
    assert (gc.isenabled(), gc.get_threshold()) == before
    assert still_frozen(), "gc_paused unfroze the caller's objects"
    assert gc.get_freeze_count() >= frozen - 10, (frozen, gc.get_freeze_count())

    try:
        with gc_paused():
            raise KeyError("out of the block")
    except KeyError:
        pass
    assert (gc.isenabled(), gc.get_threshold()) == before
    assert still_frozen(), "gc_paused unfroze the caller's objects when the block raised"
    print("ok")
    """
)


def test_gc_paused_keeps_a_callers_frozen_objects_frozen():
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr


def test_gc_paused_restores_a_disabled_collector_and_its_thresholds():
    code = textwrap.dedent(
        """
        import gc

        from runtime.ring._program import gc_paused

        gc.set_threshold(5, 3, 2)
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled() and gc.get_threshold() == (5, 3, 2)
        gc.enable()
        try:
            with gc_paused():
                assert not gc.isenabled()
                raise ValueError
        except ValueError:
            pass
        assert gc.isenabled() and gc.get_threshold() == (5, 3, 2)
        print("ok")
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr
