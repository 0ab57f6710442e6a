"""Apply the series: one commit per patch on the pin it was exported against, then
carried onto the requested pin with git's 3-way merge (merge-ort), dropping what
upstream already has.
"""

from __future__ import annotations

import email.utils
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from . import log, resolutions
from .errors import ForkError, PatchDoesNotApply
from .gitrepo import Identity, Repo
from .pins import Pin
from .resolutions import Progress
from .series import Patch, Series
from .upstream import Upstream


@dataclass(frozen=True)
class Applied:
    patch: Patch
    commit: str
    # What commit_series_on made it from: its parent and its tree ("" where not known). A
    # carry onto that very parent needs no 3-way merge: the merge of ``commit`` onto
    # ``commit^`` with base ``commit^`` is ``commit``'s own tree, without conflicts.
    parent: str = ""
    tree: str = ""


@dataclass(frozen=True)
class Dropped:
    patch: Patch
    reason: str


@dataclass(frozen=True)
class AppliedSeries:
    upstream: Upstream
    head: str
    applied: tuple[Applied, ...]
    dropped: tuple[Dropped, ...]


def patch_identity(patch: Patch) -> Identity:
    name, addr = email.utils.parseaddr(patch.author)
    return Identity(name or "unknown", addr or "unknown@invalid", patch.date)


def trailer_drop(patch: Patch, pin: Pin) -> str | None:
    """The reason to skip ``patch`` at ``pin`` by its Applied-Upstream trailer, if any."""
    version = patch.applied_upstream
    if version is not None and pin.version >= version:
        return f"Applied-Upstream: {version} (the pin {pin} contains it)"
    return None


# The commit that made a shared patch at the pin it was exported against
# (``Patch.exported_against``): the "theirs" of its 3-way merge onto another pin.
HomeCommit = Callable[[Patch], str]


def commit_series_on(
    repo: Repo, base: Upstream, series: Series, scratch: Path, home_commit: HomeCommit | None = None
) -> list[Applied]:
    """Commit every patch, in order, on the pin the series was exported against.

    This needs no work tree: ``git apply --cached`` on a private index. The commits are
    deterministic (author and date come from the patch), so they are the same everywhere.

    A shared patch (``patches/<name>``, not a pin's own form) exported against another
    pin that does not apply as it stands (upstream rewrote its context) is merged in:
    git's 3-way merge of ``home_commit(patch)``, the commit that made it at that pin,
    as a cherry-pick. So a pin needs its own form only where the patch's changed lines
    must differ there, not where its context does (docs/patch-workflow.md).
    """
    env = {"GIT_INDEX_FILE": str(scratch / "index-base")}
    repo.run("read-tree", base.commit, env=env)
    head = base.commit
    built = []
    for patch in series.patches:
        tree = _apply(repo, env, head, patch, base.pin, scratch, home_commit)
        if tree is None:
            continue
        parent, head = head, repo.commit_tree(tree, [head], patch.message, patch_identity(patch))
        built.append(Applied(patch, head, parent, tree))
    return built


def apply_as_built(
    repo: Repo, parent: str, patch: Patch, pin: Pin, scratch: Path, home_commit: HomeCommit | None
) -> str | None:
    """The tree the build makes of ``patch`` on the commit ``parent`` at ``pin`` (None: its
    trailer drops it there), or a PatchDoesNotApply."""
    env = {"GIT_INDEX_FILE": str(scratch / "index-one")}
    head = repo.out("rev-parse", "--verify", f"{parent}^{{commit}}").strip()
    repo.run("read-tree", head, env=env)
    return _apply(repo, env, head, patch, pin, scratch, home_commit)


