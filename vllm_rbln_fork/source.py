"""Where a pin's source comes from: the index (default), a local sdist/tree, or a git ref.

An sdist is unpacked by :func:`unpack_sdist`, which refuses absolute paths, ``..``, links
and devices, and checks its file name, top folder and PKG-INFO against the pin.
"""

from __future__ import annotations

import base64
import os
import shutil
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from .errors import BadPin, ForkError, SourceHashMismatch, UnsafeSource
from .files import sha256_remembered, user_path
from .paths import downloads_dir, hash_memo_dir
from .pins import LockedSdist, Pin, PinsLock
from .urls import redact


def _check_git_url(url: str) -> None:
    """Refuse, before anything logs or records the URL, a git URL that would show a secret.

    * An ``@`` after the authority, or a port that is not a number: a password holding a
      raw ``/``, ``?`` or ``#`` (``https://user:12/cret@host/r``, ``https://user:pa#ss@h/r``)
      ends the authority inside it, so nothing reads it as user info: git would get it on
      its command line and ``urls.redact`` would not hide it. The message does not repeat
      the URL.
    * A password in a URL other than http(s) (``ssh://``, ``ftp://``): only http(s) user
      info goes to git off its command line (``_credentials_off_the_command_line``).
    * A query or fragment of an http(s) URL, whatever its names (``?jwt=`` is as secret as
      ``?token=``, and no list of names is complete; git's smart HTTP needs neither), and
      of another scheme what ``urls.redact`` would hide: git hands the URL to its remote
      helper as an argument however config rewrites it (``url.<base>.insteadOf`` included).
    An scp-like ``user@host:path`` has no password to check.
    """
    parts = urllib.parse.urlsplit(url)
    if "://" not in url:
        return
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number: 'user:pa' of 'user:pa#ss')
        raw = "@" in parts.path + parts.query + parts.fragment
    except ValueError:
        raw = True
    if raw:
        raise ForkError(
            f"--source: the git URL ({parts.scheme}://...) has an '@' after its host: a password "
            "holding a raw '/', '?' or '#' ends the host inside it (the URL is not repeated "
            "here, so the password is not shown). Percent-encode them in the user info "
            "('/' %2F, '?' %3F, '#' %23, '@' %40), or give the password through a git "
            "credential helper."
        )
    web = parts.scheme in ("http", "https")
    if not web and parts.password:
        raise ForkError(
            f"--source: a password in a {parts.scheme}:// git URL would go to git's command "
            "line (ps shows that to every user of the machine). Use a key or a git credential "
            "helper, or an https:// URL, whose password goes to git as a header."
        )
    no_user = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    plain = urllib.parse.urlunsplit(no_user)
    if (web and (parts.query or parts.fragment)) or redact(plain) != plain:
        shown = urllib.parse.urlunsplit(no_user._replace(query="", fragment=""))
        raise ForkError(
            f"--source: the git URL {shown} has a query or fragment (?... or #...); git would put "
            f"it on its command line (ps shows that to every user of the machine). Give a secret "
            f"as the URL's password (USER:TOKEN@ before the host: it goes to git as a header, off "
            f"the command line) or through a git credential helper, not in the URL's query; git's "
            f"HTTP transport needs no query."
        )


class SourceKind(StrEnum):
    INDEX = "index"  # the pin's sdist from a package index
    SDIST = "sdist"  # a local sdist file
    TREE = "tree"  # a local source tree
    GIT = "git"  # a git ref


