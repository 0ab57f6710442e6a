"""The review's data: what happened to each patch when the series moved to a new pin."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

from ..pins import Pin
from ..series import Patch


class Status(StrEnum):
    """What carrying a patch onto the new pin did to it (see ``analysis``)."""

    CLEAN = "clean"  # the same diff
    CONTEXT_DRIFT = "context drift"  # the same +/- lines, other context or line numbers
    MERGED = "merged"  # the merge changed its own lines
    CONFLICT = "conflict"
    UPSTREAMED = "upstreamed"  # nothing left to apply
    DROPPED = "dropped"  # by its Applied-Upstream trailer


STATUSES = tuple(Status)


class Change(StrEnum):
    """What upstream did to a function or class a patch relies on."""

    UNCHANGED = "unchanged"
    BODY_CHANGED = "body changed"
    SIGNATURE_CHANGED = "signature changed"
    REMOVED = "removed upstream"
    CLASS_HEADER_CHANGED = "class header changed"
    MODULE_CODE_CHANGED = "module-level code changed"


# git range-diff's marks: = the same diff, ! changed, < only in the old series, > only in the new.
Mark = Literal["=", "!", "<", ">"]


class Relation(StrEnum):
    """How a patch relies on an upstream function or class."""

    CHANGED = "changed by the patch"
    CALLED = "called by the patch"
    OVERRIDDEN = "overridden by the patch"


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
    relation: Relation
    change: Change
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
    status: Status
    reason: str = ""
    old_diff: str = ""
    new_diff: str = ""
    mark: Mark = "="
    mark_note: str = ""
    own_interdiff: str = ""  # how the patch's own +/- lines changed (merged)
    interdiff: str = ""  # how the whole diff changed (context drift included)
    conflicts: tuple[ConflictHunk, ...] = ()
    # A conflict that follows only from these earlier patches not being carried (they
    # conflicted and were left out): no file of it changed upstream. Empty: a conflict with
    # what upstream changed, the kind that needs a resolution of its own.
    knock_on_from: tuple[str, ...] = ()
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
        return self.status is Status.CONFLICT or any(s.breaking for s in self.symbols)


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
    reused: tuple[str, ...] = ()  # conflicted files resolved from recorded resolutions (rerere/)
    carried_all: bool = False  # the conflict tree carried every patch (all conflicts reused)
    unexported: tuple[str, ...] = ()  # records replayed from this cache only, not from rerere/

    @property
    def counts(self) -> dict[Status, int]:
        return {s: sum(1 for p in self.patches if p.status == s) for s in STATUSES}

    @property
    def conflict_kinds(self) -> str:
        """'N with upstream, M knock-on' for the conflicts, or ''."""
        conflicts = [p for p in self.patches if p.status is Status.CONFLICT]
        knock_on = sum(1 for p in conflicts if p.knock_on_from)
        if not conflicts:
            return ""
        return f"{len(conflicts) - knock_on} with upstream, {knock_on} knock-on"

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
        conflicts = any(p.status is Status.CONFLICT for p in self.patches)
        if conflicts and self.conflict_tree is not None:
            return (
                *(
                    ()
                    if self.carried_all
                    else (
                        f"cd {self.conflict_tree}  # resolve, git add",
                        f"python build.py continue --dir {self.conflict_tree}",
                    )
                ),
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
