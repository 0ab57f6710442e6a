"""The review's and the tripwire's carry of the series onto a new pin, and ``--write``."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from .. import log
from ..apply import (
    Applied,
    Step,
    carry_step,
    commit_series_on,
    conflict_work_tree,
    patch_identity,
    resolve_instructions,
)
from ..gitrepo import Repo
from ..paths import upstream_repo_dir
from ..pins import Pin, PinsLock
from ..pipeline import base_upstream, build_lock, prepare, scratch_dir
from ..project import Project
from ..series import Series, read_series
from ..source import SourceSpec
from ..upstream import Upstream
from .model import Review


@dataclass(frozen=True)
class Carried:
    item: Applied
    step: Step
    before: str  # the head it was carried onto
    commit: str | None  # the carried commit, if it applied


class CarryRun(NamedTuple):
    repo: Repo
    scratch: Path
    base: Upstream
    target: Upstream
    built: list[Applied]
    carried: list[Carried]
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
            carried, head = carry_all(repo, built, target.upstream, scratch)
        yield CarryRun(repo, scratch, base, target.upstream, built, carried, head)


def carry_all(repo: Repo, built: list[Applied], target: Upstream, scratch: Path) -> tuple[list[Carried], str]:
    head = target.commit
    carried = []
    for item in built:
        step = carry_step(repo, head, item, target.pin, scratch)
        commit = None
        if step.kind == "applied":
            assert step.tree is not None
            commit = repo.commit_tree(step.tree, [head], item.patch.message, patch_identity(item.patch))
        carried.append(Carried(item, step, head, commit))
        head = commit or head
    return carried, head


def write_series(
    repo: Repo,
    result: Review,
    carried: list[Carried],
    head: str,
    target: Upstream,
    project: Project,
    scratch: Path,
) -> Review:
    """Refresh patches/ and series for the new pin, or leave a work tree at the first conflict."""

    from ..workflow import export

    first = next((i for i, c in enumerate(carried) if c.step.kind == "conflict"), None)
    if first is not None:
        rest = [c.item.commit for c in carried[first:] if c.step.kind not in ("dropped", "upstreamed")]
        with log.phase(f"leave a work tree at the conflict of {carried[first].item.patch.name}"):
            tree = conflict_work_tree(repo, target, carried[first].before, rest, project.work_dir)
        return replace(result, wrote=False, conflict_tree=tree, instructions=resolve_instructions(tree))
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
        changed = export(clone, project)
    return replace(result, written=tuple(changed), wrote=True)


def contained_backports(pin: Pin, spec: SourceSpec, project: Project) -> list[tuple[str, str]]:
    """The backports of the series that vllm ``pin`` already contains, with why: the same
    detection as the build's automatic drop (it reverse-applies, or carrying it changes
    nothing). The tripwire: a backport still in the series at a pin that has it is dead."""
    series = read_series(project.series_file, project.patches_dir)
    with carried_series(pin, spec, project, series, "tripwire-") as run:
        carried = run.carried
    return [(c.item.patch.name, c.step.reason) for c in carried if c.step.kind == "upstreamed"]
