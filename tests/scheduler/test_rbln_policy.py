"""The RBLN scheduler's policy, one bullet at a time (docs/scheduler.md).

Each test drives the real `RBLNScheduler` through vLLM's harness; where the
policy differs from upstream's, the same workload on upstream's `Scheduler`
shows the difference, so the test cannot pass by accident.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import sched_harness as h

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

SPEC = h.NUM_SPEC_TOKENS


request = h.named_request
num_blocks_of = h.blocks_held


def make(rbln: bool = True, **kwargs: Any) -> Scheduler:
    kwargs.setdefault("max_model_len", 512)
    return h.make_scheduler(rbln, **kwargs)


def test_selectable_by_its_qualified_name() -> None:
    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.rbln_scheduler import RBLNScheduler

    config = SchedulerConfig(
        max_model_len=512,
        is_encoder_decoder=False,
        scheduler_cls=h.RBLN_SCHEDULER,
    )
    assert config.get_scheduler_cls() is RBLNScheduler


def test_no_step_mixes_prefill_and_decode() -> None:
    scheduler = make(num_speculative_tokens=SPEC, speculative_method="ngram")
    driver = h.Driver(scheduler)
    for i, (prompt_len, max_tokens) in enumerate([(40, 6), (10, 8), (70, 3)]):
        driver.add(request(f"a{i}", prompt_len, max_tokens))
    for _ in range(4):
        driver.step()
    for i, (prompt_len, max_tokens) in enumerate([(33, 5), (5, 9), (17, 4)]):
        driver.add(request(f"b{i}", prompt_len, max_tokens))
    driver.run(200)
    assert len(driver.finished) == 6
    mixed = [s for s in driver.steps if s.prefill_req_ids and s.decode_req_ids]
    assert mixed == []
    assert all(len(s.prefill_req_ids) <= 1 for s in driver.steps)
    assert max(len(s.decode_req_ids) for s in driver.steps) >= 3
    h.assert_all_blocks_free(scheduler)

    # Upstream's scheduler batches the same workload's prefills with decodes.
    upstream = make(rbln=False, num_speculative_tokens=SPEC, speculative_method="ngram")
    up_driver = h.Driver(upstream)
    for i, (prompt_len, max_tokens) in enumerate([(40, 6), (10, 8), (70, 3)]):
        up_driver.add(request(f"a{i}", prompt_len, max_tokens))
    for _ in range(4):
        up_driver.step()
    for i, (prompt_len, max_tokens) in enumerate([(33, 5), (5, 9), (17, 4)]):
        up_driver.add(request(f"b{i}", prompt_len, max_tokens))
    up_driver.run(200)
    assert any(s.prefill_req_ids and s.decode_req_ids for s in up_driver.steps)


def test_an_admissible_waiting_request_preempts_the_decode_batch() -> None:
    scheduler = make(num_speculative_tokens=SPEC, speculative_method="ngram")
    driver = h.Driver(scheduler)
    driver.add(request("d1", 20, 50))
    driver.add(request("d2", 20, 50))
    while not driver.steps or len(driver.steps[-1].decode_req_ids) < 2:
        driver.step()
    driver.add(request("new", 30, 3))
    record = driver.step()
    assert record.prefill_req_ids == ["new"]
    assert record.decode_req_ids == []
    # The next step has no prefill left to run: the decodes, now three.
    record = driver.step()
    assert sorted(record.decode_req_ids) == ["d1", "d2", "new"]


def test_a_chunked_prefill_in_progress_goes_first() -> None:
    scheduler = make(max_num_batched_tokens=16)
    driver = h.Driver(scheduler)
    driver.add(request("long", 40, 3))  # three chunks: 16 + 16 + 8
    record = driver.step()
    assert record.num_scheduled_tokens == {"long": 16}
    driver.add(request("short", 10, 3))
    kinds = []
    for _ in range(4):
        record = driver.step()
        kinds.append((record.prefill_req_ids, sorted(record.decode_req_ids)))
    assert kinds == [
        (["long"], []),  # chunk 2, ahead of the waiting "short"
        (["long"], []),  # chunk 3 (the last)
        (["short"], []),  # a waiting request that fits, ahead of the decode
        ([], ["long", "short"]),
    ]


@pytest.mark.parametrize(("pipeline_parallel_size", "cap"), [(1, 4), (2, 2)], ids=["pp1", "pp2"])
def test_decode_batch_is_capped_at_max_num_seqs_over_pp(pipeline_parallel_size: int, cap: int) -> None:
    scheduler = make(max_num_seqs=4, pipeline_parallel_size=pipeline_parallel_size)
    assert scheduler.max_num_decode_reqs == cap
    driver = h.Driver(scheduler)
    for i in range(4):
        driver.add(request(f"r{i}", 8, 6))
    driver.run(100)
    assert len(driver.finished) == 4
    decode_steps = [s for s in driver.steps if s.decode_req_ids]
    assert max(len(s.decode_req_ids) for s in decode_steps) == cap
    # Upstream's scheduler decodes all four running requests together.
    upstream = make(rbln=False, max_num_seqs=4)
    up_driver = h.Driver(upstream)
    for i in range(4):
        up_driver.add(request(f"r{i}", 8, 6))
    up_driver.run(100)
    assert max(len(s.decode_req_ids) for s in up_driver.steps) == 4


def test_ngram_lookahead_is_num_spec_tokens() -> None:
    rbln = make(num_speculative_tokens=SPEC, speculative_method="ngram")
    upstream = make(rbln=False, num_speculative_tokens=SPEC, speculative_method="ngram")
    assert rbln.num_lookahead_tokens == SPEC
    assert upstream.num_lookahead_tokens == 0
    for scheduler in (rbln, upstream):
        h.Driver(scheduler).add(request("r", 16, 2))
        scheduler.schedule()
    # The 16-token prefill reserves its 3 lookahead slots: a second block.
    assert num_blocks_of(rbln, "r") == 2
    assert num_blocks_of(upstream, "r") == 1


def test_gate_is_always_on() -> None:
    from sched_harness import create_scheduler

    scheduler = create_scheduler(scheduler_cls=h._rbln_scheduler_cls())
    scheduler.scheduler_config.scheduler_reserve_full_isl = False
    rebuilt = type(scheduler)(
        vllm_config=scheduler.vllm_config,
        kv_cache_config=scheduler.kv_cache_config,
        block_size=h.BLOCK_SIZE,
        structured_output_manager=scheduler.structured_output_manager,
    )
    assert rebuilt.scheduler_reserve_full_isl


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_victim_is_upstreams(policy: str) -> None:
    """Two decodes fill the pool (2 blocks each, 4 usable). The first in the
    running list needs a third block at 26 computed tokens
    (26 + 1 + 3 + 3 = 33 slots): FCFS preempts the last admitted ("late"),
    priority preempts the lowest priority ("low", priority value 1)."""
    scheduler = make(
        num_blocks=5,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
        scheduling_policy=policy,
    )
    driver = h.Driver(scheduler)
    driver.add(request("low", 20, 12, priority=1))
    driver.step()
    driver.add(request("late", 20, 12, priority=0))
    driver.run(60)
    assert driver.finished == {"low", "late"}
    expected_victim = "late" if policy == "fcfs" else "low"
    assert set(driver.preemptions) == {expected_victim}
    h.assert_all_blocks_free(scheduler)


# ---------------------------------------------------------------------------
# With a KV connector.


def test_sync_connector_hit_runs_the_policy() -> None:
    from tests.v1.core.utils import mock_kv

    scheduler = make(
        use_kv_connector=mock_kv(16, False),
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    driver = h.Driver(scheduler)
    driver.add(request("a", 40, 4))
    record = driver.step()
    # 16 tokens came from the connector; the prefill computes the other 24.
    assert record.num_scheduled_tokens == {"a": 24}
    driver.add(request("b", 30, 4))
    driver.run(50)
    assert driver.finished == {"a", "b"}
    assert not [s for s in driver.steps if s.prefill_req_ids and s.decode_req_ids]
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("rbln", [True, False], ids=["rbln", "upstream"])
def test_async_load_admission_counts_the_decode_step(rbln: bool) -> None:
    """A 48-token prompt, 32 tokens loaded asynchronously, 3 usable blocks.

    The RBLN gate counts the load's first decode step: 48 + 1 + 3 = 52
    slots, 4 blocks, so it waits. Upstream's gate counts the prompt (3
    blocks) and reserves the decode step only against the load's first
    allocation (2 blocks + 1 reserved), so it admits a load whose first
    decode step will not fit."""
    from tests.v1.core.utils import mock_kv
    from vllm.v1.request import RequestStatus

    scheduler = make(
        rbln=rbln,
        num_blocks=4,
        use_kv_connector=mock_kv(32, True),
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    req = request("load", 48, 2)
    scheduler.add_request(req)
    scheduler.schedule()
    if rbln:
        assert req.status == RequestStatus.WAITING
        assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 3
    else:
        assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS


def test_async_load_runs_to_completion_when_its_decode_step_fits() -> None:
    """With 4 usable blocks the load is admitted, completes, prefills the
    rest alone and decodes within its 4 blocks, never preempted."""
    from tests.v1.core.utils import mock_kv
    from vllm.v1.request import RequestStatus

    scheduler = make(
        num_blocks=5,
        use_kv_connector=mock_kv(32, True),
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    driver = h.Driver(scheduler)
    req = request("load", 48, 2)
    driver.add(req)
    record = driver.step()
    assert record.num_scheduled_tokens == {}
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    driver.run(20)
    assert driver.finished == {"load"}
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)


def test_async_load_admission_does_not_take_the_decodes_step() -> None:
    """An async load computes nothing when admitted, so the step it is
    admitted in still runs the decode batch."""
    from tests.v1.core.utils import mock_kv
    from vllm.v1.request import RequestStatus

    scheduler = make(
        use_kv_connector=mock_kv(16, True),
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    driver = h.Driver(scheduler, async_load_steps=2)
    for name in ("d1", "d2"):
        driver.add(request(name, 16, 30))
    while not driver.steps or len(driver.steps[-1].decode_req_ids) < 2:
        driver.step()
    load = request("load", 40, 3)
    driver.add(load)
    record = driver.step()
    assert load.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sorted(record.decode_req_ids) == ["d1", "d2"]
    assert record.prefill_req_ids == []
    # Once loaded, the rest of its prompt gets a prefill step of its own.
    while "load" not in {r for s in driver.steps for r in s.prefill_req_ids}:
        record = driver.step()
        assert len(driver.steps) < 40
    assert record.prefill_req_ids == ["load"] and record.decode_req_ids == []
    assert record.num_scheduled_tokens == {"load": 40 - 16}
    driver.run(100)
    assert driver.finished == {"d1", "d2", "load"}
    h.assert_all_blocks_free(scheduler)


def _with_async_scheduling(**kwargs: Any) -> Scheduler:
    """The RBLN scheduler under a config whose async scheduling is on, as
    vLLM resolves it by default (for EAGLE, MTP and draft-model drafters
    too); the harness's config validation refuses async + ngram, so it is
    switched on after validation, where the engine core would find it."""
    from sched_harness import create_scheduler

    rbln = h._rbln_scheduler_cls()

    def factory(*, vllm_config: Any, **scheduler_kwargs: Any) -> Scheduler:
        vllm_config.scheduler_config.async_scheduling = True
        return rbln(vllm_config=vllm_config, **scheduler_kwargs)

    return create_scheduler(scheduler_cls=factory, block_size=h.BLOCK_SIZE, max_model_len=512, **kwargs)  # type: ignore[arg-type]


def test_async_scheduling_with_a_drafter_is_refused() -> None:
    """Risk 5: drafts never reach a `Scheduler` (not `AsyncScheduler`) under
    async scheduling, so spec decoding would silently stop."""
    with pytest.raises(ValueError, match="does not support async scheduling.*--no-async-scheduling"):
        _with_async_scheduling(num_speculative_tokens=SPEC, speculative_method="ngram")


def test_async_scheduling_without_a_drafter_warns(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.WARNING):
        scheduler = _with_async_scheduling()
    assert scheduler.num_spec_tokens == 0
    assert any(
        "not an AsyncScheduler" in record.getMessage() and "--no-async-scheduling" in record.getMessage()
        for record in caplog.records
    )


def _finish_step(scheduler: Scheduler, output: Any) -> None:
    """The model runner's answer to one scheduled step: every request that
    reached the end of its sequence samples one token."""
    req_ids = list(output.num_scheduled_tokens)
    sampled = [
        [h.SAMPLED_TOKEN]
        if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens
        else []
        for r in req_ids
    ]
    scheduler.update_from_output(
        output,
        h.runner_output(req_ids, sampled),
    )


def test_pp_microbatches_split_the_decodes_evenly() -> None:
    """Six decodes at pp 2, max_num_seqs 8 (a hard cap of 4 per microbatch):
    the two microbatches in flight (vLLM's batch queue: a step is scheduled
    before the previous one's output is back) carry 3 + 3, not 4 + 2, and
    stay balanced to the end (issue 21, gap 5a).

    Shown failing first on 0.31.0+rbln.12 (microbatches of 4 and 2)."""
    scheduler = make(max_num_seqs=8, pipeline_parallel_size=2)
    driver = h.Driver(scheduler)
    for i in range(6):
        driver.add(request(f"r{i}", 8, 12))
    while len(scheduler.running) < 6 or any(r.num_output_tokens == 0 for r in scheduler.running):
        driver.step()
        assert len(driver.steps) < 20
    first, second = scheduler.schedule(), scheduler.schedule()
    sizes = [len(first.num_scheduled_tokens), len(second.num_scheduled_tokens)]
    assert sizes == [3, 3], f"microbatches {sizes}"
    in_flight = [first, second]
    batches: list[int] = []
    for _ in range(60):
        if not scheduler.has_requests():
            break
        _finish_step(scheduler, in_flight.pop(0))
        output = scheduler.schedule()
        batches.append(len(output.num_scheduled_tokens))
        in_flight.append(output)
    for output in in_flight:
        _finish_step(scheduler, output)
    assert not scheduler.has_requests()
    # While all six decode, every microbatch carries three of them.
    assert batches[:8] == [3] * 8, f"microbatches {sizes + batches}"
    h.assert_all_blocks_free(scheduler)


def test_a_non_last_pp_stage_gets_the_tokens_it_may_lag_by() -> None:
    """Pipeline parallel 2, synchronous scheduling, ngram k=3 with 2 of 3
    drafts accepted: each cached request's `new_token_ids` start
    `num_spec_tokens` before its computed count (a non-last stage never sees
    the accepted drafts, so its copy lags by up to that many), and end where
    upstream's do, at the tokens it is scheduled beyond its drafts (issue
    21, gap 5b).

    Shown failing first on 0.31.0+rbln.12 (payloads of 1 token, from the
    computed count)."""
    from vllm.v1.outputs import DraftTokenIds

    scheduler = make(
        pipeline_parallel_size=2,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    for i, prompt_len in enumerate((40, 20, 9)):
        scheduler.add_request(request(f"pp{i}", prompt_len, 12))
    widened = 0
    for _ in range(200):
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        cached = output.scheduled_cached_reqs
        assert len(cached.new_token_ids) == len(cached.req_ids)
        for index, req_id in enumerate(cached.req_ids):
            req = scheduler.requests[req_id]
            scheduled = output.num_scheduled_tokens[req_id]
            drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            # num_computed_tokens now includes this step's tokens.
            start = req.num_computed_tokens - scheduled
            expected = list(req.all_token_ids[max(0, start - SPEC) : start + scheduled - drafts])
            assert list(cached.new_token_ids[index]) == expected, req_id
            widened += len(expected) > scheduled - drafts
        req_ids = list(output.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            req = scheduler.requests[req_id]
            if req.num_computed_tokens < req.num_tokens:
                sampled.append([])
                continue
            drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            sampled.append([h.DRAFT_TOKEN] * min(2, drafts) + [h.SAMPLED_TOKEN])
        scheduler.update_from_output(
            output,
            h.runner_output(req_ids, sampled),
        )
        drafting = [r.request_id for r in scheduler.running if not r.is_prefill_chunk]
        if drafting:
            scheduler.update_draft_token_ids(
                DraftTokenIds(req_ids=drafting, draft_token_ids=[[h.DRAFT_TOKEN] * SPEC for _ in drafting])
            )
    assert not scheduler.has_requests()
    assert widened > 10
    h.assert_all_blocks_free(scheduler)
