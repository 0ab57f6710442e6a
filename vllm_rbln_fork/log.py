"""Progress events, decoupled from how they are shown.

Library code calls ``step``/``info``/``warn``/``progress``; the CLI installs a
reporter that prints them (rich only for a progress bar), tests install one that records them. Every text
passes :func:`urls.redact` first: a password in a URL is never shown.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .urls import redact

Level = Literal["info", "warn"]


class Reporter(Protocol):
    def phase_start(self, name: str) -> None: ...
    def phase_end(self, name: str, seconds: float) -> None: ...
    def message(self, level: Level, text: str) -> None: ...
    def progress(self, task: str, done: int, total: int | None) -> None: ...


@dataclass
class RecordingReporter:
    """Keeps every event; the default, and what tests read."""

    events: list[tuple[str, str]] = field(default_factory=list)

    def phase_start(self, name: str) -> None:
        self.events.append(("phase", name))

    def phase_end(self, name: str, seconds: float) -> None:
        self.events.append(("phase-end", name))

    def message(self, level: Level, text: str) -> None:
        self.events.append((level, text))

    def progress(self, task: str, done: int, total: int | None) -> None:
        pass

    def messages(self, level: str) -> list[str]:
        return [text for kind, text in self.events if kind == level]


_reporter: ContextVar[Reporter | None] = ContextVar("reporter", default=None)
_fallback = RecordingReporter()


def set_reporter(reporter: Reporter) -> None:
    _reporter.set(reporter)


def get_reporter() -> Reporter:
    return _reporter.get() or _fallback


@contextmanager
def phase(name: str) -> Iterator[None]:
    """A named, timed stage of the work."""
    name = redact(name)
    reporter = get_reporter()
    reporter.phase_start(name)
    start = time.perf_counter()
    try:
        yield
    finally:
        reporter.phase_end(name, time.perf_counter() - start)


def info(text: str) -> None:
    get_reporter().message("info", redact(text))


def warn(text: str) -> None:
    get_reporter().message("warn", redact(text))


def progress(task: str, done: int, total: int | None) -> None:
    get_reporter().progress(redact(task), done, total)
