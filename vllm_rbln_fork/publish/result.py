"""What a publish did: the same answer from the folder index and from an upload."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ForkError
from ..urls import redact


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


def is_url(dest: str) -> bool:
    return urlsplit(dest).scheme in ("http", "https")


def check_upload_url(dest: str) -> None:
    """Refuse an upload URL that carries credentials (before a build, so nothing is built for
    an upload that would be refused)."""
    parts = urlsplit(dest)
    if parts.username is not None or parts.password is not None:
        raise ForkError(
            f"the upload URL {redact(dest)} carries credentials; they would show up in logs and "
            f"process lists. Remove them from the URL and set TWINE_USERNAME and TWINE_PASSWORD "
            f"(or store them in keyring) instead."
        )
