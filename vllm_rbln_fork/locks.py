"""Locks between processes on one machine, that say when they wait."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from . import log


@contextmanager
def held(path: Path, waiting: str) -> Iterator[None]:
    """Hold the lock file ``path``; if another process holds it, say ``waiting`` and wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        log.info(waiting)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
