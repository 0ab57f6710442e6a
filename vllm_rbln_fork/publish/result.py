"""What a publish did: the same answer from the folder index and from an upload."""

from __future__ import annotations

import re
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


# A scheme of two letters or more and its colon (``C:`` is a drive letter elsewhere, not a URL).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


def is_url(dest: str) -> bool:
    """Whether ``dest`` is an upload URL (http or https) rather than a folder.

    A ``dest`` that starts like a URL of another scheme (``htps://``, ``ftp://``, ``file:///``)
    is refused, not taken for a folder of that name under the current directory: a typo in an
    upload URL would otherwise publish into a stray folder and report success.
    """
    match = _SCHEME.match(dest)
    if match is None:
        return False
    scheme = match.group(1).lower()
    if scheme in ("http", "https"):
        return True
    raise ForkError(
        f"{redact(dest)} is neither a folder nor an http(s) upload URL: its scheme {scheme}: is not "
        f"http: or https:, so nothing was built or published. Give the index server's http(s) URL, "
        f"or a folder path (a folder whose name starts with {scheme}: is ./{redact(dest)})."
    )


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
