"""The RBLN scheduler under async scheduling: its async form, `RBLNAsyncScheduler`.

With async scheduling on, vLLM's engine core keeps two batches in flight
(`EngineCore.step_with_batch_queue`) and builds the class
`SchedulerConfig.get_scheduler_cls` picks: for
`scheduler_cls="vllm.v1.core.sched.rbln_scheduler.RBLNScheduler"`, its async form.
These cases drive it as the engine does (the harness's `Driver` with two
batches in flight) and check what the batch queue needs: output placeholders
(a decode whose batch has not come back is scheduled again), no token
scheduled twice or past `max_tokens`, and preemption while the victim's batch
is in flight. vLLM's own `test_async_scheduler.py` runs against it too
(`test_upstream_async_scheduler.py`).
"""

from __future__ import annotations

from typing import Any

import pytest
import sched_harness as h

IN_FLIGHT = 2  # `VllmConfig.max_concurrent_batches` with async scheduling, pp 1


def make(**kwargs: Any) -> Any:
    """The class vLLM picks for the RBLN scheduler with async scheduling on."""
    from sched_harness import create_scheduler

    kwargs.setdefault("block_size", h.BLOCK_SIZE)
    return create_scheduler(scheduler_cls=h.rbln_scheduler_factory(async_scheduling=True), **kwargs)


def run(scheduler: Any, requests: list[Any], max_steps: int = 400) -> h.Driver:
    driver = h.Driver(scheduler, accept=lambda req_id, num_drafts: 1, max_in_flight=IN_FLIGHT)
    for request in requests:
        driver.add(request)
    taken = driver.run(max_steps)
    assert taken < max_steps, f"not finished in {max_steps} steps"
    return driver


def assert_each_token_scheduled_once(driver: h.Driver, requests: list[Any]) -> None:
    """Each request's steps cover its sequence in order: a step starts where the
    last one ended (placeholders included), or from 0 again after a preemption."""
    for request in requests:
        end = None
        for record in driver.steps:
            if request.request_id in record.preempted_req_ids:
                end = None
            if request.request_id not in record.num_scheduled_tokens:
                continue
            start = record.num_computed_before[request.request_id]
            if end is not None:
                assert start == end, (
                    f"{request.request_id} scheduled from {start}, its last step ended at {end}"
                )
            end = start + record.num_scheduled_tokens[request.request_id]


def test_vllm_picks_the_async_form_when_async_scheduling_is_on() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.rbln_scheduler import RBLNAsyncScheduler, RBLNScheduler

    config = h.make_scheduler().scheduler_config
    for named in (h.RBLN_SCHEDULER, RBLNScheduler):
        config.scheduler_cls = named
        config.async_scheduling = True
        assert config.get_scheduler_cls() is RBLNAsyncScheduler
        config.async_scheduling = False
        assert config.get_scheduler_cls() is RBLNScheduler
    assert issubclass(RBLNAsyncScheduler, AsyncScheduler) and issubclass(RBLNAsyncScheduler, RBLNScheduler)
    # A class that names no async form is used as it is.
    config.scheduler_cls = "vllm.v1.core.sched.scheduler.Scheduler"
    config.async_scheduling = True
    assert config.get_scheduler_cls().__name__ == "Scheduler"


