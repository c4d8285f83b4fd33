"""``env={"PYTHONPATH": ...}`` (and ``PYTHONHOME``) act in exec, and are refused where they
cannot (issue 18, item 7)."""

from __future__ import annotations

import os
import sys

import pytest

import harness
from suites.harness import _targets


@pytest.fixture
def module_dir(tmp_path):
    """A directory with a module ``devmem_probe_mod`` that is nowhere else."""
    (tmp_path / "devmem_probe_mod.py").write_text("VALUE = 1\n")
    return str(tmp_path)


@pytest.mark.parametrize("name", ["PYTHONPATH", "PYTHONHOME"])
def test_pythonpath_is_honoured_in_exec_and_refused_in_fork_and_forkserver(
    run, style, module_dir, name
):
    value = module_dir if name == "PYTHONPATH" else sys.base_prefix
    if style != "exec":
        with pytest.raises(harness.HarnessError, match=f"env changes {name}.*style='exec'"):
            run(_targets.import_probe, "json", env={name: value})
        return
    if name == "PYTHONHOME":
        outcome = run(_targets.import_probe, "json", env={name: value}).assert_clean()
        assert outcome.returned["base_prefix"] == sys.base_prefix
        return
    outcome = run(_targets.import_probe, "devmem_probe_mod", env={name: value}).assert_clean()
    probe = outcome.returned
    assert probe["file"] == os.path.join(module_dir, "devmem_probe_mod.py")
    assert probe["PYTHONPATH"] == module_dir
    assert probe["sys_path"].index(module_dir) < probe["sys_path"].index(os.getcwd())


def test_auto_picks_exec_for_pythonpath(module_dir):
    outcome = harness.run_child(
        _targets.import_probe, "devmem_probe_mod", env={"PYTHONPATH": module_dir}, timeout=30
    )

    assert outcome.style == "exec"
    outcome.assert_clean()


def test_the_same_pythonpath_as_the_parent_s_changes_nothing(run, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    run(_targets.give_back, env={"PYTHONPATH": None}).assert_clean()  # unset, as it is
