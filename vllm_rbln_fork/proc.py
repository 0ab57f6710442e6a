"""The one gateway for subprocesses: captured output, and a clear error on failure."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import FailedProcess


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    hint: str = "",
    input: str | None = None,
) -> str:
    """Run ``cmd`` (never through a shell), return its stdout+stderr, raise on failure."""
    args = [str(c) for c in cmd]
    result = subprocess.run(
        args,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        input=input,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise FailedProcess(args, result.returncode, result.stdout, hint)
    return result.stdout


def stream(
    cmd: Sequence[str | os.PathLike[str]], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> int:
    """Run ``cmd`` with its output going straight to the terminal; return its exit status.

    For long runs a user watches (test suites), where capturing would hide progress.
    """
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=dict(env) if env is not None else None, check=False
    ).returncode
