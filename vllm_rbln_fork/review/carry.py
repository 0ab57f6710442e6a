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
from ..gitrepo import Repo
from ..paths import upstream_repo_dir
from ..pins import Pin, PinsLock
from ..pipeline import base_upstream, build_lock, prepare, scratch_dir
from ..project import Project
from ..series import Series
from ..source import SourceSpec
from ..supported import read_series_for
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
        with log.phase(f"carry {len(series.patches)} patches from vllm {base.pin} onto {pin}"):
            built = commit_series_on(repo, base, series, scratch)
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
        changed = export(clone, project).changed
    return replace(result, written=tuple(changed), wrote=True)


def check_writable(project: Project, pin: Pin) -> None:
    """``--write`` exports ``series/<pin>``; nothing to check before the carry (a pin being
    moved to gets its series first and joins ``pins.toml`` once its tests pass)."""
    del project, pin


def contained_backports(pin: Pin, spec: SourceSpec, project: Project) -> list[tuple[str, str]]:
    """The backports of the series that vllm ``pin`` already contains, with why: the same
    detection as the build's automatic drop (it reverse-applies, or carrying it changes
    nothing). The tripwire: a backport still in the series at a pin that has it is dead."""
    series = read_series_for(project, pin)
    with carried_series(pin, spec, project, series, "tripwire-") as run:
        carried = run.carried
    return [(c.item.patch.name, c.step.reason) for c in carried if c.step.kind is StepKind.UPSTREAMED]
