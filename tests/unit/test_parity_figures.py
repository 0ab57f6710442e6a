"""The parity tier's figures and verdicts on hand-made traces, and the files it reads."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

PARITY = Path(__file__).resolve().parent.parent / "parity"
sys.path.insert(0, str(PARITY))

import figures as fig  # noqa: E402
from workloads import BY_NAME, WORKLOADS, Arrival, Figure, Workload  # noqa: E402

W = Workload(
    name="two-requests",
    what="test",
    arrivals=(Arrival("a", 16, 2), Arrival("b", 16, 2, at_step=1)),
    judged=(Figure.FINISHED, Figure.STEPS, Figure.HIT_TOKENS),
)


def step(tokens: dict[str, int], prefill: list[str], decode: list[str], **kw: Any) -> dict[str, Any]:
    return {
        "tokens": tokens,
        "prefill": prefill,
        "decode": decode,
        "preempted": kw.get("preempted", []),
        "sampled": kw.get("sampled", []),
        "computed_before": kw.get("computed_before", {r: 0 for r in tokens}),
        "free_blocks": 0,
        "copies": 0,
    }


def trace(steps: list[dict[str, Any]], finished: list[str], reported: int = 0) -> dict[str, Any]:
    return {
        "steps": steps,
        "arrived": {"a": 0, "b": 1},
        "max_tokens": {"a": 2, "b": 2},
        "finished": finished,
        "reported_preemptions": reported,
        "blocks_not_free": 0,
        "blocks_held_by_requests": 0,
    }


# ours: a prefills, b prefills (preempting a once), then both decode.
OURS = trace(
    [
        step({"a": 16}, ["a"], [], sampled=["a"]),
        step({"b": 16}, ["b"], [], sampled=["b"], preempted=["a"]),
        step({"a": 17}, ["a"], [], sampled=["a"], computed_before={"a": 0}),
        step({"b": 1}, [], ["b"], sampled=["b"]),
    ],
    ["a", "b"],
)
# vllm-rbln: a mixed step, both finish in 3 steps; b's admission hit 8 tokens.
THEIRS = trace(
    [
        step({"a": 16}, ["a"], [], sampled=["a"]),
        step({"a": 1, "b": 16}, ["b"], ["a"], sampled=["a", "b"], computed_before={"a": 16, "b": 8}),
        step({"b": 1}, [], ["b"], sampled=["b"]),
    ],
    ["a", "b"],
)


def test_figures_count_steps_preemptions_ttft_and_hits() -> None:
    ours = fig.figures_of(OURS, W)
    assert (ours.steps, ours.prefill_steps, ours.decode_steps, ours.mixed_steps) == (4, 3, 1, 0)
    assert (ours.preemptions, ours.reported_preemptions) == (1, 0)
    assert ours.value(Figure.HIDDEN_PREEMPTIONS) == 1
    assert fig.first_tokens(OURS) == {"a": 1, "b": 1}
    assert fig.admissions(OURS) == [0, 0, 0]  # a, b, a again after its preemption
    assert ours.steps_per_token == 1.0
    theirs = fig.figures_of(THEIRS, W)
    assert (theirs.steps, theirs.mixed_steps, theirs.hit_tokens) == (3, 1, 4.0)
    assert fig.first_divergence(OURS, THEIRS) == 1


def test_behind_and_unlisted_fails_listed_passes() -> None:
    ours, theirs = fig.figures_of(OURS, W), fig.figures_of(THEIRS, W)
    verdicts = {j.figure: j.verdict for j in fig.judge(W, ours, theirs, [])}
    assert verdicts == {
        Figure.FINISHED: fig.Verdict.SAME_OR_BETTER,
        Figure.STEPS: fig.Verdict.BEHIND,
        Figure.HIT_TOKENS: fig.Verdict.BEHIND,
    }
    listed = [
        fig.Difference(W.name, Figure.STEPS, "no mixed steps", ours=4),
        fig.Difference(W.name, Figure.HIT_TOKENS, "x", ours=0),
    ]
    judged = fig.judge(W, ours, theirs, listed)
    assert not any(j.fails for j in judged)


def test_a_listed_difference_where_ours_falls_further_behind_fails() -> None:
    """A listed difference holds ours to the value it had when listed (``ours``): ours' 4 steps
    (vllm-rbln's 3) pass listed at 4 or 5, and fail listed at 3.5, further behind than listed;
    for a higher-is-better figure the other way round."""
    ours, theirs = fig.figures_of(OURS, W), fig.figures_of(THEIRS, W)
    assert (ours.steps, theirs.steps, ours.hit_tokens, theirs.hit_tokens) == (4, 3, 0, 4)
    for listed_steps, fails in ((4, False), (5, False), (3.5, True)):
        judged = {
            j.figure: j
            for j in fig.judge(
                W, ours, theirs, [fig.Difference(W.name, Figure.STEPS, "why", ours=listed_steps)]
            )
        }
        assert judged[Figure.STEPS].fails is fails, listed_steps
        if fails:
            assert judged[Figure.STEPS].verdict is fig.Verdict.FURTHER_BEHIND
    hits = fig.judge(W, ours, theirs, [fig.Difference(W.name, Figure.HIT_TOKENS, "why", ours=1)])
    assert [j.verdict for j in hits if j.figure is Figure.HIT_TOKENS] == [fig.Verdict.FURTHER_BEHIND]


def test_a_listed_difference_that_no_longer_differs_is_stale() -> None:
    theirs = fig.figures_of(THEIRS, W)
    judged = fig.judge(W, theirs, theirs, [fig.Difference(W.name, Figure.STEPS, "was behind", ours=4)])
    stale = [j for j in judged if j.fails]
    assert [(j.figure, j.verdict) for j in stale] == [(Figure.STEPS, fig.Verdict.STALE)]


def test_a_missing_figure_is_the_worst() -> None:
    unfinished = trace([step({"a": 16}, ["a"], [])], [])
    ours, theirs = fig.figures_of(unfinished, W), fig.figures_of(THEIRS, W)
    assert ours.steps_per_token is None
    judged = {j.figure: j.verdict for j in fig.judge(W, ours, theirs, [])}
    assert judged[Figure.FINISHED] is fig.Verdict.BEHIND
    # A figure ours lacks (no output token, no first token) is behind any value of theirs, for
    # a lower-is-better figure as for a higher-is-better one; theirs lacking it is not.
    per_token = Workload(
        name="per-token", what="test", arrivals=W.arrivals, judged=(Figure.STEPS_PER_TOKEN, Figure.HIT_TOKENS)
    )
    no_hits = fig.figures_of(trace([], []), per_token)
    assert no_hits.hit_tokens is None
    verdicts = {j.figure: j.verdict for j in fig.judge(per_token, no_hits, theirs, [])}
    assert verdicts == {Figure.STEPS_PER_TOKEN: fig.Verdict.BEHIND, Figure.HIT_TOKENS: fig.Verdict.BEHIND}
    reverse = {j.figure: j.verdict for j in fig.judge(per_token, theirs, no_hits, [])}
    assert set(reverse.values()) == {fig.Verdict.SAME_OR_BETTER}


def test_differences_must_name_a_workload_and_a_judged_figure(tmp_path: Path) -> None:
    path = tmp_path / "differences.toml"
    path.write_text('[[difference]]\nworkload = "no-such"\nfigure = "steps"\nwhy = "x"\n')
    with pytest.raises(fig.ParityError, match="not in tests/parity/workloads.py"):
        fig.load_differences(path, "0.31.0")
    path.write_text('[[difference]]\nworkload = "roomy-pool"\nfigure = "blocks leaked"\nwhy = "x"\n')
    with pytest.raises(fig.ParityError, match="judges"):
        fig.load_differences(path, "0.31.0")
    path.write_text('[[difference]]\nworkload = "roomy-pool"\nfigure = "steps"\nwhy = "x"\n')
    with pytest.raises(fig.ParityError, match="'ours'"):
        fig.load_differences(path, "0.31.0")
    path.write_text(
        '[[difference]]\nworkload = "roomy-pool"\nfigure = "steps"\nwhy = "x"\nours = 40\npins = ["0.32.0"]\n'
    )
    assert fig.load_differences(path, "0.31.0") == ()
    assert len(fig.load_differences(path, "0.32.0")) == 1


def test_the_shipped_lists_load_and_every_workload_is_named_once() -> None:
    fig.load_differences(fig.DIFFERENCES, "0.31.0")
    assert fig.load_cannot_run(fig.CANNOT_RUN)
    assert len(BY_NAME) == len(WORKLOADS)
    assert sum(w.name.startswith("livelock-") for w in WORKLOADS) == 12


def test_blocks_an_unfinished_request_holds_are_not_leaked() -> None:
    held_by_a_livelocked_prompt = {**trace([step({"a": 16}, ["a"], [])], []), "blocks_not_free": 6}
    held_by_a_livelocked_prompt["blocks_held_by_requests"] = 6
    assert fig.figures_of(held_by_a_livelocked_prompt, W).leaked == 0
    lost = {**held_by_a_livelocked_prompt, "blocks_held_by_requests": 4}
    assert fig.figures_of(lost, W).leaked == 2
