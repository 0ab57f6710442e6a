"""Publish a built wheel to the internal index: a static folder, or an upload to a server.

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

import hashlib
import html
import json
import os
import shutil
import sys
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

import filelock
import requests
from packaging.metadata import parse_email
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import Version
from pypi_simple import NoSuchProjectError, PyPISimple

from .. import log, proc
from ..errors import FailedProcess, ForkError, IndexConflict, IndexUnreachable, WheelError

API_VERSION = "1.1"  # PEP 691 JSON with PEP 700's versions/size/upload-time
JSON_CONTENT_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_CONTENT_TYPE = "application/vnd.pypi.simple.v1+html"
FILES_DIR = "files"
PAGES_DIR = "simple"
STATE_DIR = ".index-state"
METADATA_SUFFIX = ".metadata"


@dataclass(frozen=True)
class PublishResult:
    """What :func:`publish` did.

    ``already_published`` is true when the index already held these exact bytes
    (nothing was written or uploaded). ``file_url`` is where the wheel is now: a path
    in the folder, or the URL the server lists it under (empty if the server's pages
    could not be read back).
    """

    filename: str
    sha256: str
    dest: str
    index_url: str
    file_url: str
    already_published: bool


@dataclass(frozen=True)
class WheelFacts:
    """What the index needs to know about one wheel, read from its bytes."""

    filename: str
    name: NormalizedName
    version: Version
    sha256: str
    size: int
    metadata: bytes  # the wheel's .dist-info/METADATA, unchanged
    requires_python: str | None

    @property
    def metadata_sha256(self) -> str:
        return hashlib.sha256(self.metadata).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file on a project page: the wheel's facts plus its sidecar."""

    facts: WheelFacts
    upload_time: datetime
    yanked: bool
    yanked_reason: str


def is_url(dest: str) -> bool:
    return urlsplit(dest).scheme in ("http", "https")


def publish(wheel: Path, dest: str, *, index_url: str | None = None) -> PublishResult:
    """Put ``wheel`` into the index at ``dest`` (a folder, or an upload URL).

    For an upload URL, ``index_url`` is the server's PEP 503 page root used to check
    for an existing file first; by default ``<dest>/simple/`` (pypiserver's layout).
    Credentials come from ``TWINE_USERNAME``/``TWINE_PASSWORD`` or keyring, never
    from the URL or the command line.
    """
    facts = read_wheel(wheel)
    if is_url(dest):
        return _publish_upload(wheel, facts, dest, index_url)
    return _publish_folder(wheel, facts, Path(dest))


def yank(dest: str, filename: str, reason: str) -> None:
    """Mark ``filename`` yanked (PEP 592) in the folder index at ``dest``; nothing is deleted.

    An installer skips a yanked file unless it is pinned exactly (``==`` with the full
    version). Yanking again with another reason updates the reason.
    """
    if is_url(dest):
        raise ForkError(
            f"yanking on an index server ({_redact(dest)}) is done with the server's own tools "
            f"(its web UI or API); this command yanks in a static folder index."
        )
    root = Path(dest)
    if not (root / FILES_DIR).is_dir():
        raise ForkError(f"{root} is not a published index (it has no {FILES_DIR}/ folder); check the path.")
    if Path(filename).name != filename:
        raise ForkError(f"{filename!r} is not a file name; give the wheel's name as the index lists it.")
    with _locked(root):
        wheel = root / FILES_DIR / filename
        if not wheel.is_file():
            known = ", ".join(sorted(p.name for p in _wheels(root))) or "none"
            raise ForkError(f"{root} has no published file {filename!r} to yank. Published files: {known}.")
        state = _read_state(root, filename) or _default_state(wheel)
        if state.get("yanked") and state.get("yanked_reason", "") == reason:
            log.info(f"{filename} is already yanked with that reason; nothing to do")
            return
        state.update(yanked=True, yanked_reason=reason)
        _atomic_write(_state_file(root, filename), _state_json(state))
        _regenerate(root)
    log.info(f"yanked {filename} in {root}" + (f": {reason}" if reason else ""))


