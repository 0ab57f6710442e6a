"""The internal wheel index (``--publish DEST``, ``yank``): wheel facts, folder index, pages, upload.

``DEST`` is either a folder, which becomes (or already is) a static index that any
web server can serve (:mod:`.folder`), or an ``http(s)://`` URL of an index server that
accepts uploads (twine's ``--repository-url``, :mod:`.upload`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ForkError
from ..urls import redact
from .result import PublishResult, is_url

# folder, upload and wheelfacts (pypi_simple, requests, bs4, pydantic: a third of a second)
# are imported where they run: ``build.py --pin`` imports .result for every build, and a
# cache hit must not pay for an index client it does not use.

__all__ = ["PublishResult", "publish", "yank"]


def publish(
    wheel: Path, dest: str, *, index_url: str | None = None, new_project: bool = False
) -> PublishResult:
    """Put ``wheel`` into the index at ``dest`` (a folder, or an upload URL).

    For an upload URL, ``index_url`` is the server's PEP 503 page root used to check
    for an existing file first; by default ``<dest>/simple/`` (pypiserver's layout).
    ``new_project``: a 404 for the project's page is taken as a project not uploaded yet
    even where the page root has no page of its own (Gitea, Forgejo).
    Credentials come from ``TWINE_USERNAME``/``TWINE_PASSWORD`` or keyring, never
    from the URL or the command line.
    """
    from . import folder, upload
    from .wheelfacts import read_wheel

    facts = read_wheel(wheel)
    if is_url(dest):
        return upload.publish_upload(wheel, facts, dest, index_url, new_project=new_project)
    return folder.publish_folder(wheel, facts, Path(dest))


def yank(dest: str, filename: str, reason: str) -> None:
    """Mark ``filename`` yanked (PEP 592) in the folder index at ``dest``; nothing is deleted.

    An installer skips a yanked file unless it is pinned exactly (``==`` with the full
    version). Yanking again with another reason updates the reason.
    """
    if is_url(dest):
        raise ForkError(
            f"yanking on an index server ({redact(dest)}) is done with the server's own tools "
            f"(its web UI or API); this command yanks in a static folder index."
        )
    from . import folder

    folder.yank(Path(dest), filename, reason)
