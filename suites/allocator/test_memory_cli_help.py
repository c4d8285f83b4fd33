"""``python -m allocator.memory``: the help names every mark ``plot`` draws, and a snapshot
field of the wrong type is named in the one error line (issue 25, item 4)."""

from __future__ import annotations

import pickle

import pytest

from allocator import memory


def test_plot_help_names_every_mark_it_draws(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        memory.main(["plot", "--help"])
    text = " ".join(capsys.readouterr().out.split()).lower()
    for _, name in memory._MARKER_STYLE.values():
        stem = {"snapshot taken": "snapshots pytorch took"}.get(name, name)
        assert stem.lower() in text, name


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        ({"segments": 1, "device_traces": 2}, "segments is int 1, expected a list of segments"),
        ({"segments": "x"}, "segments is str 'x', expected a list of segments"),
        ({"segments": [], "device_traces": 2}, "device_traces"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(tmp_path, capsys, snapshot, message):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert memory.main(["summary", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m allocator.memory summary: error: {path}: not a memory")
    assert message in err and len(err.splitlines()) == 1, err
