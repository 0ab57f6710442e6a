"""Find and download a pin's sdist from a PEP 503/691 index (via pypi-simple)."""

from __future__ import annotations

import bisect
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import requests
from packaging.utils import parse_sdist_filename
from packaging.version import InvalidVersion, Version
from pypi_simple import (
    PYPI_SIMPLE_ENDPOINT,
    DistributionPackage,
    NoSuchProjectError,
    PyPISimple,
)

from . import log
from .errors import IndexUnreachable, PinNotFound, SourceHashMismatch
from .files import remember_sha256, sha256_remembered
from .paths import hash_memo_dir
from .pins import LockedSdist, Pin
from .urls import redact

PROJECT = "vllm"


def configured_index_url() -> str:
    """The index pip is configured with (``PIP_INDEX_URL``, then pip's ``install`` and
    ``global`` settings, as pip and build.py's bootstrap read them), else the default."""
    if url := os.environ.get("PIP_INDEX_URL"):
        return url
    from .pipconfig import configured_pip_settings

    url = configured_pip_settings().get("index-url", "").strip()
    return url or PYPI_SIMPLE_ENDPOINT


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
        return LockedSdist(self.filename, self.sha256)

    @property
    def yanked(self) -> bool:
        return self.package.is_yanked

    @property
    def yanked_reason(self) -> str:
        return (self.package.yanked_reason or "").strip() or "no reason given"


def check_index_scheme(index_url: str, flag: str = "--index-url") -> None:
    """Refuse, before any network error could be blamed, an index that is not read over
    http(s): pypi-simple (requests) reads no ``file://`` page."""
    scheme = index_url.partition("://")[0].lower() if "://" in index_url else ""
    if scheme not in ("http", "https"):
        raise IndexUnreachable(
            f"{flag} {index_url}: the tool reads a package index over http(s) only. Serve a "
            f"folder index with 'python -m http.server --directory DIR' and give its "
            f"http://127.0.0.1:PORT/simple/ URL, or build from a local sdist with --source PATH."
        )


def sdists(index_url: str) -> dict[Version, RemoteSdist]:
    """Every sdist of vllm on the index (with a sha256), by version; yanked ones too."""
    check_index_scheme(index_url)
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
    # Every sdist with a sha256, yanked ones too (PEP 592: an exact pin may still use a yanked
    # file; only a list of candidates skips them). Of two files of one version, a file not
    # yanked wins.
    found: dict[Version, RemoteSdist] = {}
    for pkg in page.packages:
        if pkg.package_type != "sdist" or not pkg.filename.endswith(".tar.gz"):
            continue
        try:
            _, version = parse_sdist_filename(pkg.filename)
        except (ValueError, InvalidVersion):
            continue
        sha256 = pkg.digests.get("sha256")
        if sha256 is None or (version in found and pkg.is_yanked and not found[version].yanked):
            continue
        found[version] = RemoteSdist(pkg.filename, pkg.url, sha256, pkg.size, index_url, pkg)
    return found


def _is_release(version: Version) -> bool:
    """A final release (PEP 440): not a pre- or dev-release, nor a local build (``1.1+cpu``,
    a mirror's rebuild, not vLLM's release). A post-release (``0.2.1.post1``) is one."""
    return not version.is_prerelease and version.local is None


def releases(index_url: str) -> list[Version]:
    """The final releases with an sdist on the index that is not yanked (the candidates a move
    may go to), oldest first: post-releases included, local versions and yanked files not."""
    return sorted(v for v, s in sdists(index_url).items() if _is_release(v) and not s.yanked)


def find_sdist(pin: Pin, index_url: str) -> RemoteSdist:
    """The sdist of exactly ``pin``; a yanked one too (PEP 592: an exact pin may use it), with a
    warning that names the index's reason."""
    available = sdists(index_url)
    if pin.version in available:
        found = available[pin.version]
        if found.yanked:
            log.warn(
                f"{found.filename} is yanked on {redact(index_url)} ({found.yanked_reason}); used because "
                f"vllm {pin} is asked for exactly (PEP 592)"
            )
        return found
    nearest = nearby_releases(
        [v for v, s in available.items() if _is_release(v) and not s.yanked], pin.version
    )
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


def download(sdist: RemoteSdist, dest: Path) -> Path:
    """Download ``sdist`` to ``dest``, verified against the index's sha256."""
    return download_file(sdist.url, dest, sdist.sha256)[0]


def download_file(url: str, dest: Path, sha256: str | None = None) -> tuple[Path, str]:
    """The one download: ``url`` to ``dest`` through a ``.part`` file, hashed as it is
    written, flushed to disk, then renamed into place; return (``dest``, its sha256).

    A file already at ``dest`` is kept only when it has the promised ``sha256`` (the hash
    memo's, while it is unchanged); any other is downloaded afresh, and so is one left
    half-written by an interrupted run. A download whose bytes are not ``sha256`` is
    refused and nothing is kept. Its sha256 is remembered, so the next run does not read
    the file again (a 128 MB base wheel)."""
    if sha256 is not None and dest.is_file() and sha256_remembered(dest, hash_memo_dir()) == sha256:
        return dest, sha256
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    try:
        with requests.get(url, stream=True, timeout=120) as response, part.open("wb") as out:
            response.raise_for_status()
            total = int(response.headers.get("Content-Length") or 0) or None
            done = 0
            log.progress(dest.name, done, total)
            for chunk in response.iter_content(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                log.progress(dest.name, done, total)
            out.flush()
            os.fsync(out.fileno())
    except requests.RequestException as exc:
        part.unlink(missing_ok=True)
        raise IndexUnreachable(
            f"downloading {dest.name} from {url} failed: {exc}. Run the same command again; a "
            f"partial download is not reused."
        ) from None
    got = digest.hexdigest()
    if sha256 is not None and got != sha256:
        part.unlink(missing_ok=True)
        raise SourceHashMismatch(
            f"the download of {dest.name} from {url} has sha256 {got}, but the index promised "
            f"{sha256}. Nothing was kept; try again, or use another --index-url."
        )
    part.replace(dest)
    remember_sha256(dest, got, hash_memo_dir())
    return dest, got
