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
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .. import log
from ..apply import (
    Applied,
    Step,
    carry_step,
    commit_series_on,
    conflict_work_tree,
    patch_identity,
    resolve_instructions,
    trailer_drop,
)
from ..gitrepo import Repo
from ..paths import upstream_repo_dir
from ..pins import Pin, PinsLock
from ..pipeline import base_upstream, build_lock, prepare, scratch_dir
from ..project import Project
from ..series import Patch, Series, read_series
from ..source import SourceSpec
from ..upstream import Upstream
from . import pyast
from .difftext import FileDiff, normalized, own_lines, parse_diff

STATUSES = ("clean", "context drift", "merged", "conflict", "upstreamed", "dropped")
DIFF = ("diff", "--no-color", "--no-ext-diff", "--find-renames", "--abbrev=12")
SHORT = {
    "changed by the patch": "edited",
    "called by the patch": "called",
    "overridden by the patch": "overridden",
}
MAX_NAME_MATCHES = 6  # a called name defined in more places than this is too ambiguous to follow


@dataclass(frozen=True)
class ConflictHunk:
    path: str
    line: int  # where the hunk starts in the merged file
    ours: str  # upstream's new code (with the patches before this one)
    base: str  # the old code the patch was made on
    theirs: str  # the patch's version


@dataclass(frozen=True)
class SymbolChange:
    """A function or class the patch relies on, and what upstream did to it."""

    path: str
    qualname: str
    relation: str  # "changed by the patch", "called by the patch", "overridden by the patch"
    change: str  # "unchanged", "body changed", "signature changed", "removed upstream"
    old_signature: str
    new_signature: str
    note: str
    old_text: str
    new_text: str
    flagged: bool  # the reader must look: a signature or symbol the patch relies on moved
    breaking: bool = False  # a call or override of the patch may no longer bind: needs work

    def diff(self, old_label: str, new_label: str) -> str:
        return "".join(
            difflib.unified_diff(
                self.old_text.splitlines(keepends=True),
                self.new_text.splitlines(keepends=True),
                f"{self.path} ({self.qualname}) @ {old_label}",
                f"{self.path} ({self.qualname}) @ {new_label}",
            )
        )


@dataclass(frozen=True)
class PatchReview:
    patch: Patch
    status: str
    reason: str = ""
    old_diff: str = ""
    new_diff: str = ""
    mark: str = "="  # range-diff mark
    mark_note: str = ""
    own_interdiff: str = ""  # how the patch's own +/- lines changed (merged)
    interdiff: str = ""  # how the whole diff changed (context drift included)
    conflicts: tuple[ConflictHunk, ...] = ()
    symbols: tuple[SymbolChange, ...] = ()  # everything it relies on that upstream changed
    unchanged: tuple[str, ...] = ()  # what it relies on that upstream left alone
    files: tuple[tuple[str, int], ...] = ()  # (touched file, upstream lines changed in it)
    elsewhere: tuple[tuple[str, tuple[str, ...]], ...] = ()  # other symbols upstream changed there
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.patch.name

    @property
    def flags(self) -> tuple[SymbolChange, ...]:
        return tuple(s for s in self.symbols if s.flagged)

    @property
    def needs_work(self) -> bool:
        return (
            self.status == "conflict"
            or any(s.breaking for s in self.symbols)
            or any("needs work" in n for n in self.notes)
        )


@dataclass(frozen=True)
class Review:
    old_pin: Pin
    new_pin: Pin
    old_commit: str
    new_commit: str
    patches: tuple[PatchReview, ...]
    range_diff: str  # git's own range-diff, for reference
    written: tuple[str, ...] = ()  # files --write changed
    wrote: bool = False
    conflict_tree: Path | None = None
    instructions: str = ""

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for p in self.patches if p.status == s) for s in STATUSES}

    @property
    def ready(self) -> bool:
        return not any(p.needs_work for p in self.patches)

    @property
    def verdict(self) -> str:
        return "ready" if self.ready else "needs work"

    @property
    def exit_code(self) -> int:
        return 0 if self.ready else 1

    @property
    def next_commands(self) -> tuple[str, ...]:
        pin = self.new_pin
        conflicts = any(p.status == "conflict" for p in self.patches)
        if conflicts and self.conflict_tree is not None:
            return (
                f"cd {self.conflict_tree}  # resolve, git add, git cherry-pick --continue",
                f"python build.py export --dir {self.conflict_tree}",
                f"python build.py --pin {pin} --review",
            )
        if conflicts:
            return (f"python build.py --pin {pin} --review --write  # a work tree at the first conflict",)
        if self.wrote:
            return (
                "git diff series patches/",
                f"python build.py --pin {pin}",
                f"python build.py test --pin {pin}",
            )
        first = f"python build.py --pin {pin} --review --write  # refresh patches/ and series for {pin}"
        if not self.ready:
            return ("# check the flagged functions below first, then:", first)
        return (first,)