def _apply(
    repo: Repo,
    env: dict[str, str],
    head: str,
    patch: Patch,
    pin: Pin,
    scratch: Path,
    home_commit: HomeCommit | None,
) -> str | None:
    """``patch`` applied to the index ``env`` holds (``head``'s tree): as it stands, else
    merged from its home; the new tree, or None where its trailer drops it at ``pin``."""
    patch_file = scratch / patch.name
    patch_file.write_text(patch.text)
    status, out = repo.run("apply", "--cached", "--recount", str(patch_file), env=env, ok_codes=(0, 1))
    if status != 0:
        if trailer_drop(patch, pin):
            return None
        home = patch.exported_against
        if home is None or home == pin or patch.path or home_commit is None:
            raise PatchDoesNotApply(_does_not_apply(patch, pin, out))
        repo.run("read-tree", _merged_from_home(repo, head, patch, pin, home_commit(patch)), env=env)
    return repo.out("write-tree", env=env).strip()


def _does_not_apply(patch: Patch, pin: Pin, out: str) -> str:
    if patch.path:  # a pin's own form is exported against its pin
        where = f"vllm {pin}, the pin whose own form it is"
    else:
        where = f"vllm {pin}, the pin the series says it was exported against"
    return (
        f"patches/{patch.entry} does not apply to {where}:\n{out.strip()}\nThe patch file was "
        f"edited by hand or the series order changed. Check it out with 'python build.py checkout "
        f"--pin {pin}' at the last good state, fix it there and export again."
    )


def _merged_from_home(repo: Repo, head: str, patch: Patch, pin: Pin, theirs: str) -> str:
    """The tree of ``theirs`` (``patch`` at its home pin) cherry-picked onto ``head``, or a
    PatchDoesNotApply naming the files in conflict and the way out."""
    tree, conflicts = _three_way(repo, head, theirs)
    if not conflicts:
        return tree
    home = patch.exported_against
    raise PatchDoesNotApply(
        f"patches/{patch.name} does not apply to vllm {pin} as it stands, and its 3-way merge "
        f"from vllm {home} (the pin it was exported against) conflicts in {', '.join(conflicts)}. "
        f"A shared patch that merges at every pin naming it is what 'export --promote' writes: "
        f"was it edited by hand? Restore it (git checkout -- patches/{patch.name}), or give vllm "
        f"{pin} its own form: 'python build.py checkout --pin {pin}' with the last good file, make "
        f"the change there, and export."
    )


def _reverse_applies(repo: Repo, head: str, patch: Patch, scratch: Path) -> bool:
    env = {"GIT_INDEX_FILE": str(scratch / "index-check")}
    repo.run("read-tree", head, env=env)
    status, _ = repo.run(
        "apply", "--cached", "--check", "--reverse", str(scratch / patch.name), env=env, ok_codes=(0, 1)
    )
    return status == 0


def _three_way(repo: Repo, head: str, commit: str) -> tuple[str, list[str]]:
    """Cherry-pick ``commit`` onto ``head`` in memory: merge-ort with base ``commit^``.

    git 2.39's ``merge-tree --write-tree`` takes no explicit base, so give it one: a
    throwaway commit with head's tree whose parent is ``commit^``.
    """
    parent = repo.out("rev-parse", f"{commit}^").strip()
    ours = repo.commit_tree(
        repo.tree_of(head), [parent], "carry", Identity("carry", "carry@invalid", "@0 +0000")
    )
    status, out = repo.run(
        "merge-tree", "--write-tree", "--name-only", "--no-messages", ours, commit, ok_codes=(0, 1)
    )
    lines = out.splitlines()
    return lines[0].strip(), [line.strip() for line in lines[1:] if line.strip()] if status == 1 else []


class StepKind(StrEnum):
    """What carrying one patch onto a head gives."""

    APPLIED = "applied"  # ``tree`` is the result
    DROPPED = "dropped"  # by its Applied-Upstream trailer
    UPSTREAMED = "upstreamed"  # a backport the head already contains
    EMPTY = "empty"  # a non-backport that changes nothing: never dropped, always an error
    CONFLICT = "conflict"  # ``tree`` holds the conflict markers, ``conflicts`` names the files


class AtConflict(StrEnum):
    """The carry's policy at a conflict (an empty RBLN patch is an error under either)."""

    STOP = "stop"  # the build: leave a work tree stopped at the conflict and raise
    GO_ON = "go on"  # the review and the tripwire: record it, carry the rest without it


