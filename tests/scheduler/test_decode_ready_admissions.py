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
    """Two blocks free: a decode-ready request whose prompt, decode step and
    lookahead need three more blocks is not admitted (the gate), and the
    decodes still run; it joins once a decode has finished."""
    scheduler = pd_decode_side(
        num_blocks=6, num_speculative_tokens=h.NUM_SPEC_TOKENS, speculative_method="ngram"
    )
    driver = h.Driver(scheduler, async_load_steps=1)
    driver.add(h.named_request("d", 20, 6))
    while not driver.steps or not driver.steps[-1].decode_req_ids:
        driver.step()
    driver.add(h.named_request("big", 60, 3))
    record = driver.step()
    assert record.decode_req_ids == ["d"]
    assert "big" not in record.num_scheduled_tokens
    driver.run(60)
    assert driver.finished == {"d", "big"}
    assert driver.preemptions == {}
    h.assert_all_blocks_free(scheduler)
