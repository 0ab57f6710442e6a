"""Locks between processes on one machine, that say when they wait."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import log


@contextmanager
def held(path: Path, waiting: str) -> Iterator[None]:
    """Hold the lock file ``path``; if another process holds it, say ``waiting`` and wait.

    ``fcntl.flock`` on the file, as filelock's Unix lock does, without importing filelock
    (a thirtieth of a second, on the path of every cache hit). The kernel drops the lock
    when the process ends, however it ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info(waiting)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
