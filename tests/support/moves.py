"""A move made by hand on the synthetic upstream: 1.3 and 2.3 rewrote the backport's line
the same way (GATE_1_3), so carrying the 1.0 series onto either meets the same conflict."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from vllm_rbln_fork.errors import PatchDoesNotApply
from vllm_rbln_fork.gitrepo import Repo
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.workflow import continue_carry

CONFLICT = re.compile(r"<<<<<<< [^\n]*\n.*?>>>>>>> [^\n]*\n", re.S)
RESOLVED = "    needed = 2 * prompt_tokens + 1\n"


def per_pin_layout(fork: Any, pins_toml: str) -> None:
    """Turn the fork's one series (exported on 1.0) into the per-pin layout: series/1.0, a test
    lock, and ``pins_toml`` as the project's pins.toml."""
    root = fork.project.root
    series = fork.project.series_file.read_text()
    fork.project.series_file.unlink()
    (root / "series").mkdir()
    (root / "series" / "1.0").write_text(series)
    (root / "test.lock").write_text("pytest\n")
    (root / "pins.toml").write_text(pins_toml)


def resolve_by_hand(tree: Path) -> None:
    gate = tree / "vllm/core/gate.py"
    gate.write_text(CONFLICT.sub(RESOLVED, gate.read_text()))
    Repo(tree, bare=False).run("add", "-f", "vllm/core/gate.py", cwd=tree, in_work_tree=True)


def move_by_hand(fork: Any, pin: str) -> Path:
    """The move a maintainer makes: build stops at the conflict, resolve, continue."""
    with pytest.raises(PatchDoesNotApply):
        build(Pin.parse(pin), fork.spec(), fork.project)
    tree = fork.project.work_dir / f"conflict-v{pin}"
    resolve_by_hand(tree)
    assert not continue_carry(tree).stopped
    return tree
