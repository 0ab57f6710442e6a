"""The build: pin -> source -> upstream commit -> patched branch -> wheel -> dist/.

Each stage's result is content-addressed and cached; only a finished wheel ever
reaches dist/, and builds on one machine are serialised by a lock.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__, log
from .errors import ForkError, PatchDoesNotApply, WouldRecord
from .files import (
    copy_atomic,
    fsync_dir,
    held,
    remember_sha256,
    sha256_of,
    sha256_remembered,
    tree_id,
    write_atomic,
)
from .manifest import BuildManifest, PatchRecord
from .paths import PROJECT_ROOT, cache_root, hash_memo_dir, locks_dir, upstream_repo_dir, wheel_cache_dir
from .pins import Pin, PinsLock
from .project import Project
from .releases import record_release, release_number
from .series import Patch, Series
from .source import SourceKind, SourceSpec, clone_ref, copy_tree, fetch_sdist, unpack_sdist
from .supported import carry_note, project_spelling, read_series_for, supported_pins
from .urls import redact

# A cache hit needs only the modules above. The stages that a hit skips (git: apply,
# gitrepo, upstream; the wheel build: wheel, packaging.metadata; --base-wheel: basewheel)
# are imported where they run, so a hit does not pay a third of a second to import them.
if TYPE_CHECKING:
    from .apply import AppliedSeries
    from .basewheel import BaseWheelSpec
    from .gitrepo import Repo
    from .upstream import Upstream

BUILD_LOCK = PROJECT_ROOT / "requirements" / "build.lock"


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    manifest_file: Path
    manifest: BuildManifest
    cached: bool


@dataclass(frozen=True)
class Prepared:
    """A pin's upstream commit and, when it had to be unpacked, its files on disk."""

    upstream: Upstream
    source_kind: str
    source_file: str
    source_sha256: str
    tree_dir: Path | None  # the upstream files, to be patched in place


@contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time on this machine: they share the cache repo and dist/.

    Every process of ours that writes a pack in the cache repo runs under this lock, so a
    temporary pack found on taking it is one a killed import left: it goes at once, on every
    build (a cache hit too: the rerun after the kill may import nothing)."""
    from .gitrepo import sweep_unfinished_packs

    with held(
        locks_dir() / "build.lock", "another build is running on this machine; waiting for it to finish"
    ):
        for path in sweep_unfinished_packs(upstream_repo_dir()):
            log.info(f"removed {path.name}, an unfinished pack a killed import left in {upstream_repo_dir()}")
        for path in _sweep_scratch():
            log.info(f"removed {path}, the scratch folder of a build that was killed")
        yield


@contextmanager
def project_lock(project: Project) -> Iterator[None]:
    """One writer at a time of the project's ``fork-releases.toml``, ``pins.lock`` and
    ``dist/``: :func:`build_lock` is the cache's, and two builds of one project with different
    caches (``VLLM_RBLN_FORK_CACHE``) hold two of those. Taken inside the build lock, never
    around it."""
    with held(
        project.lock_file,
        f"another build of {project.root} is recording its release (with another build cache); waiting",
    ):
        yield


def _sweep_scratch() -> list[Path]:
    """Every scratch folder under ``cache/tmp``: each is made by a build, checkout or review
    under the build lock and removed before it is let go, so one found by the lock's new
    holder is a killed run's (an unpacked sdist: hundreds of MB, kept forever otherwise).
    So is a wheel-cache entry still being filled (``wheels/.<key>-*``, see :func:`_store`,
    which runs only under the lock): a build killed while it copied its wheel there."""
    root = cache_root() / "tmp"
    stale = sorted(root.iterdir()) if root.is_dir() else []
    if wheel_cache_dir().is_dir():
        stale += sorted(p for p in wheel_cache_dir().iterdir() if p.name.startswith("."))
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def scratch_dir() -> Path:
    path = cache_root() / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def prepare(
    repo: Repo,
    pin: Pin,
    spec: SourceSpec,
    lock: PinsLock,
    scratch: Path,
    fetched: tuple[Path, str] | None = None,
) -> Prepared:
    """Make sure ``pin``'s upstream commit exists; unpack only when it does not."""
    from .upstream import find, import_tree, record_import, tree_import

    if spec.is_canonical:
        if fetched is None:
            with log.phase(f"source vllm {pin}"):
                fetched = fetch_sdist(pin, spec, lock)
        sdist, sha256 = fetched
        known = find(repo, pin)
        if known is not None and sha256 in repo.out("log", "-1", "--format=%B", known.commit):
            return Prepared(known, spec.kind, sdist.name, sha256, None)
        with log.phase(f"import vllm {pin} into git"):
            # One pass over the sdist: each file is written out and streamed into git.
            with tree_import(repo) as (importer, tree):
                tree_dir, epoch = unpack_sdist(sdist, scratch / f"src-{pin}", importer.add, pin)
            origin = f"{sdist.name} (sha256 {sha256})"
            up = record_import(repo, pin, tree[0], epoch, origin, canonical=True)
        return Prepared(up, spec.kind, sdist.name, sha256, tree_dir)
    shown = redact(spec.location)  # a git URL's credentials go to git alone: not to a commit or dist/
    with log.phase(f"import {spec.kind} source {shown}"):
        dest = scratch / f"src-{pin}"
        if spec.kind is SourceKind.GIT:
            assert spec.ref is not None
            tree_dir, epoch = clone_ref(spec.location, spec.ref, dest)
            origin = f"git {shown} at {spec.ref}"
        else:
            tree_dir, epoch = copy_tree(Path(spec.location), dest)
            origin = f"a local tree ({Path(spec.location).name})"
        up = import_tree(repo, pin, tree_dir, epoch, origin, scratch / f"index-{pin}", canonical=False)
    return Prepared(up, spec.kind, shown, "", tree_dir)


