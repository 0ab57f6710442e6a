"""Find and download a pin's sdist from a PEP 503/691 index (via pypi-simple)."""

from __future__ import annotations

import bisect
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import requests
from packaging.utils import parse_sdist_filename
from packaging.version import InvalidVersion, Version
from pypi_simple import (
    PYPI_SIMPLE_ENDPOINT,
    DigestMismatchError,
    DistributionPackage,
    NoSuchProjectError,
    PyPISimple,
)

from . import log
from .errors import IndexUnreachable, PinNotFound, SourceHashMismatch
from .files import sha256_of
from .pins import LockedSdist, Pin

PROJECT = "vllm"


def configured_index_url() -> str:
    """The index pip is configured with (``PIP_INDEX_URL`` or pip's config), else the default."""
    if url := os.environ.get("PIP_INDEX_URL"):
        return url
    result = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        if key in ("global.index-url", "install.index-url", "download.index-url"):
            return value.strip().strip("'\"")
    return PYPI_SIMPLE_ENDPOINT


@dataclass(frozen=True)
class RemoteSdist:
    filename: str
    url: str
    sha256: str
    size: int | None
    index_url: str
    package: DistributionPackage

    @property
    def locked(self) -> LockedSdist:
        return LockedSdist(self.filename, self.sha256, self.size)


def _sdist_versions(index_url: str) -> dict[Version, RemoteSdist]:
    try:
        with PyPISimple(endpoint=index_url) as client:
            page = client.get_project_page(PROJECT, timeout=60)
    except NoSuchProjectError:
        raise PinNotFound(f"the index {index_url} has no project {PROJECT!r}. Check --index-url.") from None
    except requests.RequestException as exc:
        raise IndexUnreachable(
            f"cannot read the package index {index_url}: {exc}. Check the network or point "
            f"--index-url at a reachable mirror; --source PATH builds from a local sdist."
        ) from None
    found: dict[Version, RemoteSdist] = {}
    for pkg in page.packages:
        if pkg.package_type != "sdist" or not pkg.filename.endswith(".tar.gz"):
            continue
        try:
            _, version = parse_sdist_filename(pkg.filename)
        except (ValueError, InvalidVersion):
            continue
        sha256 = pkg.digests.get("sha256")
        if sha256 is None or pkg.is_yanked:
            continue
        found[version] = RemoteSdist(pkg.filename, pkg.url, sha256, pkg.size, index_url, pkg)
    return found


def releases(index_url: str) -> list[Version]:
    """The final releases (no pre-, dev- or post-release) with an sdist on the index, oldest first."""
    return sorted(v for v in _sdist_versions(index_url) if not (v.is_prerelease or v.is_postrelease))


def find_sdist(pin: Pin, index_url: str) -> RemoteSdist:
    available = _sdist_versions(index_url)
    if pin.version in available:
        return available[pin.version]
    nearest = nearby_releases([v for v in available if not v.is_prerelease], pin.version)
    hint = ", ".join(str(v) for v in nearest) or "none"
    raise PinNotFound(
        f"vllm {pin} has no sdist on {index_url}. Nearby releases there: {hint}. Pick one of them with --pin."
    )


def nearby_releases(releases: list[Version], version: Version, count: int = 5) -> list[Version]:
    """The ``count`` releases next to ``version`` in version order, newest first: past the
    newest release, the newest few; before the oldest, the oldest few."""
    ordered = sorted(releases)
    at = bisect.bisect_left(ordered, version)
    start = min(max(at - (count + 1) // 2, 0), max(len(ordered) - count, 0))
    return sorted(ordered[start : start + count], reverse=True)


class _Progress:
    """Feeds pypi-simple's download progress into the log's progress events."""

    def __init__(self, filename: str, total: int | None) -> None:
        self.filename, self.total, self.done = filename, total, 0

    def __enter__(self) -> _Progress:
        log.progress(self.filename, 0, self.total)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def update(self, increment: int) -> None:
        self.done += increment
        log.progress(self.filename, self.done, self.total)


def download(sdist: RemoteSdist, dest: Path) -> Path:
    """Download to ``dest`` (verified against the index's sha256), via a ``.part`` file.

    An interrupted download leaves only the ``.part`` file, which the next run replaces.
    """
    if dest.exists() and sha256_of(dest) == sdist.sha256:
        return dest
    part = dest.with_name(dest.name + ".part")
    try:
        with PyPISimple(endpoint=sdist.index_url) as client:
            client.download_package(
                sdist.package,
                part,
                verify=True,
                progress=lambda total: _Progress(sdist.filename, total),
                timeout=120,
            )
    except DigestMismatchError as exc:
        raise SourceHashMismatch(
            f"the download of {sdist.filename} from {sdist.url} has sha256 {exc.actual_digest}, "
            f"but the index promised {exc.expected_digest}. Nothing was kept; try again, or use "
            f"another --index-url."
        ) from None
    except requests.RequestException as exc:
        raise IndexUnreachable(
            f"downloading {sdist.filename} failed: {exc}. Run the same command again; a partial "
            f"download is not reused."
        ) from None
    part.replace(dest)
    return dest
