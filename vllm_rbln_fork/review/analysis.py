"""Review a move of the pin: carry the series onto a new vLLM release and explain it.

``review(pin, ...)`` commits the series on the pin it was exported against, carries it
patch by patch onto ``pin`` with git's 3-way merge (the same steps as the build, from
``apply``), and records for each patch:

* its status: ``clean`` (the same diff), ``context drift`` (the same ``+``/``-`` lines,
  other context or line numbers), ``merged`` (the merge changed its own lines),
  ``conflict`` (each hunk with ours, base and theirs), ``upstreamed`` (nothing left to
  apply) or ``dropped`` (by its ``Applied-Upstream`` trailer);
* what upstream changed under it, by ``ast``: the functions and classes it edits, calls
  or overrides, in the files it touches and the vLLM modules those import, with changed
  signatures and vanished keywords flagged;
* its range-diff mark against the old series (``=``, ``!``, ``<``, ``>``), telling
  context-only drift from a change of its own lines.

Unlike the build, a conflict does not stop the review: the conflicting patch is left
out and the rest are carried without it. Nothing here prints; ``render`` writes
the Markdown and HTML reports.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from .. import log
from ..apply import Applied, Carried, StepKind, trailer_drop
from ..errors import ForkError
from ..gitrepo import Repo
from ..pins import Pin
from ..project import Project
from ..series import Series
from ..source import SourceSpec
from ..supported import project_spelling, read_series_for, source_pin_for
from ..upstream import Upstream
from .carry import carried_series, check_writable, write_series
from .difftext import FileDiff, normalized, own_lines, parse_diff
from .model import ConflictHunk, Mark, PatchReview, Review, Status
from .render import write_reports
from .symbols import Sources, upstream_under

DIFF = ("diff", "--no-color", "--no-ext-diff", "--find-renames", "--abbrev=12")


def review(
    pin: Pin,
    spec: SourceSpec,
    project: Project,
    *,
    write: bool = False,
    series: Series | None = None,
    source: Pin | None = None,
    report_dir: Path | None = None,
) -> Review:
    """Carry the series onto ``pin`` and explain every patch; with ``write``, refresh the
    series for ``pin`` (nothing conflicts) or leave a work tree at the first conflict.

    With ``pins.toml``, the series carried is ``source``'s, by default the newest supported
    pin older than ``pin`` (see ``supported.source_pin_for``). ``report_dir``: the reports are
    written there before ``write`` is attempted (and the caller writes them again after it)."""
    pin = project_spelling(project, pin)  # --pin 1.1.0 is 1.1, as for the build and checkout
    if source is not None:
        source = project_spelling(project, source)
    source = source_pin_for(project, pin, source)
    if write:
        check_writable(project, pin, source)
    series = series or read_series_for(project, source)
    with carried_series(pin, spec, project, series, "review-") as run:
        repo, scratch, base, target, built, carried, head = run
        with log.phase("read what upstream changed under each patch"):
            src = Sources(repo)
            churn = _churn(repo, base.commit, target.commit, built)
            by_name = {c.item.patch.name: c for c in carried}
            reviews = []
            for patch in series.patches:
                if patch.name not in by_name:  # not even applied on its own pin: its trailer
                    reason = trailer_drop(patch, base.pin) or "not applied"
                    reviews.append(PatchReview(patch, Status.DROPPED, reason, mark="<", mark_note=reason))
                    continue
                reviews.append(_review_one(src, by_name[patch.name], base, target, churn))
            reviews = _note_skipped(reviews, churn)
            old_head = built[-1].commit if built else base.commit
            range_diff = repo.out(
                "range-diff", "--no-color", f"{base.commit}..{old_head}", f"{target.commit}..{head}"
            )
        result = Review(base.pin, pin, base.commit, target.commit, tuple(reviews), range_diff.rstrip())
        if report_dir is not None:  # before --write: a write that fails leaves the report
            write_reports(result, report_dir)
        if write:
            try:
                result = write_series(repo, result, carried, head, target, project, scratch)
            except ForkError as exc:
                if report_dir is not None:
                    exc.add_note(f"The review's reports were written first: {report_dir / 'review.md'}")
                raise
    return result


def _note_skipped(reviews: list[PatchReview], churn: dict[str, int]) -> list[PatchReview]:
    """After a conflict, later patches were carried without the conflicting one: say so, and
    tell a conflict with upstream from a knock-on one. A conflict is knock-on when upstream
    left every file it conflicts in alone between the pins (the fork's own files, or an
    upstream file no release changed) and an earlier patch that conflicted and was left out
    touched one of them: it follows from that patch, and names the root of the chain (the
    conflicts with upstream it follows from, through any knock-on between). Anything else
    is counted with upstream, including a conflict in an unchanged file that no left-out
    patch touched (say one an upstreamed patch wrote): it needs a look of its own."""
    from dataclasses import replace

    out: list[PatchReview] = []
    left_out: list[PatchReview] = []  # earlier conflicting patches, not carried
    for r in reviews:
        if left_out and r.status not in (Status.DROPPED, Status.UPSTREAMED):
            skipped = ", ".join(q.name for q in left_out)
            r = replace(r, notes=(*r.notes, f"carried without {skipped} (conflict)"))
        if r.status is Status.CONFLICT:
            paths = {h.path for h in r.conflicts}
            if paths and not any(churn.get(path, 0) for path in paths):
                # Every file a left-out patch touches, not only the Python ones `files` lists.
                touching = [q for q in left_out if paths & {f.path for f in parse_diff(q.patch.text)}]
                roots = dict.fromkeys(name for q in touching for name in (q.knock_on_from or (q.name,)))
                if roots:
                    r = replace(r, knock_on_from=tuple(roots))
            left_out.append(r)
        out.append(r)
    return out


def _churn(repo: Repo, old: str, new: str, built: list[Applied]) -> dict[str, int]:
    """Upstream's changed lines (added + removed) per file the series touches."""
    paths: set[str] = set()
    for item in built:
        paths |= set(repo.out("diff", "--name-only", f"{item.commit}^", item.commit).split())
    if not paths:
        return {}
    out = repo.out("diff", "--numstat", old, new, "--", *sorted(paths))
    churn = {}
    for line in out.splitlines():
        added, removed, path = line.split("\t", 2)
        churn[path] = (int(added) if added.isdigit() else 0) + (int(removed) if removed.isdigit() else 0)
    return churn