def base_upstream(
    repo: Repo, series: Series, target: Prepared, spec: SourceSpec, lock: PinsLock, scratch: Path
) -> Upstream:
    """The upstream commit of the pin the series was exported against (imported if need be)."""
    base_pin = series.exported_against
    if base_pin == target.upstream.pin:
        return target.upstream
    base_spec = spec if spec.kind is SourceKind.INDEX else SourceSpec.parse(None, None)
    return prepare(repo, base_pin, base_spec, lock, scratch).upstream


class Homes:
    """Each shared patch's commit at the pin it was exported against (its home,
    ``Patch.exported_against``): the 3-way merge's "theirs" where the patch does not apply
    to another pin as it stands. It is the shared file committed on the home's series up to
    it (its sdist imported if this machine lacks it), even where that series has since given
    the home an own form of the patch: the other pins keep building what they built, and a
    change made at one pin never reaches another unasked. Merges of the home's own are
    followed.

    ``override``: commits given by pin and patch name, of patches whose shared text they
    make (export checks a series not yet written).
    ``peer``: a repository to take a pin's upstream commit from before importing its sdist
    (export works in a checkout's clone; the build cache has the pins it built)."""

    def __init__(
        self,
        repo: Repo,
        project: Project,
        spec: SourceSpec,
        lock: PinsLock,
        scratch: Path,
        override: dict[Pin, dict[str, str]] | None = None,
        peer: Path | None = None,
    ) -> None:
        self.repo, self.project, self.lock, self.scratch, self.peer = repo, project, lock, scratch, peer
        # A home comes from the index even when the pin built comes from a git or local tree.
        self.spec = spec if spec.kind is SourceKind.INDEX else SourceSpec.parse(None, None)
        self._override = override or {}
        self._commits: dict[tuple[Pin, str], str] = {}
        self._building: set[tuple[Pin, str]] = set()

    def __call__(self, patch: Patch) -> str:
        home = patch.exported_against
        assert home is not None
        if commit := self._override.get(home, {}).get(patch.name):
            return commit
        key = (home, patch.name)
        if key not in self._commits:
            if key in self._building:
                raise PatchDoesNotApply(
                    f"patches/{patch.name} cannot be merged from vllm {home}: building it there "
                    f"needs this very merge. Export it again at a supported pin ('python build.py "
                    f"checkout --pin <pin>', then 'export --rehome')."
                )
            self._building.add(key)
            try:
                self._commits[key] = self._commit_at_home(home, patch)
            finally:
                self._building.discard(key)
        return self._commits[key]

    def with_commit(self, pin: Pin, name: str, commit: str) -> Homes:
        """These homes with ``commit`` as ``name``'s at ``pin`` (export's check of a patch
        it would promote), and nothing built yet (a home's build may merge that patch)."""
        given = {**self._override, pin: {**self._override.get(pin, {}), name: commit}}
        return Homes(self.repo, self.project, self.spec, self.lock, self.scratch, given, self.peer)

    def _commit_at_home(self, home: Pin, patch: Patch) -> str:
        from .apply import commit_series_on
        from .series import read_series

        series_file = self.project.series_dir / str(home)
        if not series_file.is_file():
            raise PatchDoesNotApply(
                f"patches/{patch.name} does not apply as it stands, and it cannot be merged "
                f"from vllm {home}, the pin it was exported against: there is no series/{home} "
                f"to build it from (a retired pin?). A pin is retired after the shared patches "
                f"merged from it get another home: with series/{home} there (restore it from git "
                f"if it went), 'python build.py checkout --pin <a supported pin>', then 'python "
                f"build.py export --dir <tree> --rehome' (docs/patch-workflow.md)."
            )
        series = read_series(series_file, self.project.patches_dir)
        names = [p.name for p in series.patches]
        if patch.name not in names:
            raise PatchDoesNotApply(
                f"patches/{patch.name} does not apply as it stands, and series/{home} (the pin it "
                f"was exported against) does not name it, so there is nothing to merge it from. "
                f"Export it again at a pin whose series names it ('python build.py checkout --pin "
                f"<pin>', then 'export --rehome')."
            )
        prefix = Series(home, (*series.patches[: names.index(patch.name)], patch), ())
        scratch = self.scratch / f"home-{home}-{len(self._commits)}"
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            with log.phase(f"commit series/{home} on vllm {home} up to {patch.name}, to merge it from"):
                built = commit_series_on(self.repo, self.upstream(home), prefix, scratch, self)
        except PatchDoesNotApply as exc:
            raise PatchDoesNotApply(
                f"while committing series/{home} on vllm {home} to merge patches/{patch.name} from: {exc}"
            ) from None
        if not built or built[-1].patch is not patch:
            raise PatchDoesNotApply(
                f"patches/{patch.name} does not apply as it stands, and at vllm {home}, the pin it "
                f"was exported against, its trailer drops it: there is nothing to merge it from."
            )
        return built[-1].commit

    def upstream(self, pin: Pin) -> Upstream:
        """``pin``'s upstream commit in ``repo``: fetched from ``peer`` if it has it, else
        imported from the sdist (hash-checked, as a build does)."""
        from .upstream import find

        if self.peer is not None and self.peer != self.repo.git_dir:
            tag = f"refs/tags/upstream/v{pin}"
            fetch = ("fetch", "--quiet", "--no-tags", str(self.peer), f"+{tag}:{tag}")
            self.repo.run(*fetch, ok_codes=(0, 1, 128))  # not there: imported below
        locked = self.lock.get(pin)
        known = find(self.repo, pin)
        if known and locked and locked.sha256 in self.repo.out("log", "-1", "--format=%B", known.commit):
            return known  # the import of the very sdist pins.lock records: no download
        scratch = self.scratch / f"upstream-{pin}"
        scratch.mkdir(parents=True, exist_ok=True)
        return prepare(self.repo, pin, self.spec, self.lock, scratch).upstream