def regenerate(dest: Path) -> None:
    """Rewrite every page of the folder index at ``dest`` from its files (e.g. after a repair)."""
    with _locked(dest):
        _regenerate(dest)


# --- reading a wheel -----------------------------------------------------------------


def read_wheel(wheel: Path) -> WheelFacts:
    """Name, version, hashes and core metadata of ``wheel``; refuse anything malformed."""
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise WheelError(
            f"{wheel.name} is not a wheel file name ({exc}); only wheels are published."
        ) from None
    if not wheel.is_file():
        raise WheelError(f"{wheel} does not exist; build it first (python build.py --pin ...).")
    try:
        with zipfile.ZipFile(wheel) as zf:
            metadata_names = [
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            ]
            if len(metadata_names) != 1:
                raise WheelError(
                    f"{wheel.name} has {len(metadata_names)} .dist-info/METADATA files, expected one; "
                    f"it is not a valid wheel."
                )
            metadata = zf.read(metadata_names[0])
    except zipfile.BadZipFile:
        raise WheelError(f"{wheel} is not a zip file; it is not a valid wheel.") from None
    raw, _ = parse_email(metadata)
    meta_name, meta_version = raw.get("name", ""), raw.get("version", "")
    if canonicalize_name(meta_name) != name or not meta_version or Version(meta_version) != version:
        raise WheelError(
            f"{wheel.name} says {meta_name} {meta_version} in its METADATA but {name} {version} in "
            f"its file name; refusing to publish a wheel that contradicts itself."
        )
    digest, size = _sha256_and_size(wheel)
    return WheelFacts(
        filename=wheel.name,
        name=name,
        version=version,
        sha256=digest,
        size=size,
        metadata=metadata,
        requires_python=raw.get("requires_python"),
    )


