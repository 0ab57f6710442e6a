"""Helpers shared by the tiers (the suite has no packages: conftests put this folder on sys.path).

``recorder``: the one fixture that records the tool's progress events; conftests import it.
``assert_well_formed_html``: a check that fails on a page whose tags do not nest.
"""

from __future__ import annotations

import html.parser

import pytest

from vllm_rbln_fork import log

VOID = frozenset(
    "area base br col embed hr img input link meta source track wbr".split()
)  # elements with no end tag (HTML Living Standard)


@pytest.fixture
def recorder() -> log.RecordingReporter:
    """Every log event of the test, to assert on."""
    reporter = log.RecordingReporter()
    log.set_reporter(reporter)
    return reporter


class _Nesting(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, tuple[int, int]]] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.open.append((tag, self.getpos()))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:  # <br/> is a void element written the XML way; <div/> opens a div
            self.open.append((tag, self.getpos()))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            self.problems.append(f"</{tag}> at {self.getpos()}: a void element has no end tag")
        elif not self.open or self.open[-1][0] != tag:
            expected = f"</{self.open[-1][0]}>" if self.open else "nothing"
            self.problems.append(f"</{tag}> at {self.getpos()}, expected {expected}")
        else:
            self.open.pop()


def assert_well_formed_html(text: str) -> None:
    """Every non-void element is closed, in order, and the page starts with a doctype."""
    checker = _Nesting()
    checker.feed(text)
    checker.close()
    problems = checker.problems + [f"<{tag}> at {pos} is never closed" for tag, pos in checker.open]
    assert text.lstrip().lower().startswith("<!doctype html>"), "no <!DOCTYPE html>"
    assert not problems, "\n".join(problems)
