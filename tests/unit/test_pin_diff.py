"""The behavioural diff of a pin move (tests/parity/pin_diff.py) on hand-made parity reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "parity"))

import pin_diff


def trace(name: str, steps: list[dict[str, Any]], **end: Any) -> dict[str, Any]:
    return {"workload": name, "steps": steps, "finished": ["a"], "unfinished": [], **end}


def report(path: Path, version: str, *traces: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"ours": {"vllm": version, "traces": list(traces)}, "vllm-rbln": {}}))
    return path


STEP = {"tokens": {"a": 16}, "prefill": ["a"], "decode": [], "free_blocks": 3}


def test_the_same_traces_at_both_pins_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = report(tmp_path / "a.json", "0.33.0+rbln.1", trace("w", [STEP, STEP]))
    b = report(tmp_path / "b.json", "0.34.0+rbln.1", trace("w", [STEP, STEP]))
    assert pin_diff.main(["pin_diff.py", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "w: the same, step by step" in out and "0 of 1 workloads differ" in out


def test_the_first_differing_step_and_the_end_state_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    later = {**STEP, "tokens": {"a": 8}, "free_blocks": 4}
    a = report(tmp_path / "a.json", "0.33.0+rbln.1", trace("w", [STEP, STEP]), trace("same", [STEP]))
    moved = trace("w", [STEP, later, STEP], blocks_not_free=1)
    b = report(tmp_path / "b.json", "0.34.0+rbln.1", moved, trace("same", [STEP]))
    assert pin_diff.main(["pin_diff.py", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "step 1 differs first:\n    free_blocks: 3 vs 4\n    tokens: {'a': 16} vs {'a': 8}" in out
    assert "steps: 2 vs 3" in out and "blocks_not_free: None vs 1" in out
    assert "same: the same, step by step" in out and "1 of 2 workloads differ" in out


def test_a_workload_at_one_pin_only_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = report(tmp_path / "a.json", "0.33.0+rbln.1", trace("w", [STEP]))
    b = report(tmp_path / "b.json", "0.34.0+rbln.1", trace("w", [STEP]), trace("new", [STEP]))
    assert pin_diff.main(["pin_diff.py", str(a), str(b)]) == 1
    assert "new: only at B" in capsys.readouterr().out
