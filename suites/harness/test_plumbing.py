"""The pure pieces: capture limits, the status decoder, the summary line, the public API."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import types

import pytest

import harness
from harness._capture import Stream, read_kept
from harness._child import SEAL_BYTES, SEAL_FINAL_AT
from harness._env import startup_variables
from harness._protocol import Raised, Seal, Status, decode_seal, decode_status
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
    exit_3 = decode_status(b'{"event": "exit", "code": 3}\n')
    assert exit_3 == Status(final="exit")  # the wait status says 3
    harness_error = decode_status(b'{"event": "harness_error", "message": "no module"}\n')
    assert harness_error == Status(harness_error="no module", final="harness_error")
    assert decode_status(b"") == decode_status(b"torn") == Status()
    raised = decode_status(
        b'{"event": "raised", "type": "m.E", "bases": ["ValueError", "Exception"], '
        b'"message": "x", "traceback": "T"}\n'
    ).raised
    assert raised == Raised("m.E", "x", "T", ("ValueError", "Exception"))
    assert raised.is_a("m.E") and raised.is_a("Exception") and not raised.is_a("KeyError")


def _seal(pid: bytes, verdict: bytes) -> bytes:
    page = bytearray(SEAL_BYTES)
    page[: len(pid)] = pid
    page[SEAL_FINAL_AT : SEAL_FINAL_AT + len(verdict)] = verdict
    return bytes(page)


def test_decode_seal():
    assert decode_seal(bytes(SEAL_BYTES)) == Seal()  # the child never got that far
    assert decode_seal(_seal(b"123\n", b"")) == Seal(pid=123)
    delivered = _seal(b"7\n", b'{"event": "returned", "delivered": true, "error": null}')
    assert decode_seal(delivered) == Seal(pid=7, final="returned")
    lost = b'{"event": "raised", "delivered": false, "error": "OSError: [Errno 27] File too large"}'
    assert decode_seal(_seal(b"7\n", lost)) == Seal(
        pid=7, final="raised", delivered=False, error="OSError: [Errno 27] File too large"
    )
    for foreign in (b"not json", b"[1, 2]"):
        seal = decode_seal(_seal(b"x\n", foreign))
        assert (seal.pid, seal.delivered) == (None, False)
        assert seal.error.startswith("unreadable seal")


def test_startup_variables():
    names = ["PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONMALLOC", "LD_PRELOAD", "MALLOC_ARENA_MAX"]
    names += ["GLIBC_TUNABLES", "PYTHONHASHSEED"]
    assert startup_variables([*names, "PYTHONBREAKPOINT", "DEVMEM_BACKEND", "OLD_LD_X"]) == names


def test_a_stream_keeps_its_head_and_tail_in_bounded_memory():
    stream = Stream("stderr", head=4, tail=6)
    try:
        for chunk in (b"HE", b"AD", b"-middle-" * 50, b"..TAIL"):
            stream.feed(chunk)
            assert len(stream.head) + len(stream.tail) <= 4 + 2 * 6 + len(chunk)
        assert stream.total == 4 + 400 + 6
        assert stream.cut_bytes == 400
        assert (stream.text(), stream.cut_at) == ("HEAD..TAIL", 4)  # only what it wrote
        assert stream.all_notes() == [
            "devmem-harness cut 400 bytes (0.0 MiB) of stderr: it wrote 410 bytes; kept the "
            "first 4 and the last 6"
        ]
        whole = Stream("stdout", head=4, tail=6)
        whole.feed(b"0123456789")
        assert (whole.text(), whole.cut_bytes, whole.cut_at) == ("0123456789", 0, None)
        assert whole.all_notes() == []
        whole.close()
    finally:
        stream.close()


def test_a_stream_drains_its_pipe_until_end_of_file():
    stream = Stream("stdout")
    try:
        os.write(stream.write_fd, b"one\n")
        stream.drain()
        assert (stream.text(), stream.eof) == ("one\n", False)
        stream.drain()  # nothing there: no wait
        stream.close_write()
        stream.drain()
        assert stream.eof and stream.last_data_at is not None
    finally:
        stream.close()


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
    if "MUTANT_UNDER_TEST" in os.environ:  # mutmut's copy of a mutated module imports mutmut
        imports = [name for name in imports if name != "mutmut"]
    assert all(name in sys.stdlib_module_names for name in imports), imports
