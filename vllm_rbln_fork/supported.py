"""The supported pins (``pins.toml``) and which series serves a pin.

A project with ``pins.toml`` keeps one series per supported pin, ``series/<pin>``, each
exported against its own pin, in one ``patches/`` directory: a patch that is the same
at every pin is one file, ``patches/<name>``; a pin's own form of a patch is
``patches/<pin>/<name>``, and that pin's series names it so. Any other pin is built by
carrying the newest supported series (the build's 3-way carry), as a project without
``pins.toml`` carries its one ``series`` file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import log
from .errors import BadPin, SeriesError
from .pins import Pin
from .project import Project
from .series import Series, read_series


@dataclass(frozen=True)
class SupportedPin:
    pin: Pin
    test_lock: Path  # the vLLM test venv's requirements: pins whose dependencies agree share one


def supported_pins(project: Project) -> tuple[SupportedPin, ...]:
    """The pins of ``pins.toml``, oldest first; empty for a single-series project."""
    path = project.pins_file
    if not path.exists():
        return ()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SeriesError(f"{path.name} is not valid TOML: {exc}") from None
    table = data.get("pin")
    if not isinstance(table, dict) or not table:
        raise SeriesError(
            f'{path.name} lists no pins; add a table [pin."0.31.0"] per supported vLLM release.'
        )
    result = []
    for text, entry in table.items():
        try:
            pin = Pin.parse(text)
        except BadPin as exc:
            raise SeriesError(f"{path.name}: {exc}") from None
        lock = entry.get("test-lock") if isinstance(entry, dict) else None
        if not isinstance(lock, str) or not (project.root / lock).is_file():
            raise SeriesError(
                f'{path.name}: [pin."{pin}"] needs test-lock = "<file>" naming an existing requirements '
                f"lock for its test venv (got {lock!r})."
            )
        result.append(SupportedPin(pin, project.root / lock))
    return tuple(sorted(result, key=lambda s: s.pin))


def series_file_for(project: Project, pin: Pin | None = None) -> Path:
    """The series that builds ``pin``: its own (``series/<pin>``, also for a pin being moved
    to and not yet in ``pins.toml``), else the newest supported one, carried onto it.
    ``None``: the newest supported one."""
    supported = supported_pins(project)
    if not supported:
        return project.series_file
    if pin is not None and (project.series_dir / str(pin)).is_file():
        return project.series_dir / str(pin)
    have = [s.pin for s in supported if (project.series_dir / str(s.pin)).is_file()]
    if not have:
        raise SeriesError(
            f"{project.pins_file.name} lists {', '.join(str(s.pin) for s in supported)}, but series/ "
            f"has none of them. Each supported pin needs its series, series/<pin>."
        )
    return project.series_dir / str(have[-1])


def series_pins(project: Project) -> list[Pin]:
    """Every pin with a series of its own in series/: the supported ones and any being moved to."""
    if not project.series_dir.is_dir():
        return []
    pins = []
    for path in project.series_dir.iterdir():
        if not path.is_file():
            continue
        try:
            pins.append(Pin.parse(path.name))
        except BadPin:  # an editor's backup or a note: not a series, and no reason to fail
            log.warn(f"series/{path.name} is not named after a vLLM release; ignored")
    return sorted(pins)


def read_series_for(project: Project, pin: Pin | None = None) -> Series:
    return read_series(series_file_for(project, pin), project.patches_dir)


def source_pin_for(project: Project, target: Pin, source: Pin | None = None) -> Pin | None:
    """The pin whose series a move to ``target`` carries: ``source`` if given (it must be
    supported), else the newest supported pin older than ``target``, else the newest."""
    pins = [s.pin for s in supported_pins(project)]
    if not pins:
        return None
    if source is not None:
        if source not in pins:
            raise SeriesError(
                f"--from {source}: not a supported pin ({', '.join(map(str, pins))} in "
                f"{project.pins_file.name})."
            )
        return source
    have = [p for p in pins if (project.series_dir / str(p)).is_file()]
    older = [p for p in have if p < target]
    return older[-1] if older else (have or pins)[-1]


def unused_patch_files(project: Project) -> list[Path]:
    """Files under patches/ that no series in series/ names (export removes them)."""
    named: set[Path] = set()
    for pin in series_pins(project):
        series = read_series(project.series_dir / str(pin), project.patches_dir)
        named |= {project.patches_dir / p.entry for p in series.patches}
    return sorted(p for p in project.patches_dir.rglob("*.patch") if p not in named)
