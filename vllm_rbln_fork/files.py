"""Small file helpers shared by every stage: hashing, writes that never leave half a file, and
reading our TOML files with errors that name the file and the line.

Standard library only (build.py's bootstrap may use it before any package is installed)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

from .errors import ForkError


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_id(root: Path, *subdirs: str) -> str:
    """A content hash of ``subdirs`` of ``root`` (paths and bytes, ``__pycache__`` left out):
    the same files give the same id, git or not."""
    digest = hashlib.sha256()
    for sub in subdirs:
        digest.update(f"[{sub}]".encode())
        for path in sorted((root / sub).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def write_atomic(path: Path, data: str | bytes, *, skip_if_same: bool = False) -> None:
    """Write through a temp file in the same directory, flushed to disk, and rename it into
    place (mode 0644): a reader sees the old file or the new one. With ``skip_if_same``, a
    file that already holds ``data`` is left alone (its time too)."""
    raw = data.encode() if isinstance(data, str) else data
    if skip_if_same and path.is_file() and path.read_bytes() == raw:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def copy_atomic(source: Path, target: Path, sha256: str | None = None) -> None:
    """Copy ``source`` to ``target`` as :func:`write_atomic` writes; with ``sha256``, refuse
    (``ForkError``, nothing written) a copy whose bytes are not those."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, source.open("rb") as f:
            shutil.copyfileobj(f, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        if sha256 is not None and (copied := sha256_of(Path(tmp))) != sha256:
            raise ForkError(
                f"{source.name} changed while it was being copied (sha256 {copied}, expected {sha256}); "
                f"nothing was written to {target.parent}. Is a build still writing it?"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def made_once(directory: Path, make: Callable[[Path], None]) -> Path:
    """``directory``, made by ``make(directory)`` unless a finished one is there: a
    ``.complete`` marker, written last, tells a finished one from an interrupted one
    (which is removed and made again)."""
    marker = directory / ".complete"
    if marker.exists():
        return directory
    # Two test runs sharing a cache must not remove each other's half-made directory
    # (fcntl, not filelock: this module is standard library only).
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            shutil.rmtree(directory, ignore_errors=True)
            make(directory)
            marker.write_text("")
    return directory


def read_toml(
    path: Path, *, missing_ok: bool = True, error: type[ForkError] = ForkError
) -> dict[str, object]:
    """``path`` parsed as TOML (``{}`` if it does not exist and ``missing_ok``); a malformed
    file raises ``error`` naming the file and the line, and nothing is written."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise error(f"{path} does not exist.") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        at = f", line {where[1]}, column {where[2]}" if where else ""
        reason = re.sub(r"\s*\(at .*?\)$", "", str(exc))
        raise error(
            f"{path}{at}: not valid TOML ({reason}). Fix that line, or restore the file from git "
            f"(git checkout -- {path.name}) if it was not meant to change."
        ) from None