@dataclass(frozen=True)
class Step:
    """What carrying one patch onto a head gives, before anything is committed."""

    kind: StepKind
    tree: str | None = None
    conflicts: tuple[str, ...] = ()
    reason: str = ""

    @property
    def left_out(self) -> bool:
        """Upstream has the patch (by trailer or by detection): it is not carried."""
        return self.kind in (StepKind.DROPPED, StepKind.UPSTREAMED)


def carry_step(repo: Repo, head: str, item: Applied, pin: Pin, scratch: Path) -> Step:
    """Carry one commit made by commit_series_on onto ``head`` (at ``pin``), in memory."""
    patch = item.patch
    if reason := trailer_drop(patch, pin):
        return Step(StepKind.DROPPED, reason=reason)
    if patch.is_backport and _reverse_applies(repo, head, patch, scratch):
        return Step(StepKind.UPSTREAMED, reason=_detected_reason(patch, pin, "it reverse-applies"))
    conflicts: list[str]
    if item.parent and item.parent == head:  # the base pin: the 3-way merge would give item.tree
        tree, conflicts = item.tree, []
    else:
        tree, conflicts = _three_way(repo, head, item.commit)
    if conflicts:
        return Step(StepKind.CONFLICT, tree, tuple(conflicts))
    if tree == repo.tree_of(head):
        if patch.is_backport:
            reason = _detected_reason(patch, pin, "applying it changes nothing")
            return Step(StepKind.UPSTREAMED, tree, reason=reason)
        return Step(StepKind.EMPTY, tree, reason=f"applying it to vllm {pin} changes nothing")
    return Step(StepKind.APPLIED, tree)


@dataclass(frozen=True)
class Carried:
    """One patch's fate in a carry."""

    item: Applied
    step: Step
    before: str  # the head it was carried onto
    commit: str | None  # the carried commit, if it applied


@dataclass(frozen=True)
class Carry:
    target: Upstream
    carried: tuple[Carried, ...]
    head: str


def carry(
    repo: Repo,
    built: list[Applied],
    target: Upstream,
    scratch: Path,
    *,
    at_conflict: AtConflict,
    conflict_root: Path | None = None,
    records: Path | None = None,
) -> Carry:
    """The one carry loop: the commits made by commit_series_on, onto ``target``, in order.

    Patches upstream has are left out with their reason. An RBLN patch that changes nothing
    raises (it is never dropped silently, whatever the policy). At a conflict, ``STOP``
    leaves a work tree in ``conflict_root`` and raises; ``GO_ON`` records it and carries
    the rest without it.
    """
    head = target.commit
    carried: list[Carried] = []
    for index, item in enumerate(built):
        patch = item.patch
        step = carry_step(repo, head, item, target.pin, scratch)
        if step.kind is StepKind.EMPTY:
            raise ForkError(
                f"patches/{patch.name} (Origin: {patch.origin_kind}) changes nothing on vllm "
                f"{target.pin}: upstream seems to contain it. An RBLN patch is never dropped "
                f"silently: remove it from the series, or give it 'Origin: backport, <ref>' "
                f"and 'Applied-Upstream: {target.pin}' if it was upstreamed."
            )
        if step.kind is StepKind.CONFLICT and at_conflict is AtConflict.STOP:
            assert conflict_root is not None, "AtConflict.STOP needs a conflict_root"
            rest = remaining_commits(built[index:], target.pin)
            raise _conflict_error(repo, patch, target, head, rest, conflict_root, records)
        commit = None
        if step.kind is StepKind.APPLIED:
            assert step.tree is not None
            # Same tree, parent, message and identity give the same id: on the base pin the
            # carried commit is the one commit_series_on made.
            commit = repo.commit_tree(step.tree, [head], patch.message, patch_identity(patch))
        carried.append(Carried(item, step, head, commit))
        head = commit or head
    return Carry(target, tuple(carried), head)


