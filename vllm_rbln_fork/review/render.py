"""The review as Markdown (a pull-request comment) and as one self-contained HTML page
with side-by-side diffs. Data in, text out; ``write_reports`` puts both in a folder."""

from __future__ import annotations

import difflib
import html
import re
from collections.abc import Callable
from pathlib import Path

from ..files import write_atomic
from .model import Change, PatchReview, Review, Status, SymbolChange

ICONS = {
    Status.CLEAN: "✅",
    Status.CONTEXT_DRIFT: "🟢",
    Status.MERGED: "🟡",
    Status.CONFLICT: "❌",
    Status.UPSTREAMED: "⬆️",
    Status.DROPPED: "➖",
}
MD_DIFF_LINES = 80  # per block in the Markdown; the HTML page has everything


def write_reports(review: Review, folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    md, page = folder / "review.md", folder / "review.html"
    write_atomic(md, markdown(review))
    write_atomic(page, html_page(review))
    return md, page


def summary_lines(review: Review) -> list[str]:
    """The few lines a terminal shows."""
    counts = ", ".join(f"{n} {s}" for s, n in review.counts.items() if n)
    kinds = f"; conflicts: {review.conflict_kinds}" if review.conflict_kinds else ""
    lines = [f"vllm {review.old_pin} -> {review.new_pin}: {review.verdict} ({counts}{kinds})"]
    for p in review.patches:
        flags = f"  [{len(p.flags)} flagged]" if p.flags else ""
        lines.append(f"  {p.mark} {p.status:<13} {p.name}{flags}{_knock_on(p)}")
    return lines


def _knock_on(p: PatchReview) -> str:
    if not p.knock_on_from:
        return ""
    return f"  (knock-on: follows from {', '.join(p.knock_on_from)} not being carried)"


def _knock_on_sentence(p: PatchReview, code: Callable[[str], str]) -> str:
    """The reports' paragraph on a knock-on conflict, ``code`` marking up a patch name."""
    return (
        "no file of it changed upstream; it follows from "
        + ", ".join(code(n) for n in p.knock_on_from)
        + " not being carried. Resolving that conflict usually resolves this one."
    )


# --- Markdown ---------------------------------------------------------------------------


def _fence(text: str, lang: str = "diff", limit: int = MD_DIFF_LINES) -> str:
    lines = text.rstrip("\n").splitlines()
    more = len(lines) - limit
    body = "\n".join(lines[:limit]) + (f"\n… {more} more lines in the HTML report" if more > 0 else "")
    fence = "````" if "```" in body else "```"
    return f"{fence}{lang}\n{body}\n{fence}"


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def _symbol_line(s: SymbolChange) -> str:
    flag = "⚠️ " if s.flagged else ""
    text = f"- {flag}`{s.qualname}` ({s.path}), {s.relation}: **{s.change}**"
    if s.note:
        text += f" — {s.note}"
    if s.change is Change.SIGNATURE_CHANGED:
        text += f"\n  `{s.old_signature}` → `{s.new_signature}`"
    return text


def markdown(review: Review) -> str:
    out = [
        f"## vLLM pin review: {review.old_pin} → {review.new_pin}: **{review.verdict}**",
        "",
        "| status | patches |",
        "|---|---|",
        *(f"| {ICONS[s]} {s} | {n} |" for s, n in review.counts.items()),
        "",
        *([f"Conflicts: **{review.conflict_kinds}**.", ""] if review.conflict_kinds else []),
        "**Next:**",
        "",
        "```sh\n" + "\n".join(review.next_commands) + "\n```",
    ]
    if review.instructions:
        out += ["", review.instructions]
    if review.written:
        out += ["", "`--write` changed: " + ", ".join(f"`{w}`" for w in review.written)]
    elif review.wrote:
        out += ["", "`--write`: patches/ and series were already up to date."]
    out += [
        "",
        "| # | patch | origin | status | range-diff | upstream changes under it |",
        "|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(review.patches, 1):
        under = f"{len(p.symbols)} changed" + (f", **{len(p.flags)} flagged**" if p.flags else "")
        origin = p.patch.trailer("Origin") or ""
        out.append(
            f"| {i} | `{p.name}` | {origin} | {ICONS[p.status]} {p.status} "
            f"| `{p.mark}` {p.mark_note} | {under} |"
        )
    for i, p in enumerate(review.patches, 1):
        out += ["", *_md_patch(i, p, review)]
    out += ["", "### Old series against new (range-diff)", "", _md_range_diff(review)]
    if review.range_diff:
        out += [
            "",
            _details(
                "git range-diff (for reference; it does not tell drift from change)",
                _fence(review.range_diff, ""),
            ),
        ]
    return "\n".join(out) + "\n"


def _md_patch(i: int, p: PatchReview, review: Review) -> list[str]:
    out = [f"### {i}. {p.patch.subject} — {ICONS[p.status]} {p.status}", "", f"`patches/{p.name}`"]
    if p.reason:
        out += ["", p.reason]
    if p.knock_on_from:
        out += ["", "**Knock-on conflict**: " + _knock_on_sentence(p, lambda n: f"`{n}`")]
    for note in p.notes:
        out += ["", f"> {note}"]
    for h in p.conflicts:
        out += [
            "",
            f"**Conflict** in `{h.path}` at line {h.line}:",
            "",
            f"ours (upstream {review.new_pin}):",
            _fence(h.ours, "python"),
            f"base ({review.old_pin}):",
            _fence(h.base, "python"),
            "theirs (the patch):",
            _fence(h.theirs, "python"),
        ]
    if p.files:
        files = ", ".join(f"`{path}` ({n} lines changed upstream)" for path, n in p.files)
        out += ["", f"Files: {files}"]
    if p.symbols:
        out += ["", f"**What upstream changed under it** ({review.old_pin} → {review.new_pin}):", ""]
        out += [_symbol_line(s) for s in p.symbols]
        diffs = "\n".join(s.diff(str(review.old_pin), str(review.new_pin)) for s in p.symbols)
        out += ["", _details("upstream diff of these functions and classes", _fence(diffs))]
    elif p.status not in (Status.DROPPED, Status.UPSTREAMED):
        out += ["", "Upstream changed nothing the patch edits, calls or overrides."]
    if p.unchanged:
        out += ["", "Unchanged upstream: " + ", ".join(f"`{u}`" for u in p.unchanged)]
    for path, names in p.elsewhere:
        shown = ", ".join(f"`{n}`" for n in names[:12]) + (
            f" and {len(names) - 12} more" if len(names) > 12 else ""
        )
        out += ["", f"Elsewhere in `{path}` (not under this patch) upstream changed: {shown}"]
    if p.own_interdiff:
        out += ["", _details("how the patch's own lines changed", _fence(p.own_interdiff))]
    return out


def _md_range_diff(review: Review) -> str:
    return "```\n" + _range_diff_table(review) + "\n```"


def _range_diff_table(review: Review) -> str:
    """One line a patch: old index and name, its mark, new index and name, the note."""
    lines = []
    width = max((len(p.name) for p in review.patches), default=0)
    new_index = 0
    for i, p in enumerate(review.patches, 1):
        if p.mark == "<":
            right = "-:" + " " * (width + 1)
        else:
            new_index += 1
            right = f"{new_index}: {p.name:<{width}}"
        lines.append(f"{i}: {p.name:<{width}} {p.mark} {right}  {p.mark_note}")
    return "\n".join(lines)


# --- HTML -------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #1f2328; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
table.summary { border-collapse: collapse; margin: .5em 0; }
table.summary td, table.summary th { border: 1px solid #d0d7de; padding: .25em .6em; text-align: left; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; font-size: 12px; }
.verdict-ready { color: #1a7f37; } .verdict-needs { color: #cf222e; }
.flag { color: #9a6700; font-weight: bold; }
table.three { width: 100%; table-layout: fixed; border-collapse: collapse; }
table.three td { vertical-align: top; width: 33%; padding: 0 .3em; }
table.diff { font-family: ui-monospace, monospace; font-size: 12px; border: 1px solid #d0d7de;
  width: 100%; table-layout: fixed; }
table.diff td { white-space: pre-wrap; word-break: break-all; }
.diff_header { background-color: #e0e0e0; width: 3em; }
td.diff_header { text-align: right; }
.diff_next { background-color: #c0c0c0; width: 1em; }
.diff_add { background-color: #aaffaa; } .diff_chg { background-color: #ffff77; }
.diff_sub { background-color: #ffaaaa; }
details { margin: .4em 0; } summary { cursor: pointer; }
"""


def _side_by_side(old: str, new: str, old_label: str, new_label: str) -> str:
    a, b = old.splitlines(), new.splitlines()
    if a == b:
        return "<p><em>identical</em></p>"
    if len(a) + len(b) > 6000:  # HtmlDiff is slow on huge inputs: a unified diff instead
        text = "\n".join(difflib.unified_diff(a, b, old_label, new_label, lineterm=""))
        return f"<pre>{html.escape(text)}</pre>"
    table = difflib.HtmlDiff(tabsize=4).make_table(
        a, b, html.escape(old_label), html.escape(new_label), context=True, numlines=3
    )
    return table


# HtmlDiff numbers each table's anchors from a process-wide counter (from<N>_, to<N>_);
# renumbered per page, in order of appearance, the same review gives the same bytes.
_ANCHOR = re.compile(r'((?:id|href)="#?(?:difflib_chg_)?(?:from|to))(\d+)_')


def _stable_anchors(page: str) -> str:
    numbers: dict[str, int] = {}

    def renumber(match: re.Match[str]) -> str:
        number = numbers.setdefault(match[2], len(numbers))
        return f"{match[1]}{number}_"

    return _ANCHOR.sub(renumber, page)


def html_page(review: Review) -> str:
    e = html.escape
    verdict_class = "verdict-ready" if review.ready else "verdict-needs"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>vLLM pin review {e(str(review.old_pin))} → {e(str(review.new_pin))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>vLLM pin review: {e(str(review.old_pin))} → {e(str(review.new_pin))}: "
        f'<span class="{verdict_class}">{e(review.verdict)}</span></h1>',
        '<table class="summary"><tr><th>status</th><th>patches</th></tr>',
        *(f"<tr><td>{ICONS[s]} {e(s)}</td><td>{n}</td></tr>" for s, n in review.counts.items()),
        "</table>",
        "<p><strong>Next:</strong></p><pre>" + e("\n".join(review.next_commands)) + "</pre>",
    ]
    if review.instructions:
        parts.append(f"<p>{e(review.instructions)}</p>")
    if review.written:
        parts.append("<p><code>--write</code> changed: " + ", ".join(e(w) for w in review.written) + "</p>")
    parts.append(
        '<table class="summary"><tr><th>#</th><th>patch</th><th>origin</th><th>status</th>'
        "<th>range-diff</th><th>flags</th></tr>"
    )
    for i, p in enumerate(review.patches, 1):
        parts.append(
            f'<tr><td>{i}</td><td><a href="#p{i}">{e(p.name)}</a></td>'
            f"<td>{e(p.patch.trailer('Origin') or '')}</td><td>{ICONS[p.status]} {e(p.status)}</td>"
            f"<td><code>{e(p.mark)}</code> {e(p.mark_note)}</td><td>{len(p.flags) or ''}</td></tr>"
        )
    parts.append("</table>")
    for i, p in enumerate(review.patches, 1):
        parts += _html_patch(i, p, review)
    parts.append("<h2>Old series against new (range-diff)</h2>")
    parts.append(f"<pre>{e(_range_diff_table(review))}</pre>")
    if review.range_diff:
        parts.append(f"<details><summary>git range-diff</summary><pre>{e(review.range_diff)}</pre></details>")
    parts.append("</body></html>")
    return _stable_anchors("\n".join(parts) + "\n")


def _html_patch(i: int, p: PatchReview, review: Review) -> list[str]:
    e = html.escape
    old, new = str(review.old_pin), str(review.new_pin)
    parts = [
        f'<h2 id="p{i}">{i}. {e(p.patch.subject)}: {ICONS[p.status]} {e(p.status)}</h2>',
        f"<p><code>patches/{e(p.name)}</code> · {e(p.patch.trailer('Origin') or '')}</p>",
    ]
    if p.reason:
        parts.append(f"<p>{e(p.reason)}</p>")
    if p.knock_on_from:
        sentence = _knock_on_sentence(p, lambda n: f"<code>{e(n)}</code>")
        parts.append(f"<p><strong>Knock-on conflict</strong>: {sentence}</p>")
    parts += [f"<blockquote>{e(n)}</blockquote>" for n in p.notes]
    for h in p.conflicts:
        parts.append(f"<h3>Conflict in <code>{e(h.path)}</code> at line {h.line}</h3>")
        parts.append(
            '<table class="three"><tr>'
            f"<th>ours (upstream {e(new)})</th><th>base ({e(old)})</th><th>theirs (the patch)</th></tr><tr>"
            + "".join(f"<td><pre>{e(x)}</pre></td>" for x in (h.ours, h.base, h.theirs))
            + "</tr></table>"
        )
    if p.files:
        parts.append(
            "<p>Files: "
            + ", ".join(f"<code>{e(f)}</code> ({n} lines changed upstream)" for f, n in p.files)
            + "</p>"
        )
    if p.symbols:
        parts.append(f"<h3>What upstream changed under it ({e(old)} → {e(new)})</h3>")
        for s in p.symbols:
            flag = '<span class="flag">⚠ </span>' if s.flagged else ""
            head = f"{flag}<code>{e(s.qualname)}</code> ({e(s.path)}), {e(s.relation)}: <b>{e(s.change)}</b>"
            if s.note:
                head += f" — {e(s.note)}"
            body = ""
            if s.change is Change.SIGNATURE_CHANGED:
                body += f"<pre>{e(s.old_signature)}\n→ {e(s.new_signature)}</pre>"
            body += _side_by_side(s.old_text, s.new_text, f"{s.qualname} @ {old}", f"@ {new}")
            parts.append(f"<details{' open' if s.flagged else ''}><summary>{head}</summary>{body}</details>")
    if p.unchanged:
        parts.append(
            "<p>Unchanged upstream: " + ", ".join(f"<code>{e(u)}</code>" for u in p.unchanged) + "</p>"
        )
    for path, names in p.elsewhere:
        parts.append(
            f"<p>Elsewhere in <code>{e(path)}</code> (not under this patch) upstream changed: "
            + ", ".join(f"<code>{e(n)}</code>" for n in names)
            + "</p>"
        )
    if p.new_diff and p.status is not Status.CLEAN:
        parts.append(
            f"<details{' open' if p.status is Status.MERGED else ''}><summary>the patch at {e(old)} "
            f"against at {e(new)} ({e(p.mark_note)})</summary>"
            + _side_by_side(p.old_diff, p.new_diff, f"@ {old}", f"@ {new}")
            + "</details>"
        )
    elif p.old_diff:
        parts.append(f"<details><summary>the patch</summary><pre>{e(p.old_diff)}</pre></details>")
    return parts
