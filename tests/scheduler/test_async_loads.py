"""Async KV loads under the RBLN scheduler (issue 14, bug 3 and the cases
the liveness properties did not reach: loads of different lengths, the
priority policy, a drafter that needs the lookahead kept at 0 while loading).

An async load is admitted with `num_new_tokens = 0` and no lookahead (the
waiting loop allocates no lookahead slots while KV is in flight). When the
load lands, the request comes back through the full-sequence gate holding
its blocks, at the head of the waiting queue, and is never preempted. If the
gate asked for more the second time than the first, the request would hold
its blocks and fail, and stop the waiting loop for every request behind it.
The RBLN gate counts the lookahead at an async admission too, so both counts
are the same (`_admission_decode_step_tokens`).
"""

from __future__ import annotations

from typing import Any

import pytest
import sched_harness as h

SPEC = h.NUM_SPEC_TOKENS


request = h.named_request
blocks_held = h.blocks_held


def make(rbln: bool = True, **kwargs: Any) -> Any:
    kwargs.setdefault("num_speculative_tokens", SPEC)
    kwargs.setdefault("speculative_method", "ngram")
    return h.make_scheduler(rbln, **kwargs)


def _review_repro(rbln: bool, num_blocks: int) -> tuple[Any, h.Driver]:
    """The review's repro: blocks of 16, max_model_len 64, a connector that
    loads 16 tokens asynchronously, ngram k=3, priority policy. B (20
    tokens, priority 1) arrives first, then A (44 tokens, priority 0)."""
    from tests.v1.core.utils import mock_kv

    scheduler = make(
        rbln,
        num_blocks=num_blocks,
        max_num_batched_tokens=16,
        max_model_len=64,
        scheduling_policy="priority",
        use_kv_connector=mock_kv(16, True),
    )
    driver = h.Driver(scheduler, async_load_steps=2)
    driver.add(request("B", 20, max_tokens=4, priority=1))
    driver.add(request("A", 44, max_tokens=4, priority=0))
    return scheduler, driver


def test_a_landed_load_never_holds_blocks_it_cannot_use() -> None:
    """3 usable blocks (48 slots): A, ranked first, needs 44 + 1 + 3 + 3 =
    51 slots (4 blocks) through its first decode step under the RBLN
    lookahead. Before the fix its async admission counted 48 (no
    lookahead), so A was admitted as a load holding a block, landed, and
    then failed the gate at the head of the queue forever, with its block
    held and nothing running. Now the admission refuses A and A holds
    nothing while it waits. (B stays behind A: the waiting loop stops at
    the first request that does not fit, upstream's head-of-line policy.
    This pool is smaller than max_model_len, which a real engine refuses
    at start; upstream's Scheduler finishes both because its ngram
    lookahead is 0, so A needs 44 slots.)"""
    scheduler, driver = _review_repro(True, num_blocks=4)
    for _ in range(30):
        driver.step()
        assert blocks_held(scheduler, "A") == 0
    upstream, upstream_driver = _review_repro(False, num_blocks=4)
    upstream_driver.run(60)
    assert upstream_driver.finished == {"A", "B"}
    h.assert_all_blocks_free(upstream)


@pytest.mark.parametrize("rbln", [True, False], ids=["rbln", "upstream"])
@pytest.mark.parametrize("num_blocks", [5, 6, 9])
def test_loads_under_priority_finish(rbln: bool, num_blocks: int) -> None:
    """The same two loads in pools that hold A: both finish."""
    scheduler, driver = _review_repro(rbln, num_blocks)
    steps = driver.run(80)
    assert driver.finished == {"A", "B"}, (steps, driver.preemptions)
    h.assert_all_blocks_free(scheduler)


def test_a_load_that_can_never_run_holds_no_blocks() -> None:
    """FCFS, 3 usable blocks: a 44-token prompt with 32 tokens to load needs
    44 + 1 + 3 + 3 = 51 slots (4 blocks) through its first decode step. It
    must not be admitted as a load (holding 2 blocks) that then fails the
    gate forever once its KV has landed."""
    from tests.v1.core.utils import mock_kv

    scheduler = make(
        num_blocks=4, max_num_batched_tokens=16, max_model_len=64, use_kv_connector=mock_kv(32, True)
    )
    driver = h.Driver(scheduler)
    driver.add(request("big", 44, max_tokens=4))
    for _ in range(10):
        driver.step()
    assert blocks_held(scheduler, "big") == 0
    h.assert_all_blocks_free(scheduler)


def test_admission_and_landing_count_the_same_blocks() -> None:
    """The gate at an async admission counts exactly what the landed
    request's gate counts: a pool with just those blocks admits the load and
    then runs it to the end; one block less refuses it up front."""
    from tests.v1.core.utils import mock_kv

    # 44 tokens + 1 + 3 decode step + 3 lookahead = 51 slots: 4 blocks.
    for num_usable, admitted in ((4, True), (3, False)):
        scheduler = make(
            num_blocks=num_usable + 1,
            max_num_batched_tokens=16,
            max_model_len=64,
            use_kv_connector=mock_kv(32, True),
        )
        driver = h.Driver(scheduler)
        driver.add(request("r", 44, max_tokens=3))
        record = driver.step()
        assert (blocks_held(scheduler, "r") == 2) is admitted, record
        driver.run(30)
        assert ("r" in driver.finished) is admitted


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_loads_of_different_lengths_all_finish(policy: str) -> None:
    """Four loads that land after 1, 5, 2 and 3 steps, with prompts of
    different lengths, on a pool that holds two of them at a time; the
    priority policy ranks the later arrivals first."""
    from tests.v1.core.utils import mock_kv

    scheduler = make(
        num_blocks=9,
        max_num_batched_tokens=16,
        max_model_len=128,
        scheduling_policy=policy,
        use_kv_connector=mock_kv(16, True),
    )
    driver = h.Driver(scheduler, load_steps={"r0": 1, "r1": 5, "r2": 2, "r3": 3})
    for i, prompt_len in enumerate((20, 50, 33, 40)):
        driver.add(request(f"r{i}", prompt_len, max_tokens=5, priority=3 - i))
    steps = driver.run(200)
    assert driver.finished == {"r0", "r1", "r2", "r3"}, steps
    h.assert_all_blocks_free(scheduler)
    # No step mixes a prefill and decodes, landed loads included.
    for record in driver.steps:
        assert not (record.prefill_req_ids and record.decode_req_ids), record
