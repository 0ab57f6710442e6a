"""The static folder index: files written once, sidecars, pages regenerated under a lock.

``DEST`` is either a folder, which becomes (or already is) a static index that any
web server can serve, or an ``http(s)://`` URL of an index server that accepts
uploads (twine's ``--repository-url``).

The static folder::

    DEST/
      simple/index.html              root page (PEP 503)
      simple/index.json              root page, PEP 691 JSON
      simple/<name>/index.html       project page: <a href="../../files/<file, + as %2B>#sha256=...">
                                     with data-requires-python, data-core-metadata and
                                     data-dist-info-metadata (PEP 658/714), data-yanked (PEP 592)
      simple/<name>/index.json       the same as PEP 691 JSON, api-version 1.1, with PEP 700
                                     "versions", "size" and "upload-time"
      files/<wheel>                  the wheels: written once, never overwritten, never deleted
      files/<wheel>.metadata         each wheel's core metadata (PEP 658), byte for byte
      .index-state/<wheel>.json      sidecar: upload time and yank state (nothing else)
      .index-state/lock              publishers and yank take it in turn

The files are the single source of truth: every publish and yank regenerates all
pages from ``files/`` and the sidecars, writing each changed page to a temporary file
and renaming it into place, so a reader sees the old page or the new one, and a page
never links a file that is not there yet. Pages are deterministic: re-publishing the
same wheel changes no byte in the folder.

Serving: ``simple/<name>/`` must serve ``index.html`` (every static server does). For
PEP 691 JSON, a server that can look at the ``Accept`` header serves ``index.json``
with ``Content-Type: application/vnd.pypi.simple.v1+json`` when the client asks for
it; a server that cannot (S3) just serves the HTML, which every installer reads.
Files ending in ``.metadata`` can be served as ``application/octet-stream``.

Immutability: a file name, once published, always means the same bytes. Publishing the
same bytes again is a no-op; different bytes under a published name raise
:class:`IndexConflict` and touch nothing. Withdraw a build with :func:`yank`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from packaging.utils import NormalizedName

from .. import log
from ..errors import ForkError, IndexConflict, WheelError
from ..files import copy_atomic, held, sha256_of, write_atomic
from .pages import (
    FILES_DIR,
    FileEntry,
    format_time,
    parse_time,
    render_project_html,
    render_project_json,
    render_root_html,
    render_root_json,
)
from .result import PublishResult
from .wheelfacts import WheelFacts, check_kinds, read_wheel

PAGES_DIR = "simple"
STATE_DIR = ".index-state"
METADATA_SUFFIX = ".metadata"


def yank(root: Path, filename: str, reason: str) -> None:
    """Mark ``filename`` yanked in the folder index at ``root`` (see :func:`..publish.yank`)."""
    if not (root / FILES_DIR).is_dir():
        raise ForkError(f"{root} is not a published index (it has no {FILES_DIR}/ folder); check the path.")
    if Path(filename).name != filename:
        raise ForkError(f"{filename!r} is not a file name; give the wheel's name as the index lists it.")
    with _locked(root):
        wheel = root / FILES_DIR / filename
        # Only a wheel is yanked: the files folder also holds each wheel's ``.metadata``, which no
        # page lists as a file, so marking it would change nothing an installer reads.
        if wheel not in _wheels(root):
            known = ", ".join(sorted(p.name for p in _wheels(root))) or "none"
            named = filename.removesuffix(METADATA_SUFFIX)
            if named != filename and (root / FILES_DIR / named) in _wheels(root):
                raise ForkError(
                    f"{filename!r} is the metadata of {named}, not a wheel; nothing was yanked. "
                    f"Yank the wheel: build.py yank {named} --from {root} --reason ..."
                )
            raise ForkError(f"{root} has no published wheel {filename!r} to yank. Published wheels: {known}.")
        state = _read_state(root, filename) or _default_state(wheel)
        if state.get("yanked") and state.get("yanked_reason", "") == reason:
            log.info(f"{filename} is already yanked with that reason; nothing to do")
            return
        state.update(yanked=True, yanked_reason=reason)
        write_atomic(_state_file(root, filename), _state_json(state), skip_if_same=True)
        _regenerate(root)
    log.info(f"yanked {filename} in {root}" + (f": {reason}" if reason else ""))


def regenerate(dest: Path) -> None:
    """Rewrite every page of the folder index at ``dest`` from its files (e.g. after a repair)."""
    with _locked(dest):
        _regenerate(dest)


def publish_folder(wheel: Path, facts: WheelFacts, root: Path) -> PublishResult:
    target = root / FILES_DIR / facts.filename
    result = PublishResult(
        filename=facts.filename,
        sha256=facts.sha256,
        dest=str(root),
        index_url=str(root / PAGES_DIR),
        file_url=str(target),
        already_published=False,
    )
    with log.phase(f"publish {facts.filename} to {root}"), _locked(root):
        if target.exists():
            existing = sha256_of(target)
            if existing != facts.sha256:
                raise IndexConflict(
                    f"{root} already has {facts.filename} with different bytes (sha256 {existing}, "
                    f"this one {facts.sha256}). A published file is never replaced: build a new "
                    f"release (the next +rbln.<n>), and yank the old one if it must not be installed. "
                    f"The index was left as it was."
                )
            _regenerate(root)  # repairs a publish that was interrupted; else changes nothing
            log.info(f"{facts.filename} is already published with the same bytes; nothing to do")
            return replace(result, already_published=True)
        check_kinds(facts, [p.name for p in _wheels(root)], str(root))
        (root / FILES_DIR).mkdir(parents=True, exist_ok=True)
        # The metadata and the sidecar first, the wheel next, the pages last: a page
        # never links a file that is not there.
        write_atomic(root / FILES_DIR / (facts.filename + METADATA_SUFFIX), facts.metadata, skip_if_same=True)
        state = _read_state(root, facts.filename) or {"upload_time": _now(), "yanked": False}
        write_atomic(_state_file(root, facts.filename), _state_json(state), skip_if_same=True)
        copy_atomic(wheel, target, facts.sha256)
        _regenerate(root)
    log.info(f"published {facts.filename} (sha256 {facts.sha256}) to {root}")
    return result


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One writer at a time per folder (several publishers may share a network folder)."""
    if root.exists() and not root.is_dir():
        raise ForkError(f"{root} is a file, not a folder; --publish wants a folder or an http(s) URL.")
    with held(root / STATE_DIR / "lock", f"another publish to {root} is running; waiting for it to finish"):
        yield


