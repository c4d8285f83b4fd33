"""The child side's helpers for taking the test process's state (``harness._child``), called
in this process: the warning categories and filters a child sets, the limits a note names, and
the parent's ``__main__`` a forkserver or exec child loads.

A child runs them where the test process's state differs from its own, which a fork-style
child's never does: these reach them where mutmut's map sees them (a whole run of each style
is in ``test_same_state.py``).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import types
import warnings

import pytest

import harness
from harness import _child
from suites.harness import _state_targets

HERE = "suites.harness._state_targets"


@pytest.mark.parametrize(
    "limit, text",
    [
        ((-1, -1), "(unlimited, unlimited)"),
        ((200, 4096), "(200, 4096)"),
        ((0, -1), "(0, unlimited)"),
    ],
)
def test_a_limit_is_written_with_unlimited_for_minus_one(limit, text):
    assert _child._limit_text(limit) == text


@pytest.mark.parametrize(
    "name, found",
    [
        ("UserWarning", UserWarning),
        ("builtins.DeprecationWarning", DeprecationWarning),
        (f"{HERE}.Outer.NestedWarning", _state_targets.Outer.NestedWarning),  # longest module
        ("warnings.WarningMessage", None),  # a class, not a warning category
        ("ValueError", None),
        ("NoSuchWarning", None),
        (f"{HERE}.Outer.NoSuchWarning", None),
        ("no_such_module_of_devmem.SomeWarning", None),
        ("pytest.PytestWarning", pytest.PytestWarning),  # imported here: found
    ],
)
def test_a_warning_category_is_found_by_its_dotted_name(name, found):
    assert _child._warning_category(name) is found


def test_a_category_of_a_package_the_child_never_imports_is_not_imported_for_it(monkeypatch):
    # importable, but a child would import it only for the filter: found once imported
    import suites.harness

    monkeypatch.setattr(_child, "NOT_IN_CHILD", ("suites",))
    with monkeypatch.context() as unimported:  # as if never imported, nor its package's attribute
        unimported.delitem(sys.modules, HERE)
        unimported.delattr(suites.harness, "_state_targets")
        assert _child._warning_category(f"{HERE}.Outer.NestedWarning") is None
        assert HERE not in sys.modules
    # imported: the nested class is found under the longest prefix that is imported
    assert (
        _child._warning_category(f"{HERE}.Outer.NestedWarning")
        is _state_targets.Outer.NestedWarning
    )


def test_a_category_of_main_is_looked_up_in_the_parent_s_script_loaded_as_mp_main(monkeypatch):
    script = types.ModuleType(_child.MP_MAIN)
    script.ScriptWarning = type("ScriptWarning", (UserWarning,), {})
    assert _child._warning_category("__main__.ScriptWarning") is None  # pytest's __main__
    monkeypatch.setitem(sys.modules, _child.MP_MAIN, script)
    assert _child._warning_category("__main__.ScriptWarning") is script.ScriptWarning
    # without a script loaded as __mp_main__: the process's own __main__ (a fork child's)
    own = types.ModuleType("__main__")
    own.MainWarning = type("MainWarning", (UserWarning,), {})
    monkeypatch.delitem(sys.modules, _child.MP_MAIN)
    monkeypatch.setitem(sys.modules, "__main__", own)
    assert _child._warning_category("__main__.MainWarning") is own.MainWarning


def test_a_category_of_a_module_nobody_imported_yet_is_imported_for_it(package):
    (package / "devmem_cat_pkg").mkdir()
    (package / "devmem_cat_pkg" / "__init__.py").write_text("")
    (package / "devmem_cat_pkg" / "kinds.py").write_text(
        "class KindWarning(UserWarning):\n    pass\n"
    )
    importlib.invalidate_caches()

    found = _child._warning_category("devmem_cat_pkg.kinds.KindWarning")

    assert found is sys.modules["devmem_cat_pkg.kinds"].KindWarning


def _filters() -> list[tuple]:
    return [
        (action, message and message.pattern, category, module and module.pattern, lineno)
        for action, message, category, module, lineno in warnings.filters
    ]


def test_warning_filters_replace_the_child_s_own_in_order():
    filters = [
        ["ignore", "a message", "UserWarning", "a.module", 3],
        ["error", None, f"{HERE}.Outer.NestedWarning", None, 0],
        ["always", "", "DeprecationWarning", "", 0],
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # the child's own: gone
        notes, complete = _child._apply_warning_filters(filters)
        assert _filters() == [
            ("ignore", "a message", UserWarning, "a.module", 3),
            ("error", None, _state_targets.Outer.NestedWarning, None, 0),
            ("always", None, DeprecationWarning, None, 0),
        ]
    assert (notes, complete) == ([], True)


def test_a_filter_whose_category_is_not_found_is_left_out_and_named_in_a_note():
    filters = [
        ["error", "", "no_such_module_of_devmem.AWarning", "", 0],
        ["ignore", "", "UserWarning", "", 0],
        ["default", "", "_pytest.no_such_module.BWarning", "", 0],  # never imported: no note
        ["always", "", "ValueError", "", 0],
    ]
    with warnings.catch_warnings():
        notes, complete = _child._apply_warning_filters(filters)
        assert _filters() == [("ignore", None, UserWarning, None, 0)]
    assert notes == [
        "devmem-harness: the child could not set the test process's warning filters "
        "error::no_such_module_of_devmem.AWarning, always::ValueError: their categories "
        "could not be imported here"
    ]
    assert complete is False


def test_a_filter_left_out_for_a_package_the_child_never_imports_is_no_note():
    with warnings.catch_warnings():
        notes, complete = _child._apply_warning_filters(
            [["default", "", "_pytest.no_such_module.BWarning", "", 0]]
        )
        assert warnings.filters == []
    assert (notes, complete) == ([], False)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """``<tmp>/devmem_main_pkg/tool.py`` (a package's script) and ``<tmp>/loose.py``, with
    ``<tmp>`` on ``sys.path``; whatever imports them is forgotten afterwards."""
    root = tmp_path / "devmem_main_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "helper.py").write_text("")
    (root / "tool.py").write_text(  # a relative import: it needs its package
        "import sys\nfrom . import helper\nNAME = __name__\nARGV0 = sys.argv[0]\n"
    )
    (tmp_path / "loose.py").write_text("NAME = __name__\n")
    (tmp_path / "not-a-name").mkdir()
    (tmp_path / "not-a-name" / "tool.py").write_text("NAME = __name__\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run_module sets argv[0]
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    importlib.invalidate_caches()
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_the_name_a_script_was_run_by_with_python_m(package, monkeypatch):
    tool = str(package / "devmem_main_pkg" / "tool.py")
    assert _child._main_module_name(tool) == "devmem_main_pkg.tool"
    assert _child._main_module_name(str(package / "loose.py")) is None  # its folder is on the path
    assert _child._main_module_name(str(package / "not-a-name" / "tool.py")) is None
    assert _child._main_module_name("/nowhere/devmem_main_pkg/tool.py") is None  # another file
    ghost = str(package / "devmem_main_pkg" / "ghost.py")
    assert _child._main_module_name(ghost) is None  # no such module: imports as nothing
    elsewhere = package / "elsewhere"
    (elsewhere / "devmem_main_pkg").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(elsewhere / "devmem_main_pkg"), *sys.path])
    assert _child._main_module_name(tool) == "devmem_main_pkg.tool"  # the entry it is under
    monkeypatch.setattr(sys, "path", [str(package / "devmem_main_pkg"), *sys.path])
    assert _child._main_module_name(tool) is None  # run by its path: its folder comes first


def test_a_script_whose_dotted_name_imports_another_file_was_not_run_by_it(package, monkeypatch):
    # devmem_twin.tool is found first under another entry: that file, not this one
    for side in ("first", "second"):
        (package / side / "devmem_twin").mkdir(parents=True)
        (package / side / "devmem_twin" / "__init__.py").write_text("")
        (package / side / "devmem_twin" / "tool.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(package / "first"), str(package / "second")])
    assert _child._main_module_name(str(package / "second" / "devmem_twin" / "tool.py")) is None
    assert _child._main_module_name(str(package / "first" / "devmem_twin" / "tool.py")) == (
        "devmem_twin.tool"
    )


def test_an_entry_whose_dotted_name_cannot_be_looked_up_is_passed_over(package, monkeypatch):
    # under <tmp> the script's name is devmem_shadow.devmem_deep.tool, and devmem_shadow is
    # the module devmem_shadow.py (no package: the look-up raises); under <tmp>/devmem_shadow
    # it is devmem_deep.tool, the name it was run by
    (package / "devmem_shadow.py").write_text("")
    (package / "devmem_shadow" / "devmem_deep").mkdir(parents=True)
    (package / "devmem_shadow" / "devmem_deep" / "__init__.py").write_text("")
    tool = package / "devmem_shadow" / "devmem_deep" / "tool.py"
    tool.write_text("")
    monkeypatch.setattr(sys, "path", [str(package), str(package / "devmem_shadow")])
    with pytest.raises(ImportError):
        importlib.util.find_spec("devmem_shadow.devmem_deep.tool")

    assert _child._main_module_name(str(tool)) == "devmem_deep.tool"


@pytest.mark.parametrize("by", ["path", "name"])
def test_the_parent_s_script_is_loaded_as_mp_main_and_is_main(package, by):
    path = package / ("loose.py" if by == "path" else "devmem_main_pkg/tool.py")

    module = _child._load_main(str(path))

    assert module.NAME == _child.MP_MAIN
    assert sys.modules[_child.MP_MAIN] is module and sys.modules["__main__"] is module
    assert module.__name__ == _child.MP_MAIN
    if by == "name":  # run as python -m runs it: in its package, argv[0] its file
        assert module.__package__ == "devmem_main_pkg"
        argv0 = module.ARGV0
        assert argv0 == str(path)


def test_a_parent_s_script_that_cannot_be_loaded_says_from_where(package):
    with pytest.raises(ImportError, match="cannot load the parent's __main__ from '/nowhere"):
        _child._load_main("/nowhere/script.txt")


@pytest.mark.parametrize("save", [True, False], ids=["save", "no-save"])
@pytest.mark.parametrize("restart", [True, False], ids=["restart", "keep"])
def test_a_fork_child_measures_coverage_as_its_orders_say(tmp_path, restart, save):
    # a test process measuring without coverage.py's fork and _exit support (pytest started
    # in a subdirectory): the child stops the measurement it inherited (whose data is the test
    # process's) and measures into a file of its own, saved when it leaves
    pytest.importorskip("coverage")
    data_file = str(tmp_path / "child.cov")

    outcome = harness.run_child(
        "suites.harness._state_targets:restart_coverage",
        data_file,
        restart,
        save,
        style="fork",
        timeout=60,
    )

    seen = outcome.assert_clean().returned
    assert seen == {
        "measures": data_file if restart else "before",
        "before_saves_itself": not restart,
        "saved_at_exit": save,
    }
    saved = sorted(path.name for path in tmp_path.iterdir())
    if restart and save:
        assert len(saved) == 1 and saved[0].startswith("child.cov.")  # a name per process
    else:
        assert saved == (["child.cov-before"] if save else [])


@pytest.mark.parametrize("orders", [None, {"config": "[run]", "restart": True, "save": False}])
def test_a_fork_child_takes_the_coverage_orders_the_harness_gives_it(monkeypatch, orders):
    # harness._fork puts fork_orders() in the request ("coverage") only when there are some;
    # the child restarts coverage with exactly those, and with nothing when there are none
    monkeypatch.setattr("harness._fork.fork_orders", lambda: orders)
    monkeypatch.setattr(_child, "_restart_coverage", _state_targets.take_orders)

    outcome = harness.run_child(
        "suites.harness._state_targets:orders_taken", style="fork", timeout=60
    )

    assert outcome.assert_clean().returned == ([] if orders is None else [orders])


def _taken(
    taken: dict, filters: bool = True, lower_nofile: bool = False, refuse_first: bool = False
) -> dict:
    """:func:`suites.harness._state_targets.take_state` in a fork child (its flags by name
    here: a target's arguments travel by position)."""
    return (
        harness.run_child(
            "suites.harness._state_targets:take_state",
            taken,
            filters,
            lower_nofile,
            refuse_first,
            style="fork",
            timeout=60,
        )
        .assert_clean()
        .returned
    )


def test_a_child_takes_each_part_of_the_state_it_is_given():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    digits = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else None
    taken = {
        "environ": {
            "DEVMEM_TAKE_SET": "taken",
            "DEVMEM_TAKE_UNSET": None,
            "DEVMEM_TAKE_NEVER_SET": None,  # unset already: nothing to do
        },
        "umask": 0o027,
        "rlimits": {
            "RLIMIT_NO_SUCH_LIMIT": [1, 1],  # not on this system: skipped, the rest taken
            "RLIMIT_NOFILE": [soft - 1, hard],  # a lower soft limit: always allowed
            "RLIMIT_STACK": list(resource.getrlimit(resource.RLIMIT_STACK)),  # the same
        },
        "nice": min(nice + 1, 19),  # a higher nice value: always allowed
        "warnings": [["error", "", "UserWarning", "", 0]],
        "dont_write_bytecode": not sys.dont_write_bytecode,
        "int_max_str_digits": 5000 if digits != 5000 else 6000,
    }

    seen = _taken(taken)

    state = seen["state"]
    assert seen["notes"] == []
    assert seen["env"] == ["taken", None]
    assert state["umask"] == 0o027
    assert state["rlimits"]["RLIMIT_NOFILE"] == [soft - 1, hard]
    assert state["nice"] == taken["nice"]
    assert state["filters"] == [["error", "UserWarning", None]]
    assert state["dont_write_bytecode"] is taken["dont_write_bytecode"]
    if digits is not None:  # Python 3.11 and later
        assert state["int_max_str_digits"] == taken["int_max_str_digits"]


def test_a_child_given_no_state_keeps_its_own_and_filters_false_keeps_its_filters():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        own = _taken({})["state"]
        kept = _taken({"warnings": [["error", "", "UserWarning", "", 0]]}, filters=False)

    assert kept["notes"] == []
    assert kept["state"] == own
    assert own["filters"][0] == ["ignore", "ResourceWarning", None]


@pytest.mark.parametrize("wanted", ["too-many", "unlimited", "hard-too-many"])
def test_a_limit_the_child_cannot_take_is_a_note_naming_what_it_runs_with(wanted):
    # no process may raise RLIMIT_NOFILE above fs.nr_open, root neither: the child takes as
    # much as it may (the soft limit asked for, at most its own hard limit) and says so
    with open("/proc/sys/fs/nr_open") as file:
        too_many = int(file.read()) + 1
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit, got, text = {
        "too-many": ([too_many, too_many], [hard, hard], f"({too_many}, {too_many})"),
        "unlimited": ([-1, -1], [hard, hard], "(unlimited, unlimited)"),
        "hard-too-many": ([hard - 1, too_many], [hard - 1, hard], f"({hard - 1}, {too_many})"),
    }[wanted]

    seen = _taken({"rlimits": {"RLIMIT_NOFILE": limit}}, lower_nofile=True)

    assert seen["nofile_before"][0] < hard - 1
    assert seen["state"]["rlimits"]["RLIMIT_NOFILE"] == got
    (note,) = seen["notes"]
    assert note.startswith(
        f"devmem-harness: the child could not take the test process's RLIMIT_NOFILE {text} ("
    )
    assert note.endswith(f"); it runs with ({got[0]}, {got[1]})")


def test_a_coverage_restart_that_fails_leaves_the_child_unmeasured_and_clean():
    # a configuration coverage.py cannot read: the child runs on, unmeasured, and leaves clean
    pytest.importorskip("coverage")
    outcome = harness.run_child(
        "suites.harness._state_targets:restart_coverage_with", "not a configuration", style="fork"
    )

    assert outcome.assert_clean().returned is None


def test_a_limit_refused_under_an_unlimited_hard_limit_takes_the_soft_one():
    # an unprivileged child refused a raise (here the first setrlimit is made to fail, as it
    # would): under an unlimited hard limit it takes the test process's soft limit as it is
    data = resource.getrlimit(resource.RLIMIT_DATA)
    if data[1] != resource.RLIM_INFINITY:
        pytest.skip(f"RLIMIT_DATA's hard limit here is {data[1]}, not unlimited")

    seen = _taken({"rlimits": {"RLIMIT_DATA": [1 << 40, -1]}}, refuse_first=True)

    text = "(1099511627776, unlimited)"
    assert seen["notes"] == [
        f"devmem-harness: the child could not take the test process's RLIMIT_DATA {text} "
        f"(not allowed to raise maximum limit); it runs with {text}"
    ]


@pytest.mark.parametrize("refused", [False, True], ids=["taken", "refused"])
def test_the_nice_value_is_this_process_s_own_and_set_for_it(monkeypatch, refused):
    # the nice value read and set is this process's (who=0), never another's
    calls = []

    def getpriority(which: int, who: int) -> int:
        assert which == os.PRIO_PROCESS
        return 7 if who == 0 else -3

    def setpriority(which: int, who: int, value: int) -> None:
        calls.append((which, who, value))
        if refused:
            raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "getpriority", getpriority)
    monkeypatch.setattr(os, "setpriority", setpriority)

    notes = _child.apply_state({"nice": 5})

    assert calls == [(os.PRIO_PROCESS, 0, 5)]
    assert notes == (
        [
            "devmem-harness: the child could not take the test process's nice value 5 "
            "(Operation not permitted: lowering it takes a privilege); it runs at 7"
        ]
        if refused
        else []
    )
    assert _child.apply_state({"nice": 7}) == [] and len(calls) == 1  # its own: nothing to set


def test_apply_state_sets_the_warning_filters_unless_told_not_to():
    filters = [["error", "", "UserWarning", "", 0]]
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("ignore")
        assert _child.apply_state({"warnings": filters}, filters=False) == []
        assert _filters() == [("ignore", None, Warning, None, 0)]
        assert _child.apply_state({"warnings": filters}) == []  # by default it does
        assert _filters() == [("error", None, UserWarning, None, 0)]
