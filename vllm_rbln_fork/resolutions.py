"""Recorded conflict resolutions: git's rerere, with its records kept in the repo.

git records a conflict (``preimage``: the file with its conflict markers) and, once the
conflict is committed, how it was resolved (``postimage``), under ``rr-cache/<id>`` of the
git directory, ``<id>`` being a hash of the conflicting hunks. The same conflict met
again, at another pin or after the series changed, is resolved from the record. The
cache repo is a cache, so the records live in the project (``rerere/<id>/preimage`` and
``postimage``): ``load`` copies them into a git directory before a carry, ``save`` copies
the new ones back on export.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .files import write_atomic
from .gitrepo import Identity, Repo

RECORD_FILES = ("preimage", "postimage")
REUSED = re.compile(r"^(?:Resolved|Staged) '(.+)' using previous resolution\.$", re.M)
IDENTITY = Identity("vllm-rbln-fork", "vllm-rbln-fork@users.noreply.invalid", "@0 +0000")


def _rr_cache(repo: Repo) -> Path:
    common = repo.out("rev-parse", "--git-common-dir").strip()
    path = Path(common)
    return (path if path.is_absolute() else repo.path / path) / "rr-cache"


def load(records: Path, repo: Repo) -> int:
    """Copy the project's records into ``repo``'s rr-cache (ones it lacks); return how many."""
    if not records.is_dir():
        return 0
    cache = _rr_cache(repo)
    copied = 0
    for record in sorted(records.iterdir()):
        if not all((record / f).is_file() for f in RECORD_FILES):
            continue
        dest = cache / record.name
        if (dest / "postimage").is_file():
            continue
        dest.mkdir(parents=True, exist_ok=True)
        for f in RECORD_FILES:
            shutil.copyfile(record / f, dest / f)
        copied += 1
    return copied


def save(repo: Repo, records: Path) -> list[str]:
    """Copy every resolved record of ``repo``'s rr-cache into ``records``; return the new or
    changed ones, as ``rerere/<id>``."""
    cache = _rr_cache(repo)
    if not cache.is_dir():
        return []
    changed = []
    for record in sorted(cache.iterdir()):
        if not all((record / f).is_file() for f in RECORD_FILES):
            continue  # a conflict not resolved (yet): nothing to reuse
        dest = records / record.name
        wrote = False
        for f in RECORD_FILES:
            data = (record / f).read_bytes()
            if not (dest / f).is_file() or (dest / f).read_bytes() != data:
                dest.mkdir(parents=True, exist_ok=True)
                write_atomic(dest / f, data)
                wrote = True
        if wrote:
            changed.append(f"{records.name}/{record.name}")
    return changed


@dataclass(frozen=True)
class Progress:
    """Where a cherry-pick of the series stands after resolutions were reused."""

    reused: tuple[str, ...]  # files resolved from a record, one entry per conflicted file
    stopped: bool  # still stopped at a conflict that needs a hand
    unresolved: tuple[str, ...]  # its files


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
        left = unmerged(repo, tree)
        if left:
            return Progress(tuple(reused), True, tuple(left))
        picking = _picking(repo, tree)
        status, out = repo.run(
            "cherry-pick", "--continue", env=env, cwd=tree, in_work_tree=True, ok_codes=(0, 1)
        )
        reused += REUSED.findall(out)
        if status != 0 and in_progress(tree, repo) and _picking(repo, tree) == picking:
            # No progress (e.g. the resolution left the commit empty): a hand is needed.
            return Progress(tuple(reused), True, ())
    return Progress(tuple(reused), False, ())


def _picking(repo: Repo, tree: Path) -> str:
    """The commit being cherry-picked (CHERRY_PICK_HEAD)."""
    args = ("rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD")
    return repo.run(*args, cwd=tree, in_work_tree=True, ok_codes=(0, 1))[1]
