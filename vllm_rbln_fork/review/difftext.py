"""Unified diffs (as ``git diff`` writes them) as data: files, hunks, a patch's own lines.

A patch's *own lines* are its ``+``/``-`` lines, file by file, in order. Two versions of
a patch with the same own lines differ only in context and line numbers (drift).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[str, ...]  # " x", "+x", "-x" (and "\\ No newline ...")

    def added(self) -> set[int]:
        return {n for n, sign in self._numbered("+") if sign}

    def removed(self) -> set[int]:
        return {n for n, sign in self._numbered("-") if sign}

    def _numbered(self, which: str) -> list[tuple[int, bool]]:
        old, new, out = self.old_start, self.new_start, []
        for line in self.lines:
            sign = line[:1]
            if sign == " ":
                old, new = old + 1, new + 1
            elif sign == "-":
                out.append((old, which == "-"))
                old += 1
            elif sign == "+":
                out.append((new, which == "+"))
                new += 1
        return out

    def anchors(self) -> set[int]:
        """Old-side lines around each pure insertion (so the enclosing code can be named)."""
        old, points, pending = self.old_start, set(), False
        for line in self.lines:
            sign = line[:1]
            if sign == "+":
                pending = True
                continue
            if pending:
                points |= {max(old - 1, 1), old}
                pending = False
            if sign in (" ", "-"):
                old += 1
        if pending:
            points.add(max(old - 1, 1))
        return points


@dataclass(frozen=True)
class FileDiff:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    def own_lines(self) -> tuple[str, ...]:
        return tuple(line for h in self.hunks for line in h.lines if line[:1] in "+-")

    def added(self) -> set[int]:
        return set().union(*(h.added() for h in self.hunks)) if self.hunks else set()

    def removed(self) -> set[int]:
        return set().union(*(h.removed() for h in self.hunks)) if self.hunks else set()

    def anchors(self) -> set[int]:
        return set().union(*(h.anchors() for h in self.hunks)) if self.hunks else set()


def parse_diff(text: str) -> list[FileDiff]:
    files: list[FileDiff] = []
    old: str | None = None
    new: str | None = None
    hunks: list[Hunk] = []
    current: list[str] | None = None
    header: tuple[int, int, int, int] | None = None
    started = False

    def close_hunk() -> None:
        nonlocal current, header
        if current is not None and header is not None:
            hunks.append(Hunk(*header, tuple(current)))
        current, header = None, None

    def close_file() -> None:
        nonlocal hunks
        close_hunk()
        if started:
            files.append(FileDiff(old, new, tuple(hunks)))
        hunks = []

    for line in text.splitlines():
        if line.startswith("diff --git "):
            close_file()
            started = True
            parts = line.split(" ")
            old = parts[2][2:] if len(parts) > 3 else None
            new = parts[3][2:] if len(parts) > 3 else None
            continue
        if current is None:
            if line.startswith("--- "):
                old = None if line[4:] == "/dev/null" else line[6:]
            elif line.startswith("+++ "):
                new = None if line[4:] == "/dev/null" else line[6:]
            elif line.startswith("new file mode"):
                old = None
            elif line.startswith("deleted file mode"):
                new = None
        if m := HUNK_HEADER.match(line):
            close_hunk()
            a, b, c, d = m.group(1), m.group(2), m.group(3), m.group(4)
            header = (int(a), int(b) if b is not None else 1, int(c), int(d) if d is not None else 1)
            current = []
        elif current is not None and line[:1] in (" ", "+", "-", "\\"):
            current.append(line)
    close_file()
    return files


def normalized(text: str) -> str:
    """The diff without its ``index`` lines (blob ids move with any upstream change to a file)."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("index ")).strip()


def own_lines(files: list[FileDiff]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((f.path, f.own_lines()) for f in files)