def carry_series(
    repo: Repo,
    built: list[Applied],
    base: Upstream,
    target: Upstream,
    scratch: Path,
    conflict_root: Path,
    records: Path | None = None,
) -> AppliedSeries:
    """The build's carry: stop at a conflict, say what was dropped and why."""
    result = carry(
        repo,
        built,
        target,
        scratch,
        at_conflict=AtConflict.STOP,
        conflict_root=conflict_root,
        records=records,
    )
    applied = [Applied(c.item.patch, c.commit) for c in result.carried if c.commit is not None]
    dropped = [Dropped(c.item.patch, c.step.reason) for c in result.carried if c.step.left_out]
    for drop in dropped:
        log.warn(f"dropped patches/{drop.patch.name}: {drop.reason}")
    return AppliedSeries(target, result.head, tuple(applied), tuple(dropped))


def remaining_commits(built: list[Applied], pin: Pin) -> list[str]:
    """The commits a conflict work tree cherry-picks: ``built`` less what trailers drop."""
    return [b.commit for b in built if not trailer_drop(b.patch, pin)]


def _detected_reason(patch: Patch, pin: Pin, how: str) -> str:
    return (
        f"already in vllm {pin} ({how}); add 'Applied-Upstream: {pin}' (or the first release "
        f"that has {patch.origin_ref}) to its trailers"
    )


HUNK = re.compile(r"^<<<<<<< ", re.M)


def conflict_work_tree(
    repo: Repo, target: Upstream, head: str, rest: list[str], root: Path, records: Path | None = None
) -> tuple[Path, Progress]:
    """Leave ``root/conflict-<label>``: ``head`` checked out, ``rest`` cherry-picked up to
    the first conflict that no recorded resolution (``records``, git rerere's) settles:
    a real ``git cherry-pick`` in progress, or the whole series carried."""
    tree = root / f"conflict-{target.label}"
    refuse_conflict_tree(tree)
    repo.run("worktree", "prune")  # git's record of a tree thrown away with rm -rf
    tree.parent.mkdir(parents=True, exist_ok=True)
    if records is not None:
        resolutions.load(records, repo)
    repo.run("worktree", "add", "--detach", str(tree), head)
    identity = Identity("vllm-rbln-fork", "vllm-rbln-fork@users.noreply.invalid", "@0 +0000").env()
    _, out = resolutions.run_tracked(repo, tree, "cherry-pick", *rest, env=identity)
    return tree, resolutions.advance(repo, tree, out)


def refuse_conflict_tree(tree: Path) -> None:
    """A ForkError if ``tree`` (``work/conflict-<label>``) is there: it holds a carry's
    resolutions (staged, committed, or a whole carried series not yet exported), which a new
    carry must never remove. It names how to go on with it and how to throw it away."""
    if not tree.exists() and not tree.is_symlink():
        return
    raise ForkError(
        f"{tree} is there: a carry of this pin stopped at a conflict, or carried and not yet "
        f"exported, and its resolutions would be lost. Go on with it: resolve, 'git add', "
        f"'python build.py continue --dir {tree}', then 'python build.py export --dir {tree}'. "
        f"Or, if it is done with or abandoned, throw it away ('rm -rf {tree}') and run this again."
    )


def resolve_instructions(tree: Path, progress: Progress | None = None) -> str:
    reused = ""
    if progress is not None and progress.reused:
        reused = f"{len(progress.reused)} conflicted file(s) were resolved from recorded resolutions"
        if progress.unexported:
            ids = " ".join(i[:12] for i in progress.unexported)
            reused += (
                f", {len(progress.unexported)} of them only in this cache, never exported to rerere/ "
                f"({ids}: a resolution an earlier carry made that was not exported). Check what they "
                f"resolved; if one is wrong, 'python build.py forget <id>' and run this again. "
            )
        else:
            reused += " (rerere/). "
    if progress is not None and not progress.stopped:
        return (
            f"{reused}Every patch is carried in {tree}: 'python build.py export --dir {tree}', "
            f"then build and test."
        )
    return (
        f"{reused}A work tree stopped at the conflict is at {tree}: resolve the files there, 'git add' "
        f"them, then 'python build.py continue --dir {tree}' (it carries the remaining patches, "
        f"reusing recorded resolutions), then 'python build.py export --dir {tree}'."
    )


