"""AllocatorConfig: the DEVMEM_* knobs, the cap parser and its warning (DESIGN 2.1)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys

import pytest

from allocator import AllocatorConfig, ConfigError, parse_cache_cap

WARNING = (
    "devmem: ignoring DEVMEM_CACHE_CAP_BYTES={!r}: expected an unsigned decimal byte count;"
    " the cache stays unbounded"
)


@pytest.mark.parametrize(
    ("value", "cap"),
    [
        (None, 0),
        ("", 0),
        ("0", 0),
        ("1", 1),
        ("1048576", 1048576),
        ("007", 7),
        (str(2**64 - 1), 2**64 - 1),
    ],
)
def test_cap_accepts_plain_decimal_digits(value, cap):
    assert parse_cache_cap(value) == (cap, None)


@pytest.mark.parametrize(
    "value",
    [
        "1MiB",
        "-1",
        "0x10",
        "9" * 26,
        str(2**64),
        " 1024",
        "1024 ",
        "10 24",
        "+5",
        "1e6",
        "1.5",
        "\u0661\u0662",  # Arabic-Indic digits: str.isdigit() says yes, the parser says no
    ],
)
def test_malformed_cap_warns_with_the_exact_line_and_stays_unbounded(value):
    assert parse_cache_cap(value) == (0, WARNING.format(value))


def test_from_env_reads_every_knob():
    config = AllocatorConfig.from_env(
        {
            "DEVMEM_BACKEND": "sim",
            "DEVMEM_CACHE_CAP_BYTES": "4096",
            "DEVMEM_ARENA_DEBUG": "raise",
            "DEVMEM_SIM_CAPACITY_BYTES": "1048576",
            "DEVMEM_SIM_LATENCY_US": "25",
            "DEVMEM_HISTORY": "stacks",
        }
    )
    assert config == AllocatorConfig(
        backend="sim",
        cache_cap_bytes=4096,
        arena_debug="raise",
        sim_capacity_bytes=1048576,
        sim_latency_us=25,
        history="stacks",
    )


def test_from_env_defaults_when_nothing_is_set():
    assert AllocatorConfig.from_env({}) == AllocatorConfig()
    assert AllocatorConfig() == AllocatorConfig(
        backend="cpu",
        cache_cap_bytes=0,
        arena_debug="off",
        sim_capacity_bytes=4 << 30,
        sim_latency_us=0,
        history="off",
    )


@pytest.mark.parametrize(
    ("value", "mode"),
    [("", "off"), ("0", "off"), ("1", "abort"), ("yes", "abort"), ("raise", "raise")],
)
def test_arena_debug_values(value, mode):
    assert AllocatorConfig.from_env({"DEVMEM_ARENA_DEBUG": value}).arena_debug == mode


def test_malformed_cap_in_env_calls_warn_once_and_is_unbounded(capsys):
    lines = []
    config = AllocatorConfig.from_env({"DEVMEM_CACHE_CAP_BYTES": "1MiB"}, warn=lines.append)
    assert config.cache_cap_bytes == 0
    assert lines == [WARNING.format("1MiB")]
    AllocatorConfig.from_env({"DEVMEM_CACHE_CAP_BYTES": "-1"})
    assert capsys.readouterr().err == WARNING.format("-1") + "\n"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEVMEM_BACKEND", "gpu"),
        ("DEVMEM_SIM_CAPACITY_BYTES", "4GiB"),
        ("DEVMEM_SIM_CAPACITY_BYTES", "0"),
        ("DEVMEM_SIM_LATENCY_US", "-3"),
        ("DEVMEM_SIM_LATENCY_US", "1.5"),
    ],
)
def test_unusable_env_values_raise_naming_the_variable(name, value):
    with pytest.raises(ConfigError, match=f"^{name}={value!r}") as info:
        AllocatorConfig.from_env({name: value})
    assert isinstance(info.value, ValueError)  # what except ValueError code expects
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args


def test_a_bad_variable_fails_the_first_call_in_a_few_lines(tmp_path):
    # Issue 14: the import succeeds and the first call used to raise a 20-line traceback
    # through the configuration's internals. Now: the caller's line, the module-level
    # function, and the one line that names the variable, the value and what is accepted.
    script = tmp_path / "first_call.py"
    script.write_text("import allocator\n\nallocator.full(4, 1.0)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVMEM_")}
    result = subprocess.run(
        [sys.executable, str(script)],
        env={**env, "DEVMEM_BACKEND": "gpu"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = result.stderr.splitlines()
    assert result.returncode == 1
    assert (
        lines[-1] == "allocator.ConfigError: DEVMEM_BACKEND='gpu': expected one of cpu, sim, cuda"
    )
    assert 'first_call.py", line 3' in result.stderr
    assert "_config.py" not in result.stderr and "_per_process.py" not in result.stderr
    assert len(lines) <= 10, result.stderr  # it was 20


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("backend", "tpu", ValueError),
        ("arena_debug", "1", ValueError),
        ("cache_cap_bytes", -1, ValueError),
        ("cache_cap_bytes", 2**64, ValueError),
        ("cache_cap_bytes", 1.5, TypeError),
        ("cache_cap_bytes", True, TypeError),
        ("sim_capacity_bytes", 0, ValueError),
        ("sim_latency_us", -1, ValueError),
    ],
)
def test_config_fields_are_validated(field, value, error):
    with pytest.raises(error, match=field):
        dataclasses.replace(AllocatorConfig(), **{field: value})


@pytest.mark.parametrize(
    ("name", "value", "field", "parsed"),
    [
        ("DEVMEM_SIM_LATENCY_US", "", "sim_latency_us", 0),
        ("DEVMEM_SIM_LATENCY_US", "0", "sim_latency_us", 0),
        ("DEVMEM_SIM_LATENCY_US", str(2**64 - 1), "sim_latency_us", 2**64 - 1),
        ("DEVMEM_SIM_CAPACITY_BYTES", "", "sim_capacity_bytes", 4 << 30),
        ("DEVMEM_SIM_CAPACITY_BYTES", "1", "sim_capacity_bytes", 1),
        ("DEVMEM_SIM_CAPACITY_BYTES", str(2**64 - 1), "sim_capacity_bytes", 2**64 - 1),
    ],
)
def test_env_boundaries_are_accepted(name, value, field, parsed):
    assert getattr(AllocatorConfig.from_env({name: value}), field) == parsed


@pytest.mark.parametrize("field", ["cache_cap_bytes", "sim_capacity_bytes", "sim_latency_us"])
def test_a_field_of_2_to_the_64_minus_1_is_accepted_and_one_more_is_not(field):
    assert getattr(dataclasses.replace(AllocatorConfig(), **{field: 2**64 - 1}), field) == 2**64 - 1
    with pytest.raises(ValueError, match=rf"^{field}=18446744073709551616: expected"):
        dataclasses.replace(AllocatorConfig(), **{field: 2**64})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("backend", "tpu", "backend='tpu': expected one of cpu, sim, cuda"),
        ("arena_debug", "1", "arena_debug='1': expected one of off, abort, raise"),
        ("cache_cap_bytes", -1, "cache_cap_bytes=-1: expected 0 <= cache_cap_bytes <= 2**64-1"),
        (
            "sim_capacity_bytes",
            0,
            "sim_capacity_bytes=0: expected 1 <= sim_capacity_bytes <= 2**64-1",
        ),
        ("sim_latency_us", -1, "sim_latency_us=-1: expected 0 <= sim_latency_us <= 2**64-1"),
        ("sim_latency_us", 1.5, "sim_latency_us must be an int, got float 1.5"),
    ],
)
def test_field_errors_give_the_exact_accepted_values(field, value, message):
    with pytest.raises((ValueError, TypeError)) as info:
        dataclasses.replace(AllocatorConfig(), **{field: value})
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEVMEM_BACKEND", "gpu", "DEVMEM_BACKEND='gpu': expected one of cpu, sim, cuda"),
        (
            "DEVMEM_SIM_CAPACITY_BYTES",
            "0",
            "DEVMEM_SIM_CAPACITY_BYTES='0': expected a decimal integer >= 1",
        ),
        (
            "DEVMEM_SIM_LATENCY_US",
            "-3",
            "DEVMEM_SIM_LATENCY_US='-3': expected a decimal integer >= 0",
        ),
    ],
)
def test_env_errors_give_the_exact_accepted_values(name, value, message):
    with pytest.raises(ValueError) as info:
        AllocatorConfig.from_env({name: value})
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "mode"), [("", "off"), ("0", "off"), ("1", "on"), ("stacks", "stacks")]
)
def test_history_values(value, mode):
    assert AllocatorConfig.from_env({"DEVMEM_HISTORY": value}).history == mode


@pytest.mark.parametrize("value", ["yes", "2", "STACKS", " 1", "on"])
def test_an_unusable_history_value_is_an_error_naming_the_variable(value):
    with pytest.raises(ValueError) as info:
        AllocatorConfig.from_env({"DEVMEM_HISTORY": value})
    assert str(info.value) == f"DEVMEM_HISTORY={value!r}: expected 0, 1 or stacks"


def test_the_history_field_is_validated():
    with pytest.raises(ValueError) as info:
        AllocatorConfig(history="all")
    assert str(info.value) == "history='all': expected one of off, on, stacks"
