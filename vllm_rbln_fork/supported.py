"""The supported pins (``pins.toml``) and which series serves a pin.

A project with ``pins.toml`` keeps one series per supported pin, ``series/<pin>``, each
exported against its own pin, in one ``patches/`` directory: a patch that is the same
at every pin is one file, ``patches/<name>``; a pin's own form of a patch is
``patches/<pin>/<name>``, and that pin's series names it so. Any other pin is built by
carrying the series of the newest supported pin older than it (the build's 3-way carry;
``source_pin_for``, the same choice as the review's), as a project without ``pins.toml``
carries its one ``series`` file.

A move to a new pin is marked in ``pins.toml`` before its series is used:
``[pin."X"] status = "moving"`` (no tier runs it by default; ``--pin X`` builds it from
``series/X``). A ``series/<pin>`` of a pin that ``pins.toml`` does not list (left from an
abandoned move) is an error, never silently preferred to carrying the newest series.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from packaging.version import InvalidVersion, Version

from . import log
from .errors import BadPin, SeriesError
from .files import read_toml
from .pins import Pin
from .project import Project
from .series import Series, read_series

Status = Literal["supported", "moving"]
STATUSES: tuple[Status, ...] = ("supported", "moving")


@dataclass(frozen=True)
class SupportedPin:
    pin: Pin
    test_lock: Path  # the vLLM test venv's requirements: pins whose dependencies agree share one
    engine_lock: Path | None = None  # the engine tier's constraints; None: see tests/engine/cannot-run.toml
    status: Status = "supported"  # "moving": a move under way, built from series/<pin>, not tested by default


def _lock(project: Project, entry: dict[str, object], key: str, pin: Pin, required: bool) -> Path | None:
    value = entry.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not (project.root / value).is_file():
        raise SeriesError(
            f'{project.pins_file.name}: [pin."{pin}"] needs {key} = "<file>" naming an existing '
            f"requirements lock (got {value!r})."
        )
    return project.root / value


def listed_pins(project: Project) -> tuple[SupportedPin, ...]:
    """Every pin of ``pins.toml`` (supported and moving), oldest first; empty without it."""
    path = project.pins_file
    if not path.exists():
        return ()
    data = read_toml(path, error=SeriesError)
    table = data.get("pin")
    if not isinstance(table, dict) or not table:
        raise SeriesError(
            f'{path.name} lists no pins; add a table [pin."0.31.0"] per supported vLLM release.'
        )
    parsed: list[tuple[Pin, Status, Path | None, Path | None]] = []
    for text, entry in table.items():
        try:
            pin = Pin.parse(text)
        except BadPin as exc:
            raise SeriesError(f"{path.name}: {exc}") from None
        entry = entry if isinstance(entry, dict) else {}
        status = entry.get("status", "supported")
        if status not in STATUSES:
            raise SeriesError(
                f'{path.name}: [pin."{pin}"] has status = {status!r}; use "supported" (the default) '
                'or "moving" (a move under way: docs/patch-workflow.md).'
            )
        test_lock = _lock(project, entry, "test-lock", pin, required=status == "supported")
        engine_lock = _lock(project, entry, "engine-lock", pin, required=False)
        parsed.append((pin, cast(Status, status), test_lock, engine_lock))
    parsed.sort(key=lambda p: p[0])
    newest = [lock for _, status, lock, _ in parsed if status == "supported" and lock is not None]
    if not newest:
        raise SeriesError(
            f'{path.name} lists no supported pin (each has status = "moving"); add one that the '
            "project supports."
        )
    # A moving pin without a test lock of its own is tested with the newest supported pin's.
    return tuple(
        SupportedPin(pin, lock or newest[-1], engine, status) for pin, status, lock, engine in parsed
    )


def supported_pins(project: Project) -> tuple[SupportedPin, ...]:
    """The supported pins of ``pins.toml``, oldest first; empty for a single-series project."""
    return tuple(s for s in listed_pins(project) if s.status == "supported")


def series_file_for(project: Project, pin: Pin | None = None) -> Path:
    """The series that builds ``pin``: its own (``series/<pin>``) when ``pins.toml`` lists the
    pin (supported, or ``status = "moving"``), else that of ``source_pin_for(pin)`` (the newest
    supported pin older than it), carried onto it. ``None``: the newest supported one. A
    ``series/<pin>`` of an unlisted pin is an error."""
    listed = listed_pins(project)
    if not listed:
        return project.series_file
    supported = [s for s in listed if s.status == "supported"]
    have = [s.pin for s in supported if (project.series_dir / str(s.pin)).is_file()]
    if not have:
        raise SeriesError(
            f"{project.pins_file.name} lists {', '.join(str(s.pin) for s in supported)}, but series/ "
            f"has none of them. Each supported pin needs its series, series/<pin>."
        )
    own = project.series_dir / str(pin)
    if pin is not None and own.is_file():
        if pin in {s.pin for s in listed}:
            return own
        raise SeriesError(
            f"series/{pin} exists, but {project.pins_file.name} does not list vllm {pin}: it is left "
            f'from a move. To go on with that move, add [pin."{pin}"] with status = "moving" to '
            f"{project.pins_file.name} (docs/patch-workflow.md); if the move was abandoned, delete "
            f"series/{pin} (and patches/{pin}/), and vllm {pin} is built by carrying the newest "
            f"supported series older than it, series/{source_pin_for(project, pin)}."
        )
    if pin is None:
        return project.series_dir / str(have[-1])
    return project.series_dir / str(source_pin_for(project, pin))


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


def project_spelling(project: Project, pin: Pin) -> Pin:
    """``pin`` as the project already spells it (``pins.toml``, ``series/``, ``pins.lock``,
    the release ledger): ``--pin 1.0.0`` or ``--pin 1`` is vllm 1.0 when the project knows
    1.0, and says so. PEP 440 holds them equal; one release must not get a second lock
    entry, ledger or wheel name. A pin the project does not know yet keeps its spelling, and
    the sdist's file name settles it (``source.check_sdist_name``)."""
    from .pins import PinsLock

    known = [s.pin for s in listed_pins(project)] + series_pins(project)
    known += [Pin(Version(name)) for name in PinsLock(project.pins_lock).pinned()]
    releases = read_toml(project.releases_file).get("release", [])
    for entry in releases if isinstance(releases, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("pin"), str):
            with contextlib.suppress(InvalidVersion):
                known.append(Pin(Version(entry["pin"])))
    for other in known:
        if other == pin and str(other) != str(pin):
            log.info(f"--pin {pin} is vllm {other} (PEP 440), as the project spells it; building {other}")
            return other
    return pin


