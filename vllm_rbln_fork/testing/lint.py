"""``python build.py lint``: the project's static checks, as CI, reviewers and the pre-commit
hooks run them (``.pre-commit-config.yaml`` has one hook per check, each
``python build.py lint --only <id>``; tests/tooling/test_forge.py holds the two together).

build.py installs requirements/dev.lock (ruff, mypy) for this command.
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

from .. import log, proc
from ..paths import PROJECT_ROOT


class Check(NamedTuple):
    id: str  # the --only name, and the pre-commit hook's id
    name: str
    args: tuple[str, ...]  # after the tool env's python


CHECKS: tuple[Check, ...] = (
    Check("ruff-check", "ruff check", ("-m", "ruff", "check", ".")),
    Check("ruff-format", "ruff format --check", ("-m", "ruff", "format", "--check", ".")),
    Check("mypy", "mypy vllm_rbln_fork", ("-m", "mypy", "vllm_rbln_fork")),
    Check("series", "series lint", ("-m", "vllm_rbln_fork.testing.series_lint")),
)


def run_lint(argv: list[str]) -> int:
    """Run every check (all of them, even after a failure); exit 1 if any failed."""
    parser = argparse.ArgumentParser(
        prog="build.py lint",
        description="ruff check, ruff format --check, mypy and the series lint, as CI and the "
        "pre-commit hooks run them.",
    )
    parser.add_argument(
        "--only", action="append", choices=[c.id for c in CHECKS], help="run only this check (repeatable)"
    )
    args = parser.parse_args(argv)
    failed = []
    for check in CHECKS:
        if args.only and check.id not in args.only:
            continue
        with log.phase(check.name):
            if proc.stream([sys.executable, *check.args], cwd=PROJECT_ROOT) != 0:
                failed.append(check.name)
    if failed:
        log.warn("failed: " + ", ".join(failed))
        return 1
    return 0
