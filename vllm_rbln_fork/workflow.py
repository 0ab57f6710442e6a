"""The edit loop (quilt push/pop/refresh, git style): checkout the series as a git
tree with one commit per patch, edit with ordinary git, export back to patches/.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from . import log, resolutions
from .errors import ForkError, PatchDoesNotApply, SeriesError
from .files import write_atomic
from .gitrepo import Repo
from .paths import upstream_repo_dir
from .pins import Pin, PinsLock
from .pipeline import Homes, apply_series, build_lock, prepare, project_lock, scratch_dir
from .project import Project
from .series import (
    EXPORTED_AGAINST_HEADER,
    Patch,
    Series,
    lint,
    parse_patch,
    read_series,
    read_series_names,
    render_series,
)
from .source import SourceSpec
from .supported import (
    carry_note,
    listed_pins,
    project_spelling,
    read_series_for,
    series_pins,
    supported_pins,
    unused_patch_files,
)

# Pinned so that exporting an unchanged branch changes no byte, whatever the
# user's git config says. Blob ids are abbreviated to a fixed length; they stay
# put because patches are exported against one recorded pin.
FORMAT_PATCH = (
    "format-patch",
    "-1",
    "--stdout",
    "--keep-subject",
    "--no-stat",
    "--no-signature",
    "--zero-commit",
    "--no-numbered",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--find-renames",
    "--abbrev=12",
    "--encoding=UTF-8",
    "--no-notes",
    "--no-add-header",
    # What format.* and diff.* settings would change, pinned too (a work tree's own config):
    "--no-thread",
    "--no-signoff",
    "--no-to",
    "--no-cc",
    "--no-from",
    "--no-base",
    "--unified=3",
    "--inter-hunk-context=0",
    "--indent-heuristic",
    "--encode-email-headers",
)


def exported_against_header(pin: Pin) -> str:
    """format-patch's option that records, in each patch's mail header, the pin it was
    exported against (``Patch.exported_against``): where a build merges a shared patch from."""
    return f"--add-header={EXPORTED_AGAINST_HEADER}: vllm {pin}"


def checkout(pin: Pin, spec: SourceSpec, project: Project, dest: Path) -> Path:
    """Apply the series at ``pin`` and clone its branch to ``dest`` for editing (a new or
    empty directory)."""
    # Absolute: git runs in the cache repo, where a relative dest would be cloned (and an
    # empty repo made at the dest the user meant).
    dest = dest.absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ForkError(
            f"{dest} already exists. Export it first ('python build.py export --dir {dest}') "
            f"or delete it, then check out again."
        )
    pin = project_spelling(project, pin)
    series = read_series_for(project, pin)
    if supported_pins(project) and (note := carry_note(series, pin)):
        log.warn(note)
    with build_lock(), tempfile.TemporaryDirectory(prefix="checkout-", dir=scratch_dir()) as tmp:
        repo = Repo(upstream_repo_dir())
        lock = PinsLock(project.pins_lock)
        target = prepare(repo, pin, spec, lock, Path(tmp))
        with project_lock(project):
            lock.commit()  # the sdist is in git: its hash may be recorded
        result = apply_series(repo, series, target, spec, lock, Path(tmp), project)
        dest.parent.mkdir(parents=True, exist_ok=True)
        repo.run("clone", "--quiet", "--branch", target.upstream.branch, str(repo.git_dir), str(dest))
    resolutions.load(project.rerere_dir, Repo(dest, bare=False))  # and the pinned config
    del result
    return dest


def continue_carry(tree: Path) -> resolutions.Progress:
    """After a conflict was resolved and added in ``tree``: go on with the carry, reusing
    recorded resolutions, up to the next conflict that needs a hand."""
    if not (tree / ".git").exists():
        raise ForkError(f"{tree} is not a work tree made by 'python build.py checkout' or a conflict.")
    repo = Repo(tree, bare=False)
    if not resolutions.in_progress(tree, repo):
        raise ForkError(
            f"{tree}: no cherry-pick is in progress; export it ('python build.py export --dir {tree}')."
        )
    if left := resolutions.unmerged(repo, tree):
        raise ForkError(
            f"{tree}: still unresolved: {', '.join(left)}. Edit them, 'git add' them, then run this again."
        )
    return resolutions.advance(repo, tree)


def _names_by_subject(project: Project) -> dict[str, str]:
    """The file name of each patch in patches/ (shared or a pin's own form), by its subject:
    a patch's name is its identity, so an exported patch keeps the name it has."""
    names: dict[str, str] = {}
    for path in sorted(project.patches_dir.rglob("*.patch")) if project.patches_dir.is_dir() else []:
        try:
            names.setdefault(parse_patch(path.name, path.read_bytes()).subject, path.name)
        except (SeriesError, UnicodeDecodeError):  # a damaged file: export rewrites it
            continue
    return names


def _refuse_uncommitted(repo: Repo, tree: Path) -> None:
    """A SeriesError naming the files of ``tree`` that are changed, staged or new and not
    committed: export writes the commits, so they would be left out without a word."""
    status = repo.run("status", "--porcelain", "--untracked-files=all", cwd=tree, in_work_tree=True)[1]
    if not (lines := [line for line in status.splitlines() if line.strip()]):
        return
    shown = ", ".join(line.strip() for line in lines[:8]) + (
        f" and {len(lines) - 8} more" if len(lines) > 8 else ""
    )
    raise SeriesError(
        f"{tree} has changes that are not committed ({shown}): export writes the commits only, so "
        f"they would be left out. Commit them into the patch they belong to ('git commit --fixup="
        f"<commit>', then 'git rebase -i --autosquash' onto the upstream tag) or as a new commit; or "
        f"put them aside ('git stash -u'). Then export again. Nothing was written."
    )


def _check_message_kept(repo: Repo, commit: str, patch: Patch) -> None:
    """The patch file gives back the commit's whole message, or a SeriesError naming the line
    that cuts it: a message line starting ``diff --git`` reads as the start of the diff."""
    message = repo.out("log", "-1", "--format=%B", commit)
    if " ".join(patch.message.split()) == " ".join(message.split()):
        return
    for number, line in enumerate(message.splitlines(), start=1):
        if line.startswith("diff --git "):
            raise SeriesError(
                f"commit {commit[:12]} ({patch.subject!r}): line {number} of its message, {line!r}, "
                f"reads in a patch file as the start of the diff, so the rest of the message would "
                f"be lost. Indent or reword that line ('git rebase -i', reword), then export again."
            )
    raise SeriesError(
        f"commit {commit[:12]} ({patch.subject!r}): its message does not survive as a patch file "
        f"(it reads back as {patch.message!r}). Reword it ('git rebase -i', reword), then export again."
    )


def slug(subject: str) -> str:
    """A patch file name from its subject: lower case, dashes, at most 64 characters. Letters
    with accents lose them (NFKD: 'Añadir' -> 'anadir'); other non-ASCII characters are dropped."""
    ascii_text = unicodedata.normalize("NFKD", subject).encode("ascii", "ignore").decode()
    text = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    if len(text) > 64:  # at a word's end where there is one
        text = text[:65].rsplit("-", 1)[0] if "-" in text[:65] else text[:64]
    return (text[:64].rstrip("-") or "patch") + ".patch"


@dataclass(frozen=True)
class Exported:
    """What an export wrote, and what it asks of the maintainer."""

    # Files written or removed, relative to the project root.
    changed: list[str]
    # A patch changed at this pin that other pins' series name plainly: written (by this
    # export) as this pin's own form; the other pins keep the shared file. {name: those pins}.
    kept_own: dict[str, list[Pin]] = field(default_factory=dict)
    # Promoted (``promote=True``): the shared file changed for every pin that names it;
    # those pins must be tested again. {name: those pins, this one excluded}.
    promoted: dict[str, list[Pin]] = field(default_factory=dict)
    # Of ``kept_own``, those --promote cannot promote (they change files upstream has, or start
    # from other contents than the shared file), and why: {name: reason}. With ``promote=True``
    # they are the ones not promoted.
    cannot_promote: dict[str, str] = field(default_factory=dict)
    # The pin exported (None for a single-series project).
    pin: Pin | None = None
    # A pin's own form (``patches/<pin>/<name>``) that this export found redundant: the shared
    # ``patches/<name>`` applies at the pin and gives the same commit (the same message and
    # tree; only line numbers and blob ids differ). The pin's series now names the shared
    # file, and the own form is removed. {name: the own form's path, relative to the root}.
    redundant: dict[str, str] = field(default_factory=dict)
    # A shared patch this export changed that other pins build in their own form
    # (``patches/<other>/<name>``): the change did not reach them. {name: those pins}.
    own_forms_not_updated: dict[str, list[Pin]] = field(default_factory=dict)


def export(
    tree: Path, project: Project, *, promote: bool = False, rehome: bool = False, work_tree: bool = True
) -> Exported:
    """Write one patch per commit since the upstream root, and the series.

    A change to a shared patch that other pins' series name is written as this pin's own
    form unless ``promote`` is given; ``rehome`` also makes this pin the home of every
    shared patch it builds (the step before a home pin is retired); see ``_write_pin_series``.
    Everything is checked and
    rendered first, then written: a failing export writes nothing. A work tree with changes
    not committed is refused (export writes commits only); ``work_tree=False`` is for a clone
    made without a checkout (``--review --write``), which has no work tree to check.
    """
    if not (tree / ".git").exists():
        raise ForkError(f"{tree} is not a git work tree made by 'python build.py checkout'.")
    repo = Repo(tree, bare=False)
    if resolutions.in_progress(tree, repo):
        raise ForkError(
            f"{tree}: a cherry-pick is in progress (the carry stopped at a conflict). Resolve it, "
            f"'git add' the files and run 'python build.py continue --dir {tree}' first."
        )
    if work_tree:
        _refuse_uncommitted(repo, tree)
    roots = repo.out("rev-list", "--max-parents=0", "HEAD").split()
    if len(roots) != 1:
        raise ForkError(f"{tree}: HEAD must descend from exactly one upstream commit, found {len(roots)}.")
    tags = [t for t in repo.out("tag", "--points-at", roots[0], "--list", "upstream/v*").split()]
    if not tags:
        raise ForkError(f"{tree}: the root commit carries no upstream/v<pin> tag; was it made by checkout?")
    pin = Pin.parse(tags[0].removeprefix("upstream/v").split("-src.")[0])
    commits = repo.out("rev-list", "--reverse", "--topo-order", f"{roots[0]}..HEAD").split()
    merges = repo.out("rev-list", "--merges", f"{roots[0]}..HEAD").split()
    if merges:
        raise ForkError(f"{tree}: the series must be linear; rebase away merge commit {merges[0][:12]}.")

    rendered: dict[str, str] = {}
    commit_of: dict[str, str] = {}
    known = _names_by_subject(project)
    for commit in commits:
        text = repo.run(*FORMAT_PATCH, exported_against_header(pin), commit, strip=False)[1]
        # The decoded subject: the header is RFC 2047 encoded when it is not ASCII (and folded
        # when long). A patch already in patches/ keeps its file name.
        subject = parse_patch("subject", text.encode()).subject
        name = known.get(subject) or slug(subject)
        if name in rendered:
            raise SeriesError(f"two commits have subjects that give the same file name {name}; reword one.")
        patch = parse_patch(name, text.encode())
        _check_message_kept(repo, commit, patch)
        if problems := lint(patch):
            raise SeriesError(
                f"commit {commit[:12]} ({patch.subject!r}) fails lint: "
                + "; ".join(problems)
                + ". Fix its message with 'git commit --amend' or 'git rebase -i', then export again."
            )
        rendered[name] = text
        commit_of[name] = commit

    if listed := listed_pins(project):
        if pin not in {s.pin for s in listed}:
            raise SeriesError(
                f"{project.pins_file.name} does not list vllm {pin}, so export writes no series/{pin}: "
                f'a move is marked first. Add [pin."{pin}"] with status = "moving" to '
                f"{project.pins_file.name} (docs/patch-workflow.md), then export {tree} again."
            )
        result = _write_pin_series(
            repo, roots[0], pin, rendered, commit_of, project, promote=promote, rehome=rehome
        )
    else:
        result = Exported(_write_single_series(pin, rendered, project))
    return Exported(
        result.changed + resolutions.save(repo, project.rerere_dir),
        result.kept_own,
        result.promoted,
        result.cannot_promote,
        result.pin,
        result.redundant,
        result.own_forms_not_updated,
    )


def _write_single_series(pin: Pin, rendered: dict[str, str], project: Project) -> list[str]:
    """A single-series project: ``series`` and ``patches/<name>``."""
    old_names: list[str] = []
    if project.series_file.exists():  # its patch files may be damaged: export rewrites them
        try:
            old_names = read_series_names(project.series_file)[1]
        except SeriesError as exc:
            raise SeriesError(
                f"{exc}\nExport needs the old series to know which patch files to remove, and wrote "
                f"nothing. Fix that line, or restore the file (git checkout -- "
                f"{project.series_file.name}), then export again."
            ) from None
    changed = []
    project.patches_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        path = project.patches_dir / name
        if not path.exists() or path.read_text() != text:
            write_atomic(path, text)
            changed.append(f"patches/{name}")
    for name in old_names:
        if name not in rendered and (project.patches_dir / name).exists():
            (project.patches_dir / name).unlink()
            changed.append(f"patches/{name} (removed)")
    series_text = render_series(pin, list(rendered))
    if not project.series_file.exists() or project.series_file.read_text() != series_text:
        write_atomic(project.series_file, series_text)
        changed.append(project.series_file.name)
    return changed


PREIMAGE = re.compile(r"^diff --git a/(\S+) b/\S+\n(?:(?!diff --git).*\n)*?index ([0-9a-f]+)\.\.", re.M)
TOUCHED = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def _preimages(text: str) -> dict[str, str]:
    """Each touched file's blob id before the patch, from its ``index`` lines."""
    return dict(PREIMAGE.findall(text))


def _shared_gives_same(repo: Repo, commit: str, pin: Pin, shared: Patch, text: str, homes: Homes) -> bool:
    """The shared patch ``shared``, applied where the build applies it (on ``commit``'s
    parent: as it stands, offsets allowed, else merged from its home), gives ``commit``
    itself: the same message, author, date and tree. Then a pin's own form (``text``)
    differs from it only in context, hunk line numbers and blob ids, and is redundant."""
    mine = parse_patch(shared.name, text.encode())
    if (mine.message, mine.author, mine.date) != (shared.message, shared.author, shared.date):
        return False
    from .apply import apply_as_built

    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        try:
            tree = apply_as_built(repo, f"{commit}^", shared, pin, Path(tmp), homes)
        except PatchDoesNotApply:
            return False
        return tree == repo.tree_of(commit)


def _merge_failure(
    repo: Repo, name: str, text: str, commit: str, pins: list[Pin], project: Project, homes: Homes
) -> str:
    """Why the shared ``patches/<name>`` rewritten as ``text`` (this pin's form, made by
    ``commit``) would not build at one of ``pins``, whose series name it (its series built
    with it, merges and all, as their builds will), or "" if it builds at every one."""
    from .apply import commit_series_on

    candidate = parse_patch(name, text.encode())
    assert candidate.exported_against is not None  # export wrote it: this pin
    homes = homes.with_commit(candidate.exported_against, name, commit)
    for other in pins:
        series = read_series(project.series_dir / str(other), project.patches_dir)
        patches = tuple(candidate if p.name == name and not p.path else p for p in series.patches)
        with tempfile.TemporaryDirectory(prefix="promote-") as tmp:
            try:
                commit_series_on(repo, homes.upstream(other), Series(other, patches, ()), Path(tmp), homes)
            except PatchDoesNotApply as exc:
                return f"it would not build at vllm {other}: {str(exc).splitlines()[0]}"
    return ""


def _shared_text(project: Project, name: str) -> str | None:
    path = project.patches_dir / name
    return path.read_text() if path.is_file() else None


def _why_not_promotable(
    repo: Repo,
    root: str,
    old: Patch,
    text: str,
    commit: str,
    pins: list[Pin],
    project: Project,
    homes: Homes,
) -> str:
    """Why ``text`` may not replace the shared ``old`` for every pin that names it ("" if it
    may). A patch of the fork's own files must start from the shared one's file contents; a
    patch on upstream files must build at every one of ``pins`` (merged in where it does not
    apply as it stands)."""
    paths = sorted({p for m in TOUCHED.findall(text) for p in m})
    upstream_files = [
        p for p in paths if repo.run("cat-file", "-e", f"{root}:{p}", ok_codes=(0, 1, 128))[0] == 0
    ]
    if not upstream_files:
        if _preimages(old.text) != _preimages(text):
            return f"it starts from other file contents than the shared patches/{old.name}"
        return ""
    return _merge_failure(repo, old.name, text, commit, pins, project, homes)


def _write_pin_series(
    repo: Repo,
    root: str,
    pin: Pin,
    rendered: dict[str, str],
    commit_of: dict[str, str],
    project: Project,
    *,
    promote: bool,
    rehome: bool = False,
) -> Exported:
    """``series/<pin>`` and the patches it names.

    * A patch whose text the shared file ``patches/<name>`` already has stays shared.
    * A new patch, or one no other pin's series names plainly, is the shared file.
    * A patch the shared file gives exactly (applied at this pin as the build applies it,
      merged from its home where it does not apply as it stands, it makes the same commit:
      only context and line numbers differ) stays shared; an own form of it is redundant
      and goes.
    * A patch other pins name plainly is written as this pin's own form,
      ``patches/<pin>/<name>``: a change made and tested at one pin never reaches
      another pin's build unasked.
    * Except with ``promote``, for a patch of the fork's own files that starts from the same
      file contents as the shared one, or a patch on upstream files that builds at every
      pin naming it (``_why_not_promotable``): the shared file is rewritten, so a fix is
      made once for every pin, and the pins that name it are returned to be tested again.
      Only from a supported pin (pins.toml). ``rehome`` does the same for every shared
      patch this pin builds whose home (``Patch.exported_against``) is another pin, changed
      or not, so that pin's series can be retired.
      A patch that cannot be promoted stays this pin's own form and is returned with the
      reason (``cannot_promote``): nothing is lost, and nothing is silent.
    """
    supported = [s.pin for s in supported_pins(project)]
    if (promote or rehome) and pin not in supported:
        raise ForkError(
            f"--{'promote' if promote else 'rehome'} writes a shared patch that the supported pins "
            f"build from, but {pin} is not "
            f"supported in {project.pins_file.name} (a move under way: its series is not tested). "
            f"Export without --promote "
            f"(the change stays {pin}'s own form), or make the change at a supported pin "
            f"({', '.join(map(str, supported))}) with 'python build.py checkout --pin <pin>'."
        )
    pins = [p for p in {*series_pins(project), *supported} if p != pin]
    naming: dict[str, list[Pin]] = {}
    own_at: dict[str, list[Pin]] = {}  # the pins with their own form of a patch
    for other in sorted(pins):
        path = project.series_dir / str(other)
        if path.is_file():
            for entry in read_series(path, project.patches_dir).patches:
                if not entry.path:
                    naming.setdefault(entry.name, []).append(other)
                else:
                    own_at.setdefault(entry.name, []).append(other)
    entries: list[str] = []
    writes: dict[Path, str] = {}
    kept_own: dict[str, list[Pin]] = {}
    promoted: dict[str, list[Pin]] = {}
    not_promotable: dict[str, str] = {}
    redundant: dict[str, str] = {}
    # A shared patch's home (the pin it was exported against) is committed in this clone on
    # first need. This pin's commits stand for the shared patches they leave as they are
    # (the series on disk is being rewritten); a changed one, not yet promoted, is not the
    # shared file.
    # Not under the cache's tmp/: a build taking the lock sweeps it, and export runs without it.
    scratch = Path(tempfile.mkdtemp(prefix="vllm-rbln-export-"))
    homes = Homes(
        repo,
        project,
        SourceSpec.parse(None, None),
        PinsLock(project.pins_lock),
        scratch,
        override={pin: {n: commit_of[n] for n, text in rendered.items() if _shared_text(project, n) == text}},
        peer=upstream_repo_dir(),
    )
    try:
        for name, text in rendered.items():
            shared = project.patches_dir / name
            old = parse_patch(name, shared.read_bytes()) if shared.is_file() else None
            if old is not None and old.text == text:
                entries.append(name)
            elif old is None or name not in naming:
                entries.append(name)
                writes[shared] = text
            elif not (rehome and old.exported_against != pin) and _shared_gives_same(
                repo, commit_of[name], pin, old, text, homes
            ):
                entries.append(name)
                if (own := project.patches_dir / str(pin) / name).is_file():
                    redundant[name] = str(own.relative_to(project.root))
            elif (promote or rehome) and not (
                why := _why_not_promotable(
                    repo, root, old, text, commit_of[name], naming[name], project, homes
                )
            ):
                entries.append(name)
                writes[shared] = text
                promoted[name] = naming[name]
            else:
                entries.append(f"{pin}/{name}")
                writes[project.patches_dir / str(pin) / name] = text
                kept_own[name] = naming[name]
                if promote or rehome:
                    not_promotable[name] = why
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    changed = []
    for path, text in writes.items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)
            changed.append(str(path.relative_to(project.root)))
    series_file = project.series_dir / str(pin)
    series_text = render_series(pin, entries)
    if not series_file.is_file() or series_file.read_text() != series_text:
        write_atomic(series_file, series_text)
        changed.append(str(series_file.relative_to(project.root)))
    for path in unused_patch_files(project):
        path.unlink()
        changed.append(f"{path.relative_to(project.root)} (removed)")
        if path.parent != project.patches_dir and not any(path.parent.iterdir()):
            path.parent.rmdir()
    own_written = {Path(c).name for c in changed if c.startswith(f"patches/{pin}/")}
    # Said whenever this export writes the own form (the patch changed at this pin), --promote
    # or not; an own form already there and unchanged (a pin's form of a patch on upstream
    # files, from its move) is the normal state, not a change.
    said = {n: p for n, p in kept_own.items() if n in own_written}
    cannot = {n: r for n, r in not_promotable.items() if n in said}
    # The shared file changed: the pins with their own form of that patch did not get the change.
    shared_written = {Path(c).name for c in changed if c.startswith("patches/") and c.count("/") == 1}
    missed = {n: own_at[n] for n in rendered if n in shared_written and n in own_at}
    return Exported(changed, said, promoted, cannot, pin, redundant, missed)
