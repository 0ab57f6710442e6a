"""Visible preemption (patch "Count every preemption and warn on repeated ones").

vLLM 0.31.0 counts `vllm:num_preemptions` from the requests' PREEMPTED
events, which reach the front end with the request's next output: a request
preempted before it emitted a token has none, so its preemptions go
uncounted until (and unless) it emits one, which a livelocked request never
does. The patch counts every preemption in the scheduler
(`SchedulerStats.num_preempted_reqs`) and the loggers read that. The RBLN
scheduler also warns, naming the request, when one is preempted
`preemption_warning_threshold` times in a row (`additional_config`, default
3) without emitting a token.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sched_harness as h


def _upstream_mixed_batch() -> tuple[Any, h.Driver]:
    """Upstream's Scheduler, mixed batches, 4 usable blocks: "old" (14-token
    prompt) decodes while "new" (40 tokens, no output yet) prefills in
    16-token chunks; "old" needs a block the prefill took, so FCFS preempts
    "new" before it emitted a token."""
    from sched_harness import create_scheduler

    scheduler = create_scheduler(block_size=16, num_blocks=5, max_num_batched_tokens=16, max_model_len=256)
    driver = h.Driver(scheduler)
    driver.add(h.make_request("old", h.distinct_prompt(1, 14), max_tokens=40))
    driver.step()
    driver.add(h.make_request("new", h.distinct_prompt(2, 40), max_tokens=4))
    return scheduler, driver


def test_preemptions_before_the_first_token_are_counted() -> None:
    scheduler, driver = _upstream_mixed_batch()
    preempted_without_output = 0
    for _ in range(200):
        if not scheduler.has_requests():
            break
        new = scheduler.requests.get("new")
        record = driver.step()
        if "new" in record.preempted_req_ids and new is not None and new.num_output_tokens == 0:
            preempted_without_output += 1
    assert driver.finished == {"old", "new"}
    assert preempted_without_output > 0, driver.preemptions
    # Every preemption reaches the metric, those before a first token included.
    assert driver.reported_preemptions == sum(driver.preemptions.values())


def _rbln(threshold: int | None) -> tuple[Any, h.Driver]:
    """The RBLN scheduler, `preemption_warning_threshold` set or default."""
    from sched_harness import create_scheduler

    config: dict[str, Any] = {}
    if threshold is not None:
        config["preemption_warning_threshold"] = threshold
    scheduler = create_scheduler(
        scheduler_cls=h.rbln_scheduler_factory(config),  # type: ignore[arg-type]
        block_size=16,
        num_blocks=5,
        max_num_batched_tokens=16,
        max_model_len=256,
        num_speculative_tokens=h.NUM_SPEC_TOKENS,
        speculative_method="ngram",
    )
    return scheduler, h.Driver(scheduler)


@pytest.mark.parametrize("threshold", [None, 1, 0])
def test_the_rbln_scheduler_warns_on_repeated_preemption(
    threshold: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Drive `_preempt_request` directly on a running request three times with
    no token in between: the warning names it at the threshold (default 3)."""
    scheduler, driver = _rbln(threshold)
    expected = 3 if threshold is None else threshold
    assert scheduler.preemption_warning_threshold == expected  # type: ignore[attr-defined]
    driver.add(h.make_request("victim", h.distinct_prompt(3, 20), max_tokens=3))
    logger = logging.getLogger("vllm.v1.core.sched.rbln_scheduler")
    logger.addHandler(caplog.handler)
    try:
        warned_at = []
        for attempt in range(1, 4):
            driver.step()  # (re)admitted and prefilled
            request = scheduler.requests["victim"]
            assert request in scheduler.running
            scheduler.running.remove(request)
            caplog.clear()
            scheduler._preempt_request(request, 0.0)
            if any("victim" in r.getMessage() and "in a row" in r.getMessage() for r in caplog.records):
                warned_at.append(attempt)
    finally:
        logger.removeHandler(caplog.handler)
    if expected == 0:
        assert warned_at == []
    else:
        assert warned_at == [n for n in (1, 2, 3) if n % expected == 0]
    assert driver.run(100) < 100
    h.assert_all_blocks_free(scheduler)