def home_parts(project: Project, series: Series, lock: PinsLock) -> list[str]:
    """What a build may merge from, for the wheel cache key: each home of the series' shared
    patches other than its own pin, and theirs in turn (a home's build merges too), with its
    series (order and bytes) and its sdist's recorded hash."""
    from .series import read_series

    parts: list[str] = []
    seen = {series.exported_against}
    todo = [series]
    while todo:
        homes = {p.exported_against for p in todo.pop().patches if not p.path} - seen - {None}
        for home in sorted(h for h in homes if h is not None):
            seen.add(home)
            series_file = project.series_dir / str(home)
            fingerprint = "-"
            if series_file.is_file():
                home_series = read_series(series_file, project.patches_dir)
                fingerprint = home_series.fingerprint
                todo.append(home_series)
            locked = lock.get(home)
            parts.append(f"home {home} {fingerprint} {locked.sha256 if locked else '-'}")
    return parts


def apply_series(
    repo: Repo,
    series: Series,
    target: Prepared,
    spec: SourceSpec,
    lock: PinsLock,
    scratch: Path,
    project: Project,
) -> AppliedSeries:
    """Commit the series on the pin it was exported against and carry it onto ``target``."""
    from .apply import carry_series, commit_series_on

    base = base_upstream(repo, series, target, spec, lock, scratch)
    with log.phase(f"apply {len(series.patches)} patches"):
        built = commit_series_on(repo, base, series, scratch, Homes(repo, project, spec, lock, scratch))
        result = carry_series(
            repo, built, base, target.upstream, scratch, project.work_dir, project.rerere_dir
        )
        repo.run("update-ref", f"refs/heads/{target.upstream.branch}", result.head)
    log.info(f"branch {target.upstream.branch}: {len(result.applied)} applied, {len(result.dropped)} dropped")
    return result