@dataclass
class _Sources:
    """File contents by (commit, path), read once."""

    repo: Repo
    cache: dict[tuple[str, str], str] = field(default_factory=dict)
    listing: dict[str, frozenset[str]] = field(default_factory=dict)
    parsed: dict[tuple[str, str], dict[str, pyast.Symbol]] = field(default_factory=dict)

    def text(self, commit: str, path: str) -> str:
        key = (commit, path)
        if key not in self.cache:
            status, out = self.repo.run("show", f"{commit}:{path}", strip=False, ok_codes=(0, 128))
            self.cache[key] = out if status == 0 else ""
        return self.cache[key]

    def files(self, commit: str) -> frozenset[str]:
        if commit not in self.listing:
            self.listing[commit] = frozenset(
                self.repo.out("ls-tree", "-r", "--name-only", commit).split("\n")
            )
        return self.listing[commit]

    def symbols(self, commit: str, path: str) -> dict[str, pyast.Symbol]:
        key = (commit, path)
        if key not in self.parsed:
            text = self.text(commit, path)
            self.parsed[key] = pyast.symbols(text) if text else {}  # no file: no symbols
        return self.parsed[key]


@dataclass(frozen=True)
class _Under:
    """What upstream changed under one patch (the PatchReview fields of the same names)."""

    symbols: tuple[SymbolChange, ...]
    unchanged: tuple[str, ...]
    files: tuple[tuple[str, int], ...]
    elsewhere: tuple[tuple[str, tuple[str, ...]], ...]

    def fields(self) -> dict[str, Any]:
        return {
            "symbols": self.symbols,
            "unchanged": self.unchanged,
            "files": self.files,
            "elsewhere": self.elsewhere,
        }


@dataclass(frozen=True)
class _Carried:
    item: Applied
    step: Step
    before: str  # the head it was carried onto
    commit: str | None  # the carried commit, if it applied


class _Run(NamedTuple):
    repo: Repo
    scratch: Path
    base: Upstream
    target: Upstream
    built: list[Applied]
    carried: list[_Carried]
    head: str


@contextmanager
def _carried_series(
    pin: Pin, spec: SourceSpec, project: Project, series: Series, prefix: str
) -> Iterator[_Run]:
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
            carried, head = _carry_all(repo, built, target.upstream, scratch)
        yield _Run(repo, scratch, base, target.upstream, built, carried, head)


def review(
    pin: Pin, spec: SourceSpec, project: Project, *, write: bool = False, series: Series | None = None
) -> Review:
    """Carry the series onto ``pin`` and explain every patch; with ``write``, refresh the
    series for ``pin`` (nothing conflicts) or leave a work tree at the first conflict."""
    series = series or read_series(project.series_file, project.patches_dir)
    with _carried_series(pin, spec, project, series, "review-") as run:
        repo, scratch, base, target, built, carried, head = run
        with log.phase("read what upstream changed under each patch"):
            src = _Sources(repo)
            churn = _churn(repo, base.commit, target.commit, built)
            by_name = {c.item.patch.name: c for c in carried}
            reviews = []
            for patch in series.patches:
                if patch.name not in by_name:  # not even applied on its own pin: its trailer
                    reason = trailer_drop(patch, base.pin) or "not applied"
                    reviews.append(PatchReview(patch, "dropped", reason, mark="<", mark_note=reason))
                    continue
                reviews.append(_review_one(src, by_name[patch.name], base, target, churn))
            reviews = _note_skipped(reviews)
            old_head = built[-1].commit if built else base.commit
            range_diff = repo.out(
                "range-diff", "--no-color", f"{base.commit}..{old_head}", f"{target.commit}..{head}"
            )
        result = Review(base.pin, pin, base.commit, target.commit, tuple(reviews), range_diff.rstrip())
        if write:
            result = _write(repo, result, carried, head, target, project, scratch)
    return result


def _note_skipped(reviews: list[PatchReview]) -> list[PatchReview]:
    """After a conflict, later patches were carried without the conflicting one: say so."""
    from dataclasses import replace

    out: list[PatchReview] = []
    skipped: list[str] = []
    for r in reviews:
        if skipped and r.status not in ("dropped", "upstreamed"):
            r = replace(r, notes=(*r.notes, "carried without " + ", ".join(skipped) + " (conflict)"))
        if r.status == "conflict":
            skipped.append(r.name)
        out.append(r)
    return out


