"""Admission leaves the running decodes their growth until the admitted
request's first decode step (issue 21, gap 3): their next step (one in
flight under PP included), or, with the decode batch full, what they can
still grow to; under the priority policy nothing for a decode the priority
rule preempts first.

The full-sequence gate reserves the admitted request's own sequence through
its first decode step. Before this, it kept nothing back for the running
decodes' next step: a prompt admitted into the blocks a drafting decode
needs next was preempted on the next decode step (FCFS: the last running
request, the prompt itself), and its prefill was wasted. Now the gate
counts those blocks, so the next step never has to preempt what was just
admitted, and the progress guarantee (a lone prefill preempting a decode)
is untouched.

Shown failing first on 0.31.0+rbln.12 (the prompt preempted once, see the
assertion message) and on the series with the patch "Keep the running
decodes' next step out of the RBLN admission gate" reverted.
"""

from __future__ import annotations

import sched_harness as h

SPEC = h.NUM_SPEC_TOKENS


def test_a_prompt_is_not_admitted_into_a_drafting_decodes_next_blocks() -> None:
    """4 usable 16-token blocks, ngram k=3 (lookahead 3). The decode's
    26-token prompt holds 2 blocks (26 + 3 lookahead slots); its next step
    needs 27 + 3 drafts + 3 lookahead = 33 slots, a third block. Two blocks
    are free: a 10-token prompt's gate counts 10 + 1 + 3 + 3 = 17 slots, two
    blocks, so the old gate admitted it into the decode's next block, and
    the prompt's own first decode step then found no block and preempted
    the prompt. Now it waits for the decode to finish."""
    scheduler = h.make_scheduler(
        num_blocks=5,
        max_model_len=256,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    driver = h.Driver(scheduler)
    driver.add(h.named_request("decode", 26, 8))
    driver.step()  # its prefill
    assert h.blocks_held(scheduler, "decode") == 2
    driver.add(h.named_request("prompt", 10, 3))
    driver.run(60)
    assert driver.finished == {"decode", "prompt"}
    assert driver.preemptions == {}, f"preemptions {driver.preemptions}"
    assert driver.reported_preemptions == 0
    h.assert_all_blocks_free(scheduler)


def test_the_prompt_is_admitted_as_soon_as_the_decodes_leave_room() -> None:
    """A roomy pool: the decodes' next step leaves the prompt room, so it
    is admitted at once, in the step after it arrives, as before."""
    scheduler = h.make_scheduler(
        num_blocks=12,
        max_model_len=256,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    driver = h.Driver(scheduler)
    driver.add(h.named_request("decode", 26, 8))
    driver.step()
    driver.add(h.named_request("prompt", 10, 3))
    record = driver.step()
    assert record.prefill_req_ids == ["prompt"]
    driver.run(60)
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)


def test_under_pp_the_gate_leaves_an_in_flight_decode_its_next_step() -> None:
    """Pipeline parallel 2 (vLLM's batch queue: two batches in flight), 4
    usable blocks, ngram k=3, no draft accepted. The decode's 25-token
    prompt holds 2 blocks; its first decode step, in flight, has advanced
    its computed count to 25 + 1 + 3 = 29 and holds 29 + 3 lookahead = 32
    slots. The step after it needs 26 + 1 + 3 + 3 = 33 slots, a third
    block. A 10-token prompt (its gate: 10 + 1 + 3 + 3 = 17 slots, 2
    blocks) arriving while that step is in flight must wait: reckoned from
    the advanced computed count the decode's next step looked free, the
    prompt was admitted into the decode's third block and preempted when
    the decode's output came back.

    Shown failing first on the series without this fix (the reserve
    reckoned from `num_tokens`): preemptions {'prompt': 1}."""
    scheduler = h.make_scheduler(
        num_blocks=5,
        max_model_len=256,
        max_num_seqs=4,
        pipeline_parallel_size=2,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    driver = h.Driver(scheduler, max_in_flight=2)
    driver.add(h.named_request("decode", 25, 8))
    # Until the decode's first decode step is in flight.
    while not any("decode" in record.decode_req_ids for record in driver.steps):
        driver.step_with_batch_queue()
        assert len(driver.steps) < 10, "the decode did not start"
    decode = scheduler.requests["decode"]
    assert decode.num_computed_tokens == 25 + 1 + SPEC, "its decode step is not in flight"
    assert h.blocks_held(scheduler, "decode") == 2
    driver.add(h.named_request("prompt", 10, 3))
    driver.run(80)
    assert driver.finished == {"decode", "prompt"}
    assert driver.preemptions == {}, f"preemptions {driver.preemptions}"
    h.assert_all_blocks_free(scheduler)


def test_under_priority_a_lower_priority_decodes_growth_keeps_nothing_back() -> None:
    """The priority policy, 4 usable blocks, ngram k=3: the decode (priority
    5) holds 2 blocks and needs a third for its next step. An urgent
    10-token prompt (priority 0, 2 blocks at the gate) is admitted at once:
    when the decode cannot get its block, the priority rule preempts the
    decode, not the prompt, so the reserve keeps nothing back for it. A
    prompt of the decode's own priority still waits (it would be the
    victim).

    Shown failing first on the series without this fix (the reserve
    counting every decode): the step after the urgent prompt arrived went
    to the decode."""
    for priority, admitted_at_once in ((0, True), (5, False)):
        scheduler = h.make_scheduler(
            num_blocks=5,
            max_model_len=256,
            num_speculative_tokens=SPEC,
            speculative_method="ngram",
            scheduling_policy="priority",
        )
        driver = h.Driver(scheduler)
        driver.add(h.named_request("decode", 26, 8, priority=5))
        driver.step()  # its prefill
        assert h.blocks_held(scheduler, "decode") == 2
        driver.add(h.named_request("prompt", 10, 3, priority=priority))
        record = driver.step()
        assert (record.prefill_req_ids == ["prompt"]) is admitted_at_once, (priority, record)
        driver.run(60)
        assert driver.finished == {"decode", "prompt"}
        assert "prompt" not in driver.preemptions, (priority, driver.preemptions)
        if admitted_at_once:
            # The decode made room for the urgent prompt by the priority rule.
            assert driver.preemptions == {"decode": 1}, driver.preemptions
        else:
            assert driver.preemptions == {}, driver.preemptions
        h.assert_all_blocks_free(scheduler)


def _full_decode_batch(num_blocks: int) -> h.Driver:
    """ngram k=3, no draft accepted, a token budget of 16: a decode step
    runs 4 decodes (4 tokens each). Six 24-token prompts generating 24
    tokens arrive at once (the parity workload ngram-k3-pressured); each
    grows from 2 blocks to 4 (its last step: 24 + 23 + 3 drafts + 3
    lookahead = 53 slots)."""
    scheduler = h.make_scheduler(
        num_blocks=num_blocks,
        max_model_len=256,
        max_num_batched_tokens=16,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
    )
    driver = h.Driver(scheduler)
    for i in range(6):
        driver.add(h.named_request(f"req-{i}", 24, 24))
    return driver


def _first_decode_step(driver: h.Driver, req_id: str) -> int | None:
    return next((i for i, s in enumerate(driver.steps) if req_id in s.decode_req_ids), None)


def test_no_prompt_is_admitted_behind_a_full_decode_batch_into_its_growth() -> None:
    """12 usable blocks. The four decodes the budget holds take 8 blocks
    and still fit their next step when a fifth prompt could be admitted
    into the 4 free blocks; but it would not decode (the batch is full)
    until one of them finished, and two steps later they outgrow their
    second blocks: the fifth and sixth prompts, admitted into the blocks
    the decodes grow into, were preempted before their first decode step.
    Now they wait for the batch to make room. The one preemption left is
    the fourth decode's, at its fourth block (4 x 4 blocks > 12), as in
    vllm-rbln 0.12.0.

    Shown failing first on the series with the gate reserving the running
    decodes' next step only (3 preemptions: req-4 and req-5 before their
    first decode step, then req-3)."""
    driver = _full_decode_batch(num_blocks=13)
    driver.run(400)
    assert len(driver.finished) == 6
    for req_id in driver.preemptions:
        preempted_at = next(i for i, s in enumerate(driver.steps) if req_id in s.preempted_req_ids)
        first_decode = _first_decode_step(driver, req_id)
        assert first_decode is not None and first_decode < preempted_at, (
            f"{req_id} preempted before its first decode step: {driver.preemptions}"
        )
    assert driver.preemptions == {"req-3": 1}, driver.preemptions
    h.assert_all_blocks_free(driver.scheduler)


def test_behind_a_full_decode_batch_a_prompt_is_admitted_when_the_pool_holds_their_growth() -> None:
    """The same workload in 24 usable blocks: the four decodes' growth to
    their last step (16 blocks) leaves the fifth prompt its 2, so it is
    admitted at once, behind the full batch, as before (its first token
    comes with its prefill), and nothing is preempted."""
    driver = _full_decode_batch(num_blocks=25)
    driver.run(400)
    assert len(driver.finished) == 6
    assert driver.preemptions == {}, driver.preemptions
    # req-4's prefill follows req-3's at once (steps 8 and 9), before any decode.
    assert driver.steps[8].prefill_req_ids == ["req-4"]
    h.assert_all_blocks_free(driver.scheduler)


def test_a_running_prompts_one_token_last_chunk_keeps_its_next_block() -> None:
    """4 usable 16-token blocks, chunks of 16. A 33-token prompt has run its
    two chunks (32 tokens, 2 blocks): its last token is a decode's input and
    runs with the next decode step (patch "Let a running prompt's one-token
    last chunk join the decode batch"), where it needs a third block. A
    20-token prompt arriving then (its gate: 20 + 1 = 21 slots, 2 blocks)
    must not be admitted into that block: its first decode step would find
    the pool empty and preempt it (FCFS: the last running), its prefill
    wasted. It waits for room instead.

    Shown failing first on the series with the join and the reserve
    counting only requests past their prompt (`is_prefill_chunk`):
    preemptions {'prompt': 1}."""
    scheduler = h.make_scheduler(num_blocks=5, max_model_len=256, max_num_batched_tokens=16)
    driver = h.Driver(scheduler)
    driver.add(h.named_request("chunked", 33, 4))
    assert driver.step().prefill_req_ids == ["chunked"]
    assert driver.step().prefill_req_ids == ["chunked"]
    assert h.blocks_held(scheduler, "chunked") == 2
    driver.add(h.named_request("prompt", 20, 3))
    record = driver.step()
    # The last token runs as a decode; the prompt waits.
    assert record.decode_req_ids == ["chunked"] and record.prefill_req_ids == [], record
    driver.run(60)
    assert driver.finished == {"chunked", "prompt"}
    assert driver.preemptions == {}, f"preemptions {driver.preemptions}"
    h.assert_all_blocks_free(scheduler)