@dataclass(frozen=True)
class SourceSpec:
    """What the user asked for: where the pin's source comes from."""

    kind: SourceKind
    location: str  # index URL ("" for the index pip is configured with), local path, or git URL
    ref: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SourceKind(self.kind))  # "index" from a caller is checked too

    @classmethod
    def parse(cls, source: str | None, index_url: str | None) -> SourceSpec:
        if source is None:
            # No index given: pip's is asked for only when the index is needed (a cache hit
            # of a locked pin never needs it, and asking pip takes a subprocess).
            return cls(SourceKind.INDEX, index_url or "")
        if source.startswith("git+"):
            url, sep, ref = source[4:].rpartition("@")
            if not sep or not url or not ref:
                raise ForkError(f"--source {source!r}: write a git source as git+URL@REF.")
            # The @REF follows the URL's path: an '@' still inside scheme://authority is the
            # user info's ('git+https://user:secret@host/r' written without its @REF), and
            # splitting there would hand git (and a message) the secret as a URL of its own.
            _scheme, slashes, rest = url.partition("://")
            if slashes and not any(c in rest for c in "/?#"):
                raise ForkError(
                    f"--source {source!r}: the last '@' is in the URL's user info, so no @REF "
                    f"follows the repository's path. Write a git source as git+URL@REF "
                    f"(git+https://host/org/repo.git@v1.0)."
                )
            _check_git_url(url)
            return cls(SourceKind.GIT, url, ref)
        path = user_path(source, "--source")
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            return cls(SourceKind.SDIST, str(path))
        if path.is_dir():
            return cls(SourceKind.TREE, str(path))
        raise ForkError(f"--source {source!r} is neither an sdist (.tar.gz), a directory, nor git+URL@REF.")

    def index_url(self) -> str:
        """The index to ask: the one given, else the one pip is configured with."""
        if self.location:
            return self.location
        from .index_client import configured_index_url  # asks pip: only when needed

        return configured_index_url()

    @property
    def is_canonical(self) -> bool:
        """The pin's released sdist: the only source that gets the ``upstream/v<pin>`` tag."""
        return self.kind in (SourceKind.INDEX, SourceKind.SDIST)


def fetch_sdist(pin: Pin, spec: SourceSpec, lock: PinsLock) -> tuple[Path, str]:
    """Return (path of the pin's sdist, its sha256), checked against pins.lock.

    A cached download whose hash matches the lock is used without asking the index.
    """
    if spec.kind is SourceKind.SDIST:
        path = Path(spec.location)
        check_sdist_name(path.name, pin, f"--source {path}")
        sha256 = sha256_remembered(path, hash_memo_dir())
        lock.check_or_record(pin, LockedSdist(path.name, sha256))
        return path, sha256
    locked = lock.get(pin)
    if locked is not None:
        cached = downloads_dir() / locked.filename
        if cached.exists() and sha256_remembered(cached, hash_memo_dir()) == locked.sha256:
            return cached, locked.sha256
    from . import index_client as index  # the index client is heavy to import: not on the cache-hit path

    index_url = spec.index_url()
    remote = index.find_sdist(pin, index_url)
    check_sdist_name(remote.filename, pin, f"the index {redact(index_url)}")
    if locked is not None and locked.sha256 != remote.sha256:
        raise SourceHashMismatch(
            f"the index {index_url} offers {remote.filename} with sha256 {remote.sha256}, but "
            f"pins.lock recorded {locked.sha256} for vllm {pin}. Nothing was downloaded or built. "
            f"Use the index the lock was made from (--index-url), or, if upstream really "
            f"re-released it, remove the entry from pins.lock after review."
        )
    downloads_dir().mkdir(parents=True, exist_ok=True)
    path = index.download(remote, downloads_dir() / remote.filename)
    lock.check_or_record(pin, remote.locked)  # written by lock.commit(), once it is used
    return path, remote.sha256


