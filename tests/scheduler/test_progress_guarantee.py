"""The progress guarantee under the priority policy, and DP prefill
throttling (issue 14, bug 2 and risk 7).

The guarantee (patch "Let a lone prefill that cannot get blocks preempt a
decode") lets a prefill chunk that cannot get blocks preempt a decode
instead of itself. Under `scheduling_policy="priority"` it may only choose a
decode that ranks at or below the prefill (a priority value at least the
prefill's): it never inverts priorities. FCFS keeps the most recently
admitted decode.
"""

from __future__ import annotations

from typing import Any

import pytest
import sched_harness as h

SPEC = h.NUM_SPEC_TOKENS


def _cadence(step: int) -> bool:
    """DP prefill throttling on a [False, True, True] cadence: prefills run
    on one step in three (the engine core's prefill interval 3)."""
    return (step + 2) % 3 != 0


def _review_repro(progress_guarantee: bool, prompt_priority: int) -> tuple[Any, h.Driver]:
    """RBLN, block 16, 7 usable blocks, chunk 16, ngram k=3. Decodes d1 (24
    tokens) and d2 (16 tokens) run at priority 0; prompt P (32 tokens)
    arrives at `prompt_priority` while DP throttling defers prefills on two
    steps of three."""
    from sched_harness import create_scheduler

    scheduler = create_scheduler(
        scheduler_cls=h._rbln_scheduler_cls(),  # type: ignore[arg-type]
        block_size=h.BLOCK_SIZE,
        num_blocks=8,
        max_num_batched_tokens=h.PREFILL_CHUNK,
        max_model_len=256,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
        scheduling_policy="priority",
    )
    h.set_progress_guarantee(scheduler, progress_guarantee)
    driver = h.Driver(scheduler, throttle=_cadence)
    driver.add(h.make_request("d1", h.distinct_prompt(1, 24), max_tokens=10, priority=0))
    driver.add(h.make_request("d2", h.distinct_prompt(2, 16), max_tokens=10, priority=0))
    for _ in range(3):
        driver.step()
    assert [r.request_id for r in scheduler.running] == ["d1", "d2"]
    driver.add(h.make_request("P", h.distinct_prompt(3, 32), max_tokens=4, priority=prompt_priority))
    return scheduler, driver


def _decodes_preempted_for_the_prompt(driver: h.Driver) -> list[int]:
    """Steps that gave P's prefill blocks by preempting d1 or d2."""
    return [
        i
        for i, record in enumerate(driver.steps)
        if "P" in record.prefill_req_ids and record.preempted_req_ids & {"d1", "d2"}
    ]


@pytest.mark.parametrize("progress_guarantee", [True, False], ids=["guarantee", "no-guarantee"])
def test_a_lower_priority_prefill_never_preempts_a_higher_priority_decode(progress_guarantee: bool) -> None:
    """The review's repro: before the fix the guarantee preempted d2
    (priority 0) to give P (priority 10) its last chunk; now P, which ranks
    lowest, is the victim, as with the guarantee off."""
    scheduler, driver = _review_repro(progress_guarantee, prompt_priority=10)
    driver.run(300)
    assert driver.finished == {"d1", "d2", "P"}
    assert _decodes_preempted_for_the_prompt(driver) == [], driver.preemptions
    # The workload does make P's prefill fail (else the test shows nothing).
    assert driver.preemptions == {"P": 1}, driver.preemptions
    h.assert_all_blocks_free(scheduler)


def test_at_the_same_priority_the_guarantee_preempts_a_decode() -> None:
    """At the decodes' own priority the guarantee applies as under FCFS: the
    prefill is never preempted, a decode of its rank is (the latest one)."""
    scheduler, driver = _review_repro(progress_guarantee=True, prompt_priority=0)
    driver.run(300)
    assert driver.finished == {"d1", "d2", "P"}
    assert driver.preemptions == {"d2": 1}, driver.preemptions
    assert _decodes_preempted_for_the_prompt(driver) != []
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_guarantee_holds_at_the_livelock_geometry(policy: str) -> None:
    """The livelock matrix's 32-token case without a gate margin to spare:
    under both policies (all requests at one priority) the prompt is never
    preempted."""
    from sched_harness import create_scheduler

    scheduler = create_scheduler(
        scheduler_cls=h._rbln_scheduler_cls(),  # type: ignore[arg-type]
        block_size=h.BLOCK_SIZE,
        num_blocks=8,
        max_num_batched_tokens=h.PREFILL_CHUNK,
        max_model_len=256,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
        scheduling_policy=policy,
    )
    driver = h.Driver(scheduler, throttle=_cadence)
    driver.add(h.make_request("d1", h.distinct_prompt(1, 24), max_tokens=10))
    driver.add(h.make_request("d2", h.distinct_prompt(2, 16), max_tokens=10))
    for _ in range(3):
        driver.step()
    driver.add(h.make_request("P", h.distinct_prompt(3, 32), max_tokens=4))
    driver.run(300)
    assert driver.finished == {"d1", "d2", "P"}
    assert driver.preemptions.get("P", 0) == 0, driver.preemptions
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("progress_guarantee", [True, False], ids=["guarantee", "no-guarantee"])
def test_dp_throttling_lets_the_decodes_run_between_a_prefills_chunks(progress_guarantee: bool) -> None:
    """Risk 7: what holds under DP prefill throttling (docs/scheduler.md).
    The admission step runs no decode, so the gate decides against the pool
    before any decode of that step. But a throttled step defers the
    admitted prompt's next chunk, and the step falls back to the decodes,
    which grow into the blocks the gate counted for the prompt: its next
    chunk then cannot get them. With the progress guarantee a decode is
    preempted (FCFS: the most recent one); without it the prompt preempts
    itself. Either way everything finishes."""
    from sched_harness import create_scheduler

    scheduler = create_scheduler(
        scheduler_cls=h._rbln_scheduler_cls(),  # type: ignore[arg-type]
        block_size=h.BLOCK_SIZE,
        num_blocks=8,
        max_num_batched_tokens=h.PREFILL_CHUNK,
        max_model_len=256,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    h.set_progress_guarantee(scheduler, progress_guarantee)
    driver = h.Driver(scheduler, throttle=_cadence)
    driver.add(h.make_request("d1", h.distinct_prompt(1, 24), max_tokens=10))
    driver.add(h.make_request("d2", h.distinct_prompt(2, 16), max_tokens=10))
    for _ in range(3):
        driver.step()
    driver.add(h.make_request("P", h.distinct_prompt(3, 32), max_tokens=4))
    driver.run(300)
    assert driver.finished == {"d1", "d2", "P"}
    chunks = [i for i, record in enumerate(driver.steps) if "P" in record.prefill_req_ids]
    # Decode steps ran between the prompt's first and second chunk.
    assert any(driver.steps[i].decode_req_ids for i in range(chunks[0] + 1, chunks[1]))
    assert driver.preemptions == ({"d2": 1} if progress_guarantee else {"P": 1})
    h.assert_all_blocks_free(scheduler)