def _review_one(
    src: Sources, c: Carried, base: Upstream, target: Upstream, churn: dict[str, int]
) -> PatchReview:
    repo, patch, step = src.repo, c.item.patch, c.step
    old_diff = repo.out(*DIFF, f"{c.item.commit}^", c.item.commit)
    if step.kind is StepKind.DROPPED:
        return PatchReview(
            patch, Status.DROPPED, step.reason, old_diff=old_diff, mark="<", mark_note=step.reason
        )
    if step.kind is StepKind.UPSTREAMED:
        notes = (f"suggest the trailer `Applied-Upstream: {target.pin}`",)
        return PatchReview(
            patch,
            Status.UPSTREAMED,
            step.reason or "upstream contains it",
            old_diff=old_diff,
            mark="<",
            mark_note="upstream has it",
            notes=notes,
        )
    old_files = parse_diff(old_diff)
    analysis = upstream_under(src, c, old_files, base, target, churn)
    if step.kind is StepKind.CONFLICT:
        assert step.tree is not None
        hunks = tuple(h for path in step.conflicts for h in _conflict_hunks(src.text(step.tree, path), path))
        note = "conflict: no new version yet"
        return PatchReview(
            patch,
            Status.CONFLICT,
            "3-way merge conflicts in " + ", ".join(step.conflicts),
            old_diff=old_diff,
            mark="!",
            mark_note=note,
            conflicts=hunks,
            **analysis.fields(),
        )
    assert c.commit is not None
    new_diff = repo.out(*DIFF, c.before, c.commit)
    new_files = parse_diff(new_diff)
    interdiff = _udiff(
        normalized(old_diff), normalized(new_diff), f"{patch.name} @ {base.pin}", f"@ {target.pin}"
    )
    mark: Mark
    if normalized(old_diff) == normalized(new_diff):
        status, mark, note, own = Status.CLEAN, "=", "same diff", ""
    elif own_lines(old_files) == own_lines(new_files):
        status, mark, note, own = (
            Status.CONTEXT_DRIFT,
            "!",
            "context / line numbers only; own lines identical",
            "",
        )
    else:
        status, mark, note = Status.MERGED, "!", "own +/- lines changed by the merge"
        own = _udiff(_own_text(old_files), _own_text(new_files), f"own lines @ {base.pin}", f"@ {target.pin}")
    return PatchReview(
        patch,
        status,
        old_diff=old_diff,
        new_diff=new_diff,
        mark=mark,
        mark_note=note,
        own_interdiff=own,
        interdiff=interdiff if status is not Status.CLEAN else "",
        **analysis.fields(),
    )


def _own_text(files: list[FileDiff]) -> str:
    return "".join(f"{f.path}:\n" + "".join(f"{line}\n" for line in f.own_lines()) for f in files)


def _udiff(a: str, b: str, a_label: str, b_label: str) -> str:
    return "".join(
        difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), a_label, b_label)
    )


def _conflict_hunks(text: str, path: str) -> list[ConflictHunk]:
    """Split a diff3-style merged file into its conflict hunks."""
    hunks = []
    state: str | None = None
    parts: dict[str, list[str]] = {"ours": [], "base": [], "theirs": []}
    start = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if line.startswith("<<<<<<< ") or line.rstrip("\n") == "<<<<<<<":
            state, parts, start = "ours", {"ours": [], "base": [], "theirs": []}, number
        elif state and (line.startswith("||||||| ") or line.rstrip("\n") == "|||||||"):
            state = "base"
        elif state and line.rstrip("\n") == "=======":
            state = "theirs"
        elif state and (line.startswith(">>>>>>> ") or line.rstrip("\n") == ">>>>>>>"):
            hunks.append(ConflictHunk(path, start, *("".join(parts[k]) for k in ("ours", "base", "theirs"))))
            state = None
        elif state:
            parts[state].append(line)
    if not hunks:
        hunks.append(ConflictHunk(path, 0, "", "", "(file-level conflict: added, deleted or renamed)"))
    return hunks
