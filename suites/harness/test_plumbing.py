"""The pure pieces: capture limits, the status decoder, the summary line, the public API."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import types

import pytest

import harness
from harness._capture import read_kept
from harness._protocol import Status, decode_status
from harness._report import format_summary


def test_read_kept_keeps_head_and_tail_and_says_what_was_cut():
    with tempfile.TemporaryFile() as file:
        file.write(b"HEAD" + b"x" * 100 + b"TAIL")
        file.flush()
        assert read_kept(file.fileno(), "stderr", head=10, tail=200).endswith("TAIL")
        text = read_kept(file.fileno(), "stderr", head=4, tail=4)
    assert text.startswith("HEAD\n[... devmem-harness cut 100 bytes (0.0 MiB) of stderr here")
    assert "it wrote 108 bytes; kept the first 4 and the last 4" in text
    assert text.endswith("...]\nTAIL")


def test_decode_status():
    status = decode_status(
        b'{"event": "started", "pid": 1}\n{"event": "returned", "value": [1, "a"]}\n'
        b'{"event": "raised", "type": "ValueEr'  # torn: the child died mid-write
    )
    assert status.started and status.returned == [1, "a"] and status.raised is None

    assert decode_status(b'{"event": "bogus"}\n').harness_error == (
        "unknown status event 'bogus' from the child"
    )
    for unreadable in (b"not json\n", b"[1]\n", b'"started"\n', b'{"pid": 1}\n'):
        assert "unreadable status record" in decode_status(unreadable).harness_error
    assert decode_status(b'{"event": "exit", "code": 3}\n') == Status()  # the wait status says 3
    harness_error = decode_status(b'{"event": "harness_error", "message": "no module"}\n')
    assert harness_error == Status(harness_error="no module")
    assert decode_status(b"") == decode_status(b"torn")


def test_format_summary():
    assert format_summary([]) is None
    children = [
        ("fork", 0.002, "t.py::a"),
        ("forkserver", 0.004, "t.py::b"),
        ("forkserver", 1.5, "t.py::c[exec]"),
        ("exec", 0.030, "t.py::d"),
    ]
    assert format_summary(children) == (
        "death tests: 4 children (fork 1, forkserver 2, exec 1); median 17.0 ms, "
        "slowest 1.50 s (t.py::c[exec])"
    )
    assert format_summary([("exec", 0.5, "t.py::a")]) == (
        "death tests: 1 child (exec 1); median 500.0 ms, slowest 500.0 ms (t.py::a)"
    )


def test_every_public_name_is_exported_once_and_documented():
    assert len(harness.__all__) == len(set(harness.__all__))
    for name in harness.__all__:
        value = getattr(harness, name)
        if name != "STYLES":
            assert value.__doc__ and value.__doc__.strip(), f"harness.{name} has no docstring"
    public = {
        name
        for name, value in vars(harness).items()
        if name[0].isalpha() and not isinstance(value, types.ModuleType)
    }
    assert sorted(harness.__all__) == sorted(public)


def test_importing_harness_imports_neither_pytest_nor_allocator():
    code = "import sys, harness; print(sorted({'pytest', 'allocator'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["_child", "_exec_runner", "_zygote"])
def test_child_side_modules_use_the_standard_library_only(module):
    path = os.path.join(os.path.dirname(harness.__file__), f"{module}.py")
    with open(path, encoding="utf-8") as source:
        imports = [
            line.split()[1].split(".")[0]
            for line in source
            if line.startswith(("import ", "from ")) and "__future__" not in line
        ]
    assert imports, path
    assert all(name in sys.stdlib_module_names for name in imports), imports