def check_sdist_name(filename: str, pin: Pin, where: str) -> None:
    """Refuse an sdist whose file name is not vLLM ``pin``'s, spelled as ``--pin`` is: a
    version PEP 440 holds equal but spelled otherwise (``1.0.0`` for ``1.0``) would get a
    ledger, a lock entry and a wheel name of its own."""
    from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename

    try:
        name, version = parse_sdist_filename(filename)
    except InvalidSdistFilename:
        name, version = canonicalize_name(""), None
    if name != "vllm" or version is None or version != pin.version:
        raise UnsafeSource(
            f"{where}: {filename} is not vLLM {pin}'s sdist (vllm-{pin}.tar.gz); nothing was built "
            f"or recorded. Give --pin the version the file is, or the sdist of vllm {pin}."
        )
    if str(version) != str(pin):
        raise BadPin(
            f"--pin {pin}: vLLM spells this release {version} ({where} has {filename}). Give "
            f"--pin {version}: one release has one spelling in pins.lock, fork-releases.toml "
            f"and the wheel's name."
        )


def _check_member_version(sdist: Path, what: str, found: str, pin: Pin) -> None:
    from packaging.version import InvalidVersion, Version

    try:
        same = Version(found) == pin.version
    except InvalidVersion:
        same = False
    if not same:
        raise UnsafeSource(
            f"{sdist.name}: its {what} says version {found!r}, not {pin}: it is not vLLM {pin}'s "
            f"sdist, and nothing from it was used or recorded. Give --pin the version the file "
            f"is, or the sdist of vllm {pin}."
        )


FileSink = Callable[[str, int, bytes], None]
"""Called with each file of an sdist as it is unpacked: (its path inside the top
directory, 0o755 or 0o644, its bytes)."""


def unpack_sdist(
    sdist: Path, dest: Path, sink: FileSink | None = None, pin: Pin | None = None
) -> tuple[Path, int]:
    """Unpack ``sdist`` into ``dest`` in one pass; return (its top directory, SOURCE_DATE_EPOCH).

    With ``pin``, the top directory (``vllm-<version>``) and ``PKG-INFO``'s ``Version`` must
    be that pin's: a file renamed to another pin's name is refused.

    Each file is also handed to ``sink`` (the git import), so the sdist is read once. An
    sdist holds only files and directories under one top directory: a member that is
    absolute, has a ``..``, is a link or a device, or lies outside that directory is
    refused, and so is a truncated file (files written before that stay in ``dest``,
    which is the caller's scratch; the caller discards the import). This is stricter than
    tarfile's ``data`` filter, whose per-member ``realpath`` costs seconds on 8,000
    members, and needs no such check: no link is ever made. Modes are 0644, or 0755 when
    the owner may execute (as git records them).

    The epoch is the newest mtime among the sdist's members: a fact of the release,
    the same on every machine.
    """
    import email.parser  # here, with tarfile: a cache hit reads no sdist, and need not import them
    import tarfile

    top: str | None = None
    epoch = 0
    seen_pkg_info = False
    made: set[str] = set()
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                if member.name.startswith("/") or ".." in parts or not parts:
                    raise UnsafeSource(
                        f"{sdist.name} holds an unsafe member {member.name!r} (absolute or with '..'); "
                        f"nothing from it was used. Do not build from this file; fetch the sdist "
                        f"again from a trusted index."
                    )
                if not (member.isreg() or member.isdir()):
                    raise UnsafeSource(
                        f"{sdist.name} holds {member.name!r}, a link or special file, where an sdist "
                        f"holds only files and directories; nothing from it was used. Do not build "
                        f"from this file; fetch the sdist again from a trusted index."
                    )
                if top is None:
                    top = parts[0]
                    if pin is not None:
                        _check_member_version(sdist, f"top folder {top!r}", top.rpartition("-")[2], pin)
                if parts[0] != top or (member.isreg() and len(parts) == 1):
                    raise UnsafeSource(
                        f"{sdist.name} does not unpack into one top-level directory, as an sdist must."
                    )
                epoch = max(epoch, int(member.mtime))
                path = os.path.join(dest, *parts)
                if member.isdir():
                    os.makedirs(path, exist_ok=True)
                    continue
                reader = tar.extractfile(member)
                assert reader is not None  # a regular file always has a reader
                data = reader.read()
                parent = os.path.dirname(path)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                mode = 0o755 if member.mode & 0o100 else 0o644
                if os.path.lexists(path):  # the same name twice: the later one wins, as with tar
                    os.unlink(path)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
                if sink is not None:
                    sink("/".join(parts[1:]), mode, data)
                if pin is not None and parts[1:] == ["PKG-INFO"]:
                    pkg_info = email.parser.BytesHeaderParser().parsebytes(data)
                    _check_member_version(sdist, "PKG-INFO", str(pkg_info.get("Version", "")), pin)
                    seen_pkg_info = True
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise UnsafeSource(
            f"{sdist.name} is truncated or corrupt ({exc}). Delete it and run again to download it afresh."
        ) from None
    if top is None:
        raise UnsafeSource(f"{sdist.name} is empty: an sdist unpacks into one top-level directory.")
    if pin is not None and not seen_pkg_info:
        raise UnsafeSource(
            f"{sdist.name} has no {top}/PKG-INFO, which every sdist has; nothing from it was used or "
            f"recorded. Fetch vllm {pin}'s sdist again from a trusted index."
        )
    return dest / top, epoch


