"""Small file helpers shared by every stage: hashing, writes that never leave half a file, and
reading our TOML files with errors that name the file and the line.

Standard library only (build.py's bootstrap may use it before any package is installed)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import tomllib
from pathlib import Path

from .errors import ForkError


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write through a temp file in the same directory and rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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