PACKAGE_DIR = Path(__file__).resolve().parent
KEY_FORMAT = "wheel-cache-2"  # bump when the key's parts change meaning


def tool_fingerprint(package: Path = PACKAGE_DIR) -> str:
    """A hash of the tool's own files (their paths and bytes): any change to the code that
    makes a wheel gives another cache key."""
    return tree_id(package.parent, package.name)


def cache_key(parts: Iterable[str]) -> str:
    """The wheel cache's key: a hash of every input to the wheel, in order."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def key_parts(
    source_identity: str, series: Series, pin: Pin, base_identity: str = "", homes: Iterable[str] = ()
) -> list[str]:
    """What a wheel depends on: the source, the series, the pin, the tool that builds it
    (its code, its Python, its lock), with --base-wheel the base's sha256 (and the policy's),
    and what its shared patches may be merged from (``home_parts``)."""
    return [
        KEY_FORMAT,
        source_identity,
        series.fingerprint,
        str(pin),
        tool_fingerprint(),
        platform.python_version(),
        sha256_of(BUILD_LOCK),
        base_identity,
        *homes,
    ]


def build(
    pin: Pin,
    spec: SourceSpec,
    project: Project,
    *,
    use_cache: bool = True,
    base_wheel: BaseWheelSpec | None = None,
    locked: bool = False,
) -> BuildResult:
    """The RBLN wheel of ``pin``: pure Python by default, or over ``base_wheel``'s binary build.

    ``locked``: refuse (:class:`WouldRecord`, nothing built into dist/) a build that would add
    to ``pins.lock`` or ``fork-releases.toml``: a release publishes only what main records."""
    pin = project_spelling(project, pin)
    series = read_series_for(project, pin)
    if not supported_pins(project):
        for stray in series.stray_files:
            log.warn(f"patches/{stray} is not named in {project.series_file.name}; it is not applied")
    elif note := carry_note(series, pin):
        log.warn(note)
    lock = PinsLock(project.pins_lock)
    with build_lock(), tempfile.TemporaryDirectory(prefix="build-", dir=scratch_dir()) as tmp:
        scratch = Path(tmp)
        key = fetched = base = policy = None
        base_identity = ""
        if base_wheel is not None:
            from .basewheel import Policy, fetch_base_wheel

            policy = Policy.load(pin, project.base_wheel_policy)
            with log.phase(f"base wheel {base_wheel.location}"):
                base = fetch_base_wheel(base_wheel, lambda: _index_url(spec), lock)
            base_identity = f"{base.sha256} {policy.digest}"
        if spec.is_canonical:
            with log.phase(f"source vllm {pin}"):
                fetched = fetch_sdist(pin, spec, lock)
            if locked:
                _refuse_unlocked(project, lock, pin)
            homes = home_parts(project, series, lock)
            key = cache_key(key_parts(fetched[1], series, pin, base_identity, homes))
            if use_cache and (hit := _cached(key, project, pin)):
                return _finish(hit, project, lock, cached=True, locked=locked)
        from .apply import checkout_into, materialize
        from .gitrepo import Repo
        from .wheel import build_wheel

        repo = Repo(upstream_repo_dir())
        target = prepare(repo, pin, spec, lock, scratch, fetched)
        if key is None:
            homes = home_parts(project, series, lock)
            upstream_tree = repo.tree_of(target.upstream.commit)
            key = cache_key(key_parts(upstream_tree, series, pin, base_identity, homes))
            if use_cache and (hit := _cached(key, project, pin)):
                return _finish(hit, project, lock, cached=True, locked=locked)
        if base is not None and policy is not None:
            from .basewheel import check_base

            with log.phase(f"check {base.filename}'s Python against vllm {pin}'s sdist"):
                facts = check_base(base, pin, repo, target.upstream.commit, policy)
        result = apply_series(repo, series, target, spec, lock, scratch, project)
        tree_dir = scratch / "patched"
        with log.phase("check out the patched tree"):
            if target.tree_dir is not None:
                materialize(repo, target.tree_dir, target.upstream.commit, result.head)
                tree_dir = target.tree_dir
            else:
                checkout_into(repo, result.head, tree_dir, scratch / "index-patched")
        patched_tree = repo.tree_of(result.head)
        n, new = release_number(project.releases_file, pin, patched_tree)
        if locked:
            _refuse_unlocked(project, lock, pin, (n, patched_tree) if new else None)
        manifest = _manifest(pin, n, target, result, series, patched_tree)
        if base is None or policy is None:
            with log.phase(f"build wheel {manifest.wheel_version}"):
                wheel = build_wheel(
                    tree_dir, manifest.wheel_version, target.upstream.epoch, manifest, scratch
                )
        else:
            manifest = replace(
                manifest,
                base_wheel_file=base.filename,
                base_wheel_sha256=base.sha256,
                base_wheel_device=facts.device,
            )
            from .basewheel import overlay

            with log.phase(f"put the patched Python over {base.filename}"):
                wheel = overlay(
                    base,
                    facts,
                    repo,
                    target.upstream.commit,
                    result.head,
                    tree_dir,
                    manifest,
                    policy,
                    scratch,
                )
        manifest = replace(manifest, wheel_file=wheel.name, wheel_sha256=sha256_of(wheel))
        entry = _store(key, wheel, manifest)
        return _finish(entry, project, lock, cached=False, locked=locked)


def _finish(entry: Path, project: Project, lock: PinsLock, *, cached: bool, locked: bool) -> BuildResult:
    """Once the wheel is built (in the wheel cache, ``entry``), under :func:`project_lock`:
    record the wheel's number in fork-releases.toml (refused, nothing written, if another
    build of the project gave it to another tree meanwhile) and the sdist's hash in
    pins.lock, then, last, put the wheel into dist/. A build killed or failed before leaves
    all three as they were; dist/ never holds a wheel whose label the ledger refused."""
    manifest = BuildManifest.from_json((entry / "manifest.json").read_text())
    pin = Pin.parse(manifest.pin)
    with project_lock(project):
        new = release_number(project.releases_file, pin, manifest.patched_tree)[1]
        if locked:
            _refuse_unlocked(
                project, lock, pin, (manifest.fork_release, manifest.patched_tree) if new else None
            )
        if new:
            record_release(project.releases_file, pin, manifest.fork_release, manifest.patched_tree)
            log.info(f"new fork release {manifest.wheel_version} recorded in {project.releases_file.name}")
        for name in lock.commit():
            log.info(f"recorded {name}'s sha256 in {lock.path.name}")
        return _install_into_dist(entry, manifest, project, cached=cached)


def _refuse_unlocked(
    project: Project, lock: PinsLock, pin: Pin, unrecorded: tuple[int, str] | None = None
) -> None:
    """``--locked``: refuse a build that would add ``unrecorded`` (a number and its tree) to
    fork-releases.toml, or any staged hash to pins.lock. Nothing is written."""
    way_out = (
        f"Nothing was built into dist/ or published. Build it without --locked (python build.py "
        f"--pin {pin}), commit what it records to main, and release from that commit."
    )
    if unrecorded is not None:
        n, tree = unrecorded
        raise WouldRecord(
            f"--locked: {project.releases_file.name} has no number for vllm {pin}'s patched tree "
            f"{tree} (this build would record it as +rbln.{n}), and a release publishes only a "
            f"label the committed ledger holds: another build could take the number. {way_out}"
        )
    if staged := lock.staged():
        raise WouldRecord(
            f"--locked: {lock.path.name} has no sha256 for {', '.join(staged)}, and a release "
            f"builds only from files whose hashes are committed. {way_out}"
        )


def _index_url(spec: SourceSpec) -> str:
    return spec.index_url() if spec.kind is SourceKind.INDEX else SourceSpec.parse(None, None).index_url()


def wheel_version(pin: Pin, n: int, source_kind: str, patched_commit: str) -> str:
    """``<pin>+rbln.<n>`` for a build of the pin's released sdist; for a local tree or a git
    ref, ``<pin>+rbln.<n>.<tree|git>.<patched commit, 12 digits>``: the same patched tree
    built from there gives other bytes (its upstream commit names that source, and the
    manifest inside the wheel holds the commits), so it never takes the release's label and
    file name (``dist/``, an index: "a published file is never replaced")."""
    if source_kind in (SourceKind.INDEX, SourceKind.SDIST):
        return f"{pin}+rbln.{n}"
    return f"{pin}+rbln.{n}.{source_kind}.{patched_commit[:12]}"


def _manifest(
    pin: Pin, n: int, target: Prepared, result: AppliedSeries, series: Series, patched_tree: str
) -> BuildManifest:
    def record(patch: Patch, reason: str = "") -> PatchRecord:
        return PatchRecord(patch.name, patch.sha256, patch.trailer("Origin") or "", patch.subject, reason)

    return BuildManifest(
        pin=str(pin),
        wheel_version=wheel_version(pin, n, target.source_kind, result.head),
        fork_release=n,
        source_kind=target.source_kind,
        source_file=target.source_file if target.source_kind != "tree" else Path(target.source_file).name,
        source_sha256=target.source_sha256,
        upstream_commit=target.upstream.commit,
        patched_commit=result.head,
        patched_tree=patched_tree,
        series_exported_against=str(series.exported_against),
        source_date_epoch=target.upstream.epoch,
        tool_version=__version__,
        applied=tuple(record(a.patch) for a in result.applied),
        dropped=tuple(record(d.patch, d.reason) for d in result.dropped),
    )


def _store(key: str, wheel: Path, manifest: BuildManifest) -> Path:
    """Put the wheel and its manifest in the wheel cache, atomically."""
    entry = wheel_cache_dir() / key
    if entry.exists():
        shutil.rmtree(entry)
    wheel_cache_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=wheel_cache_dir()))
    copy_atomic(wheel, tmp / wheel.name)  # each flushed to disk (fsync)
    write_atomic(tmp / "manifest.json", manifest.to_json())
    tmp.rename(entry)
    fsync_dir(wheel_cache_dir())
    remember_sha256(entry / wheel.name, manifest.wheel_sha256, hash_memo_dir())
    return entry


def _cached(key: str, project: Project, pin: Pin) -> Path | None:
    """The wheel-cache entry of ``key``; None (a miss) when there is none, when it is
    damaged (its manifest unreadable, its wheel missing or of other bytes), or when its label
    is not the one fork-releases.toml gives its tree: one label never names two trees (a
    colleague's release may have taken the number since the wheel was cached)."""
    entry = wheel_cache_dir() / key
    if not (entry / "manifest.json").exists():
        return None
    try:
        manifest = BuildManifest.from_json((entry / "manifest.json").read_text())
    except (ValueError, TypeError, KeyError, OSError) as exc:  # JSONDecodeError is a ValueError
        log.warn(f"the cache entry {entry} has an unreadable manifest.json ({exc}); rebuilding")
        shutil.rmtree(entry, ignore_errors=True)
        return None
    wheel = entry / manifest.wheel_file
    if not wheel.exists() or sha256_remembered(wheel, hash_memo_dir()) != manifest.wheel_sha256:
        log.warn(f"the cached wheel in {entry} is damaged; rebuilding")
        shutil.rmtree(entry, ignore_errors=True)
        return None
    n, _ = release_number(project.releases_file, pin, manifest.patched_tree)
    if n != manifest.fork_release:
        log.warn(
            f"the cached {manifest.wheel_file} is labelled +rbln.{manifest.fork_release}, but "
            f"{project.releases_file.name} gives its tree +rbln.{n}; rebuilding it with that label"
        )
        return None
    log.info(f"cache hit: {manifest.wheel_file} (same source, series, tool code, Python and lock)")
    return entry


def _install_into_dist(
    entry: Path, manifest: BuildManifest, project: Project, *, cached: bool
) -> BuildResult:
    """Copy wheel and manifest into dist/ through temp files and renames: never half-written.
    A wheel already in dist/ with the right bytes (its remembered sha256) is left alone."""
    dist = project.dist_dir
    wheel = dist / manifest.wheel_file
    manifest_file = dist / (manifest.wheel_file.removesuffix(".whl") + ".manifest.json")
    try:
        dist.mkdir(parents=True, exist_ok=True)
        if not (wheel.is_file() and sha256_remembered(wheel, hash_memo_dir()) == manifest.wheel_sha256):
            copy_atomic(entry / manifest.wheel_file, wheel)
            remember_sha256(wheel, manifest.wheel_sha256, hash_memo_dir())
        write_atomic(manifest_file, (entry / "manifest.json").read_bytes(), skip_if_same=True)
    except OSError as exc:
        raise ForkError(
            f"cannot write {manifest.wheel_file} into {dist} ({exc.strerror or exc}). Nothing there "
            f"was half-written; {project.releases_file.name} and pins.lock record the wheel, which "
            f"waits in the build cache. Make {dist} a writable folder (or free space on its disk) "
            f"and run the same command again: that takes a moment."
        ) from None
    return BuildResult(wheel, manifest_file, manifest, cached)
