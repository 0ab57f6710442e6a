"""The matrix catches the bug: run it against fault-injected source trees.

Each tree is the full series plus one test-only patch from
tests/scheduler/variants/ (see its README): "no-backport" restores vLLM
0.31.0's gate (it counts the prompt alone), "lookahead-only" counts the
lookahead but not the first decode step. Every tree is imported in its own
subprocess with PYTHONPATH set to it, running sched_harness.py's "matrix"
command. The same command against the patched tree is the control: there
every case must pass, so a failure in a variant is the variant's doing.

"no-backport-no-retry" also reverts the retry of a failed admission without
its sub-block match: it shows why that retry must come after the backport
(without the backport, the retry turns the sub-block cases' accidental escape
into the same repeated self-preemption as with sub-block caching off).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sched_harness as h

HARNESS = Path(h.__file__).resolve()
CASE_IDS = [case.id for case in h.LIVELOCK_CASES]
PROMPT26_IDS = [case.id for case in h.LIVELOCK_CASES if case.prompt_len == 26]
PROMPT26_SUB_BLOCK_IDS = [
    case.id for case in h.LIVELOCK_CASES if case.prompt_len == 26 and case.sub_block_size is not None
]


def variant_tree(name: str) -> Path:
    raw = os.environ.get(h.VARIANT_TREES_ENV)
    if not raw:
        pytest.fail(
            f"{h.VARIANT_TREES_ENV} is not set: it must be a JSON object "
            '{"no-backport": "/path", "lookahead-only": "/path"} naming the '
            "fault-injected source trees (tests/scheduler/variants/README.md)",
            pytrace=False,
        )
    trees = json.loads(raw)
    if name not in trees:
        pytest.fail(f"{h.VARIANT_TREES_ENV} names no {name!r} tree", pytrace=False)
    return Path(trees[name])


def run_matrix_in(
    tree: Path, progress_guarantee: bool = False, extra: bool = False
) -> dict[str, dict[str, Any]]:
    """The matrix's outcomes with vLLM and its test harness imported from `tree`.

    The variants run without the progress guarantee by default: the proofs
    are about the gate's arithmetic, and the guarantee rescues the cases
    whose prefill chunk fails (`test_the_progress_guarantee_...`)."""
    everything = _matrix_with_extra(tree, progress_guarantee)
    wanted = set(CASE_IDS) | (set(EXTRA_IDS) if extra else set())
    return {case_id: outcome for case_id, outcome in everything.items() if case_id in wanted}


# One subprocess a (tree, progress guarantee) for the whole test run, shared by
# pytest-xdist's workers: each case runs alone (its own scheduler), so the
# `--extra` run's outcomes of the plain cases are theirs; several proofs ask
# for the same tree (a subprocess importing vLLM costs seconds). The memo lives in
# the run's pytest temp root (shared by its xdist workers, kept for pytest's last
# three runs and then removed by pytest), never in /tmp for good.
_memo: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _matrix_memo(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # popen-gwN's parent
    _memo[:] = [root / "livelock-matrix"]


def _matrix_with_extra(tree: Path, progress_guarantee: bool) -> dict[str, dict[str, Any]]:
    memo = _memo[0]
    memo.mkdir(exist_ok=True)
    key = hashlib.sha256(f"{tree.resolve()}\0{progress_guarantee}".encode()).hexdigest()[:16]
    result = memo / f"{key}.json"
    with open(memo / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker running the same tree: wait for it
        if not result.exists():
            result.write_text(json.dumps(_run_matrix(tree, progress_guarantee)))
    return dict(json.loads(result.read_text()))


def _run_matrix(tree: Path, progress_guarantee: bool) -> dict[str, dict[str, Any]]:
    flags = ([] if progress_guarantee else ["--no-progress-guarantee"]) + ["--extra"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    result = subprocess.run(
        [sys.executable, str(HARNESS), "matrix", str(tree), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"matrix run in {tree} failed:\n{result.stdout}\n{result.stderr}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The subprocess must really have run the tree's vLLM, not the wheel's.
    assert Path(report["vllm"]).resolve().is_relative_to(tree.resolve())
    return {outcome["case_id"]: outcome for outcome in report["outcomes"]}


def failing_cases(outcomes: dict[str, dict[str, Any]]) -> list[str]:
    return [
        case_id
        for case_id, outcome in outcomes.items()
        if not (outcome["finished"] and outcome["preemptions"] == 0 and outcome["all_blocks_free"])
    ]


def test_control_patched_tree_passes_every_case(source_tree: Path) -> None:
    for progress_guarantee in (True, False):
        outcomes = run_matrix_in(source_tree, progress_guarantee)
        assert sorted(outcomes) == sorted(CASE_IDS)
        assert failing_cases(outcomes) == []


def test_without_the_backport_every_case_fails() -> None:
    outcomes = run_matrix_in(variant_tree("no-backport"))
    assert sorted(outcomes) == sorted(CASE_IDS)
    assert sorted(failing_cases(outcomes)) == sorted(CASE_IDS)
    for outcome in outcomes.values():
        # The same admission as with the fix (two free blocks), and the
        # failure is the self-preemption loop, not a crash or a leak.
        assert outcome["free_blocks_at_admission"] == h.FREE_BLOCKS_AT_ADMISSION
        assert outcome["preemptions"] > 0
        assert outcome["all_blocks_free"]


def test_counting_only_the_lookahead_fails_exactly_the_26_token_cases() -> None:
    outcomes = run_matrix_in(variant_tree("lookahead-only"))
    assert sorted(outcomes) == sorted(CASE_IDS)
    assert sorted(failing_cases(outcomes)) == sorted(PROMPT26_IDS)
    for case_id in PROMPT26_IDS:
        assert outcomes[case_id]["preemptions"] > 0


def test_the_sub_block_retry_removes_the_escape_without_the_backport() -> None:
    """Without the backport and without the retry, a 26-token prompt with a
    sub-block match is preempted once and then waits: its readmission hits its
    own sub-block tail, which costs the gate a copy-on-write block and the
    cached tail block, so the gate refuses it and the decodes run (it finishes
    by luck). With the retry (the "no-backport" tree) the admission is tried
    again without the sub-block match, passes, and the prompt preempts itself
    again and again, exactly as with sub-block caching off.

    With a KV connector the readmission of a preempted request takes whole
    blocks in both trees (patch "Resume a preempted request at the local hit
    its KV connector was shown"), so there is no escape for the retry to
    remove: the prompt preempts itself as with sub-block caching off."""
    no_retry = run_matrix_in(variant_tree("no-backport-no-retry"))
    with_retry = run_matrix_in(variant_tree("no-backport"))
    assert sorted(failing_cases(no_retry)) == sorted(CASE_IDS)
    for case_id in PROMPT26_SUB_BLOCK_IDS:
        off_id = case_id.replace("subblock-4", "subblock-off").replace("subblock-8", "subblock-off")
        assert with_retry[case_id]["preemptions"] == with_retry[off_id]["preemptions"] > 1, case_id
        if case_id.endswith("-no-connector"):
            assert no_retry[case_id]["preemptions"] == 1, case_id
        else:
            assert no_retry[case_id]["preemptions"] == no_retry[off_id]["preemptions"] > 1, case_id


PROMPT32_IDS = [case.id for case in h.LIVELOCK_CASES if case.prompt_len == 32]


def test_the_progress_guarantee_lets_the_prefill_progress_without_the_backport() -> None:
    """Without the backport, the 32-token prompt's last prefill chunk cannot
    get its third block. Without the progress guarantee that lone prefill
    preempts itself (3 times in a row with sub-block caching off); with it,
    it preempts the most recently admitted decode once, finishes without
    being preempted, and the decode is readmitted and finishes too. The
    26-token prompt fails at its first decode step, in a decode batch, which
    the guarantee (about a lone prefill) leaves to upstream's victim choice:
    only the backport's gate fixes it."""
    tree = variant_tree("no-backport")
    without = run_matrix_in(tree, progress_guarantee=False)
    with_guarantee = run_matrix_in(tree, progress_guarantee=True)
    for case_id in PROMPT32_IDS:
        assert without[case_id]["preemptions"] > 0, case_id
        assert without[case_id]["decode_preemptions"] == 0, case_id
        outcome = with_guarantee[case_id]
        assert outcome["finished"] and outcome["all_blocks_free"], case_id
        assert outcome["preemptions"] == 0, case_id
        assert outcome["decode_preemptions"] == 1, case_id
    assert without["prompt32-subblock-off-no-connector"]["preemptions"] == 3
    for case_id in PROMPT26_IDS:
        assert with_guarantee[case_id]["preemptions"] == without[case_id]["preemptions"] > 0, case_id


EXTRA_IDS = [case.id for case in h.EXTRA_LIVELOCK_CASES]
EXTRA_PROMPT26_IDS = [case.id for case in h.EXTRA_LIVELOCK_CASES if case.prompt_len == 26]
EXTRA_WHOLE_BLOCK_NO_CONNECTOR_IDS = [
    case.id for case in h.EXTRA_LIVELOCK_CASES if case.whole_block_caching and not case.kv_connector
]


def test_the_extra_cases_fail_without_the_fix() -> None:
    """The extra cases are not vacuous. Without the backport, whole-block
    prefix caching fails both prompts and a connector hit fails every
    26-token case; counting only the lookahead fails exactly the 26-token
    cases, as in the design's matrix. The 32-token prompt with a connector
    hit escapes either way: its first 16 tokens are loaded, so its one
    prefill chunk asks for 32 + 3 lookahead slots, 3 blocks, at its own
    allocation, which two free blocks refuse before the gate's arithmetic
    matters."""
    no_backport = run_matrix_in(variant_tree("no-backport"), extra=True)
    lookahead_only = run_matrix_in(variant_tree("lookahead-only"), extra=True)
    control_ids = sorted(CASE_IDS + EXTRA_IDS)
    assert sorted(no_backport) == sorted(lookahead_only) == control_ids
    extra_failing = [case_id for case_id in failing_cases(no_backport) if case_id in EXTRA_IDS]
    assert sorted(extra_failing) == sorted(set(EXTRA_PROMPT26_IDS) | set(EXTRA_WHOLE_BLOCK_NO_CONNECTOR_IDS))
    extra_failing = [case_id for case_id in failing_cases(lookahead_only) if case_id in EXTRA_IDS]
    assert sorted(extra_failing) == sorted(EXTRA_PROMPT26_IDS)


def test_control_patched_tree_passes_the_extra_cases(source_tree: Path) -> None:
    outcomes = run_matrix_in(source_tree, progress_guarantee=False, extra=True)
    assert failing_cases(outcomes) == []
