"""Case 6: data parallelism and async scheduling with the RBLN scheduler.

* DP=2 on this machine's CPU (one core a rank): each rank's published stats must carry its
  real waiting count (the DP coordinator and the front end's load balancer use it). With
  ``max_num_seqs`` 1 a rank and 12 concurrent requests, requests wait on both ranks; the
  probe (dp_probe.py) reads the counts the front end received through the coordinator.
* ``async_scheduling=True`` with a drafter whose drafts reach the scheduler only through it
  (a draft model: vLLM disables async scheduling for ngram itself): the RBLN scheduler must
  either refuse it with a clear error or really use the drafts. Never silently drop them.
  On this machine vLLM's CPU platform turns async scheduling off, so the case is listed in
  cannot-run.toml; it checks the engine's real setting first and never passes void.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_kit import RBLN, prompts_with_shared_prefixes, run

PROMPTS = prompts_with_shared_prefixes(seed=11, count=12)


def test_dp2_ranks_publish_their_waiting_counts(model: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("dp_probe.py")), str(model)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("DP-PROBE ")), None)
    assert proc.returncode == 0 and line is not None, (proc.stdout + proc.stderr)[-6000:]
    result = json.loads(line.removeprefix("DP-PROBE "))
    assert result["finished"] == len(PROMPTS), result
    assert len(result["max_running"]) == 2 and all(r >= 1 for r in result["max_running"]), result
    # 12 requests, one running a rank: each rank had requests waiting, and must have said so.
    assert all(w > 0 for w in result["max_waiting"]), f"a rank published no waiting request: {result}"


REFUSAL = "RBLNScheduler does not support async scheduling"


def test_async_scheduling_with_a_draft_model_is_refused_or_really_drafts(model: Path) -> None:
    spec = {"method": "draft_model", "model": str(model), "num_speculative_tokens": 3}
    try:
        outcome = run(
            model, PROMPTS[:4], 16, scheduler_cls=RBLN, speculative_config=spec, async_scheduling=True
        )
    except AssertionError as failed:  # the engine did not start: it must say why, clearly
        # The engine's own output after the header line (which repeats the overrides, and so
        # names both RBLNScheduler and async_scheduling whatever the crash was) must carry the
        # scheduler's refusal sentence.
        output = str(failed).split("\n", 1)[-1]
        assert REFUSAL in output, output[-3000:]
        return
    # vLLM's CPU platform turns async scheduling off whatever was asked (platforms/cpu.py:
    # "async scheduling is not required on CPU"); then this case tests nothing, and says so.
    assert outcome.async_scheduling, "the engine ran without async scheduling: the case is void here"
    drafted = outcome.metrics.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = outcome.metrics.get("vllm:spec_decode_num_accepted_tokens", 0)
    # The draft model is the target itself: every draft it makes is accepted.
    assert drafted > 0 and accepted > 0, f"async scheduling dropped the drafts: {outcome.metrics}"


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
