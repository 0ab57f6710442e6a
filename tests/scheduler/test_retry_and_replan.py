"""The sub-block retry and the replanned step (issue 14, risk 6 and the
small defects of item 8).

* The retry without the sub-block hit (`_should_retry_admission`) fires only
  in sub-block mode, and at most once per request per step: a hit that ends
  inside a block is otherwise not a sub-block hit (a hybrid model's
  Mamba-aligned hit), and a connector that rebuilds a partial hit would make
  it retry forever.
* A retried admission asks the connector once per step (its lookup metrics
  count once).
* The retry state lives for one step: an aborted request leaves none behind.
* A replanned step is one step: the KV cache manager's `new_step_starts()`
  (which clears Mamba's per-step cache state) and the step counter advance
  once.
* `preemption_warning_threshold` reads `additional_config` only when it is a
  dict (vLLM also allows a platform's own object there; the sub-block
  settings are read from one too, test_sub_block_cache.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import sched_harness as h

BLOCK = h.BLOCK_SIZE


def make(settings: dict[str, Any] | None, **kwargs: Any) -> Any:
    from sched_harness import create_scheduler

    kwargs.setdefault("num_blocks", 20)
    kwargs.setdefault("max_num_batched_tokens", 16)
    kwargs.setdefault("enable_prefix_caching", True)
    return create_scheduler(
        scheduler_cls=h.rbln_scheduler_factory(settings),  # type: ignore[arg-type]
        block_size=BLOCK,
        max_model_len=256,
        **kwargs,
    )


def _request(req_id: str = "r") -> Any:
    return h.make_request(req_id, h.distinct_prompt(1, 40), max_tokens=2, hash_block_size=4)


@pytest.mark.parametrize(
    "settings",
    [None, h.sub_block_settings(None, enabled=False)],
    ids=["chunk-equals-block", "sub-block-off"],
)
def test_no_retry_outside_sub_block_mode(settings: dict[str, Any] | None) -> None:
    """A hit of 20 tokens (not block-aligned) outside sub-block mode is not
    a sub-block hit: no retry."""
    scheduler = make(settings)
    assert scheduler._should_retry_admission(_request(), 20) is False


def test_retry_at_most_once_per_request_per_step() -> None:
    scheduler = make(h.sub_block_settings(4))
    request = _request()
    assert scheduler._should_retry_admission(request, 20) is True
    assert scheduler._should_retry_admission(request, 20) is False
    assert scheduler._should_retry_admission(_request("other"), 20) is True
    scheduler.schedule()
    assert scheduler._should_retry_admission(request, 20) is True


def _cached_prefix_and_b(scheduler: Any, driver: h.Driver) -> list[int]:
    """A 26-token prompt run to the end (cached on sub-block boundaries up to
    24 tokens); returns B's prompt, which shares those 24 tokens."""
    a_prompt = h.distinct_prompt(1, 26)
    driver.add(h.make_request("A", a_prompt, max_tokens=1, hash_block_size=4))
    driver.run(10, until=["A"])
    h.assert_all_blocks_free(scheduler)
    return a_prompt + h.distinct_prompt(2, 14)


def test_a_retried_admission_asks_the_connector_once() -> None:
    """The retry scenario of test_sub_block_cache (3 usable blocks: B's
    sub-block hit fails, the whole-block hit is admitted in the same step),
    with a connector: it is asked once in that step, not once per attempt."""
    from tests.v1.core.utils import mock_kv

    scheduler = make(h.sub_block_settings(4), num_blocks=4, use_kv_connector=mock_kv(0, False))
    driver = h.Driver(scheduler)
    b_prompt = _cached_prefix_and_b(scheduler, driver)
    connector = scheduler.connector
    asked: list[str] = []
    lookup = connector.get_num_new_matched_tokens

    def counting_lookup(request: Any, num_computed_tokens: int) -> Any:
        asked.append(request.request_id)
        return lookup(request, num_computed_tokens)

    connector.get_num_new_matched_tokens = counting_lookup
    driver.add(h.make_request("B", b_prompt, max_tokens=2, hash_block_size=4))
    record = driver.step()
    # The whole-block hit was admitted: the retry happened.
    assert record.prefill_req_ids == ["B"] and record.num_computed_before == {"B": 16}
    assert asked == ["B"]


def test_an_aborted_request_leaves_no_retry_behind() -> None:
    """A request marked for the retry and aborted before its next lookup:
    a new request under the same id keeps its sub-block hit."""
    from vllm.v1.request import RequestStatus

    scheduler = make(h.sub_block_settings(4))
    driver = h.Driver(scheduler)
    b_prompt = _cached_prefix_and_b(scheduler, driver)
    stale = h.make_request("B", b_prompt, max_tokens=2, hash_block_size=4)
    driver.add(stale)
    assert scheduler._should_retry_admission(stale, 24) is True
    scheduler.finish_requests("B", RequestStatus.FINISHED_ABORTED)
    driver.add(h.make_request("B", b_prompt, max_tokens=2, hash_block_size=4))
    record = driver.step()
    assert record.num_computed_before["B"] == 24, record


def test_a_replanned_step_is_one_step() -> None:
    """A waiting request that does not fit makes the RBLN scheduler plan
    each step twice (admission, then decodes); the KV cache manager is told
    of one new step per schedule() call, and the step counter agrees."""
    from sched_harness import create_scheduler

    scheduler = create_scheduler(
        scheduler_cls=h._rbln_scheduler_cls(),  # type: ignore[arg-type]
        block_size=BLOCK,
        num_blocks=5,
        max_num_batched_tokens=16,
        max_model_len=256,
    )
    manager = scheduler.kv_cache_manager
    new_steps: list[int] = []
    step_starts = manager.new_step_starts

    def counting_step_starts() -> None:
        new_steps.append(scheduler.current_step)
        step_starts()

    manager.new_step_starts = counting_step_starts
    driver = h.Driver(scheduler)
    driver.add(h.make_request("old", h.distinct_prompt(1, 40), max_tokens=6))
    driver.run(5)
    driver.add(h.make_request("big", h.distinct_prompt(2, 40), max_tokens=2))
    replanned = 0
    for _ in range(6):
        before = len(new_steps)
        record = driver.step()
        replanned += bool(record.decode_req_ids) and scheduler.waiting and 1
        assert len(new_steps) == before + 1
    assert replanned, "no step was replanned: the test shows nothing"
    assert new_steps == list(range(1, len(driver.steps) + 1))
    assert scheduler.current_step == len(driver.steps)


class _PlatformSettings:
    """A platform's own `additional_config` object (vLLM allows any object
    with `compute_hash`)."""

    def compute_hash(self) -> str:
        return "platform-settings"


def test_warning_threshold_with_a_non_dict_additional_config() -> None:
    from sched_harness import create_scheduler
    from vllm.v1.core.sched.rbln_scheduler import DEFAULT_PREEMPTION_WARNING_THRESHOLD

    rbln = h._rbln_scheduler_cls()

    def factory(*, vllm_config: Any, **kwargs: Any) -> Any:
        vllm_config.additional_config = _PlatformSettings()
        return rbln(vllm_config=vllm_config, **kwargs)

    scheduler = create_scheduler(scheduler_cls=factory, block_size=BLOCK, max_model_len=256)  # type: ignore[arg-type]
    assert scheduler.preemption_warning_threshold == DEFAULT_PREEMPTION_WARNING_THRESHOLD
    assert scheduler.sub_block_cache.enabled is False
