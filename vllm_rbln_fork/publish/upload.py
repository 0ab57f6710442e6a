"""Publish to an index server: check it for the file, upload with twine, read it back."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from urllib.parse import urljoin

import requests
from pypi_simple import NoSuchProjectError, PyPISimple

from .. import log, proc
from ..errors import FailedProcess, IndexConflict, IndexUnreachable
from ..urls import redact
from .result import PublishResult, check_upload_url
from .wheelfacts import WheelFacts, check_kinds


def default_index_url(upload_url: str) -> str:
    """Where an upload URL's server lists its files (pypiserver: ``<url>/simple/``)."""
    return urljoin(upload_url if upload_url.endswith("/") else upload_url + "/", "simple/")


def _auth_from_env() -> tuple[str, str] | None:
    user, password = os.environ.get("TWINE_USERNAME"), os.environ.get("TWINE_PASSWORD")
    return (user, password) if user and password else None


def _remote_files(
    index_url: str, facts: WheelFacts, *, new_project: bool = False
) -> dict[str, tuple[str | None, str]]:
    """``{filename: (sha256 or None, url)}`` of the project's files on the server.

    Raises :class:`IndexUnreachable` when the server's pages cannot be read. A 404 for the
    project is a project not uploaded yet only if the index's own page answers (a wrong page
    root 404s too), or if the caller says the project is new (``new_project``: Gitea's and
    Forgejo's registries have no root page, so nothing else can tell the two apart).
    """
    auth = _auth_from_env()
    try:
        with PyPISimple(endpoint=index_url, auth=auth) as client:
            try:
                page = client.get_project_page(facts.name, timeout=60)
            except NoSuchProjectError:
                if new_project:
                    return {}
                # Only its status: the root page of a big index is large, and its body says nothing.
                with client.s.get(index_url, timeout=60, stream=True) as root:
                    if root.status_code == 404:
                        raise IndexUnreachable(
                            f"cannot read {redact(index_url)}: it has no page for {facts.name} and "
                            f"no page of its own (404 for both), so a wrong page root cannot be told "
                            f"from a project not uploaded yet. If this is the first upload of "
                            f"{facts.name} to a server with no root page (Gitea, Forgejo), say so "
                            f"with --new-project"
                        ) from None
                    root.raise_for_status()
                return {}
    except requests.RequestException as exc:
        raise IndexUnreachable(f"cannot read {redact(index_url)}: {exc}") from None
    return {pkg.filename: (pkg.digests.get("sha256"), pkg.url) for pkg in page.packages}


def _remote_file(
    index_url: str, facts: WheelFacts, *, new_project: bool = False
) -> tuple[str | None, str] | None:
    """``(sha256 or None, url)`` of ``facts.filename`` on the server, or None if it is not there."""
    return _remote_files(index_url, facts, new_project=new_project).get(facts.filename)


def publish_upload(
    wheel: Path, facts: WheelFacts, dest: str, index_url: str | None, *, new_project: bool = False
) -> PublishResult:
    check_upload_url(dest)
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
            files = _remote_files(simple, facts, new_project=new_project)
        except IndexUnreachable as exc:
            raise IndexUnreachable(
                f"{exc}. An upload first reads the index for an existing {facts.filename} and for "
                f"the other kind (pure or binary) of wheel of {facts.name} {facts.version}; it is "
                f"never made blind. Nothing was uploaded. Check the network and the credentials "
                f"(TWINE_USERNAME and TWINE_PASSWORD, or keyring), or, if the server lists its "
                f"files elsewhere than {redact(default_index_url(dest))}, name that page root with "
                f"--check-index URL."
            ) from None
        existing = files.get(facts.filename)
        if existing is None:
            check_kinds(facts, list(files), redact(simple))
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
            after = _remote_file(simple, facts, new_project=new_project)
        except IndexUnreachable as exc:
            log.warn(f"uploaded, but {exc}; check that {facts.filename} is listed there")
            return result
    if after is None:
        if new_project:  # a 404 was taken for a new project: a wrong page root 404s alike
            log.warn(
                f"uploaded, but {simple} still lists no {facts.filename}: with --new-project a 404 "
                f"there counts as a project not uploaded yet, and a wrong page root 404s alike. "
                f"Check that {facts.name} is on the server, and name its page root with --check-index URL"
            )
        else:
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
                f"{redact(dest)} refused {wheel.name}: a file of that name is already there. "
                f"A published file is never replaced: build a new release (the next +rbln.<n>)."
            ) from None
        raise
