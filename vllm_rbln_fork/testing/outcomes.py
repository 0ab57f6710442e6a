"""Outcome tables of an upstream test run, and their comparison: pure functions and data.

``parse_junit`` reads pytest's JUnit XML into node id -> outcome; ``compare`` sets the
unpatched and patched tables against the expected differences; ``render_report`` says it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import ForkError

SUITE = "tests/v1/core"
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "absent")


class ConformanceError(ForkError):
    """The conformance run could not be set up or its inputs are malformed."""


@dataclass(frozen=True)
class ExpectedDifference:
    """One upstream test whose outcome the series changes, and the patch that changes it."""

    test: str  # pytest node id, relative to the tree: tests/v1/core/test_x.py::test_y[p]
    unpatched: str
    patched: str
    patch: str  # file name in patches/
    why: str
    pins: tuple[str, ...] = ()  # empty: every pin


@dataclass(frozen=True)
class CannotRun:
    """Upstream tests deselected on both sides, because this machine cannot run them."""

    test: str  # node id or node id prefix (a file)
    reason: str


@dataclass(frozen=True)
class Difference:
    test: str
    unpatched: str
    patched: str
    expected: ExpectedDifference | None

    @property
    def listed(self) -> bool:
        return self.expected is not None


@dataclass(frozen=True)
class Problem:
    """Why a comparison fails: ``unlisted``, ``stale`` or ``mismatch``."""

    kind: Literal["unlisted", "stale", "mismatch"]
    test: str
    text: str


@dataclass(frozen=True)
class Comparison:
    differences: tuple[Difference, ...]
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class SideRun:
    """One side's outcomes, and how they were obtained."""

    label: str
    outcomes: Mapping[str, str]
    command: tuple[str, ...]
    seconds: float
    cached: bool
    log_file: Path | None = None

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.outcomes.values()))


@dataclass(frozen=True)
class ConformanceReport:
    pin: str
    unpatched: SideRun
    patched: SideRun
    comparison: Comparison
    cannot_run: tuple[CannotRun, ...]
    series_changed_tests: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.comparison.ok

    @property
    def collected(self) -> int:
        return len(set(self.unpatched.outcomes) | set(self.patched.outcomes))


# ---------------------------------------------------------------------------------------------
# The comparison: pure functions over outcome tables.


def compare(
    unpatched: Mapping[str, str],
    patched: Mapping[str, str],
    expected: Sequence[ExpectedDifference],
) -> Comparison:
    """Compare two outcome tables (node id -> outcome) against the expected differences.

    A test missing from one side has the outcome ``absent``. Fails on a difference that is
    not listed (``unlisted``), on a listed difference that no longer happens (``stale``), and
    on a listed difference whose outcomes are not the listed ones (``mismatch``).
    """
    listed: dict[str, ExpectedDifference] = {}
    for item in expected:
        if item.test in listed:
            raise ConformanceError(f"the expected differences list {item.test} twice; keep one entry.")
        listed[item.test] = item
    differences: list[Difference] = []
    problems: list[Problem] = []
    for test in sorted(set(unpatched) | set(patched) | set(listed)):
        before = unpatched.get(test, "absent")
        after = patched.get(test, "absent")
        entry = listed.get(test)
        if before == after:
            if entry is not None:
                problems.append(
                    Problem(
                        "stale",
                        test,
                        f"listed as {entry.unpatched} -> {entry.patched} ({entry.patch}), "
                        f"but it is {before} on both sides: remove it from the expected differences",
                    )
                )
            continue
        differences.append(Difference(test, before, after, entry))
        if entry is None:
            problems.append(
                Problem(
                    "unlisted",
                    test,
                    f"{before} unpatched, {after} patched, and not listed: fix the series, or list "
                    "it with the patch responsible and why",
                )
            )
        elif (entry.unpatched, entry.patched) != (before, after):
            problems.append(
                Problem(
                    "mismatch",
                    test,
                    f"listed as {entry.unpatched} -> {entry.patched} ({entry.patch}), "
                    f"but it is {before} -> {after}",
                )
            )
    return Comparison(tuple(differences), tuple(problems))


# ---------------------------------------------------------------------------------------------
# Reading pytest's JUnit XML.

_SEVERITY = {o: i for i, o in enumerate(("passed", "xpassed", "skipped", "xfailed", "failed", "error"))}


def parse_junit(xml_text: str) -> dict[str, str]:
    """Node id -> outcome, from a ``junit_family=xunit1`` report (it carries each test's file).

    A test reported twice (a failure and a teardown error) keeps its worse outcome; a module
    that fails to import is reported under its file path with ``error``.
    """
    root = ET.fromstring(xml_text)
    outcomes: dict[str, str] = {}
    for case in root.iter("testcase"):
        node = _node_id(case)
        outcome = _outcome(case)
        if node in outcomes and _SEVERITY[outcomes[node]] >= _SEVERITY[outcome]:
            continue
        outcomes[node] = outcome
    return outcomes


def _node_id(case: ET.Element) -> str:
    name = case.get("name", "")
    classname = case.get("classname", "")
    file = case.get("file") or ""
    if not classname:  # a module that failed to collect: name is its dotted path
        return file or name.replace(".", "/") + ".py"
    module = file.removesuffix(".py").replace("/", ".")
    if not file or not classname.startswith(module):
        raise ConformanceError(
            f"the JUnit report has no file for {classname}::{name}; run pytest with -o junit_family=xunit1."
        )
    classes = [c for c in classname[len(module) :].split(".") if c]
    return "::".join([file, *classes, name])


def _outcome(case: ET.Element) -> str:
    if case.find("error") is not None:
        return "error"
    if case.find("failure") is not None:
        return "failed"
    skipped = case.find("skipped")
    if skipped is not None:
        return "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
    return "passed"


# ---------------------------------------------------------------------------------------------
# Rendering.


def _counts_line(run: SideRun) -> str:
    counts = run.counts()
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts.get(o)]
    how = "cached" if run.cached else f"{run.seconds:.0f} s"
    return f"{run.label:>9}: {sum(counts.values())} tests, {', '.join(parts)} ({how})"


def render_report(report: ConformanceReport) -> str:
    """The report as plain text: counts, each difference with its reason, and what fails."""
    lines = [
        f"upstream conformance, vLLM {report.pin}: {SUITE}, {report.collected} tests "
        f"({len(report.cannot_run)} entries deselected as cannot-run)",
        _counts_line(report.unpatched),
        _counts_line(report.patched),
    ]
    listed = [d for d in report.comparison.differences if d.expected is not None]
    if listed:
        lines.append(f"listed differences ({len(listed)}):")
        for d in listed:
            assert d.expected is not None
            lines.append(f"  {d.test}: {d.unpatched} -> {d.patched} [{d.expected.patch}] {d.expected.why}")
    if report.series_changed_tests:
        lines.append("suite files the series changes (not run): " + ", ".join(report.series_changed_tests))
    if report.comparison.problems:
        lines.append(f"FAILED: {len(report.comparison.problems)} problem(s):")
        lines.extend(f"  {p.kind}: {p.test}: {p.text}" for p in report.comparison.problems)
        for run in (report.unpatched, report.patched):
            if run.log_file is not None:
                lines.append(f"  {run.label} pytest output: {run.log_file}")
    else:
        lines.append("OK: every difference is listed and every listed difference happens.")
    return "\n".join(lines)
