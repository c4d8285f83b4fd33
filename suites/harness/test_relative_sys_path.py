"""A relative ``sys.path`` entry means the same directory to a child in every style: the one
the test process's imports look in, even after it changed its working directory (a fork child
has the test process's import cache; forkserver and exec children once looked the entry up
again from the new directory, and did not find the module)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

import harness
from harness._request import where_imports_look


@pytest.mark.own_process  # it changes this process's directory and sys.path for good
@pytest.mark.parametrize("child_style", ["fork", "forkserver", "exec"])
def test_a_relative_entry_means_the_directory_the_test_process_imports_from(tmp_path, child_style):
    name = f"relmod_{child_style}"
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / f"{name}.py").write_text("def where():\n    return __file__\n")
    os.chdir(tmp_path)
    sys.path.insert(0, "lib")
    importlib.import_module(name)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "lib").mkdir(parents=True)  # an empty lib/ where the child would look again
    os.chdir(elsewhere)

    outcome = harness.run_child(f"{name}:where", style=child_style)

    assert outcome.kind == "exited", outcome
    assert outcome.returned == str(lib / f"{name}.py")


def test_entries_keep_their_meaning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    assert where_imports_look("") == ""  # the current directory at each import, here as there
    assert where_imports_look("/abs/dir") == "/abs/dir"
    assert where_imports_look("never-used") == str(tmp_path / "never-used")