def _carry_all(
    repo: Repo, built: list[Applied], target: Upstream, scratch: Path
) -> tuple[list[_Carried], str]:
    head = target.commit
    carried = []
    for item in built:
        step = carry_step(repo, head, item, target.pin, scratch)
        commit = None
        if step.kind == "applied":
            assert step.tree is not None
            commit = repo.commit_tree(step.tree, [head], item.patch.message, patch_identity(item.patch))
        carried.append(_Carried(item, step, head, commit))
        head = commit or head
    return carried, head


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
    src: _Sources, c: _Carried, base: Upstream, target: Upstream, churn: dict[str, int]
) -> PatchReview:
    repo, patch, step = src.repo, c.item.patch, c.step
    old_diff = repo.out(*DIFF, f"{c.item.commit}^", c.item.commit)
    if step.kind == "dropped":
        return PatchReview(patch, "dropped", step.reason, old_diff=old_diff, mark="<", mark_note=step.reason)
    if step.kind in ("upstreamed", "empty"):
        notes: tuple[str, ...] = (f"suggest the trailer `Applied-Upstream: {target.pin}`",)
        if step.kind == "empty":
            notes = (
                f"needs work: an RBLN patch (Origin: {patch.origin_kind}) that changes nothing on "
                f"{target.pin} is never dropped silently; remove it from the series, or make it a "
                f"backport with `Applied-Upstream: {target.pin}`",
            )
        return PatchReview(
            patch,
            "upstreamed",
            step.reason or "upstream contains it",
            old_diff=old_diff,
            mark="<",
            mark_note="upstream has it",
            notes=notes,
        )
    old_files = parse_diff(old_diff)
    analysis = _upstream_under(src, c, old_files, base, target, churn)
    if step.kind == "conflict":
        assert step.tree is not None
        hunks = tuple(h for path in step.conflicts for h in _conflict_hunks(src.text(step.tree, path), path))
        note = "conflict: no new version yet"
        return PatchReview(
            patch,
            "conflict",
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
    if normalized(old_diff) == normalized(new_diff):
        status, mark, note, own = "clean", "=", "same diff", ""
    elif own_lines(old_files) == own_lines(new_files):
        status, mark, note, own = "context drift", "!", "context / line numbers only; own lines identical", ""
    else:
        status, mark, note = "merged", "!", "own +/- lines changed by the merge"
        own = _udiff(_own_text(old_files), _own_text(new_files), f"own lines @ {base.pin}", f"@ {target.pin}")
    return PatchReview(
        patch,
        status,
        old_diff=old_diff,
        new_diff=new_diff,
        mark=mark,
        mark_note=note,
        own_interdiff=own,
        interdiff=interdiff if status != "clean" else "",
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


def _upstream_under(
    src: _Sources,
    c: _Carried,
    old_files: list[FileDiff],
    base: Upstream,
    target: Upstream,
    churn: dict[str, int],
) -> _Under:
    """What upstream changed, old pin -> new pin, in the code the patch edits, calls or overrides."""
    commit, parent = c.item.commit, f"{c.item.commit}^"
    old, new = base.commit, target.commit
    interest: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}  # -> (relation, keywords)
    calls: list[pyast.CallSite] = []
    methods: list[pyast.NewMethod] = []
    own_defs: set[str] = set()
    candidates: list[str] = []
    touched: list[str] = []
    for f in old_files:
        if not f.path.endswith(".py"):
            continue
        touched.append(f.path)
        patched = src.text(commit, f.new_path) if f.new_path else ""
        psyms = pyast.symbols(patched)
        osyms = src.symbols(parent, f.old_path) if f.old_path else {}
        upstream_old = src.symbols(old, f.path)
        changed = {pyast.enclosing(psyms, n) for n in f.added()}
        changed |= {pyast.enclosing(osyms, n) for n in f.removed()}
        for q in sorted(changed):
            if q in upstream_old:
                interest.setdefault((f.path, q), ("changed by the patch", ()))
            else:
                own_defs.add(q.rsplit(".", 1)[-1])
        calls += pyast.calls(patched, f.added())
        methods += pyast.new_methods(patched, f.added())
        for module in pyast.vllm_imports(patched):
            candidates += [p for p in pyast.module_files(module) if p in src.files(old)]
    candidates = list(dict.fromkeys([*touched, *candidates]))
    defs: dict[str, list[tuple[str, str]]] = {}
    classes: dict[str, list[tuple[str, str]]] = {}
    for path in candidates:
        for q, sym in src.symbols(old, path).items():
            (defs if sym.kind == "function" else classes).setdefault(sym.name, []).append((path, q))
    for site in calls:
        matches = _resolve(site, defs.get(site.name, []), touched)
        if site.name in own_defs or not matches:
            continue
        for key in matches:
            relation, keywords = interest.get(key, ("called by the patch", ()))
            if relation == "called by the patch":
                keywords = tuple(dict.fromkeys([*keywords, *site.keywords]))
            interest[key] = (relation, keywords)
    for m in methods:
        for base_name in m.bases:
            for path, cls in classes.get(base_name, []):
                key = (path, f"{cls}.{m.name}")
                if key[1] in src.symbols(old, path):
                    interest.setdefault(key, ("overridden by the patch", ()))

    changes: list[SymbolChange] = []
    unchanged: list[SymbolChange] = []
    for (path, q), (relation, keywords) in interest.items():
        before = src.symbols(old, path)[q]
        after = src.symbols(new, path).get(q)
        change = _compare(path, q, relation, keywords, before, after)
        (changes if change.change != "unchanged" else unchanged).append(change)
    elsewhere = []
    for path in touched:
        ours = {q for (p, q) in interest if p == path}
        before_syms, after_syms = src.symbols(old, path), src.symbols(new, path)
        other = sorted(
            q
            for q, s in before_syms.items()
            if q not in ours and s.kind != "class" and (q not in after_syms or after_syms[q].text != s.text)
        )
        other += sorted(f"{q} (new)" for q in after_syms if q not in before_syms)
        if other:
            elsewhere.append((path, tuple(other)))
    order = {"signature changed": 0, "removed upstream": 0, "body changed": 1}
    changes.sort(key=lambda s: (not s.flagged, order.get(s.change, 2), s.path, s.qualname))
    return _Under(
        tuple(changes),
        tuple(f"{s.qualname} ({SHORT[s.relation]})" for s in unchanged),
        tuple((p, churn.get(p, 0)) for p in touched),
        tuple(elsewhere),
    )


def _resolve(
    site: pyast.CallSite, matches: list[tuple[str, str]], touched: list[str]
) -> list[tuple[str, str]]:
    """The definitions a call by name may reach, narrowed by its receiver when ambiguous:
    ``self.coordinator.f()`` prefers a class named like ``*Coordinator``, ``self.f()`` the
    files the patch touches."""
    if len(matches) <= 1:
        return matches
    hint = site.receiver.replace("_", "").lower()
    if hint in ("self", "cls", "super"):
        narrowed = [m for m in matches if m[0] in touched]
    elif hint:
        narrowed = [m for m in matches if "." in m[1] and hint in m[1].rsplit(".", 1)[0].lower()]
    else:
        narrowed = [m for m in matches if "." not in m[1]]  # a bare name: a module-level function
    if narrowed:
        matches = narrowed
    return matches if len(matches) <= MAX_NAME_MATCHES else []


def _compare(
    path: str,
    q: str,
    relation: str,
    keywords: tuple[str, ...],
    before: pyast.Symbol,
    after: pyast.Symbol | None,
) -> SymbolChange:
    relied_on = relation != "changed by the patch"
    if after is None:
        return SymbolChange(
            path,
            q,
            relation,
            "removed upstream",
            before.signature,
            "",
            "no longer defined here (removed, renamed or moved)",
            before.text,
            "",
            flagged=relied_on,
            breaking=relied_on,
        )
    lost = [k for k in keywords if k in before.params and k not in after.params and not after.var_keyword]
    note = f"the patch passes {', '.join(f'`{k}=`' for k in lost)}: no longer a parameter" if lost else ""
    if before.kind == "function" and before.signature != after.signature:
        # An override must accept whatever callers may now pass to the base: any change breaks it.
        fits = pyast.compatible(before, after) and not lost and relation != "overridden by the patch"
        described = pyast.describe_signature_change(before, after)
        if relation == "overridden by the patch":
            described += " (the override must follow)"
        else:
            described += " (compatible: existing calls still bind)" if fits else " (breaking)"
        note = "; ".join(x for x in (described, note) if x)
        return SymbolChange(
            path,
            q,
            relation,
            "signature changed",
            before.signature,
            after.signature,
            note,
            before.text,
            after.text,
            flagged=relied_on or bool(lost),
            breaking=(relied_on and not fits) or bool(lost),
        )
    if before.text != after.text:
        what = {"class": "class header changed", "module": "module-level code changed"}.get(
            before.kind, "body changed"
        )
        return SymbolChange(
            path,
            q,
            relation,
            what,
            before.signature,
            after.signature,
            note,
            before.text,
            after.text,
            flagged=bool(lost),
            breaking=bool(lost),
        )
    return SymbolChange(path, q, relation, "unchanged", before.signature, after.signature, "", "", "", False)


def _write(
    repo: Repo,
    result: Review,
    carried: list[_Carried],
    head: str,
    target: Upstream,
    project: Project,
    scratch: Path,
) -> Review:
    """Refresh patches/ and series for the new pin, or leave a work tree at the first conflict."""
    from dataclasses import replace

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
    with _carried_series(pin, spec, project, series, "tripwire-") as run:
        carried = run.carried
    return [(c.item.patch.name, c.step.reason) for c in carried if c.step.kind == "upstreamed"]
