"""Small file helpers shared by every stage: hashing, writes that never leave half a file, the
one lock between processes (:func:`held`), directories made once, and reading our TOML files
with errors that name the file and the line.

Standard library only (build.py's bootstrap may use it before any package is installed)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import log
from .errors import ForkError


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp(path: Path) -> str:
    """What changes whenever a file's bytes may have: device, inode, size, mtime and ctime
    (ns). ctime cannot be set back by a user, so an edit that restores mtime is seen too."""
    st = path.stat()
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def _memo_file(path: Path, memo_dir: Path) -> Path:
    return memo_dir / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]


def remember_sha256(path: Path, sha256: str, memo_dir: Path) -> None:
    """Record that ``path``, as it is now, has ``sha256`` (for :func:`sha256_remembered`).

    The memo only saves reading the file again: a memo that cannot be written (a full disk,
    a read-only cache) is said and otherwise ignored; it never fails the caller."""
    try:
        write_atomic(_memo_file(path, memo_dir), f"{_stamp(path)} {sha256}\n", durable=False)
    except OSError as exc:
        log.warn(
            f"cannot remember the sha256 of {path.name} in {memo_dir} ({exc}); "
            f"it will be hashed again next time"
        )


def sha256_remembered(path: Path, memo_dir: Path) -> str:
    """``sha256_of(path)``, not read again while the file is unchanged: the hash is kept in
    ``memo_dir`` against the file's stat stamp (:func:`_stamp`), and any write, copy over,
    rename over or chmod gives another stamp, so the file is hashed afresh."""
    memo = _memo_file(path, memo_dir)
    stamp = _stamp(path)
    try:
        known_stamp, _, known = memo.read_text().strip().rpartition(" ")
    except (OSError, UnicodeDecodeError):  # none yet, or unreadable: hash the file
        known_stamp = known = ""
    if known_stamp == stamp and len(known) == 64:
        return known
    sha256 = sha256_of(path)
    if _stamp(path) == stamp:  # not changed while it was read
        remember_sha256(path, sha256, memo_dir)
    return sha256


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


def write_atomic(path: Path, data: str | bytes, *, skip_if_same: bool = False, durable: bool = True) -> None:
    """Write through a temp file in the same directory, flushed to disk, and rename it into
    place (mode 0644): a reader sees the old file or the new one. With ``skip_if_same``, a
    file that already holds ``data`` is left alone (its time too). ``durable=False`` skips
    the fsync, for a file that is only a cache of something that can be worked out again."""
    raw = data.encode() if isinstance(data, str) else data
    if skip_if_same and path.is_file() and path.read_bytes() == raw:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def user_path(text: str, flag: str) -> Path:
    """``text`` as a path given on the command line (``~`` expanded, made absolute), or a
    ForkError naming ``flag`` where it cannot be (``~nosuchuser/x``: no such user)."""
    try:
        return Path(text).expanduser().resolve()
    except RuntimeError:  # expanduser: no home directory for the user named after the ~
        user = text.split("/", 1)[0]
        raise ForkError(
            f"{flag} {text!r}: {user} names no user of this machine. Write the path out in full."
        ) from None
    except OSError as exc:
        raise ForkError(
            f"{flag} {text!r} is not a path this machine can read ({exc}). Give another path."
        ) from None


def check_writable(path: Path, flag: str, *, folder: bool = False) -> None:
    """A ForkError naming ``flag`` if ``path`` (a file, or with ``folder`` a folder) cannot be
    written: asked before the work it is the output of, so a long run does not end in a
    traceback with its result lost. Nothing is made here."""
    want = "folder" if folder else "file"
    try:
        if path.exists():
            if path.is_dir() != folder:
                raise ForkError(
                    f"{flag} {path}: it is a {'file' if folder else 'folder'}; give a {want} to write."
                )
            if not os.access(path, os.W_OK):
                raise ForkError(f"{flag} {path}: you cannot write it. Give a {want} you can write.")
            return
        parent = path.absolute().parent
        while not parent.exists() and not parent.is_symlink():
            parent = parent.parent
    except OSError as exc:
        raise ForkError(f"{flag} {path}: cannot be written ({exc}). Give a {want} you can write.") from None
    if not parent.is_dir():
        raise ForkError(
            f"{flag} {path}: {parent} is a file, not a folder, so nothing can be written under it. Give "
            f"a {want} in a folder you can write."
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ForkError(
            f"{flag} {path}: you cannot write in {parent}. Give a {want} in a folder you can write."
        )


def fsync_dir(directory: Path) -> None:
    """Flush ``directory``'s entries (a rename into it) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


@contextmanager
def held(
    lock_file: Path, waiting: str | None = None, *, shared: bool = False, wait: bool = True
) -> Iterator[bool]:
    """Hold ``lock_file`` (made if missing) for the ``with`` block, exclusively or ``shared``;
    if another process holds it so that this one must wait, say ``waiting`` (when given) and
    wait. With ``wait=False``, yield False at once instead (holding nothing); else True.

    ``fcntl.flock``, as filelock's Unix lock does, without importing filelock (a thirtieth of
    a second, on the path of every cache hit). The kernel drops the lock when the process
    ends, however it ends."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    with lock_file.open("a") as handle:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if waiting:
                log.info(waiting)
            fcntl.flock(handle, mode)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_file(directory: Path) -> Path:
    return directory.parent / f".{directory.name}.lock"


def made_once(directory: Path, make: Callable[[Path], None]) -> Path:
    """``directory``, made by ``make(directory)`` unless a finished one is there: a
    ``.complete`` marker, written last, tells a finished one from an interrupted one
    (which is removed and made again)."""
    marker = directory / ".complete"
    if marker.exists():
        return directory
    # Two test runs sharing a cache must not remove each other's half-made directory.
    with held(_lock_file(directory)):
        if not marker.exists():
            shutil.rmtree(directory, ignore_errors=True)
            make(directory)
            marker.write_text("")
    return directory


@contextmanager
def made_and_held(
    directory: Path, make: Callable[[Path], None], *, exclusive: bool = False
) -> Iterator[Path]:
    """:func:`made_once`, then held while the ``with`` block uses it: shared (many users; only
    :func:`remove_unless_held` is kept out) or ``exclusive`` (one user at a time, who may change
    it: e.g. install another wheel into a venv). Blocks while another process holds it so."""
    while True:
        made_once(directory, make)
        with held(_lock_file(directory), shared=not exclusive):
            if (directory / ".complete").exists():  # else removed between made and held
                yield directory
                return


def remove_unless_held(directory: Path) -> bool:
    """Remove a :func:`made_once` directory unless a process holds it (:func:`made_and_held`)
    or is making it; say whether it was removed. Never waits."""
    with held(_lock_file(directory), wait=False) as got:
        if not got:
            return False
        (directory / ".complete").unlink(missing_ok=True)  # first: never a marked half-removed one
        shutil.rmtree(directory, ignore_errors=True)
        return True


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
        raise error(f"{path} does not exist. Restore it from git (git checkout -- {path.name}).") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(
            f"cannot read {path} ({exc}). Restore it from git (git checkout -- {path.name})."
        ) from None
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
