"""A waiting request stalled on the encoder budget, under the RBLN scheduler.

vLLM's ``test_waiting_encoder_stall_*`` (new in 0.33.0) (tests/v1/core/test_scheduler.py) check the
waiting loop's answer to a request none of whose tokens can be scheduled because its encoder
input does not fit: it must not starve the requests behind it, it is counted as deferred (the
DP load balancer's prefill-capacity signal, ``SchedulerStats.num_skipped_waiting_reqs``), and a
request holding KV blocks goes back to the drain-first queue. They cannot run here (their Llava
model config imports torchvision; tests/upstream/0.34.0/cannot-run.toml). Their branch sits
among the RBLN scheduler's hooks in that loop: a step with a waiting request is planned as an
admission (``_choose_step_kind``), at most one prefill is admitted
(``_should_schedule_waiting``), and a step that admitted nothing is planned again for the
decodes (``_should_replan_step``). A stalled request is exactly such a waiting request that
admits nothing, step after step.

Here the stall needs no torchvision: a text-only model has no encoder budget at all (vLLM
gives encoder compute and cache only to multimodal models), so a request with a multimodal
placeholder stalls on the same branch, at every step, with nothing poked into the scheduler.
Upstream's rule differs per pin (tests/support/upstream_rules.py, ``stall_requeues``): from
0.33.0 the stalled request is requeued and counted as deferred and the loop goes on; 0.30.0,
0.31.0 and 0.32.0 end the waiting pass at it (0.30.0 keeps a KV holder on ``skipped_waiting``,
where 0.31.0 has ``kv_holding_waiting``). The cases expect each pin's rule, from both schedulers.
"""

from __future__ import annotations

from typing import Any

import pytest
import sched_harness as h
from upstream_rules import counted_as_deferred, kv_holding_queue, stall_requeues

STALL_REQUEUES = stall_requeues()
PLACEHOLDER = 8  # tokens of the multimodal placeholder that never fits the encoder budget
LOADED = 16  # tokens an async KV load brings (a block)


def make(rbln: bool, **kwargs: Any) -> Any:
    kwargs.setdefault("num_speculative_tokens", h.NUM_SPEC_TOKENS)
    kwargs.setdefault("speculative_method", "ngram")
    scheduler = h.make_scheduler(rbln, **kwargs)
    # The harness's model is text-only: no encoder budget, so any encoder input stalls.
    assert scheduler.max_num_encoder_input_tokens == 0
    return scheduler


def stalled_request(req_id: str, num_tokens: int, placeholder_at: int) -> Any:
    """A request whose prompt has a multimodal placeholder at ``placeholder_at``: its tokens up
    to there can be scheduled, none from there on."""
    from tests.v1.core.utils import create_requests
    from vllm.multimodal.inputs import PlaceholderRange

    return create_requests(
        num_requests=1,
        num_tokens=num_tokens,
        mm_positions=[[PlaceholderRange(offset=placeholder_at, length=PLACEHOLDER)]],
        req_ids=[req_id],
        max_tokens=3,
    )[0]


def assert_stalled(
    scheduler: Any, stalled: Any, queue: Any, *, deferred: bool, others_waiting: int = 0
) -> None:
    """``stalled`` waits at the head of ``queue``, counted as deferred or not, and the
    published waiting counts (``others_waiting`` other requests wait too) say so."""
    from vllm.v1.request import RequestStatus

    assert stalled.status == RequestStatus.WAITING and stalled not in scheduler.running
    assert queue and queue.peek_request() is stalled, "not back at the head of its queue"
    assert counted_as_deferred(scheduler, stalled) == deferred
    stats = scheduler.make_stats()
    assert stats is not None
    waiting, skipped = (others_waiting, 1) if deferred else (others_waiting + 1, 0)
    assert (stats.num_waiting_reqs, stats.num_skipped_waiting_reqs) == (waiting, skipped)


@pytest.mark.parametrize("rbln", [True, False], ids=["rbln", "upstream"])
def test_a_stalled_request_does_not_starve_the_one_behind_it(rbln: bool) -> None:
    """Upstream's ``..._does_not_starve_later_requests`` and ``..._is_counted_as_deferred``.
    From 0.33.0 the request behind the stalled one is admitted in the same step (under the
    RBLN scheduler: as the step's one prefill; the stalled request is not it); 0.31.0 and
    0.32.0 stop at the stalled one."""
    scheduler = make(rbln)
    driver = h.Driver(scheduler)
    stalled = stalled_request("stalled", 40, placeholder_at=0)
    driver.add(stalled)
    driver.add(h.named_request("ready", 20, 3))

    record = driver.step()

    if STALL_REQUEUES:
        assert record.num_scheduled_tokens == {"ready": 20}
        assert_stalled(scheduler, stalled, scheduler.waiting, deferred=True)
    else:
        assert record.num_scheduled_tokens == {}
        assert_stalled(scheduler, stalled, scheduler.waiting, deferred=False, others_waiting=1)


@pytest.mark.parametrize("holds_kv", [False, True], ids=["waiting", "kv-holding"])
def test_the_decodes_keep_running_while_the_only_waiting_request_is_stalled(holds_kv: bool) -> None:
    """The RBLN scheduler plans every step with a waiting request as an admission; the
    stalled request admits nothing, so each step must go back to the decodes
    (``_should_replan_step``), not come out empty. Upstream's
    ``..._kv_holder_keeps_drain_priority`` too: a stalled request that holds KV blocks (its
    async KV load has landed; the placeholder starts where the load ends) stays on the
    drain-first queue, with its blocks, step after step."""
    from tests.v1.core.utils import mock_kv

    connector = mock_kv(LOADED, True) if holds_kv else None
    scheduler = make(True, use_kv_connector=connector)
    driver = h.Driver(scheduler)
    for name in ("a", "b"):
        driver.add(h.named_request(name, 20, 12))
    while sorted(driver.steps[-1].decode_req_ids if driver.steps else []) != ["a", "b"]:
        assert len(driver.steps) < 12, "a and b never decoded together"
        driver.step()

    stalled = stalled_request("stalled", 40, placeholder_at=LOADED if holds_kv else 0)
    driver.add(stalled)
    if holds_kv:
        driver.step()  # its admission: the async load of its first block (nothing scheduled)
        driver.step()  # the load lands: it waits holding that block, before any other
    queue = kv_holding_queue(scheduler) if holds_kv else scheduler.waiting
    held = h.blocks_held(scheduler, "stalled")
    assert held == (1 if holds_kv else 0)

    while decoding := {"a", "b"} - driver.finished:
        assert len(driver.steps) < 40, "a and b never finished"
        record = driver.step()
        assert record.prefill_req_ids == []
        assert set(record.decode_req_ids) == decoding
        # A KV holder was counted as deferred by its async load's admission already (only a
        # scheduled request leaves the count); a plain one by the stall, where the pin requeues.
        assert_stalled(scheduler, stalled, queue, deferred=holds_kv or STALL_REQUEUES)
        assert h.blocks_held(scheduler, "stalled") == held