def _sha256_and_size(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


# --- the static folder ---------------------------------------------------------------


def _publish_folder(wheel: Path, facts: WheelFacts, root: Path) -> PublishResult:
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
            existing, _ = _sha256_and_size(target)
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
        (root / FILES_DIR).mkdir(parents=True, exist_ok=True)
        # The metadata and the sidecar first, the wheel next, the pages last: a page
        # never links a file that is not there.
        _atomic_write(root / FILES_DIR / (facts.filename + METADATA_SUFFIX), facts.metadata)
        state = _read_state(root, facts.filename) or {"upload_time": _now(), "yanked": False}
        _atomic_write(_state_file(root, facts.filename), _state_json(state))
        _atomic_copy(wheel, target, facts.sha256)
        _regenerate(root)
    log.info(f"published {facts.filename} (sha256 {facts.sha256}) to {root}")
    return result


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One writer at a time per folder (several publishers may share a network folder)."""
    if root.exists() and not root.is_dir():
        raise ForkError(f"{root} is a file, not a folder; --publish wants a folder or an http(s) URL.")
    (root / STATE_DIR).mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(root / STATE_DIR / "lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        log.info(f"another publish to {root} is running; waiting for it to finish")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


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
    return {"upload_time": _format_time(mtime), "yanked": False}


def _state_json(state: Mapping[str, object]) -> bytes:
    return (json.dumps(dict(state), indent=2, sort_keys=True) + "\n").encode()


def _now() -> str:
    return _format_time(datetime.now(tz=UTC))


def _format_time(moment: datetime) -> str:
    """PEP 700's ``yyyy-mm-ddThh:mm:ss.ffffffZ``, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename; skip if unchanged."""
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_copy(source: Path, target: Path, sha256: str) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(source, tmp)
        copied, _ = _sha256_and_size(tmp)
        if copied != sha256:
            raise WheelError(
                f"{source.name} changed while it was being published (sha256 {copied}, expected "
                f"{sha256}); nothing was published. Is a build still writing it?"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


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
            _atomic_write(metadata_file, facts.metadata)
        state = _read_state(root, wheel.name)
        if state is None:
            state = _default_state(wheel)
            _atomic_write(_state_file(root, wheel.name), _state_json(state))
        entries.append(
            FileEntry(
                facts=facts,
                upload_time=_parse_time(str(state["upload_time"])),
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
        _atomic_write(pages / name / "index.html", render_project_html(name, entries).encode())
        _atomic_write(pages / name / "index.json", render_project_json(name, entries).encode())
    names = sorted(by_project)
    _atomic_write(pages / "index.html", render_root_html(names).encode())
    _atomic_write(pages / "index.json", render_root_json(names).encode())


def _file_href(filename: str) -> str:
    """From ``simple/<name>/``: the file in ``files/``, percent-encoded (``+`` is ``%2B``)."""
    return f"../../{FILES_DIR}/{quote(filename, safe='')}"


def render_root_html(names: list[NormalizedName]) -> str:
    links = "".join(f'    <a href="{quote(n)}/">{html.escape(n)}</a><br>\n' for n in names)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        f'    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
        "    <title>Simple index</title>\n  </head>\n  <body>\n"
        f"{links}  </body>\n</html>\n"
    )


def render_root_json(names: list[NormalizedName]) -> str:
    data = {"meta": {"api-version": API_VERSION}, "projects": [{"name": n} for n in names]}
    return json.dumps(data, indent=2) + "\n"


def render_project_html(name: NormalizedName, entries: list[FileEntry]) -> str:
    lines = []
    for e in entries:
        f = e.facts
        attrs = [f'href="{_file_href(f.filename)}#sha256={f.sha256}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python, quote=True)}"')
        attrs.append(f'data-core-metadata="sha256={f.metadata_sha256}"')
        attrs.append(f'data-dist-info-metadata="sha256={f.metadata_sha256}"')
        if e.yanked:
            attrs.append(f'data-yanked="{html.escape(e.yanked_reason, quote=True)}"')
        lines.append(f"    <a {' '.join(attrs)}>{html.escape(f.filename)}</a><br>\n")
    title = f"Links for {html.escape(name)}"
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        f'    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
        f"    <title>{title}</title>\n  </head>\n  <body>\n    <h1>{title}</h1>\n"
        f"{''.join(lines)}  </body>\n</html>\n"
    )


def render_project_json(name: NormalizedName, entries: list[FileEntry]) -> str:
    files = []
    for e in entries:
        f = e.facts
        item: dict[str, object] = {
            "filename": f.filename,
            "url": _file_href(f.filename),
            "hashes": {"sha256": f.sha256},
        }
        if f.requires_python:
            item["requires-python"] = f.requires_python
        item["core-metadata"] = {"sha256": f.metadata_sha256}
        item["dist-info-metadata"] = {"sha256": f.metadata_sha256}
        item["size"] = f.size
        item["upload-time"] = _format_time(e.upload_time)
        item["yanked"] = (e.yanked_reason or True) if e.yanked else False
        files.append(item)
    versions = sorted({e.facts.version for e in entries})
    data = {
        "meta": {"api-version": API_VERSION},
        "name": name,
        "versions": [str(v) for v in versions],
        "files": files,
    }
    return json.dumps(data, indent=2) + "\n"


# --- an index server -----------------------------------------------------------------


def default_index_url(upload_url: str) -> str:
    """Where an upload URL's server lists its files (pypiserver: ``<url>/simple/``)."""
    return urljoin(upload_url if upload_url.endswith("/") else upload_url + "/", "simple/")


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return parts._replace(netloc=f"***@{host}").geturl()


def _auth_from_env() -> tuple[str, str] | None:
    user, password = os.environ.get("TWINE_USERNAME"), os.environ.get("TWINE_PASSWORD")
    return (user, password) if user and password else None


def _remote_file(index_url: str, facts: WheelFacts) -> tuple[str | None, str] | None:
    """``(sha256 or None, url)`` of ``facts.filename`` on the server, or None if it is not there.

    Raises :class:`IndexUnreachable` when the server's pages cannot be read.
    """
    try:
        with PyPISimple(endpoint=index_url, auth=_auth_from_env()) as client:
            page = client.get_project_page(facts.name, timeout=60)
    except NoSuchProjectError:
        return None
    except requests.RequestException as exc:
        raise IndexUnreachable(f"cannot read {_redact(index_url)}: {exc}") from None
    for pkg in page.packages:
        if pkg.filename == facts.filename:
            return pkg.digests.get("sha256"), pkg.url
    return None


def _publish_upload(wheel: Path, facts: WheelFacts, dest: str, index_url: str | None) -> PublishResult:
    parts = urlsplit(dest)
    if parts.username is not None or parts.password is not None:
        raise ForkError(
            f"the upload URL {_redact(dest)} carries credentials; they would show up in logs and "
            f"process lists. Remove them from the URL and set TWINE_USERNAME and TWINE_PASSWORD "
            f"(or store them in keyring) instead."
        )
    simple = index_url or default_index_url(dest)
    result = PublishResult(
        filename=facts.filename,
        sha256=facts.sha256,
        dest=dest,
        index_url=simple,
        file_url="",
        already_published=False,
    )
    with log.phase(f"upload {facts.filename} to {dest}"):
        try:
            existing = _remote_file(simple, facts)
        except IndexUnreachable as exc:
            log.warn(
                f"{exc}; cannot check for an existing {facts.filename}; "
                f"the server will have to refuse an overwrite"
            )
            existing = None
        if existing is not None:
            digest, url = existing
            if digest == facts.sha256:
                log.info(f"{facts.filename} is already on {simple} with the same bytes; nothing to do")
                return replace(result, file_url=url, already_published=True)
            if digest is not None:
                raise IndexConflict(
                    f"{simple} already has {facts.filename} with different bytes (sha256 {digest}, "
                    f"this one {facts.sha256}). A published file is never replaced: build a new "
                    f"release (the next +rbln.<n>). Nothing was uploaded."
                )
            log.warn(f"{simple} lists {facts.filename} without a sha256; uploading, the server decides")
        _twine_upload(wheel, dest)
        try:
            after = _remote_file(simple, facts)
        except IndexUnreachable as exc:
            log.warn(f"uploaded, but {exc}; check that {facts.filename} is listed there")
            return result
    if after is None:
        log.warn(f"uploaded, but {simple} does not list {facts.filename} (yet); check the server")
        return result
    digest, url = after
    if digest is not None and digest != facts.sha256:
        raise IndexConflict(
            f"{simple} now lists {facts.filename} with sha256 {digest}, not {facts.sha256}: the "
            f"server kept another file under this name. Investigate before anyone installs it."
        )
    log.info(f"uploaded {facts.filename} (sha256 {facts.sha256}) to {dest}")
    return replace(result, file_url=url)


def _twine_upload(wheel: Path, dest: str) -> None:
    """twine reads TWINE_USERNAME/TWINE_PASSWORD or keyring itself: no secret on the command line.

    A refusal to overwrite comes as 409 Conflict, or as 400 with "already exists" in the
    body (pypiserver, Warehouse); both become :class:`IndexConflict`.
    """
    cmd = [
        sys.executable,
        "-m",
        "twine",
        "upload",
        "--repository-url",
        dest,
        "--non-interactive",
        "--disable-progress-bar",
        "--verbose",  # the server's reason for a refusal; twine shows the password as <hidden>
        str(wheel),
    ]
    try:
        proc.run(
            cmd,
            hint="Credentials come from TWINE_USERNAME and TWINE_PASSWORD or from keyring; check "
            "them and the upload URL.",
        )
    except FailedProcess as exc:
        if "409 Conflict" in exc.output or "already exists" in exc.output.lower():
            raise IndexConflict(
                f"{_redact(dest)} refused {wheel.name}: a file of that name is already there. "
                f"A published file is never replaced: build a new release (the next +rbln.<n>)."
            ) from None
        raise
