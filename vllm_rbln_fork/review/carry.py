"""The review's and the tripwire's carry of the series onto a new pin, and ``--write``."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from .. import log
from ..apply import (
    Applied,
    AtConflict,
    Carried,
    StepKind,
    carry,
    commit_series_on,
    conflict_work_tree,
    resolve_instructions,
)
from ..errors import ForkError, SeriesError
from ..gitrepo import Repo
from ..paths import upstream_repo_dir
from ..pins import Pin, PinsLock
from ..pipeline import Homes, base_upstream, build_lock, prepare, project_lock, scratch_dir
from ..project import Project
from ..series import Series
from ..source import SourceSpec
from ..supported import listed_pins, read_series_for
from ..upstream import Upstream
from .model import Review


class CarryRun(NamedTuple):
    repo: Repo
    scratch: Path
    base: Upstream
    target: Upstream
    built: list[Applied]
    carried: tuple[Carried, ...]
    head: str


@contextmanager
def carried_series(
    pin: Pin, spec: SourceSpec, project: Project, series: Series, prefix: str
) -> Iterator[CarryRun]:
    """Under the build lock: the series committed on its own pin and carried onto ``pin``,
    going on past conflicts (the review and the tripwire both need every patch's fate)."""
    lock = PinsLock(project.pins_lock)
    with build_lock(), tempfile.TemporaryDirectory(prefix=prefix, dir=scratch_dir()) as tmp:
        scratch = Path(tmp)
        repo = Repo(upstream_repo_dir())
        target = prepare(repo, pin, spec, lock, scratch)
        base = base_upstream(repo, series, target, spec, lock, scratch)
        with project_lock(project):
            lock.commit()  # both sdists are in git: their hashes may be recorded
        with log.phase(f"carry {len(series.patches)} patches from vllm {base.pin} onto {pin}"):
            homes = Homes(repo, project, spec, lock, scratch)
            built = commit_series_on(repo, base, series, scratch, homes)
            result = carry(repo, built, target.upstream, scratch, at_conflict=AtConflict.GO_ON)
        yield CarryRun(repo, scratch, base, target.upstream, built, result.carried, result.head)


def write_series(
    repo: Repo,
    result: Review,
    carried: tuple[Carried, ...],
    head: str,
    target: Upstream,
    project: Project,
    scratch: Path,
) -> Review:
    """Refresh patches/ and series for the new pin, or leave a work tree at the first conflict."""

    from ..workflow import export

    first = next((i for i, c in enumerate(carried) if c.step.kind is StepKind.CONFLICT), None)
    if first is not None:
        rest = [c.item.commit for c in carried[first:] if not c.step.left_out]
        with log.phase(f"leave a work tree at the conflict of {carried[first].item.patch.name}"):
            tree, progress = conflict_work_tree(
                repo, target, carried[first].before, rest, project.work_dir, project.rerere_dir
            )
        return replace(
            result,
            wrote=False,
            conflict_tree=tree,
            instructions=resolve_instructions(tree, progress),
            reused=progress.reused,
            unexported=progress.unexported,
            carried_all=not progress.stopped,
        )
    with log.phase(f"export the series carried onto vllm {target.pin}"):
        repo.run("update-ref", f"refs/heads/{target.branch}", head)
        clone = scratch / "export"
        repo.run(
            "clone",
            "--quiet",
            "--no-checkout",
            "--single-branch",
            "--branch",
            target.branch,
            str(repo.git_dir),
            str(clone),
        )
        Repo(clone, bare=False)  # the same pinned config as the cache repo
        changed = export(clone, project, work_tree=False).changed  # a clone without a checkout
    return replace(result, written=tuple(changed), wrote=True)


def check_writable(project: Project, pin: Pin, source: Pin | None) -> None:
    """Before the carry, what ``--write`` (an export of ``series/<pin>``) would refuse after it:

    * a pin ``pins.toml`` does not list (export writes no series for it: a move is marked
      first);
    * a source pin newer than ``pin`` when ``pin`` has a series of its own: that would put the
      newer pin's forms of the patches (its code) over the ones ``pin`` builds.

    Each is a ForkError naming the way out; the review itself (without ``--write``) may still
    be run and read."""
    listed = listed_pins(project)
    if not listed:
        return
    if pin not in {s.pin for s in listed}:
        raise SeriesError(
            f"--review --write exports series/{pin}, but {project.pins_file.name} does not list vllm "
            f'{pin}: a move is marked first. Add [pin."{pin}"] with status = "moving" to '
            f"{project.pins_file.name} (docs/patch-workflow.md) and run again; without --write the "
            f"review only writes its report. Nothing was carried or written."
        )
    own = project.series_dir / str(pin)
    if source is not None and source > pin and own.is_file():
        raise ForkError(
            f"--from {source} is newer than {pin}: --review --write would put {source}'s forms of "
            f"the patches over series/{pin}, the series {pin} builds. Review without --write to read "
            f"the report; to change {pin}'s series, make the change at {pin} ('python build.py "
            f"checkout --pin {pin}', then export). Nothing was carried or written."
        )


def contained_backports(pin: Pin, spec: SourceSpec, project: Project) -> list[tuple[str, str]]:
    """The backports of the series that vllm ``pin`` already contains, with why: the same
    detection as the build's automatic drop (it reverse-applies, or carrying it changes
    nothing). The tripwire: a backport still in the series at a pin that has it is dead."""
    series = read_series_for(project, pin)
    with carried_series(pin, spec, project, series, "tripwire-") as run:
        carried = run.carried
    return [(c.item.patch.name, c.step.reason) for c in carried if c.step.kind is StepKind.UPSTREAMED]
