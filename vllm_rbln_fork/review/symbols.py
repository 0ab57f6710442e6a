"""What upstream changed, old pin -> new pin, under one patch, by Python ``ast``: the
functions and classes it edits, calls (narrowed by receiver) or overrides, in the files it
touches and the vLLM modules those import; signatures and vanished keywords compared."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..gitrepo import Repo
from ..upstream import Upstream
from . import pyast, signatures
from .carry import Carried
from .difftext import FileDiff
from .model import Change, Relation, SymbolChange

SHORT = {Relation.CHANGED: "edited", Relation.CALLED: "called", Relation.OVERRIDDEN: "overridden"}
MAX_NAME_MATCHES = 6  # a called name defined in more places than this is too ambiguous to follow


@dataclass
class Sources:
    """File contents by (commit, path), read once."""

    repo: Repo
    cache: dict[tuple[str, str], str] = field(default_factory=dict)
    listing: dict[str, frozenset[str]] = field(default_factory=dict)
    parsed: dict[tuple[str, str], dict[str, pyast.Symbol]] = field(default_factory=dict)

    def text(self, commit: str, path: str) -> str:
        """The file at ``commit``; ``""`` only when the commit has no such file (any other git
        failure raises: it must not read as "removed upstream")."""
        key = (commit, path)
        if key not in self.cache:
            if path in self.files(commit):
                self.cache[key] = self.repo.run("show", f"{commit}:{path}", strip=False)[1]
            else:
                self.cache[key] = ""
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
class Under:
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


def upstream_under(
    src: Sources,
    c: Carried,
    old_files: list[FileDiff],
    base: Upstream,
    target: Upstream,
    churn: dict[str, int],
) -> Under:
    """What upstream changed, old pin -> new pin, in the code the patch edits, calls or overrides."""
    commit, parent = c.item.commit, f"{c.item.commit}^"
    old, new = base.commit, target.commit
    interest: dict[tuple[str, str], tuple[Relation, tuple[pyast.CallSite, ...]]] = {}  # -> (relation, calls)
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
                interest.setdefault((f.path, q), (Relation.CHANGED, ()))
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
            (defs if sym.kind is pyast.SymbolKind.FUNCTION else classes).setdefault(sym.name, []).append(
                (path, q)
            )
    for site in calls:
        matches = _resolve(site, defs.get(site.name, []), touched)
        if site.name in own_defs or not matches:
            continue
        for key in matches:
            relation, sites = interest.get(key, (Relation.CALLED, ()))
            if relation is Relation.CALLED:
                sites = (*sites, site)
            interest[key] = (relation, sites)
    for m in methods:
        for base_name in m.bases:
            for path, cls in classes.get(base_name, []):
                key = (path, f"{cls}.{m.name}")
                if key[1] in src.symbols(old, path):
                    interest.setdefault(key, (Relation.OVERRIDDEN, ()))

    changes: list[SymbolChange] = []
    unchanged: list[SymbolChange] = []
    for (path, q), (relation, sites) in interest.items():
        before = src.symbols(old, path)[q]
        after = src.symbols(new, path).get(q)
        change = _compare(path, q, relation, sites, before, after)
        (changes if change.change is not Change.UNCHANGED else unchanged).append(change)
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
    order = {Change.SIGNATURE_CHANGED: 0, Change.REMOVED: 0, Change.BODY_CHANGED: 1}
    changes.sort(key=lambda s: (not s.flagged, order.get(s.change, 2), s.path, s.qualname))
    return Under(
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
    relation: Relation,
    sites: tuple[pyast.CallSite, ...],
    before: pyast.Symbol,
    after: pyast.Symbol | None,
) -> SymbolChange:
    relied_on = relation is not Relation.CHANGED
    if after is None:
        return SymbolChange(
            path,
            q,
            relation,
            Change.REMOVED,
            before.signature,
            "",
            "no longer defined here (removed, renamed or moved)",
            before.text,
            "",
            flagged=relied_on,
            breaking=relied_on,
        )
    if before.kind is pyast.SymbolKind.FUNCTION and before.signature != after.signature:
        described = signatures.describe_signature_change(before, after)
        problems: list[str] = []
        if relation is Relation.OVERRIDDEN:
            # An override must accept whatever callers may now pass to the base: any change breaks it.
            breaking = True
            described += " (the override must follow)"
        elif relation is Relation.CALLED:
            # The patch's own calls, bound as Python binds them; one with *xs or **kw cannot be
            # bound statically and is judged by griffe's rules for any caller.
            verdicts = [(site, signatures.call_binds(site, before, after)) for site in sites]
            problems = [f"the patch's call on line {site.line}: {why}" for site, why in verdicts if why]
            unknown = any(why == "" for _, why in verdicts)
            breaking = bool(problems) or (unknown and not signatures.compatible(before, after))
            described += " (breaking)" if breaking else " (compatible: the patch's calls still bind)"
        else:
            breaking = False
            fits = signatures.compatible(before, after)
            described += " (compatible: existing calls still bind)" if fits else " (breaking for callers)"
        return SymbolChange(
            path,
            q,
            relation,
            Change.SIGNATURE_CHANGED,
            before.signature,
            after.signature,
            "; ".join([described, *problems]),
            before.text,
            after.text,
            flagged=relied_on,
            breaking=breaking,
        )
    if before.text != after.text:
        what = {
            pyast.SymbolKind.CLASS: Change.CLASS_HEADER_CHANGED,
            pyast.SymbolKind.MODULE: Change.MODULE_CODE_CHANGED,
        }.get(before.kind, Change.BODY_CHANGED)
        return SymbolChange(
            path, q, relation, what, before.signature, after.signature, "", before.text, after.text, False
        )
    return SymbolChange(
        path, q, relation, Change.UNCHANGED, before.signature, after.signature, "", "", "", False
    )
