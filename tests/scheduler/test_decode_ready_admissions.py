"""A decode-ready admission joins the decode batch (issue 21, gap 2).

Some waiting requests have only their last token left to compute: on a P/D
decode instance every request arrives with its prompt's KV loaded remotely,
and a full prefix-cache hit leaves one token. Such a request runs as a
decode: it joins the running decodes' step, within the decode batch cap and
through the admission gate, instead of taking a step alone while the decodes
wait. A prefill never shares a step with decodes.

Shown failing first on the series without the patch "Let a decode-ready
admission join the decode batch" (0.31.0+rbln.12): every new request there
took a step of its own, so the P/D decode side spent 1.318 steps per output
token... (see each test's numbers in its assertion message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import sched_harness as h

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

# The P/D decode side: the remote store holds every prompt but its last
# token, so a landed request has one token left.
WHOLE_PROMPT = 10**6


def steps_per_output_token(driver: h.Driver, req_id: str, num_output_tokens: int) -> float:
    """Steps from the request's first scheduled step to its last, inclusive,
    per output token: 1.0 when it emits a token in every step it is in
    flight."""
    scheduled = [i for i, step in enumerate(driver.steps) if req_id in step.num_scheduled_tokens]
    return (scheduled[-1] - scheduled[0] + 1) / num_output_tokens


def pd_decode_side(max_num_seqs: int = 16, **kwargs: Any) -> Scheduler:
    return h.prefix_hit_connector_scheduler(
        WHOLE_PROMPT, True, max_num_seqs=max_num_seqs, max_model_len=512, **kwargs
    )


def test_pd_decode_side_runs_every_landed_request_with_the_decodes() -> None:
    """Eight requests arrive one per step, each with its prompt's KV loaded
    remotely (one step), and decode 8 tokens: each emits a token in every
    step from its first to its last, and no step runs a landed request
    without the running decodes."""
    scheduler = pd_decode_side()
    driver = h.Driver(scheduler, async_load_steps=1)
    num_output = 8
    names = [f"r{i}" for i in range(8)]
    for name in names:
        driver.add(h.named_request(name, 40 + 3 * len(driver.steps), num_output))
        driver.step()
    driver.run(200)
    assert driver.finished == set(names)
    ratios = {name: steps_per_output_token(driver, name, num_output) for name in names}
    total = sum(ratios.values()) / len(ratios)
    assert ratios == dict.fromkeys(names, 1.0), f"steps per output token {total:.3f}: {ratios}"
    for step in driver.steps:
        assert not step.prefill_req_ids, "a landed request ran as a prefill"
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)


def test_landed_requests_with_nothing_running_share_one_step() -> None:
    scheduler = pd_decode_side()
    driver = h.Driver(scheduler, async_load_steps=1)
    for i in range(3):
        driver.add(h.named_request(f"r{i}", 33, 4))
    record = driver.step()  # the three loads are admitted; nothing computes
    assert record.num_scheduled_tokens == {}
    record = driver.step()
    assert sorted(record.decode_req_ids) == ["r0", "r1", "r2"]
    assert record.prefill_req_ids == []


def test_landed_requests_join_within_the_decode_batch_cap() -> None:
    """max_num_seqs 4 at pp 2: two decodes a step. Three landed requests: the
    first two share a step, the third waits for a slot (never a step of its
    own beside waiting decodes, never above the cap)."""
    scheduler = pd_decode_side(max_num_seqs=4, pipeline_parallel_size=2)
    driver = h.Driver(scheduler, async_load_steps=1)
    for i in range(3):
        driver.add(h.named_request(f"r{i}", 33, 3))
    driver.run(50)
    assert driver.finished == {"r0", "r1", "r2"}
    assert max(len(step.num_scheduled_tokens) for step in driver.steps) == 2
    assert driver.steps[1].decode_req_ids == ["r0", "r1"]


def test_full_prefix_hits_join_the_decode_batch() -> None:
    """A 33-token prompt, then three requests with the same prompt while it
    decodes: each hits its two cached blocks (32 tokens), has one token left
    and joins the decodes in its first step."""
    scheduler = h.make_scheduler(enable_prefix_caching=True, max_model_len=512)
    driver = h.Driver(scheduler)
    prompt = h.distinct_prompt(5, 33)
    driver.add(h.make_request("a", prompt, 10))
    driver.step()  # a's prefill
    for name in ("b", "c", "d"):
        driver.add(h.make_request(name, prompt, 6))
        record = driver.step()
        assert record.num_computed_before[name] == 32
        assert name in record.decode_req_ids
        assert "a" in record.decode_req_ids, f"{name}'s admission took a's step"
    driver.run(50)
    assert driver.finished == {"a", "b", "c", "d"}
    for name in ("b", "c", "d"):
        assert steps_per_output_token(driver, name, 6) == 1.0
    h.assert_all_blocks_free(scheduler)


def test_a_one_token_prompt_is_decode_ready_with_nothing_computed() -> None:
    """A one-token prompt with no prefix hit has nothing in the KV cache before
    its only token: 0 computed of 1, all but the last, which is a decode's
    input by the runner contract's phase rule (docs/runner-contract.md, 1) and
    by vllm-rbln 0.12.0's `is_prefill` (0 < 1 - 1 is false). It joins the
    running decode's step, and takes its token every step to the end.

    Checked for the review's question whether counting it decode-ready is
    wrong (it is not: a step of its own would be a decode step by the same
    rule). Shown failing against the join patch's hook made upstream's no-op
    (`_should_admit_waiting` always True: the prompt took a step alone)."""
    scheduler = h.make_scheduler(max_model_len=512)
    driver = h.Driver(scheduler)
    driver.add(h.named_request("a", 20, 10))
    driver.step()  # a's prefill
    driver.add(h.make_request("one", [7], 4))
    record = driver.step()
    assert record.num_computed_before == {"a": 20, "one": 0}
    assert sorted(record.decode_req_ids) == ["a", "one"] and record.prefill_req_ids == []
    driver.run(50)
    assert driver.finished == {"a", "one"}
    assert steps_per_output_token(driver, "one", 4) == 1.0
    h.assert_all_blocks_free(scheduler)


def test_a_chunked_prompts_one_token_last_chunk_joins_the_decode_batch() -> None:
    """A 33-token prompt in 16-token chunks: 16 and 16 run alone, and the last
    token, a decode's input (every token but the last in the KV cache), runs
    in the running decode's step, as a decode-ready admission does; a full
    prefix hit of that prompt arriving then joins the same step.

    Shown failing first on the series without the patch "Let a running
    prompt's one-token last chunk join the decode batch" (the last token took
    a step of its own, the decode and the hit waiting)."""
    scheduler = h.make_scheduler(enable_prefix_caching=True, max_model_len=512, max_num_batched_tokens=16)
    driver = h.Driver(scheduler)
    driver.add(h.named_request("d", 10, 20))
    driver.step()  # d's prefill
    prompt = h.distinct_prompt(12, 33)
    driver.add(h.make_request("chunked", prompt, 4))
    assert driver.step().prefill_req_ids == ["chunked"]
    assert driver.step().prefill_req_ids == ["chunked"]
    driver.add(h.make_request("hit", prompt, 4))
    record = driver.step()
    assert record.num_computed_before == {"d": 10, "chunked": 32, "hit": 32}
    assert sorted(record.decode_req_ids) == ["chunked", "d", "hit"] and record.prefill_req_ids == []
    driver.run(50)
    assert driver.finished == {"d", "chunked", "hit"}
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)


def test_a_prefill_behind_a_decode_ready_request_gets_the_next_step_alone() -> None:
    scheduler = h.make_scheduler(enable_prefix_caching=True, max_model_len=512)
    driver = h.Driver(scheduler)
    prompt = h.distinct_prompt(6, 33)
    driver.add(h.make_request("a", prompt, 10))
    driver.step()
    driver.add(h.make_request("hit", prompt, 4))
    driver.add(h.named_request("new", 30, 4))
    record = driver.step()
    assert sorted(record.decode_req_ids) == ["a", "hit"] and record.prefill_req_ids == []
    record = driver.step()
    assert record.prefill_req_ids == ["new"] and record.decode_req_ids == []


def test_the_gate_still_applies_to_a_decode_ready_admission() -> None:
    """P/D decode side, ngram k=3 (lookahead 3), 8 usable blocks. Two decodes
    run, f (10 tokens) and e (20, 14 to generate). x (42 tokens) arrives at
    step 7; its remote load is admitted into 3 of the 4 free blocks (its gate
    counted the fourth: 42 + 4 + 3 = 49 tokens) and lands. In step 8 e's next
    token takes the last free block. x's decode step (41 computed + 4 + 3 =
    48 slots) fits in the 3 blocks it holds, but its full sequence through
    the first decode step does not: the admission gate keeps it waiting, and
    f and e decode without it, every step until e finishes. Then x joins f's
    decode batch (not a step of its own), and nothing is ever preempted.

    Without the gate (`scheduler_reserve_full_isl` off) x joins in step 8 and
    is preempted in step 9. Shown failing first against the join patch's hook
    made upstream's no-op (`_should_admit_waiting` always True: x took step
    8 alone, admitted before e's token took the block, while f and e
    waited), and with the gate off (x joined in step 8). The test it
    replaces passed without the join patch: its request was stopped by the
    async-load admission, never reaching a decode-ready admission."""
    from vllm.v1.request import RequestStatus

    scheduler = pd_decode_side(
        num_blocks=9, num_speculative_tokens=h.NUM_SPEC_TOKENS, speculative_method="ngram"
    )
    driver = h.Driver(scheduler, async_load_steps=1)
    driver.add(h.named_request("f", 10, 40))
    driver.add(h.named_request("e", 20, 14))
    for _ in range(7):
        driver.step()
    driver.add(h.named_request("x", 42, 3))
    record = driver.step()
    assert scheduler.requests["x"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert h.blocks_held(scheduler, "x") == 3 and record.num_free_blocks_after == 1
    refused = 0
    while "e" not in driver.finished:
        record = driver.step()
        assert sorted(record.decode_req_ids) == ["e", "f"], record
        assert scheduler.requests["x"].num_computed_tokens == 41
        refused += 1
    assert refused >= 5
    record = driver.step()
    assert sorted(record.decode_req_ids) == ["f", "x"]
    driver.run(60)
    assert driver.finished == {"e", "f", "x"}
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)


def _start_decodes_at_pp2(driver: h.Driver, names: tuple[str, ...]) -> None:
    """Step the batch queue until every named request has sampled a token."""
    scheduler = driver.scheduler
    while any(scheduler.requests[name].num_output_tokens == 0 for name in names):
        driver.step_with_batch_queue()
        assert len(driver.steps) < 40


def test_a_full_prefix_hit_counts_in_the_pp_decode_demand() -> None:
    """pp 2, max_num_seqs 8 (4 a microbatch): two decodes, a and b, run one a
    microbatch (their demand, 2, over pp). A request with a's prompt arrives
    (a full prefix hit: one token left) and is decode demand too: it joins a
    microbatch at once (ceil(3 / 2) = 2: a or b with it), and finishes its 4
    tokens long before a and b, not waiting behind a cap of 1 that a and b
    fill every step until one of them finishes (issue 21, gap 5a's demand).

    Shown failing first on 0.31.0+rbln.15 (the demand without it: arrived
    before step 3, first scheduled in step 80, once a had finished)."""
    scheduler = h.make_scheduler(
        enable_prefix_caching=True, max_model_len=512, max_num_seqs=8, pipeline_parallel_size=2
    )
    driver = h.Driver(scheduler, max_in_flight=2)
    prompt = h.distinct_prompt(11, 33)
    driver.add(h.make_request("a", prompt, 40))
    driver.add(h.named_request("b", 20, 40))
    _start_decodes_at_pp2(driver, ("a", "b"))
    arrival = len(driver.steps)
    driver.add(h.make_request("hit", prompt, 4))
    driver.run(300)
    assert driver.finished == {"a", "b", "hit"}
    scheduled = [i for i, step in enumerate(driver.steps) if "hit" in step.num_scheduled_tokens]
    first = driver.steps[scheduled[0]]
    assert first.num_computed_before["hit"] == 32
    assert scheduled[0] - arrival <= 1, f"arrived before step {arrival}, first scheduled {scheduled[0]}"
    assert "hit" in first.decode_req_ids and len(first.decode_req_ids) == 2
    assert max(len(step.num_scheduled_tokens) for step in driver.steps) <= 2
    h.assert_all_blocks_free(scheduler)


def test_full_prefix_hits_join_past_the_pp_share_up_to_the_hard_cap() -> None:
    """pp 2, max_num_seqs 8 (a hard cap of 4 a microbatch): four decodes run
    two a microbatch (their demand, 4, over pp). Two full prefix hits arrive
    at once: both join the next microbatch (2 + 2, the hard cap), not one of
    them held a round by the share (ceil(6 / 2) = 3) for the other
    microbatch. The running decodes keep the share, so the round after is
    balanced again (3 + 3).

    Shown failing first on the series whose decode-ready admissions met the
    share (the second hit scheduled a step later)."""
    scheduler = h.make_scheduler(
        enable_prefix_caching=True, max_model_len=512, max_num_seqs=8, pipeline_parallel_size=2
    )
    driver = h.Driver(scheduler, max_in_flight=2)
    prompt = h.distinct_prompt(11, 33)
    driver.add(h.make_request("a", prompt, 40))
    for name in ("b", "c", "d"):
        driver.add(h.named_request(name, 20, 40))
    _start_decodes_at_pp2(driver, ("a", "b", "c", "d"))
    arrival = len(driver.steps)
    for name in ("hit-0", "hit-1"):
        driver.add(h.make_request(name, prompt, 4))
    driver.run(300)
    assert driver.finished == {"a", "b", "c", "d", "hit-0", "hit-1"}
    after = [step for step in driver.steps[arrival:] if step.num_scheduled_tokens]
    first = after[0]
    assert first.num_computed_before.get("hit-0") == 32 and first.num_computed_before.get("hit-1") == 32, (
        first
    )
    assert {"hit-0", "hit-1"} <= set(first.decode_req_ids), first
    assert len(first.decode_req_ids) == 4 and first.prefill_req_ids == []
    assert [len(step.decode_req_ids) for step in after[1:4]] == [2, 3, 3], after[1:4]
    assert max(len(step.num_scheduled_tokens) for step in driver.steps) <= 4
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("pipeline_parallel_size", [1, 2], ids=["pp1", "pp2-batch-full"])
def test_an_arrival_behind_a_landed_request_starts_its_load_in_the_same_step(
    pipeline_parallel_size: int,
) -> None:
    """P/D decode side: a request whose remote KV has landed joins the
    decodes' step, and a request that arrived behind it starts its own remote
    load in that step (its admission computes nothing, so it does not take a
    place in the batch), not a step later. At pp 2 (max_num_seqs 4, vLLM's
    batch queue) the landed request is its microbatch's only decode (the
    running decode is in flight in the other); the load starts all the
    same.

    Shown failing first on 0.31.0+rbln.15, whose decode-step waiting pass
    admitted decode-ready requests only (the load started a step later)."""
    from vllm.v1.request import RequestStatus

    scheduler = pd_decode_side(max_num_seqs=4, pipeline_parallel_size=pipeline_parallel_size)
    driver = h.Driver(scheduler, async_load_steps=2, max_in_flight=pipeline_parallel_size)

    def step() -> h.StepRecord:
        while True:
            record = driver.step() if pipeline_parallel_size == 1 else driver.step_with_batch_queue()
            if record is not None:
                return record

    driver.add(h.named_request("d", 33, 40))
    while "d" not in step().decode_req_ids:
        pass
    driver.add(h.named_request("landed", 30, 4))
    while "landed" not in scheduler.finished_recving_kv_req_ids:
        step()
    driver.add(h.named_request("new", 30, 4))
    record = step()
    if pipeline_parallel_size == 1:
        assert sorted(record.decode_req_ids) == ["d", "landed"]
    else:
        assert record.decode_req_ids == ["landed"]
    assert scheduler.requests["new"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    driver.run(200)
    assert driver.finished == {"d", "landed", "new"}
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)
