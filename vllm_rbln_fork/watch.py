"""``python build.py watch``: start the move to a new vLLM release when the index has one.

The mechanical part of a move (docs/patch-workflow.md, "Move the pin"), on a branch of the
project's git repository, from the existing steps and nothing else:

1. the newest final release on the index, against the newest supported pin (``pins.toml``);
   nothing newer, or a move to it already under way (listed with ``status = "moving"``, or
   its branch exists: the forge's Watch workflow fetches them): nothing to do;
2. ``git switch -c watch/vllm-<new>``; mark the move, ``[pin."<new>"] status = "moving"``;
3. the review with ``--write --from <newest supported>`` (``review.review``): it carries the
   series with the recorded resolutions (``rerere/``) and writes ``series/<new>`` and
   ``patches/<new>/``, or leaves a conflict tree at the first conflict; a conflict tree whose
   every conflict was resolved from a record is exported (``workflow.export``), as a
   maintainer would;
4. the draft rebase record ``docs/rebases/v<new>.md`` from the review, the previous pin's
   conformance lists copied to ``tests/upstream/<new>/``;
5. the scheduler tier at the new pin (``build.py test --tier scheduler --pin <new>``);
6. one commit on the branch.

It never changes a supported pin's entry, series or patch files (only the new pin's are
written), never publishes and never deletes a series. Its outcome is an exit status (0
nothing new, 1 a move ready for review, 2 work left by hand) and a short Markdown summary
for a pull request or an issue.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from . import log, proc
from .errors import ForkError
from .files import write_atomic
from .gitrepo import Repo
from .pins import Pin
from .project import Project
from .resolutions import unmerged
from .source import SourceSpec
from .supported import listed_pins, supported_pins


class Outcome(IntEnum):
    """The exit status of ``build.py watch``."""

    NOTHING_NEW = 0
    READY = 1  # a move on a branch, ready for review (a pull request)
    BY_HAND = 2  # the move stopped: work left by hand (an issue)


# What the watcher may write, relative to the project root; the commit adds only these.
WRITES = ("pins.toml", "pins.lock", "fork-releases.toml", "series", "patches", "rerere", "docs/rebases")


@dataclass(frozen=True)
class Watched:
    outcome: Outcome
    newest_supported: Pin
    release: Pin | None = None  # the release moved to; None: nothing new
    note: str = ""  # why nothing was done (nothing new, or a move already under way)
    branch: str | None = None
    commit: str | None = None
    report: Path | None = None  # the review report (Markdown)
    record: Path | None = None  # the draft docs/rebases/v<new>.md
    conflict_tree: Path | None = None
    patches: int = 0  # patches in the carried series
    statuses: dict[str, int] = field(default_factory=dict)  # review status -> patches
    reused: tuple[str, ...] = ()  # conflicted files resolved from recorded resolutions
    stopped_at: str = ""  # the patch the carry stopped at (its subject)
    unresolved: tuple[str, ...] = ()  # its conflicted files
    flagged: tuple[str, ...] = ()  # the review's flags: "patch: qualname (path): change, note"
    written: tuple[str, ...] = ()
    tier: str = ""  # the scheduler tier's result, or why it did not run
    tier_passed: bool | None = None
    left: tuple[str, ...] = ()  # what is left to do by hand, as commands or sentences
    seconds: float = 0.0


def newer_release(
    project: Project, index_url: str, release: Pin | None = None
) -> tuple[Pin, Pin | None, str]:
    """(newest supported pin, the release to move to or None, why None). ``release``: consider
    only that one (it must be on the index)."""
    from .index_client import releases

    supported = supported_pins(project)
    if not supported:
        raise ForkError(
            f"{project.root} has no {project.pins_file.name} with a supported pin: the watcher moves "
            "from the newest supported pin (docs/patch-workflow.md)."
        )
    newest = supported[-1].pin
    listed = {s.pin: s.status for s in listed_pins(project)}
    available = [Pin(v) for v in releases(index_url)]
    if release is not None:
        if release not in available:
            raise ForkError(f"--release {release}: the index {index_url} has no sdist of vllm {release}.")
        available = [release]
    newer = [p for p in available if p > newest]
    if not newer:
        return newest, None, f"nothing new: the newest vLLM release on the index is not newer than {newest}"
    target = newer[-1]
    if target in listed:
        return (
            newest,
            None,
            f'a move to {target} is under way already (pins.toml: [pin."{target}"] status = '
            f'"{listed[target]}"); nothing new beyond it',
        )
    return newest, target, ""


def watch(
    project: Project,
    spec: SourceSpec,
    *,
    release: Pin | None = None,
    branch: bool = True,
    run_tier: bool = True,
) -> Watched:
    """Start the move to the newest vLLM release newer than the newest supported pin (see the
    module's docstring). ``branch``: on a new branch, committed; ``run_tier``: run the
    scheduler tier at the new pin (it needs the project's own tests)."""
    start = time.perf_counter()
    newest, target, why = newer_release(project, spec.index_url(), release)
    if target is None:
        return Watched(Outcome.NOTHING_NEW, newest, note=why, seconds=time.perf_counter() - start)
    name = f"watch/vllm-{target}" if branch else None
    if name is not None:
        _check_work_tree(project)
    if name is not None and _git(project, "branch", "--list", name):
        note = f"a move to {target} is under way already on branch {name}; nothing new beyond it"
        return Watched(Outcome.NOTHING_NEW, newest, note=note, seconds=time.perf_counter() - start)
    if name is None:
        return _move(project, spec, newest, target, None, run_tier, start)
    back = _git(project, "rev-parse", "--abbrev-ref", "HEAD")  # "HEAD": detached
    back_commit = _git(project, "rev-parse", "HEAD")
    # Written by the move besides WRITES: the new pin's conformance lists, if not there before.
    extra = f"tests/upstream/{target}"
    cleaned = (*WRITES, *(() if (project.root / extra).exists() else (extra,)))
    _git(project, "switch", "--quiet", "-c", name)
    try:
        return _move(project, spec, newest, target, name, run_tier, start)
    except BaseException:
        _abandon(project, name, back, back_commit, target, cleaned)
        raise


def _abandon(
    project: Project, name: str, back: str, back_commit: str, target: Pin, cleaned: tuple[str, ...]
) -> None:
    """After an error (or an interrupt) during the move: back to the branch (or detached commit)
    it started from, the work tree as it was (it was clean in what the watcher writes), and no
    branch ``name`` left to make the next run think the move under way."""
    log.warn(f"the move to {target} failed: back to {back}, branch {name} removed")
    _git(project, "reset", "--quiet", "--hard")
    ours = [p for p in cleaned if (project.root / p).exists()]
    if ours:
        _git(project, "clean", "--quiet", "-d", "--force", "--", *ours)
    _git(project, "switch", "--quiet", *(("--detach", back_commit) if back == "HEAD" else (back,)))
    _git(project, "branch", "--quiet", "-D", name)


def _move(
    project: Project,
    spec: SourceSpec,
    newest: Pin,
    target: Pin,
    name: str | None,
    run_tier: bool,
    start: float,
) -> Watched:
    """The move itself (steps 2 to 6 of the module's docstring), on branch ``name`` if given."""
    _mark_moving(project, target)
    copied = _copy_conformance_lists(project, newest, target)

    from .review import review, write_reports
    from .review.model import Status

    result = review(target, spec, project, write=True, source=newest)
    report, _ = write_reports(result, project.work_dir / f"review-v{target}")
    written = list(result.written)
    tree = result.conflict_tree
    stopped_at = ""
    unresolved: tuple[str, ...] = ()
    if tree is not None and result.carried_all:
        from .workflow import export

        with log.phase(f"export {tree}: every conflict was resolved from rerere/"):
            written += export(tree, project).changed
    elif tree is not None:
        stopped_at, unresolved = _stopped_at(tree)
    carried = tree is None or result.carried_all
    flagged = tuple(
        f"{p.name}: `{s.qualname}` ({s.path}), {s.relation}: {s.change}" + (f" ({s.note})" if s.note else "")
        for p in result.patches
        for s in p.flags
    )
    tier, passed = "not run: the carry stopped at a conflict", None
    if carried and run_tier:
        tier, passed = _scheduler_tier(project, target)
    elif carried:
        tier = "not run (--no-tier)"
    left = _left_by_hand(target, newest, tree, carried, passed, bool(flagged), result.next_commands)
    outcome = Outcome.READY if carried and passed is not False else Outcome.BY_HAND
    watched = Watched(
        outcome,
        newest,
        target,
        branch=name,
        report=report,
        conflict_tree=None if carried else tree,
        patches=sum(n for s, n in result.counts.items() if s not in (Status.DROPPED, Status.UPSTREAMED)),
        statuses={str(s): n for s, n in result.counts.items() if n},
        reused=result.reused,
        stopped_at=stopped_at,
        unresolved=unresolved,
        flagged=flagged,
        written=tuple([*dict.fromkeys(written), *copied]),
        tier=tier,
        tier_passed=passed,
        left=left,
    )
    record = project.root / "docs" / "rebases" / f"v{target}.md"
    if record.exists():  # a record of an earlier move to it is kept: the draft goes beside it
        record = record.with_name(f"v{target}.draft.md")
    write_atomic(record, draft_record(watched))
    watched = _replace(watched, record=record, seconds=time.perf_counter() - start)
    if name is not None:
        watched = _replace(watched, commit=_commit(project, watched))
    return watched


def _replace(w: Watched, **changes: object) -> Watched:
    from dataclasses import replace

    return replace(w, **changes)  # type: ignore[arg-type]


def _git(project: Project, *args: str) -> str:
    return proc.run(["git", *args], cwd=project.root).strip()


def _check_work_tree(project: Project) -> None:
    """The project must be the top of a clean git work tree: the move goes on a new branch."""
    try:
        top = Path(_git(project, "rev-parse", "--show-toplevel")).resolve()
    except ForkError:
        top = None
    if top != project.root.resolve():
        raise ForkError(
            f"{project.root} is not the top of a git work tree: the watcher makes the move on a branch "
            "of the project's repository (or give --no-branch to write in place)."
        )
    dirty = _git(project, "status", "--porcelain", "--untracked-files=no")
    dirty += "\n" + _git(project, "status", "--porcelain", "--untracked-files=all", "--", *WRITES)
    if dirty.strip():
        raise ForkError(
            f"{project.root} has uncommitted changes ({dirty.strip().splitlines()[0].strip()} ...): "
            "commit, stash or remove them; the watcher starts its branch from a clean HEAD."
        )


def _mark_moving(project: Project, target: Pin) -> None:
    """Append ``[pin."<target>"] status = "moving"`` to pins.toml (its text and comments kept)."""
    text = project.pins_file.read_text(encoding="utf-8")
    entry = f'\n[pin."{target}"]\nstatus = "moving"  # started by build.py watch (docs/patch-workflow.md)\n'
    write_atomic(project.pins_file, text.rstrip("\n") + "\n" + entry)
    assert target in {s.pin for s in listed_pins(project)}


def _copy_conformance_lists(project: Project, newest: Pin, target: Pin) -> list[str]:
    """The previous pin's conformance lists (tests/upstream/<pin>/) as the new pin's start."""
    old, new = (
        project.root / "tests" / "upstream" / str(newest),
        project.root / "tests" / "upstream" / str(target),
    )
    if not old.is_dir() or new.exists():
        return []
    shutil.copytree(old, new)
    return [str(p.relative_to(project.root)) for p in sorted(new.rglob("*")) if p.is_file()]


def _stopped_at(tree: Path) -> tuple[str, tuple[str, ...]]:
    """The patch (subject) a conflict tree stands at, and its conflicted files."""
    repo = Repo(tree, bare=False)
    subject = repo.run(
        "log", "-1", "--format=%s", "CHERRY_PICK_HEAD", cwd=tree, in_work_tree=True, ok_codes=(0, 128)
    )
    return subject[1].strip(), tuple(unmerged(repo, tree))


def _scheduler_tier(project: Project, target: Pin) -> tuple[str, bool]:
    """``build.py test --tier scheduler --pin <target>`` in the project: (what it said, passed)."""
    build_py = project.root / "build.py"
    if not build_py.is_file():
        return f"not run: {project.root} has no build.py", False
    command = [sys.executable, str(build_py), "test", "--tier", "scheduler", "--pin", str(target)]
    started = time.perf_counter()
    with log.phase(f"the scheduler tier at vllm {target}"):
        status = proc.stream(command, cwd=project.root)
    took = f"{time.perf_counter() - started:.0f} s"
    if status == 0:
        return f"passed ({took}: python build.py test --tier scheduler --pin {target})", True
    return f"failed, exit {status} ({took}: python build.py test --tier scheduler --pin {target})", False


def _left_by_hand(
    target: Pin,
    newest: Pin,
    tree: Path | None,
    carried: bool,
    passed: bool | None,
    flagged: bool,
    next_commands: tuple[str, ...],
) -> tuple[str, ...]:
    if not carried:
        return (
            *next_commands[:3],
            f"then: python build.py test --pin {target} --tier scheduler; commit on the branch",
        )
    left = []
    if flagged:
        left.append(
            "check each flagged function (an override or call the merge did not touch may need "
            f"to follow): a fixup of its patch in 'python build.py checkout --pin {target}', then export"
        )
    if passed is False:
        left.append(f"make the scheduler tier pass: python build.py test --tier scheduler --pin {target}")
    left += [
        f"the conformance and engine tiers: python build.py test --pin {target} (the engine tier "
        "needs an engine-lock or a tests/engine/cannot-run.toml entry)",
        f'give [pin."{target}"] its test-lock (else {newest}\'s is used) and delete its status line',
        f"complete docs/rebases/v{target}.md",
    ]
    return tuple(left)


def _commit(project: Project, w: Watched) -> str:
    present = [p for p in (*WRITES, f"tests/upstream/{w.release}") if (project.root / p).exists()]
    _git(project, "add", "--all", "--", *present)
    subject = (
        f"Move to vLLM {w.release} (watcher): series carried from {w.newest_supported}, pin moving"
        if w.outcome is Outcome.READY and not w.conflict_tree
        else f"Start the move to vLLM {w.release} (watcher): pin moving, "
        + ("scheduler tier failing" if not w.conflict_tree else f"carry stopped at {w.stopped_at}")
    )
    _git(project, "commit", "--quiet", "-m", subject + "\n\n" + summary(w))
    return _git(project, "rev-parse", "HEAD")


def summary(w: Watched) -> str:
    """The few Markdown lines a bot pastes into a pull request or an issue."""
    if w.release is None:
        return f"`build.py watch`: {w.note}.\n"
    if w.outcome is Outcome.READY:
        head = f"**vLLM {w.release}** is out. The watcher carried the series of {w.newest_supported} onto it"
    else:
        head = f"**vLLM {w.release}** is out. The watcher's move from {w.newest_supported} needs a hand"
    statuses = ", ".join(f"{n} {s}" for s, n in w.statuses.items())
    lines = [
        head + (f" on branch `{w.branch}`." if w.branch else "."),
        "",
        f"* review: {statuses} (report: `{_rel(w.report)}`, and the CI artifact)",
        f"* conflicts resolved from `rerere/`: {len(w.reused)}"
        + (f" ({', '.join(f'`{f}`' for f in w.reused)})" if w.reused else ""),
    ]
    if w.conflict_tree is not None:
        lines.append(
            f"* **stopped** at `{w.stopped_at}`: "
            + (", ".join(f"`{f}`" for f in w.unresolved) or "a resolution that left the commit empty")
            + f" (conflict tree `{_rel(w.conflict_tree)}`)"
        )
    else:
        lines.append(f"* carried: {w.patches} patches; `pins.toml` marks {w.release} `moving`")
    for flag in w.flagged:
        lines.append(f"* ⚠️ flagged: {flag}")
    lines.append(f"* scheduler tier at {w.release}: {w.tier}")
    if w.written:
        shown = ", ".join(f"`{p}`" for p in w.written[:8])
        more = f" and {len(w.written) - 8} more" if len(w.written) > 8 else ""
        lines.append(f"* wrote {shown}{more}")
    if w.record is not None:
        lines.append(f"* draft record: `{_rel(w.record)}`")
    lines += ["", "Left by hand:", ""] + [f"1. {step}" for step in w.left]
    return "\n".join(lines) + "\n"


def _rel(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def draft_record(w: Watched) -> str:
    """``docs/rebases/v<new>.md``, the draft a maintainer completes (docs/rebases/README.md)."""
    return (
        f"# Move to vLLM {w.release} (from {w.newest_supported}): draft\n\n"
        "Started by `python build.py watch`; complete it as the move goes on (the review, the\n"
        "conflicts and how each was resolved, what the review got right and missed, the time).\n\n"
        "```sh\n"
        f"python build.py --pin {w.release} --review --write --from {w.newest_supported}\n"
        "```\n\n"
        "## What the watcher did\n\n" + summary(w).split("\n", 2)[2]
    )