def _conflict_error(
    repo: Repo,
    patch: Patch,
    target: Upstream,
    head: str,
    rest: list[str],
    root: Path,
    records: Path | None = None,
) -> PatchDoesNotApply:
    """Leave a work tree stopped at the conflict (a real ``git cherry-pick``) and describe it."""
    tree, progress = conflict_work_tree(repo, target, head, rest, root, records)
    if not progress.stopped:
        return PatchDoesNotApply(
            f"patches/{patch.name} does not apply to vllm {target.pin} by a plain 3-way merge; "
            + resolve_instructions(tree, progress)
        )
    files = list(progress.unresolved)
    stopped_at = repo.run("log", "-1", "--format=%s", "CHERRY_PICK_HEAD", cwd=tree, in_work_tree=True)[1]
    lines = [
        f"patches/{patch.name} does not apply to vllm {target.pin} by a plain 3-way merge. The "
        f"carry stopped at {stopped_at!r}: upstream changed the code it touches. Conflicts:"
    ]
    for name in files:
        path = tree / name
        text = path.read_text(errors="replace") if path.is_file() else ""
        starts = [text.count("\n", 0, m.start()) + 1 for m in HUNK.finditer(text)]
        where = (
            ", ".join(f"hunk at line {n}" for n in starts) or "file-level conflict (added/deleted/renamed)"
        )
        lines.append(f"  {name}: {where}")
    lines.append(resolve_instructions(tree, progress))
    return PatchDoesNotApply("\n".join(lines))


def materialize(repo: Repo, tree_dir: Path, upstream_commit: str, head: str) -> None:
    """Make ``tree_dir``, which holds ``upstream_commit``'s files, hold ``head``'s: write the
    files the series adds or changes (with their modes), remove the ones it deletes. Only
    those are touched (a handful, against thousands for a checkout).

    As a checkout does: every deletion first, and a directory left empty by one goes too
    (so a file can replace a directory, and a directory a file, whatever order git lists
    them in); a file is never written through a directory or over one."""
    _, out = repo.run("diff-tree", "-r", "-z", "--no-renames", upstream_commit, head, strip=False)
    fields = out.split("\0")
    entries = [
        (header.lstrip(":").split(" "), path)
        for header, path in zip(fields[0::2], fields[1::2], strict=False)
        if header
    ]
    root = tree_dir.resolve()
    for (_, new_mode, _, _, _), path in entries:
        if new_mode != "000000":
            continue
        target = tree_dir / path
        if target.is_symlink() or target.is_file():
            target.unlink()
        parent = target.parent
        while parent.resolve() != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    for (_, new_mode, _, new_sha, _), path in entries:
        if new_mode == "000000":
            continue
        if new_mode not in ("100644", "100755", "120000"):
            raise ForkError(f"the series makes {path} a {new_mode} entry; only files and links can be built.")
        target = tree_dir / path
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():  # a directory whose files the series deleted, now a file
            shutil.rmtree(target)
        data = repo.read_blob(new_sha)
        target.parent.mkdir(parents=True, exist_ok=True)
        if new_mode == "120000":
            target.symlink_to(os.fsdecode(data))
        else:
            target.write_bytes(data)
            target.chmod(0o755 if new_mode == "100755" else 0o644)


def checkout_into(repo: Repo, commit: str, tree_dir: Path, index_file: Path) -> None:
    """Write ``commit``'s files into the empty directory ``tree_dir``."""
    tree_dir.mkdir(parents=True, exist_ok=True)
    env = {"GIT_WORK_TREE": str(tree_dir), "GIT_INDEX_FILE": str(index_file)}
    repo.run("read-tree", commit, env=env)
    repo.run("checkout-index", "--all", "--force", env=env, cwd=tree_dir)
