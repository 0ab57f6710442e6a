"""Small file helpers shared by every stage: hashing, and writes that never leave half a file."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


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
