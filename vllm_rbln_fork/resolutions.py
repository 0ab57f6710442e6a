"""Recorded conflict resolutions: git's rerere, with its records kept in the repo.

git records a conflict (``preimage``: the file with its conflict markers) and, once the
conflict is committed, how it was resolved (``postimage``), under ``rr-cache/<id>`` of the
git directory, ``<id>`` being a hash of the conflicting hunks. The same conflict met
again, at another pin or after the series changed, is resolved from the record. The
cache repo is a cache, so the records live in the project (``rerere/<id>/preimage`` and
``postimage``, and git's variants ``preimage.1``/``postimage.1``... when a conflict was met
again before it was resolved), which is their source of truth:

* ``load`` copies them into a git directory before a carry, over any other copy of the same
  id (a corrected record replays as corrected), and removes the ones it loaded before that
  the project no longer has and nobody changed since (a forgotten record is not replayed);
* a carry notes, in its work tree's own git directory, the id of every record it made or
  reused (``run_tracked``);
* ``save`` copies back, on export, the records that carry noted and no others (the cache
  repo's rr-cache is shared by every carry made in it), and notes them as the project's, as
  ``load`` does: forgotten in the project later (by anyone), they are dropped here too;
* ``forget`` removes records from the project and the cache repo, including a record the
  cache has and the project does not (a carry's, never exported).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import ForkError
from .files import write_atomic
from .gitrepo import Identity, Repo

# git rerere keeps variants of one id: ``preimage.1``/``postimage.1`` and so on appear when a
# conflict is met again before its first meeting was resolved. Each pair is a record's file.
VARIANT = re.compile(r"^(preimage|postimage)(\.[0-9]+)?$")
REUSED = re.compile(r"^(?:Resolved|Staged) '(.+)' using previous resolution\.$", re.M)
IDENTITY = Identity("vllm-rbln-fork", "vllm-rbln-fork@users.noreply.invalid", "@0 +0000")
# Beside rr-cache (git's own directory must hold records only): the ids ``load`` copied
# there and the sha256 of each postimage it wrote.
LOADED = "rbln-rerere-loaded"
# In a work tree's own git directory: the ids of the records its carry made or reused, and
# of those it replayed (resolved a conflict from).
TRACKED = "rbln-rerere-ids"
REPLAYED = "rbln-rerere-replayed"
RECORD_ID = re.compile(r"^[0-9a-f]{40}$")


def _rr_cache(repo: Repo) -> Path:
    common = repo.out("rev-parse", "--git-common-dir").strip()
    path = Path(common)
    return (path if path.is_absolute() else repo.path / path) / "rr-cache"


def _git_dir(repo: Repo, tree: Path) -> Path:
    """The work tree's own git directory (a linked work tree's, not the common one)."""
    out = repo.run("rev-parse", "--absolute-git-dir", cwd=tree, in_work_tree=True)[1]
    return Path(out.strip())


def _pairs(record: Path) -> list[str]:
    """The resolved variants of a record directory: the file names of each complete pair
    (``preimage``, ``postimage``, ``preimage.1``, ``postimage.1``, ...), sorted."""
    names = []
    for post in sorted(record.glob("postimage*")):
        match = VARIANT.match(post.name)
        if match and match.group(1) == "postimage" and (record / f"preimage{match.group(2) or ''}").is_file():
            names += [f"preimage{match.group(2) or ''}", post.name]
    return sorted(names)


def _records(directory: Path) -> dict[str, Path]:
    """The records with at least one resolved variant (a preimage and its postimage) in
    ``directory``, by id."""
    if not directory.is_dir():
        return {}
    return {d.name: d for d in sorted(directory.iterdir()) if RECORD_ID.match(d.name) and _pairs(d)}


def _digest(record: Path) -> str:
    """sha256 over every resolution (postimage, postimage.1, ...) of a record."""
    digest = hashlib.sha256()
    for name in _pairs(record):
        if name.startswith("postimage"):
            digest.update(name.encode() + b"\0" + (record / name).read_bytes() + b"\0")
    return digest.hexdigest()


def load(records: Path, repo: Repo) -> int:
    """Make ``repo``'s rr-cache hold the project's records; return how many were copied."""
    cache = _rr_cache(repo)
    manifest = cache.parent / LOADED
    before = _loaded(manifest)
    project = _records(records)
    in_cache = _records(cache)
    for record_id, digest in before.items():
        # Loaded from the project earlier, gone from it since, and unchanged in the cache:
        # forgotten. (A record resolved again since then is a new one: kept.)
        if record_id not in project and record_id in in_cache and _digest(in_cache[record_id]) == digest:
            shutil.rmtree(in_cache[record_id])
    copied = 0
    for record_id, record in project.items():
        dest = cache / record_id
        files = _pairs(record)
        if _pairs(dest) == files and all((dest / f).read_bytes() == (record / f).read_bytes() for f in files):
            continue
        dest.mkdir(parents=True, exist_ok=True)
        for f in files:
            write_atomic(dest / f, (record / f).read_bytes())
        for other in dest.glob("postimage*"):  # git's other resolutions of the same id
            if other.name not in files:
                other.unlink()
        copied += 1
    if project or manifest.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        _write_loaded(manifest, {i: _digest(r) for i, r in project.items()})
    return copied


def _loaded(manifest: Path) -> dict[str, str]:
    """The records a cache holds as the project's (``LOADED``): id -> sha256 of the postimage."""
    if not manifest.is_file():
        return {}
    return dict(line.split() for line in manifest.read_text().splitlines() if line.strip())