def _wheels(root: Path) -> list[Path]:
    files = root / FILES_DIR
    return sorted(files.glob("*.whl")) if files.is_dir() else []


def _state_file(root: Path, filename: str) -> Path:
    return root / STATE_DIR / f"{filename}.json"


def _read_state(root: Path, filename: str) -> dict[str, object] | None:
    path = _state_file(root, filename)
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ForkError(
            f"{path} is not valid JSON; fix or delete it (deleting it un-yanks {filename} and "
            f"takes the file's modification time as its upload time)."
        ) from None
    if not isinstance(state, dict):
        raise ForkError(f"{path} should hold a JSON object; fix or delete it.")
    return state


def _default_state(wheel: Path) -> dict[str, object]:
    """For a wheel copied into files/ by hand: its modification time, not yanked."""
    mtime = datetime.fromtimestamp(wheel.stat().st_mtime, tz=UTC)
    return {"upload_time": format_time(mtime), "yanked": False}


def _state_json(state: Mapping[str, object]) -> bytes:
    return (json.dumps(dict(state), indent=2, sort_keys=True) + "\n").encode()


def _now() -> str:
    return format_time(datetime.now(tz=UTC))


def _entries(root: Path) -> list[FileEntry]:
    """Every published wheel with its sidecar, repairing a missing .metadata or sidecar."""
    entries = []
    for wheel in _wheels(root):
        try:
            facts = read_wheel(wheel)
        except WheelError as exc:
            log.warn(f"{wheel} is not indexed: {exc}")
            continue
        metadata_file = wheel.with_name(wheel.name + METADATA_SUFFIX)
        if not metadata_file.is_file() or metadata_file.read_bytes() != facts.metadata:
            write_atomic(metadata_file, facts.metadata, skip_if_same=True)
        state = _read_state(root, wheel.name)
        if state is None:
            state = _default_state(wheel)
            write_atomic(_state_file(root, wheel.name), _state_json(state), skip_if_same=True)
        entries.append(
            FileEntry(
                facts=facts,
                upload_time=parse_time(str(state["upload_time"])),
                yanked=bool(state.get("yanked", False)),
                yanked_reason=str(state.get("yanked_reason", "")),
            )
        )
    return entries


def _regenerate(root: Path) -> None:
    by_project: dict[NormalizedName, list[FileEntry]] = {}
    for entry in _entries(root):
        by_project.setdefault(entry.facts.name, []).append(entry)
    pages = root / PAGES_DIR
    for name, entries in by_project.items():
        entries.sort(key=lambda e: (e.facts.version, e.facts.filename))
        write_atomic(
            pages / name / "index.html", render_project_html(name, entries).encode(), skip_if_same=True
        )
        write_atomic(
            pages / name / "index.json", render_project_json(name, entries).encode(), skip_if_same=True
        )
    names = sorted(by_project)
    write_atomic(pages / "index.html", render_root_html(names).encode(), skip_if_same=True)
    write_atomic(pages / "index.json", render_root_json(names).encode(), skip_if_same=True)