def test_a_subclass_keeps_its_own_overrides_under_async_scheduling(caplog: pytest.LogCaptureFixture) -> None:
    """A subclass inherits `async_scheduler_cls`; taking the parent's async form
    would drop the subclass's overrides without a word (hostile review). vLLM
    keeps the named class then, and the sync form, built, says how to give it an
    async form of its own; a subclass that names one gets it."""
    import logging

    from sched_harness import create_scheduler
    from vllm.v1.core.sched.rbln_scheduler import RBLNAsyncScheduler, RBLNScheduler

    class MyPolicy(RBLNScheduler):
        pass

    class MyAsyncPolicy(RBLNAsyncScheduler):
        pass

    class MyNamedPolicy(RBLNScheduler):
        @classmethod
        def async_scheduler_cls(cls) -> type:
            return MyNamedAsyncPolicy

    class MyNamedAsyncPolicy(MyNamedPolicy, RBLNAsyncScheduler):
        pass

    config = h.make_scheduler().scheduler_config
    config.async_scheduling = True
    for named, picked in (
        (MyPolicy, MyPolicy),
        (MyAsyncPolicy, MyAsyncPolicy),
        (MyNamedPolicy, MyNamedAsyncPolicy),
    ):
        config.scheduler_cls = named
        assert config.get_scheduler_cls() is picked

    def built_under_async(**kwargs: Any) -> Any:
        kwargs["vllm_config"].scheduler_config.async_scheduling = True
        return MyPolicy(**kwargs)

    with caplog.at_level(logging.WARNING):
        create_scheduler(scheduler_cls=built_under_async, block_size=h.BLOCK_SIZE)  # type: ignore[arg-type]
    assert any(
        "MyPolicy is not an AsyncScheduler" in r.getMessage() and "async_scheduler_cls" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_a_decode_whose_batch_is_in_flight_is_scheduled_again() -> None:
    scheduler = make()
    assert type(scheduler).__name__ == "RBLNAsyncScheduler"
    requests = [h.named_request(f"r{i}", 16, 8) for i in range(2)]
    for request in requests:
        scheduler.add_request(request)
    first = scheduler.schedule()  # r0's prefill
    second = scheduler.schedule()  # r1's prefill, r0's output not back
    assert list(first.num_scheduled_tokens) == ["r0"] and list(second.num_scheduled_tokens) == ["r1"]
    third = scheduler.schedule()  # both decode before either output came back
    assert third.num_scheduled_tokens == {"r0": 1, "r1": 1}
    assert [r.num_output_placeholders for r in requests] == [2, 2]
    # As the engine runs it: once both decode, every step holds both decodes.
    driver = run(make(), [h.named_request(f"r{i}", 16, 8) for i in range(2)])
    decode_steps = [s for s in driver.steps if s.decode_req_ids]
    assert all(sorted(s.decode_req_ids) == ["r0", "r1"] for s in decode_steps), [
        s.decode_req_ids for s in decode_steps
    ]
    assert len(decode_steps) == 7  # 8 tokens: the first is the prefill's


def test_no_token_is_scheduled_twice_nor_past_max_tokens() -> None:
    requests = [h.named_request(f"r{i}", 20 + 3 * i, 5 + i) for i in range(4)]
    driver = run(make(num_blocks=200), requests)
    assert driver.finished == {r.request_id for r in requests}
    assert_each_token_scheduled_once(driver, requests)
    scheduled = sum(sum(s.num_scheduled_tokens.values()) for s in driver.steps)
    # Every prompt token and every output but the last (it is sampled, never fed back).
    assert scheduled == sum(r.num_prompt_tokens + r.max_tokens - 1 for r in requests)
    assert [r.num_output_tokens for r in requests] == [r.max_tokens for r in requests]
    assert all(r.num_output_placeholders == 0 for r in requests)


def test_preemption_while_the_victims_batch_is_in_flight() -> None:
    # async-pressured of the parity tier: 8 requests of 40 + 24 tokens in 15 usable blocks.
    requests = [h.named_request(f"r{i}", 40, 24) for i in range(8)]
    driver = run(make(num_blocks=16, max_num_batched_tokens=16, max_model_len=512), requests)
    in_flight_victims = [
        victim
        for before, step in zip(driver.steps, driver.steps[1:], strict=False)
        for victim in step.preempted_req_ids
        if victim in before.num_scheduled_tokens
    ]
    assert in_flight_victims, "no request was preempted with its batch in flight: the case tests nothing"
    assert driver.finished == {r.request_id for r in requests}
    assert_each_token_scheduled_once(driver, requests)
    # The stale output of the preempted batch is dropped, never counted twice.
    assert [r.num_output_tokens for r in requests] == [24] * 8
    assert all(r.num_output_placeholders == 0 for r in requests)
    h.assert_all_blocks_free(driver.scheduler)


def test_speculative_decoding_schedules_the_draft_slots() -> None:
    """Drafts stay in the worker under async scheduling; each decode gets
    `num_spec_tokens` placeholder slots and the accepted ones count."""
    scheduler = make(num_speculative_tokens=h.NUM_SPEC_TOKENS, speculative_method="ngram", num_blocks=200)
    requests = [h.named_request(f"r{i}", 16, 12) for i in range(2)]
    driver = run(scheduler, requests)
    decodes = [s for s in driver.steps if s.decode_req_ids]
    assert decodes and all(
        set(s.num_scheduled_tokens.values()) == {1 + h.NUM_SPEC_TOKENS} for s in decodes[:2]
    )
    assert driver.finished == {"r0", "r1"}
    assert [r.num_output_tokens for r in requests] == [12, 12]
    # One draft accepted a step: two tokens a decode step, so fewer steps than tokens.
    assert max(len([s for s in decodes if r.request_id in s.decode_req_ids]) for r in requests) < 11
    h.assert_all_blocks_free(scheduler)


def test_pipeline_parallelism_under_async_scheduling_is_refused() -> None:
    with pytest.raises(
        ValueError, match="RBLNAsyncScheduler does not support pipeline parallelism.*async_scheduling=False"
    ):
        make(pipeline_parallel_size=2)


@pytest.mark.parametrize("max_tokens", [2, 5, 9])
@pytest.mark.parametrize("seed", range(4))
def test_a_finished_request_keeps_the_placeholders_upstreams_async_scheduler_keeps(
    seed: int, max_tokens: int
) -> None:
    """A request that finishes under async scheduling with drafts keeps
    `num_output_placeholders` > 0 (an earlier review's doubt): the slots of its batch
    still in flight, and the drafts cut at its stop. Upstream's `AsyncScheduler` leaves
    the same count on the same schedule (one request: both schedule it alike), and it
    is harmless: the request is freed, no block held, and nothing reads the count of
    a finished request (the oracle checks every step's KV)."""
    import random

    from sched_harness import create_scheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    left: dict[str, int] = {}
    for name, cls in (
        ("rbln", h.rbln_scheduler_factory(async_scheduling=True)),
        ("upstream", AsyncScheduler),
    ):
        scheduler = create_scheduler(
            scheduler_cls=cls,
            block_size=h.BLOCK_SIZE,
            num_blocks=40,
            max_num_batched_tokens=h.BLOCK_SIZE,
            enable_prefix_caching=True,
            num_speculative_tokens=3,
            # The drafter async scheduling allows with drafts (vLLM refuses the CPU "ngram").
            speculative_method="ngram_gpu",
            async_scheduling=True,
        )
        rng = random.Random(seed)
        driver = h.Driver(
            scheduler, accept=lambda req_id, n, rng=rng: rng.randint(0, n), max_in_flight=IN_FLIGHT
        )
        request = h.make_request("r", h.distinct_prompt(seed, 20), max_tokens)
        driver.add(request)
        assert driver.run(100) < 100
        assert driver.finished == {"r"} and request.num_output_tokens == max_tokens
        assert not scheduler.requests
        h.assert_all_blocks_free(scheduler)
        left[name] = request.num_output_placeholders
    assert left["rbln"] == left["upstream"]