def _write_loaded(manifest: Path, loaded: dict[str, str]) -> None:
    write_atomic(manifest, "".join(f"{i} {d}\n" for i, d in sorted(loaded.items())))


def run_tracked(repo: Repo, tree: Path, *args: str, env: dict[str, str]) -> tuple[int, str]:
    """Run a git command that may meet conflicts (cherry-pick) in ``tree`` and note the
    records it made or reused: git writes or touches a record's postimage when it records or
    replays it, and lists a conflict still to resolve in MERGE_RR."""
    cache = _rr_cache(repo)
    resolved_before = {i: set(_pairs(r)) for i, r in _records(cache).items()}
    start = time.time() - 0.05  # file times lag the clock by up to a tick
    status, out = repo.run(*args, env=env, cwd=tree, in_work_tree=True, ok_codes=(0, 1))
    touched = {
        record_id: {
            f for f in _pairs(record) if f.startswith("postimage") and (record / f).stat().st_mtime >= start
        }
        for record_id, record in _records(cache).items()
    }
    _track(repo, tree, {i for i, files in touched.items() if files})
    # Replayed: a resolution that was there before the command and that git used (touched).
    replayed = {i for i, files in touched.items() if files & resolved_before.get(i, set())}
    if replayed:
        path = _git_dir(repo, tree) / REPLAYED
        known = set(path.read_text().split()) if path.is_file() else set()
        write_atomic(path, "".join(f"{i}\n" for i in sorted(known | replayed)))
    return status, out


def unexported(repo: Repo, tree: Path) -> tuple[str, ...]:
    """The records the carry in ``tree`` replayed that the project does not have: ones only
    this cache holds (a carry's resolution nobody exported), which ``load`` did not bring."""
    path = _git_dir(repo, tree) / REPLAYED
    replayed = set(path.read_text().split()) if path.is_file() else set()
    return tuple(sorted(replayed - set(_loaded(_rr_cache(repo).parent / LOADED))))


def _track(repo: Repo, tree: Path, ids: Iterable[str]) -> None:
    git_dir = _git_dir(repo, tree)
    merge_rr = git_dir / "MERGE_RR"
    pending = merge_rr.read_bytes().decode(errors="replace").split("\0") if merge_rr.is_file() else []
    ids = {*ids, *(entry.split("\t", 1)[0] for entry in pending if "\t" in entry)}
    known = tracked(repo, tree)
    if not ids <= known:
        write_atomic(git_dir / TRACKED, "".join(f"{i}\n" for i in sorted(known | ids)))


def tracked(repo: Repo, tree: Path) -> set[str]:
    """The ids of the records the carry in ``tree`` made or reused."""
    path = _git_dir(repo, tree) / TRACKED
    if not path.is_file():
        return set()
    return {line.split(".")[0] for line in path.read_text().split() if line}