def read_series_for(project: Project, pin: Pin | None = None) -> Series:
    return read_series(series_file_for(project, pin), project.patches_dir)


def source_pin_for(project: Project, target: Pin, source: Pin | None = None) -> Pin | None:
    """The pin whose series a build, a checkout or a review of ``target`` carries (one choice
    for all three): ``source`` if given (it must be supported), else the newest supported pin
    older than ``target``. With none older: ``target`` itself when it has a series of its own
    (the oldest supported pin reviews its own series: a newer pin's is never carried back onto
    it unasked), else the oldest supported pin, the nearest (carried backwards: the build says
    so)."""
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
    if older:
        return older[-1]
    if (project.series_dir / str(target)).is_file() and target in {s.pin for s in listed_pins(project)}:
        return target
    return (have or pins)[0]


def carry_note(series: Series, pin: Pin) -> str | None:
    """What a build or a checkout of ``pin`` says when ``series`` (``read_series_for``'s) is
    another pin's: which, and why that one. None when it is the pin's own."""
    if series.exported_against == pin:
        return None
    why = (
        "the newest supported pin older than it"
        if series.exported_against < pin
        else "the oldest supported pin, backwards: no supported pin is older"
    )
    source = series.exported_against
    return f"vllm {pin} has no series of its own (series/{pin}): carrying series/{source}, {why}"


def unused_patch_files(project: Project) -> list[Path]:
    """Files under patches/ that no series in series/ names (export removes them)."""
    named: set[Path] = set()
    for pin in series_pins(project):
        series = read_series(project.series_dir / str(pin), project.patches_dir)
        named |= {project.patches_dir / p.entry for p in series.patches}
    return sorted(p for p in project.patches_dir.rglob("*.patch") if p not in named)
