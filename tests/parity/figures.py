"""The parity tier's figures, verdicts and table, from the two sides' traces (docs/parity.md).

Pure functions over the JSON ``drive.py`` prints: no vLLM here (run in the tool env by the tier
and by bench/bench_parity.py).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from workloads import BY_NAME, Figure, Workload

HERE = Path(__file__).resolve().parent
DIFFERENCES = HERE / "differences.toml"
CANNOT_RUN = HERE / "cannot-run.toml"
SIDE_NAMES = ("ours", "vllm-rbln")


@dataclass(frozen=True)
class Figures:
    """One side's figures for one workload."""

    requests: int
    finished: int
    steps: int
    prefill_steps: int
    decode_steps: int
    empty_steps: int
    mixed_steps: int
    preemptions: int
    reported_preemptions: int
    ttft: float | None  # the watched request's, else the mean over requests with a first token
    steps_per_token: float | None
    hit_tokens: float | None  # per admission
    leaked: int
    copies: int  # sub-block copies handed to the runner

    def value(self, figure: Figure) -> float | None:
        return {
            Figure.FINISHED: self.finished,
            Figure.STEPS: self.steps,
            Figure.EMPTY_STEPS: self.empty_steps,
            Figure.PREEMPTIONS: self.preemptions,
            Figure.HIDDEN_PREEMPTIONS: self.preemptions - self.reported_preemptions,
            Figure.TTFT: self.ttft,
            Figure.STEPS_PER_TOKEN: self.steps_per_token,
            Figure.HIT_TOKENS: self.hit_tokens,
            Figure.LEAKED: self.leaked,
        }[figure]


def first_tokens(trace: Mapping[str, Any]) -> dict[str, int]:
    """Each request's TTFT in steps: from the step it arrived before to the step whose batch
    sampled its first token (1: its first step did)."""
    result: dict[str, int] = {}
    for index, step in enumerate(trace["steps"]):
        for req_id in step["sampled"]:
            if req_id not in result:
                result[req_id] = index - trace["arrived"][req_id] + 1
    return result


def admissions(trace: Mapping[str, Any]) -> list[int]:
    """The tokens already computed when each admission (first schedule after arrival or after
    a preemption) was first scheduled: its prefix-cache and connector hit."""
    hits: list[int] = []
    running: set[str] = set()
    for step in trace["steps"]:
        for req_id in step["tokens"]:
            if req_id not in running:
                hits.append(step["computed_before"][req_id])
                running.add(req_id)
        running -= set(step["preempted"])
    return hits


def figures_of(trace: Mapping[str, Any], workload: Workload) -> Figures:
    steps = trace["steps"]
    ttfts = first_tokens(trace)
    if workload.watch is not None:
        ttft: float | None = ttfts.get(workload.watch)
    else:
        ttft = sum(ttfts.values()) / len(ttfts) if ttfts else None
    output_tokens = sum(trace["max_tokens"][r] for r in trace["finished"])
    hits = admissions(trace)
    return Figures(
        requests=len(workload.arrivals),
        finished=len(trace["finished"]),
        steps=len(steps),
        prefill_steps=sum(1 for s in steps if s["prefill"] and not s["decode"]),
        decode_steps=sum(1 for s in steps if s["decode"] and not s["prefill"]),
        empty_steps=sum(1 for s in steps if not s["tokens"]),
        mixed_steps=sum(1 for s in steps if s["decode"] and s["prefill"]),
        preemptions=sum(len(s["preempted"]) for s in steps),
        reported_preemptions=trace["reported_preemptions"],
        ttft=ttft,
        steps_per_token=len(steps) / output_tokens if output_tokens else None,
        hit_tokens=sum(hits) / len(hits) if hits else None,
        # Not free, and held by no request (an unfinished one still holds its own): lost.
        leaked=trace["blocks_not_free"] - trace["blocks_held_by_requests"],
        copies=sum(s["copies"] for s in steps),
    )