def copy_tree(src: Path, dest: Path) -> tuple[Path, int]:
    """Copy a local tree (without any .git) to ``dest``; the epoch is its newest file mtime."""
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    epoch = 0
    for root, _dirs, files in os.walk(dest):
        for name in files:
            epoch = max(epoch, int(os.lstat(os.path.join(root, name)).st_mtime))
    return dest, epoch


def _credentials_off_the_command_line(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its user info, and the environment that gives git the credentials.

    A process's arguments can be read by every user of the machine (``ps``); its environment
    only by its owner. So an http(s) URL's user info goes to git in ``GIT_CONFIG_*`` (git
    2.31+), never as an argument of ``git clone`` or of the ``git remote-https`` it starts:
    ``user:secret@`` (``TOKEN:@`` for a token with no password) as an Authorization header,
    sent up front; a name alone (``user@``: "ask for this user's password") as
    ``credential.username``, so git asks its credential helper (or the terminal) for that
    user's password on the server's challenge, as it does with the name in the URL; the
    name may be a token, so it stays off the command line too. Other schemes keep their
    URL: ``SourceSpec.parse`` refused a password there, and a secret in any query or
    fragment (``_check_git_url``)."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    if parts.scheme not in ("http", "https") or not at:
        return url, {}
    user, colon, secret = (urllib.parse.unquote(part) for part in userinfo.partition(":"))
    if colon:
        basic = base64.b64encode(f"{user}:{secret}".encode()).decode()
        key, value = "http.extraHeader", f"Authorization: Basic {basic}"
    else:
        key, value = "credential.username", user
    count = os.environ.get("GIT_CONFIG_COUNT", "")
    n = int(count) if count.isdigit() else 0  # after the user's own, if any
    env = {"GIT_CONFIG_COUNT": str(n + 1), f"GIT_CONFIG_KEY_{n}": key, f"GIT_CONFIG_VALUE_{n}": value}
    return bare, env


def clone_ref(url: str, ref: str, dest: Path) -> tuple[Path, int]:
    """Check out ``ref`` of ``url`` into ``dest`` (GitPython); the epoch is the commit's date."""
    import git

    bare_url, auth_env = _credentials_off_the_command_line(url)
    try:
        repo = git.Repo.clone_from(bare_url, dest, no_checkout=True, env=auth_env)
        repo.git.checkout(ref)
    except git.GitCommandError as exc:
        raise ForkError(f"cannot check out {ref!r} from {url}: {exc.stderr.strip()}") from None
    except git.UnsafeProtocolError:
        raise ForkError(
            f"--source git+{url}@{ref}: git's ext:: transport runs a command; it is refused. "
            f"Give an https://, ssh:// or file:// URL, or a local path."
        ) from None
    epoch = int(repo.head.commit.committed_date)
    shutil.rmtree(dest / ".git")
    return dest, epoch
