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
nothing new, 1 a move ready for review, 2 work left by hand; 3 the watcher's own error, with
everything put back) and a short Markdown summary for a pull request or an issue.

The new release's own code (its ``setup.py``, then vLLM itself in the tests) is unreviewed:
the scheduler tier makes its wheel and test venv in a fresh tool environment, build cache and
venv folder that are removed afterwards and that nothing reuses, then runs its tests in a
bubblewrap cage (:func:`_scheduler_tier`, :mod:`.cage`; docs/building.md, "The watcher's
cage"): everything read-only but a scratch folder, ``/run``, ``/home``, ``/root`` and ``$HOME``
hidden but for the Python, project and cage folder it runs from, its own PIDs and network,
the plan's variables alone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from . import log, proc
from .cage import bwrap, caged
from .errors import ForkError
from .files import write_atomic
from .gitrepo import Repo
from .pins import Pin
from .project import Project
from .resolutions import unmerged
from .source import SourceSpec
from .supported import listed_pins, supported_pins
from .wheel import CAGE_ENV


class Outcome(IntEnum):
    """The exit status of ``build.py watch``."""

    NOTHING_NEW = 0
    READY = 1  # a move on a branch, ready for review (a pull request)
    BY_HAND = 2  # the move stopped: work left by hand (an issue)


# The exit status of an error of the watcher's own (the index unreachable, a scheduler tier that
# cannot start, a failed commit): not work left by hand. The repository is put back as it was.
ERROR_EXIT = 3
# The base every move branches from: the project's default branch (origin/HEAD's, else this).
DEFAULT_BASE = "main"
BRANCH_PREFIX = "watch/vllm-"
# What the forge gives a step to write its outputs, environment and summary with, and the
# runner's own tokens: never handed to the caged run (:func:`caged_env`).
FORGE_HANDLES = (
    "GITHUB_OUTPUT",
    "GITHUB_ENV",
    "GITHUB_PATH",
    "GITHUB_STATE",
    "GITHUB_STEP_SUMMARY",
    "ACTIONS_",
)


# What the watcher may write, relative to the project root; the commit adds only these.
WRITES = ("pins.toml", "pins.lock", "fork-releases.toml", "series", "patches", "rerere", "docs/rebases")


@dataclass(frozen=True)
class Watched:
    outcome: Outcome
    newest_supported: Pin
    release: Pin | None = None  # the release moved to; None: nothing new
    also_new: tuple[Pin, ...] = ()  # newer releases not moved to (an older one, or one waiting)
    root: Path | None = None  # the project: paths are shown relative to it
    note: str = ""  # why nothing was done (nothing new, or a move already under way)
    branch: str | None = None
    commit: str | None = None
    report: Path | None = None  # the review report (Markdown)
    record: Path | None = None  # the draft docs/rebases/v<new>.md
    conflict_tree: Path | None = None
    patches: int = 0  # patches in the carried series
    statuses: dict[str, int] = field(default_factory=dict)  # review status -> patches
    conflict_kinds: str = ""  # "N with upstream, M knock-on" (Review.conflict_kinds)
    reused: tuple[str, ...] = ()  # conflicted files resolved from recorded resolutions
    stopped_at: str = ""  # the patch the carry stopped at (its subject)
    unresolved: tuple[str, ...] = ()  # its conflicted files
    flagged: tuple[str, ...] = ()  # the review's flags: "patch: qualname (path): change, note"
    written: tuple[str, ...] = ()
    tier: str = ""  # the scheduler tier's result, or why it did not run
    tier_passed: bool | None = None
    left: tuple[str, ...] = ()  # what is left to do by hand, as commands or sentences
    seconds: float = 0.0


@dataclass(frozen=True)
class Candidates:
    """What the index offers against the project: the release to move to, or why none."""

    newest: Pin  # the newest supported pin
    target: Pin | None  # the release to move to; None: nothing to do
    note: str = ""  # why nothing is done
    also_new: tuple[Pin, ...] = ()  # other releases newer than ``newest``, not moved to


def newer_release(
    project: Project, index_url: str, release: Pin | None = None, branches: tuple[Pin, ...] = ()
) -> Candidates:
    """The release to move to. ``release``: consider only that one (it must have an sdist on the
    index, yanked or not: it is asked for exactly). ``branches``: the releases whose move has a
    ``watch/vllm-<release>`` branch.

    Two or more new releases at once: the newest is moved to (an older one would be moved
    again at once), and the others are named. A move already under way (a ``moving`` pin, or
    its branch) newer than the newest supported pin: nothing is started, not even to a newer
    release (its move would start from the newest supported pin and ignore the resolutions of
    the move under way); the newer release is named, and is moved to once that move lands.
    ``--release`` overrides that wait (not a move to the same release)."""
    from .index_client import releases, sdists

    supported = supported_pins(project)
    if not supported:
        raise ForkError(
            f"{project.root} has no {project.pins_file.name} with a supported pin: the watcher moves "
            "from the newest supported pin (docs/patch-workflow.md)."
        )
    newest = supported[-1].pin
    listed = {s.pin: s.status for s in listed_pins(project)}
    under_way = {p: f'pins.toml: [pin."{p}"] status = "{st}"' for p, st in listed.items() if p > newest}
    for p in branches:
        if p > newest:
            under_way.setdefault(p, f"on branch {BRANCH_PREFIX}{p}")
    if release is not None:
        if release.version not in sdists(index_url):
            raise ForkError(
                f"--release {release}: the index {index_url} has no sdist of vllm {release}. Check the "
                "version, or leave --release out to move to the newest release there."
            )
        if release <= newest:
            return Candidates(newest, None, f"nothing new: {release} is not newer than {newest}")
        if release in under_way:
            return Candidates(
                newest, None, f"a move to {release} is under way already ({under_way[release]})"
            )
        return Candidates(newest, release)
    newer = [Pin(v) for v in releases(index_url) if Pin(v) > newest]
    if not newer:
        return Candidates(
            newest, None, f"nothing new: the newest vLLM release on the index is not newer than {newest}"
        )
    if under_way:
        moving = max(under_way)
        waiting = tuple(p for p in newer if p > moving)
        note = f"a move to {moving} is under way already ({under_way[moving]})"
        if waiting:
            note += (
                f"; {', '.join(map(str, waiting))} {'is' if len(waiting) == 1 else 'are'} newer and "
                f"waiting: the move to {waiting[-1]} starts from {moving} once {moving} is supported "
                f"(to move to it from {newest} now, abandon the move to {moving}: delete its branch and "
                f"its pins.toml entry)"
            )
        else:
            note += "; nothing new beyond it"
        return Candidates(newest, None, note, waiting)
    return Candidates(newest, newer[-1], also_new=tuple(newer[:-1]))


def watch(
    project: Project,
    spec: SourceSpec,
    *,
    release: Pin | None = None,
    branch: bool = True,
    run_tier: bool = True,
) -> Watched:
    """Start the move to the newest vLLM release newer than the newest supported pin (see the
    module's docstring). ``branch``: on a new branch off the default branch (whatever branch the
    work tree is on), committed; ``run_tier``: run the scheduler tier at the new pin (it needs
    the project's own tests).

    An error on the way (or an interrupt) puts everything back as it was: the work tree (on its
    own branch, or, with ``branch=False``, its files), and no branch, conflict tree or review
    folder of the move left, so the next run starts the move again."""
    start = time.perf_counter()
    if run_tier:
        bwrap()  # refused before anything is changed: the tier never runs uncaged
    if not branch:
        found = newer_release(project, spec.index_url(), release, _move_branches(project))
        if found.target is None:
            return _nothing(found, project, start)
        undo = _Undo.snapshot(project, found.target)
        try:
            return _move(project, spec, found, None, run_tier, start)
        except BaseException:
            undo.restore()
            raise
    _check_work_tree(project)
    back = _git(project, "rev-parse", "--abbrev-ref", "HEAD")  # "HEAD": detached
    back_commit = _git(project, "rev-parse", "HEAD")
    base = _base(project)
    _git(project, "switch", "--quiet", "--detach", base)
    try:
        found = newer_release(project, spec.index_url(), release, _move_branches(project))
        if found.target is not None:
            _check_new_pin_files(project, found.target)
    except BaseException:
        _switch_back(project, back, back_commit)
        raise
    if found.target is None:
        _switch_back(project, back, back_commit)
        return _nothing(found, project, start)
    name = f"{BRANCH_PREFIX}{found.target}"
    undo = _Undo.snapshot(project, found.target)
    _git(project, "switch", "--quiet", "-c", name)
    try:
        return _move(project, spec, found, name, run_tier, start)
    except BaseException:
        log.warn(f"the move to {found.target} failed: back to {back}, branch {name} removed")
        _git(project, "reset", "--quiet", "--hard")
        undo.restore()
        _switch_back(project, back, back_commit)
        _git(project, "branch", "--quiet", "-D", name)
        raise


def _nothing(found: Candidates, project: Project, start: float) -> Watched:
    return Watched(
        Outcome.NOTHING_NEW,
        found.newest,
        note=found.note,
        also_new=found.also_new,
        root=project.root,
        seconds=time.perf_counter() - start,
    )


def _base(project: Project) -> str:
    """The commit a move branches from: the default branch (origin/HEAD's, else ``main``), its
    local branch if there is one, else the remote's."""
    try:
        name = _git(project, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD").partition("/")[
            2
        ]
    except ForkError:
        name = ""
    name = name or DEFAULT_BASE
    for ref in (f"refs/heads/{name}", f"refs/remotes/origin/{name}"):
        try:
            return _git(project, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        except ForkError:
            continue
    raise ForkError(
        f"{project.root} has no branch {name} (nor origin/{name}): the watcher starts each move from "
        "the default branch. Create it, or give --no-branch to write in place."
    )


def _switch_back(project: Project, back: str, back_commit: str) -> None:
    _git(project, "switch", "--quiet", *(("--detach", back_commit) if back == "HEAD" else (back,)))


def _move_branches(project: Project) -> tuple[Pin, ...]:
    """The releases with a ``watch/vllm-<release>`` branch (the forge fetches them)."""
    from packaging.version import InvalidVersion

    try:
        listed = _git(project, "for-each-ref", "--format=%(refname:short)", f"refs/heads/{BRANCH_PREFIX}*")
    except ForkError:
        return ()  # not a git repository (--no-branch)
    found = []
    for line in listed.splitlines():
        try:
            found.append(Pin.parse(line.strip().removeprefix(BRANCH_PREFIX)))
        except (ForkError, InvalidVersion):
            continue
    return tuple(found)


@dataclass
class _Undo:
    """What a move writes, as it was before it, to put back after an error: the project files
    the watcher writes (``WRITES``), the new pin's conformance lists, and the work trees the move
    makes (``work/conflict-v<new>``, a git work tree of the cache's repository, and
    ``work/review-v<new>``), removed if they were not there."""

    project: Project
    names: tuple[str, ...]
    files: dict[Path, bytes]  # every file under ``names`` before the move
    dirs: frozenset[Path]  # every folder under ``names`` before the move
    made: tuple[Path, ...]

    @classmethod
    def snapshot(cls, project: Project, target: Pin) -> _Undo:
        names = (*WRITES, f"tests/upstream/{target}")
        paths = [p for name in names for p in _under(project.root / name)]
        trees = (project.work_dir / f"conflict-v{target}", project.work_dir / f"review-v{target}")
        return cls(
            project,
            names,
            {p: p.read_bytes() for p in paths if p.is_file()},
            frozenset(p for p in paths if p.is_dir()),
            tuple(t for t in trees if not t.exists() and not t.is_symlink()),
        )

    def restore(self) -> None:
        for name in self.names:
            for path in sorted(_under(self.project.root / name), reverse=True):  # children first
                if path.is_dir() and not path.is_symlink():
                    if path not in self.dirs and not any(path.iterdir()):
                        path.rmdir()
                elif path not in self.files:
                    path.unlink()
        for path, data in self.files.items():
            if not path.is_file() or path.read_bytes() != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, data)
        for tree in self.made:
            if tree.exists():
                shutil.rmtree(tree)  # a conflict tree's record in the cache repo: pruned by the next carry


def _under(path: Path) -> list[Path]:
    """``path`` and everything under it (nothing if it is not there)."""
    if path.is_dir() and not path.is_symlink():
        return [path, *path.rglob("*")]
    return [path] if path.exists() or path.is_symlink() else []


def _move(
    project: Project, spec: SourceSpec, found: Candidates, name: str | None, run_tier: bool, start: float
) -> Watched:
    """The move itself (steps 2 to 6 of the module's docstring), on branch ``name`` if given."""
    newest, target = found.newest, found.target
    assert target is not None
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
        before = _other_pins_files(project, target)
        tier, passed = _scheduler_tier(project, target)
        _refuse_changes_to_other_pins(project, target, before)
    elif carried:
        tier = "not run (--no-tier)"
    left = _left_by_hand(target, newest, name, stopped_at, carried, passed, bool(flagged))
    outcome = Outcome.READY if carried and passed is not False else Outcome.BY_HAND
    watched = Watched(
        outcome,
        newest,
        target,
        also_new=found.also_new,
        root=project.root,
        branch=name,
        report=report,
        conflict_tree=None if carried else tree,
        patches=sum(n for s, n in result.counts.items() if s not in (Status.DROPPED, Status.UPSTREAMED)),
        statuses={str(s): n for s, n in result.counts.items() if n},
        conflict_kinds=result.conflict_kinds,
        reused=result.reused,
        stopped_at=stopped_at,
        unresolved=unresolved,
        flagged=flagged,
        written=tuple(dict.fromkeys([*written, *copied])),
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
        watched = _replace(watched, commit=_commit(project, watched, copied))
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


def _check_new_pin_files(project: Project, target: Pin) -> None:
    """Nothing of the new pin's may be there untracked: the move's commit would take it in."""
    stray = _git(
        project, "status", "--porcelain", "--untracked-files=all", "--", f"tests/upstream/{target}"
    ).strip()
    if stray:
        raise ForkError(
            f"{project.root / 'tests' / 'upstream' / str(target)} holds files git does not track "
            f"({stray.splitlines()[0][3:]} ...): the move to {target} would commit them. Move them "
            "away or delete them, then run the watcher again."
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
    if not old.is_dir() or (new.exists() and (not new.is_dir() or any(new.iterdir()))):
        return []
    shutil.copytree(old, new, dirs_exist_ok=True)  # an empty folder git does not see: as none
    return [str(p.relative_to(project.root)) for p in sorted(new.rglob("*")) if p.is_file()]


def _stopped_at(tree: Path) -> tuple[str, tuple[str, ...]]:
    """The patch (subject) a conflict tree stands at, and its conflicted files."""
    repo = Repo(tree, bare=False)
    subject = repo.run(
        "log", "-1", "--format=%s", "CHERRY_PICK_HEAD", cwd=tree, in_work_tree=True, ok_codes=(0, 128)
    )
    return subject[1].strip(), tuple(unmerged(repo, tree))


def _scheduler_tier(project: Project, target: Pin) -> tuple[str, bool]:
    """``build.py test --tier scheduler --pin <target>`` in the project: (what it said, passed).

    The release's code is unreviewed, so the run is caged, in two steps. First, outside the
    cage, ``--plan``: the tool makes the wheel and the test venv in a tool env, build cache and
    test venv of the cage's own (:func:`caged_env`), removed afterwards, and writes the pytest
    run down. Then that run (vLLM's code in the tier's tests) in bubblewrap (:mod:`.cage`): the
    file system read-only (the venv and the project with it), ``/run`` and the home folders
    hidden, its own PIDs, network and ``/tmp``, an environment of the plan's variables alone,
    one scratch folder writable. A failure of the tier's tests (exit 1) is work by hand; any
    other exit (the tool could not build or start: an index out of reach, a broken lock) is the
    watcher's own error, raised."""
    build_py = project.root / "build.py"
    if not build_py.is_file():
        raise ForkError(
            f"{project.root} has no build.py: the scheduler tier cannot run. Give --no-tier to leave it out."
        )
    shown = f"python build.py test --tier scheduler --pin {target}"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="watch-cage-") as cage_dir:
        cage = Path(cage_dir)
        plan_file = cage / "plan.json"
        command = [sys.executable, str(build_py), "test", "--tier", "scheduler", "--pin", str(target)]
        with log.phase(f"the scheduler tier's wheel and venv at vllm {target} (in {cage})"):
            status = proc.stream([*command, "--plan", str(plan_file)], cwd=project.root, env=caged_env(cage))
        if status != 0 or not plan_file.is_file():
            raise ForkError(
                f"the scheduler tier at vllm {target} could not run ({shown} --plan exited {status}, "
                "not 0 with its plan written): its error is above. Nothing was committed; fix that "
                "and run the watcher again."
            )
        plan = json.loads(plan_file.read_text())
        with log.phase(f"the scheduler tier at vllm {target} (in a bubblewrap cage)"):
            status = proc.stream(_caged_tier(project, cage, plan))
    took = f"{time.perf_counter() - started:.0f} s"
    if status == 0:
        return f"passed ({took}: {shown}, caged)", True
    if status == 1:
        return f"failed, exit 1 ({took}: {shown}, caged)", False
    raise ForkError(
        f"the scheduler tier at vllm {target} could not run ({shown} exited {status} in its cage, not 0 "
        "passed or 1 failed): its error is above. Nothing was committed; fix that and run the watcher again."
    )


def _caged_tier(project: Project, cage: Path, plan: dict[str, Any]) -> list[str]:
    """The command line of the plan's pytest run in the cage: everything read-only but the
    cage's ``scratch`` folder (its home and bytecode); the plan's variables and a ``PATH``,
    ``HOME`` and bytecode prefix of the cage's, no other."""
    argv = [str(a) for a in plan["argv"]]
    scratch = cage / "scratch"
    env = {
        "PATH": os.pathsep.join([str(Path(argv[0]).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(scratch / "home"),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        **{str(k): str(v) for k, v in plan["env"].items()},
        "PYTHONPYCACHEPREFIX": str(scratch / "bytecode"),
    }
    return caged(
        argv,
        cwd=Path(plan["cwd"]),
        env=env,
        readable=[project.root, cage],
        writable=[scratch / "home", scratch / "bytecode"],
    )


def _new_pins_own(target: Pin, relative: str) -> bool:
    """Whether ``relative`` (a path under ``WRITES``) is the new pin's own: its series, its
    patches, its draft record; the files a move to it may write."""
    own = (f"series/{target}", f"docs/rebases/v{target}.md", f"docs/rebases/v{target}.draft.md")
    return relative in own or relative.startswith(f"patches/{target}/")


def _other_pins_files(project: Project, target: Pin) -> dict[str, bytes]:
    """Every file under ``WRITES`` that is not the new pin's own, by its bytes: what the scheduler
    tier (the new release's code) must leave as it is."""
    found = {}
    for name in WRITES:
        for path in _under(project.root / name):
            relative = path.relative_to(project.root).as_posix()
            if (path.is_file() or path.is_symlink()) and not _new_pins_own(target, relative):
                found[relative] = (
                    path.read_bytes() if path.is_file() else b"-> " + os.fsencode(path.readlink())
                )
    return found


def _ledgers_agree(relative: str, before: bytes, after: bytes, target: Pin) -> bool:
    """pins.lock and fork-releases.toml may gain the new pin's lines (the tier builds its wheel,
    which records its sdist hash and release number), nothing else."""
    import tomllib

    try:
        old, new = tomllib.loads(before.decode()), tomllib.loads(after.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    if relative == "pins.lock":
        for data in (old, new):
            if isinstance(data.get("vllm"), dict):
                data["vllm"].pop(str(target), None)
        return old == new
    releases = [new.get("release", []), old.get("release", [])]
    if not all(isinstance(r, list) for r in releases):
        return False
    others = [[e for e in r if not (isinstance(e, dict) and e.get("pin") == str(target))] for r in releases]
    return others[0] == others[1] and {k: v for k, v in old.items() if k != "release"} == {
        k: v for k, v in new.items() if k != "release"
    }


def _refuse_changes_to_other_pins(project: Project, target: Pin, before: dict[str, bytes]) -> None:
    """Refuse the move (the watcher's error: everything put back) when the scheduler tier changed
    a file under ``WRITES`` that is not the new pin's own (a supported pin's patch, a rerere
    record, another pin's lines): the commit would carry it, and the summary would not say so."""
    after = _other_pins_files(project, target)
    changed = sorted(
        name
        for name in before.keys() | after.keys()
        if before.get(name) != after.get(name)
        and not (
            name in ("pins.lock", "fork-releases.toml")
            and name in before
            and name in after
            and _ledgers_agree(name, before[name], after[name], target)
        )
    )
    if changed:
        raise ForkError(
            f"the scheduler tier at vllm {target} (the new release's unreviewed code) changed "
            f"{', '.join(changed)}, which are not vllm {target}'s own files: nothing was committed "
            f"and the project was put back as it was. Look at what the release's setup.py and code "
            f"do before moving to it (python build.py --pin {target} --review), or move with "
            f"--no-tier and run the tier on a machine of its own."
        )


def caged_env(cage: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run of unreviewed code: every cache the tool keeps (its tool env
    under ``XDG_CACHE_HOME``, the build caches under ``VLLM_RBLN_FORK_CACHE``, the test venvs) in
    ``cage``, so what that code writes there is removed with it and reused by nothing. uv's
    package cache stays shared (a fresh env installs in seconds), but uv copies files out of it
    (``UV_LINK_MODE=copy``): a hard link would let a write into the new env change the cache's
    file, and every env linked from it. build.py's re-exec marker is dropped, so the run makes
    and enters its own tool env. On the forge, the files a step writes its outputs and
    environment to (``GITHUB_OUTPUT``, ``GITHUB_ENV``, ...) and the runner's ``ACTIONS_*``
    are not handed on: the release's code cannot set the watch job's outcome."""
    environ = dict(os.environ if environ is None else environ)
    home_cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    environ.setdefault("UV_CACHE_DIR", str(home_cache / "uv"))
    for name in [*environ]:
        if name in ("VLLM_RBLN_FORK_BOOTSTRAPPED", "PYTHONPATH") or name.startswith(FORGE_HANDLES):
            del environ[name]
    return {
        **environ,
        "XDG_CACHE_HOME": str(cage / "xdg-cache"),
        "VLLM_RBLN_FORK_CACHE": str(cage / "vllm-rbln-fork"),
        "UV_LINK_MODE": "copy",
        CAGE_ENV: str(cage),  # the wheel's build hook (vLLM's setup.py) runs caged too
    }


def _left_by_hand(
    target: Pin,
    newest: Pin,
    branch: str | None,
    stopped_at: str,
    carried: bool,
    passed: bool | None,
    flagged: bool,
) -> tuple[str, ...]:
    """The steps left, as a maintainer runs them in a clone of the project on their machine:
    project-relative paths only (the run's conflict tree is a work tree of its machine's cache)."""
    if not carried:
        return (
            *((f"git fetch origin {branch} && git switch {branch}",) if branch else ()),
            f"python build.py --pin {target} --review --write --from {newest}  (the carry again, on "
            f"this machine: every recorded resolution is reused, and it stops at `{stopped_at}` in "
            f"work/conflict-v{target})",
            f"resolve the files there, 'git add' them, then: python build.py continue --dir "
            f"work/conflict-v{target}  (again at each conflict)",
            f"python build.py export --dir work/conflict-v{target}  (series/{target}, patches/{target}/, "
            "the new rerere/ records)",
            f"python build.py test --pin {target} --tier scheduler; commit on the branch",
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


def _commit(project: Project, w: Watched, copied: list[str]) -> str:
    """One commit of what the move wrote: ``WRITES`` (clean before the move) and the conformance
    lists it copied, nothing else (a file the maintainer left there is not theirs to commit)."""
    present = [p for p in WRITES if (project.root / p).exists()]
    _git(project, "add", "--all", "--", *present, *copied)
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
        f"* review: {statuses}"
        + (f"; conflicts: {w.conflict_kinds}" if w.conflict_kinds else "")
        + f" (report: `{_rel(w.report, w.root)}`, and the CI artifact)",
        f"* conflicts resolved from `rerere/`: {len(w.reused)}"
        + (f" ({', '.join(f'`{f}`' for f in w.reused)})" if w.reused else ""),
    ]
    if w.conflict_tree is not None:
        lines.append(
            f"* **stopped** at `{w.stopped_at}`: "
            + (", ".join(f"`{f}`" for f in w.unresolved) or "a resolution that left the commit empty")
            + f" (conflict tree `{_rel(w.conflict_tree, w.root)}` on the machine that ran the watcher; "
            "the steps below make it again on yours)"
        )
    else:
        lines.append(f"* carried: {w.patches} patches; `pins.toml` marks {w.release} `moving`")
    for flag in w.flagged:
        lines.append(f"* ⚠️ flagged: {flag}")
    if w.also_new:
        lines.append(
            f"* also new on the index: {', '.join(map(str, w.also_new))} (not moved to: the watcher moves "
            f"to the newest release; 'python build.py watch --release <version>' moves to another)"
        )
    lines.append(f"* scheduler tier at {w.release}: {w.tier}")
    if w.written:
        shown = ", ".join(f"`{p}`" for p in w.written[:8])
        more = f" and {len(w.written) - 8} more" if len(w.written) > 8 else ""
        lines.append(f"* wrote {shown}{more}")
    if w.record is not None:
        lines.append(f"* draft record: `{_rel(w.record, w.root)}`")
    lines += ["", "Left by hand:", ""] + [f"1. {step}" for step in w.left]
    return "\n".join(lines) + "\n"


def _rel(path: Path | None, root: Path | None) -> str:
    """``path`` relative to the project (what names it on every machine), else as it is."""
    if path is None:
        return ""
    for base in (root, Path.cwd()):
        if base is not None:
            try:
                return str(path.resolve().relative_to(base.resolve()))
            except ValueError:
                continue
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