def first_divergence(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> int | None:
    """The first step whose scheduled tokens differ (a side that stopped has none)."""
    a, b = ours["steps"], theirs["steps"]
    for index in range(max(len(a), len(b))):
        left = a[index]["tokens"] if index < len(a) else None
        right = b[index]["tokens"] if index < len(b) else None
        if left != right:
            return index
    return None


def describe_step(trace: Mapping[str, Any], index: int) -> str:
    if index >= len(trace["steps"]):
        return "(done)"
    step = trace["steps"][index]
    if not step["tokens"]:
        return "empty"
    kind = "mixed" if step["prefill"] and step["decode"] else "prefill" if step["prefill"] else "decode"
    tokens = " ".join(f"{r}:{n}" for r, n in step["tokens"].items())
    preempted = f" preempted {','.join(step['preempted'])}" if step["preempted"] else ""
    return f"{kind} {tokens}{preempted}"


# ---------------------------------------------------------------------------------------------
# The verdict: ours matches or beats vllm-rbln on each judged figure, else a listed difference.


class ParityError(Exception):
    """differences.toml or cannot-run.toml is malformed."""


class Verdict(StrEnum):
    SAME_OR_BETTER = "same or better"
    LISTED = "behind, listed"
    BEHIND = "behind, not listed"  # fails the tier
    FURTHER_BEHIND = "listed, but further behind than listed"  # fails the tier
    STALE = "listed, but no longer behind"  # fails the tier: delete the entry


@dataclass(frozen=True)
class Difference:
    workload: str
    figure: Figure
    why: str
    ours: float  # ours' value when listed: ours worse than it fails (further behind)
    pins: tuple[str, ...] = ()


@dataclass(frozen=True)
class Judgement:
    workload: str
    figure: Figure
    ours: float | None
    theirs: float | None
    verdict: Verdict
    why: str = ""

    @property
    def fails(self) -> bool:
        return self.verdict in (Verdict.BEHIND, Verdict.FURTHER_BEHIND, Verdict.STALE)


def load_differences(path: Path, pin: str) -> tuple[Difference, ...]:
    """``[[difference]]`` entries (workload, figure, why, ours, optional pins) for ``pin``; each
    must name a workload of ``WORKLOADS`` and one of the figures it judges, and give ``ours``,
    ours' value when it was listed."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ParityError(f"cannot read {path}: {error}. Restore it from git.") from None
    result = []
    seen: set[tuple[str, str]] = set()
    for i, entry in enumerate(data.get("difference", [])):
        where = f"{path}: entry {i + 1}"
        workload, figure, why = entry.get("workload"), entry.get("figure"), entry.get("why")
        if workload not in BY_NAME:
            raise ParityError(
                f"{where} names workload {workload!r}, which is not in tests/parity/workloads.py."
            )
        judged = [str(f) for f in BY_NAME[workload].judged]
        if figure not in judged:
            raise ParityError(f"{where}: {workload} judges {', '.join(judged)}, not {figure!r}.")
        if not isinstance(why, str) or not why.strip():
            raise ParityError(f"{where} needs a non-empty 'why': the mechanism that puts ours behind.")
        ours = entry.get("ours")
        if isinstance(ours, bool) or not isinstance(ours, int | float):
            raise ParityError(
                f"{where} needs 'ours', a number: ours' value when listed (the tier's report shows "
                "it); ours worse than it fails, so a listed difference cannot grow unseen."
            )
        pins = entry.get("pins", [])
        if not isinstance(pins, list) or not all(isinstance(p, str) for p in pins):
            raise ParityError(f"{where}: 'pins' must be a list of versions.")
        if (workload, figure) in seen:
            raise ParityError(f"{where} lists {workload} / {figure} a second time.")
        seen.add((workload, figure))
        if not pins or pin in pins:
            result.append(
                Difference(workload, Figure(figure), " ".join(why.split()), float(ours), tuple(pins))
            )
    return tuple(result)


def load_cannot_run(path: Path) -> tuple[tuple[str, str], ...]:
    """``[[item]]`` entries: ``what`` the harness cannot show, and ``why``."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ParityError(f"cannot read {path}: {error}. Restore it from git.") from None
    items = []
    for i, entry in enumerate(data.get("item", [])):
        what, why = entry.get("what"), entry.get("why")
        if not (isinstance(what, str) and what.strip() and isinstance(why, str) and why.strip()):
            raise ParityError(f"{path}: item {i + 1} needs a non-empty 'what' and 'why'.")
        items.append((" ".join(what.split()), " ".join(why.split())))
    return tuple(items)


def _worse(figure: Figure, ours: float | None, theirs: float | None) -> bool:
    """Is ours worse? A missing figure (no first token, nothing finished) is the worst."""
    sign = -1.0 if figure.higher_is_better else 1.0
    left = math.inf if ours is None else sign * ours
    right = math.inf if theirs is None else sign * theirs
    return left > right + 1e-9


def judge(
    workload: Workload, ours: Figures, theirs: Figures, differences: Iterable[Difference]
) -> list[Judgement]:
    listed = {d.figure: d for d in differences if d.workload == workload.name}
    result = []
    for figure in workload.judged:
        a, b = ours.value(figure), theirs.value(figure)
        entry = listed.get(figure)
        if _worse(figure, a, b):
            if entry is None:
                verdict, why = Verdict.BEHIND, ""
            elif _worse(figure, a, entry.ours):
                verdict, why = Verdict.FURTHER_BEHIND, f"listed at {_num(entry.ours)}: {entry.why}"
            else:
                verdict, why = Verdict.LISTED, entry.why
        else:
            verdict, why = (Verdict.STALE, entry.why) if entry else (Verdict.SAME_OR_BETTER, "")
        result.append(Judgement(workload.name, figure, a, b, verdict, why))
    return result


# ---------------------------------------------------------------------------------------------
# The table.


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


COLUMNS = (
    "side",
    "finished",
    "steps",
    "P/D/E/M",
    "preempt (seen)",
    "TTFT",
    "steps/tok",
    "hit/adm",
    "leaked",
)


def _row(side: str, f: Figures) -> list[str]:
    return [
        side,
        f"{f.finished}/{f.requests}",
        str(f.steps),
        f"{f.prefill_steps}/{f.decode_steps}/{f.empty_steps}/{f.mixed_steps}",
        f"{f.preemptions} ({f.reported_preemptions})",
        _num(f.ttft),
        _num(f.steps_per_token),
        _num(f.hit_tokens),
        str(f.leaked),
    ]


def render(
    pin: str,
    vllm_rbln_version: str,
    results: list[tuple[Workload, Mapping[str, Any], Mapping[str, Any]]],
    judgements: Mapping[str, list[Judgement]],
    cannot_run: Iterable[tuple[str, str]],
) -> str:
    """The tier's report: per workload both sides' figures, the verdicts, and the first
    divergent step with both sides around it; then what the harness cannot show."""
    lines = [
        f"parity: ours (RBLNScheduler at vllm {pin}) against vllm-rbln 0.12.0 (vllm {vllm_rbln_version})",
        "P/D/E/M: prefill / decode / empty / mixed steps; preempt (seen): preemptions (counted by "
        "the front end); TTFT in steps (the watched request's, else the mean); hit/adm: prefix "
        "and connector hit tokens per admission; leaked: blocks neither free nor held by a request "
        "at the end.",
        "",
    ]
    widths = [6, 8, 5, 11, 14, 6, 9, 7, 6]
    header = "  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))
    for workload, ours, theirs in results:
        lines.append(f"== {workload.name}: {workload.what}")
        for side, trace in (("ours", ours), ("vllm-rbln", theirs)):
            if "error" in trace:
                lines.append(f"   {side}: refused: {trace['error']}")
        if "error" in ours or "error" in theirs:
            lines.append("")
            continue
        lines.append("   " + header)
        for side, trace in (("ours", ours), ("rbln", theirs)):
            cells = _row(side, figures_of(trace, workload))
            lines.append("   " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
        for j in judgements.get(workload.name, []):
            note = f" ({j.why})" if j.why else ""
            lines.append(f"   {j.figure}: ours {_num(j.ours)}, vllm-rbln {_num(j.theirs)}: {j.verdict}{note}")
        div = first_divergence(ours, theirs)
        if div is None:
            lines.append("   identical schedules")
        else:
            lines.append(f"   first divergent step: {div}")
            for index in range(max(0, div - 1), div + 2):
                lines.append(f"     step {index:>3}  ours: {describe_step(ours, index)}")
                lines.append(f"               rbln: {describe_step(theirs, index)}")
        lines.append("")
    lines.append("cannot run in this harness (tests/parity/cannot-run.toml):")
    lines.extend(f"  * {what}: {why}" for what, why in cannot_run)
    return "\n".join(lines) + "\n"
