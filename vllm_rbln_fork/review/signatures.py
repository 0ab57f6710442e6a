"""Signature changes: what griffe's API check finds (any caller), and whether the patch's own
calls still bind (Python's binding rules, by position and keyword)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .pyast import POSITIONAL, VARIADIC, CallSite, ParamKind, Symbol


def _stub(sym: Symbol) -> str:
    """A module holding only ``sym``'s signature, for griffe (the body does not matter)."""
    return f"def {sym.name}{sym.signature.removeprefix('async ')}: ...\n"


@dataclass(frozen=True)
class Breakage:
    """One way ``old`` -> ``new`` may break a caller, by griffe's rules."""

    param: str
    what: str  # griffe's words: "Parameter kind was changed", "Positional parameter was moved", ...
    detail: str = ""  # "positional or keyword -> keyword-only", "1 -> 2"

    @property
    def binding(self) -> bool:
        """A call may no longer bind (a changed default still binds, to another value)."""
        return self.what != "Parameter default was changed"

    def __str__(self) -> str:
        return f"`{self.param}`: {self.what.lower()}" + (f" ({self.detail})" if self.detail else "")


def breakages(old: Symbol, new: Symbol) -> list[Breakage]:
    """What griffe's API check (``griffe.find_breaking_changes``) finds between two signatures:
    parameters removed, moved, made required, added as required, changed kind or default."""
    import griffe  # only the review needs it

    def load(sym: Symbol) -> griffe.Module:
        module = griffe.visit("signature", Path("signature.py"), code=_stub(sym))
        module[sym.name].public = True  # griffe checks public names only; a hook may be _private
        return module

    found = []
    for b in griffe.find_breaking_changes(load(old), load(new)):
        param = b.old_value if b.old_value is not None else b.new_value
        name = getattr(param, "name", "")
        detail = ""
        if b.kind is griffe.BreakageKind.PARAMETER_CHANGED_KIND:
            detail = f"{b.old_value.kind.value} -> {b.new_value.kind.value}"
        elif b.kind is griffe.BreakageKind.PARAMETER_CHANGED_DEFAULT:
            detail = f"{b.old_value.default} -> {b.new_value.default}"
        found.append(Breakage(name, b.kind.value, detail))
    return found


def compatible(old: Symbol, new: Symbol) -> bool:
    """Whether every call that worked against ``old`` still binds against ``new``, for any
    caller (griffe's rules; a changed default is not counted: calls still bind)."""
    return not any(b.binding for b in breakages(old, new))


def _bind(site: CallSite, sym: Symbol) -> tuple[dict[str, str], str | None]:
    """Bind ``site``'s arguments to ``sym``'s parameters as Python would: which parameter
    each positional argument fills, or why the call does not bind."""
    params = list(sym.params[1:] if sym.bound else sym.params)
    slots = [p for p in params if p.kind in POSITIONAL]
    by_name = {p.name: p for p in params}
    takes_var_kw = any(p.kind is ParamKind.VAR_KEYWORD for p in params)
    takes_var_pos = any(p.kind is ParamKind.VAR_POSITIONAL for p in params)
    if site.positional > len(slots) and not takes_var_pos:
        return {}, f"it passes {site.positional} positional arguments, {sym.name} takes {len(slots)}"
    positions = {str(i): p.name for i, p in enumerate(slots[: site.positional])}
    filled = set(positions.values())
    for keyword in site.keywords:
        p = by_name.get(keyword)
        if p is None or p.kind in VARIADIC or p.kind is ParamKind.POSITIONAL_ONLY:
            if takes_var_kw:
                continue  # **kwargs takes it
            if p is not None and p.kind is ParamKind.POSITIONAL_ONLY:
                return positions, f"it passes `{keyword}=`, which is now positional-only"
            return positions, f"it passes `{keyword}=`: no longer a parameter"
        if keyword in filled:
            return positions, f"it passes `{keyword}` twice (by position and by keyword)"
        filled.add(keyword)
    missing = [p.name for p in params if p.required and p.name not in filled]
    if missing:
        return positions, "it does not pass the required " + ", ".join(f"`{m}`" for m in missing)
    return positions, None


def call_binds(site: CallSite, old: Symbol, new: Symbol) -> str | None:
    """``None`` if the patch's call ``site`` binds against ``new`` as it did against ``old``;
    else why not. ``""`` when a ``*xs``/``**kw`` argument makes it unknowable (judge by
    :func:`compatible` then)."""
    if site.star_args or site.star_kwargs:
        return ""
    before, _ = _bind(site, old)
    after, problem = _bind(site, new)
    if problem is not None:
        return problem
    moved = [
        f"argument {int(i) + 1} now fills `{after[i]}`, not `{name}`"
        for i, name in before.items()
        if after.get(i) != name
    ]
    return "; ".join(moved) or None


def describe_signature_change(old: Symbol, new: Symbol) -> str:
    """One line: what a reader must know about ``old`` -> ``new`` (griffe's findings first)."""
    removed = [p for p in old.param_names if p not in new.param_names]
    added = [p for p in new.param_names if p not in old.param_names]
    parts = [str(b) for b in breakages(old, new)]
    if added:
        parts.append("added " + ", ".join(f"`{p}`" for p in added))
    if removed and not parts:
        parts.append("removed " + ", ".join(f"`{p}`" for p in removed))
    if not parts:
        parts.append("annotations or return type changed")
    return "; ".join(parts)
