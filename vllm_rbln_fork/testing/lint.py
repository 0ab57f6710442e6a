"""``python build.py lint``: the project's static checks, as CI and reviewers run them.

build.py installs requirements/dev.lock (ruff, mypy) for this command.
"""

from __future__ import annotations

import argparse
import sys

from .. import log, proc
from ..paths import PROJECT_ROOT

CHECKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ruff check", ("-m", "ruff", "check", ".")),
    ("ruff format --check", ("-m", "ruff", "format", "--check", ".")),
    ("mypy vllm_rbln_fork", ("-m", "mypy", "vllm_rbln_fork")),
)


def run_lint(argv: list[str]) -> int:
    """Run every check (all of them, even after a failure); exit 1 if any failed."""
    argparse.ArgumentParser(
        prog="build.py lint", description="ruff check, ruff format --check and mypy, as CI runs them."
    ).parse_args(argv)
    failed = []
    for name, args in CHECKS:
        with log.phase(name):
            if proc.stream([sys.executable, *args], cwd=PROJECT_ROOT) != 0:
                failed.append(name)
    if failed:
        log.warn("failed: " + ", ".join(failed))
        return 1
    return 0