def save(repo: Repo, records: Path) -> list[str]:
    """Copy the records the carry in ``repo``'s work tree made or reused into ``records``;
    return the new or changed ones, as ``rerere/<id>``. Records of other carries in the same
    cache repo, and resolutions of an ordinary rebase, are left where they are."""
    ids = tracked(repo, repo.path)
    cache = _rr_cache(repo)
    changed = []
    saved: dict[str, str] = {}
    for record_id, record in _records(cache).items():
        if record_id not in ids:
            continue
        saved[record_id] = _digest(record)
        dest = records / record_id
        wrote = False
        for f in _pairs(record):  # every resolved variant (preimage.1/postimage.1 ...)
            data = (record / f).read_bytes()
            if not (dest / f).is_file() or (dest / f).read_bytes() != data:
                dest.mkdir(parents=True, exist_ok=True)
                write_atomic(dest / f, data)
                wrote = True
        if wrote:
            changed.append(f"{records.name}/{record_id}")
    if saved:
        # Now the project's: noted as if loaded, so that when the project forgets one (a
        # colleague's 'forget', pulled), this cache's next load drops its copy.
        manifest = cache.parent / LOADED
        _write_loaded(manifest, {**_loaded(manifest), **saved})
    return changed


def forget(records: Path, prefixes: list[str], repo: Repo | None = None) -> list[str]:
    """Remove the records whose ids start with ``prefixes`` (each must name one) from the
    project and from ``repo``'s rr-cache, where a carry's record that was never exported is
    found too; return them as ``rerere/<id>`` (or the cache's path, for one only there).
    Every other cache drops its copy at its next ``load``."""
    project = _records(records)
    cache = _rr_cache(repo) if repo is not None else None
    in_cache = _records(cache) if cache is not None else {}
    known = sorted({*project, *in_cache})
    chosen: list[str] = []
    for prefix in prefixes:
        matches = [i for i in known if i.startswith(prefix.lower())] if len(prefix) >= 4 else []
        if len(matches) != 1:
            found = "none" if not matches else ", ".join(m[:12] for m in matches)
            where = f"{records.name}/" + (f" or {cache}" if cache is not None else "")
            raise ForkError(
                f"{records.name}/{prefix}: give at least 4 leading hex digits of one recorded "
                f"resolution in {where} (matches: {found}; 'ls {records.name}' lists the project's). "
                f"Nothing was removed."
            )
        chosen.append(matches[0])
    removed = []
    for record_id in chosen:
        if record_id in project:
            shutil.rmtree(project[record_id])
            removed.append(f"{records.name}/{record_id}")
        if cache is not None:
            if record_id not in project:
                removed.append(str(cache / record_id))
            shutil.rmtree(cache / record_id, ignore_errors=True)
    return removed


@dataclass(frozen=True)
class Progress:
    """Where a cherry-pick of the series stands after resolutions were reused."""

    reused: tuple[str, ...]  # files resolved from a record, one entry per conflicted file
    stopped: bool  # still stopped at a conflict that needs a hand
    unresolved: tuple[str, ...]  # its files
    # The ids of the records replayed that are not the project's (never exported): named, so
    # that a resolution abandoned in this cache is not taken for one of rerere/.
    unexported: tuple[str, ...] = ()


def unmerged(repo: Repo, tree: Path) -> list[str]:
    out = repo.run("diff", "--name-only", "--diff-filter=U", cwd=tree, in_work_tree=True)[1]
    return [line for line in out.splitlines() if line.strip()]


def in_progress(tree: Path, repo: Repo) -> bool:
    return (
        repo.run(
            "rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD", cwd=tree, in_work_tree=True, ok_codes=(0, 1)
        )[0]
        == 0
    )


def advance(repo: Repo, tree: Path, first_output: str = "") -> Progress:
    """Go on with the cherry-pick in ``tree`` while every conflict it meets was resolved from a
    record (rerere.autoUpdate stages them); stop at the first one that needs a hand."""
    reused = REUSED.findall(first_output)
    env = {**IDENTITY.env(), "GIT_EDITOR": "true"}
    while in_progress(tree, repo):
        _track(repo, tree, ())  # the conflict it stands at (MERGE_RR), resolved by hand
        left = unmerged(repo, tree)
        if left:
            return Progress(tuple(reused), True, tuple(left), unexported(repo, tree))
        picking = _picking(repo, tree)
        status, out = run_tracked(repo, tree, "cherry-pick", "--continue", env=env)
        reused += REUSED.findall(out)
        if status != 0 and in_progress(tree, repo) and _picking(repo, tree) == picking:
            # No progress (e.g. the resolution left the commit empty): a hand is needed.
            return Progress(tuple(reused), True, (), unexported(repo, tree))
    return Progress(tuple(reused), False, (), unexported(repo, tree))


def _picking(repo: Repo, tree: Path) -> str:
    """The commit being cherry-picked (CHERRY_PICK_HEAD)."""
    args = ("rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD")
    return repo.run(*args, cwd=tree, in_work_tree=True, ok_codes=(0, 1))[1]
