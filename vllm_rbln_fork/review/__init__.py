"""The upstream-diff review (``--pin <new> --review``): carry analysis, Python AST, diff text, render."""

from __future__ import annotations

from .analysis import review
from .carry import contained_backports
from .model import STATUSES, PatchReview, Review, SymbolChange
from .render import html_page, markdown, summary_lines, write_reports

__all__ = [
    "STATUSES",
    "PatchReview",
    "Review",
    "SymbolChange",
    "contained_backports",
    "html_page",
    "markdown",
    "review",
    "summary_lines",
    "write_reports",
]
