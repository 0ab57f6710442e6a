"""vllm-rbln 0.12.0's `RBLNModelRunner` (adoption patches applied) driven by our RBLN scheduler.

Each workload runs the real scheduler in vLLM's harness and hands every step's output to the
real runner (`runner_harness`): every step is checked there (phase, input ids and positions,
block tables, discard mask, copies and their effect on the KV tensor, bookkeeping); each test
asserts that what it is about happened. Geometry: vllm-rbln's defaults, 32-token blocks and
16-token prefill chunks, so the default sub-block is the chunk (half a block); prefix caching
on, so sub-block caching is on (vllm-rbln's `RBLNConfig` defaults) unless a test says otherwise.
"""

from __future__ import annotations

from typing import Any

import pytest
import runner_harness as rh
import sched_harness as h

SUB = rh.CHUNK  # the default sub-block: the prefill chunk
# The tests with a pipeline peer run on one pytest-xdist worker: one peer serves them all.
with_the_pipeline_peer = pytest.mark.xdist_group("pipeline-peer")


def request(req_id: str, prompt: list[int], max_tokens: int = 3, hash_block_size: int = SUB) -> Any:
    return h.make_request(req_id, prompt, max_tokens=max_tokens, hash_block_size=hash_block_size)


def test_prefill_and_decodes() -> None:
    """Chunked prompts (the chunks that do not reach the end are discarded), then a batch of
    decodes."""
    driver = rh.drive(rh.build())
    for i, n in enumerate((40, 20, 33)):
        driver.add(request(f"r{i}", h.distinct_prompt(i + 1, n), max_tokens=4))
    driver.run(40)
    assert driver.finished == {"r0", "r1", "r2"}
    cov = driver.coverage
    assert cov.prefill_steps >= 4 and cov.decode_steps >= 3, cov
    assert cov.max_decode_batch == 3 and cov.discarded_rows >= 3, cov


def test_sub_block_hits_at_the_default_chunk() -> None:
    """A prompt sharing 48 tokens (a block and a half) with a cached one: a hit that ends inside
    block 1, whose cached half is copied into the request's own block before it writes the rest."""
    driver = rh.drive(rh.build())
    shared = h.distinct_prompt(5, 50)
    driver.add(request("a", shared))
    driver.run(20)
    driver.add(request("b", shared[:48] + h.distinct_prompt(9, 10)))
    driver.run(20)
    assert driver.finished == {"a", "b"}
    assert driver.coverage.copies == 1, driver.coverage
    first_b = next(s for s in driver.steps if "b" in s.num_scheduled_tokens)
    assert first_b.num_computed_before["b"] == 48


def test_sub_block_hits_with_full_attention_next_to_a_sliding_window() -> None:
    """Full attention next to a 16-token sliding window (two KV cache groups, one block pool, a
    KV tensor a layer): a hit that ends inside block 1 brings one copy per group, each made in
    its own group's layer (the adoption patch tags a copy with the group whose new block is its
    destination), and B's window table holds the null block below its window."""
    driver = rh.drive(rh.build(window=16))
    shared = h.distinct_prompt(5, 50)
    driver.add(request("a", shared))
    driver.run(20)
    driver.add(request("b", shared[:48] + h.distinct_prompt(9, 10)))
    driver.run(20)
    assert driver.finished == {"a", "b"}
    assert driver.coverage.copies == 2, driver.coverage
    first_b = next(s for s in driver.steps if "b" in s.num_scheduled_tokens)
    assert first_b.num_computed_before["b"] == 48


def test_preemption_and_resume() -> None:
    """Three decodes outgrow a pool of 6 blocks: preempted requests resume with their whole
    table (`resumed_req_ids`), which the runner's persistent rows take."""
    driver = rh.drive(rh.build(num_blocks=7, prefix_caching=False))
    for i in range(3):
        driver.add(request(f"p{i}", h.distinct_prompt(20 + i, 20), max_tokens=60))
    driver.run(400)
    assert driver.finished == {"p0", "p1", "p2"}
    assert sum(driver.preemptions.values()) >= 1
    assert driver.coverage.resumed >= 1, driver.coverage


def test_a_full_prefix_hit() -> None:
    """A prompt whose every token but the last is cached on a block boundary: admitted with one
    token left, a decode (no copy)."""
    driver = rh.drive(rh.build())
    prompt = h.distinct_prompt(7, 33)
    driver.add(request("a", prompt))
    driver.run(20)
    driver.add(request("again", prompt))
    driver.run(20)
    first = next(s for s in driver.steps if "again" in s.num_scheduled_tokens)
    assert first.num_computed_before["again"] == 32 and first.num_scheduled_tokens["again"] == 1
    assert driver.coverage.copies == 0
    assert driver.finished == {"a", "again"}


def test_ngram_k3() -> None:
    """ngram drafts (k=3, some accepted): each decode row feeds its base token and its drafts;
    bookkeeping keeps the accepted drafts and the bonus token."""
    accepted = {"n0": 0, "n1": 1, "n2": 3}
    built = rh.build(num_speculative_tokens=3, speculative_method="ngram")
    driver = rh.drive(built, accept=lambda req_id, n: accepted[req_id])
    for i in range(3):
        driver.add(request(f"n{i}", h.distinct_prompt(30 + i, 20), max_tokens=12))
    driver.run(60)
    assert driver.finished == {"n0", "n1", "n2"}
    assert driver.coverage.draft_rows >= 6, driver.coverage


def test_a_decode_ready_sub_block_hit_joins_a_decode_batch_with_its_copy() -> None:
    """A full prefix hit that ends on a sub-block boundary inside a block (48 of 49 tokens) is
    a decode-ready admission: it joins the running decode, and its copy comes in that
    multi-request decode step (docs/runner-contract.md, section 2)."""
    driver = rh.drive(rh.build())
    prompt = h.distinct_prompt(5, 50)
    driver.add(request("a", prompt))
    driver.add(request("long", h.distinct_prompt(11, 20), max_tokens=30))
    for _ in range(8):
        driver.step()
    driver.add(request("c", prompt[:49]))
    driver.run(60)
    assert driver.finished == {"a", "c", "long"}
    first = next(s for s in driver.steps if "c" in s.num_scheduled_tokens)
    assert first.num_computed_before["c"] == 48 and set(first.num_scheduled_tokens) == {"c", "long"}
    assert driver.coverage.copies_in_multi_request_steps == 1, driver.coverage


def test_sub_block_8_on_a_cr13() -> None:
    """Sub-blocks of 8 under 16-token chunks on a host whose NPU is a REBEL CR13: vllm-rbln's
    platform says a chunk may cross KV blocks, our scheduler takes the size, and the hit of 40
    tokens (a block and a quarter) is copied."""
    with rh.npu_named("RBLN-CR13"):
        driver = rh.drive(rh.build(rbln_settings={"sub_block_size": 8}))
        shared = h.distinct_prompt(6, 50)
        driver.add(request("a", shared, hash_block_size=8))
        driver.run(20)
        driver.add(request("b", shared[:40] + h.distinct_prompt(12, 9), hash_block_size=8))
        driver.run(20)
    assert driver.finished == {"a", "b"}
    first_b = next(s for s in driver.steps if "b" in s.num_scheduled_tokens)
    assert first_b.num_computed_before["b"] == 40
    assert driver.coverage.copies == 1


@pytest.mark.parametrize(
    ("wrong", "error", "match"),
    [
        # Into the request's first block (A's, shared): the harness's check of the copies.
        ("a block of the request", AssertionError, "the blocks holding the ends of the hits"),
        # Into the block after it, which the step gives no request: the runner cannot tell its
        # KV cache group (the adoption patch's `_kv_cache_copy_ops`) and refuses it.
        ("a block of no request", RuntimeError, "which the step gives no request"),
    ],
)
def test_a_copy_to_a_wrong_block_is_caught(wrong: str, error: type[Exception], match: str) -> None:
    """The checks can fail: the sub-block workload with its copy sent to another block."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

    def wrong_block(output: Any) -> None:
        if output.kv_cache_block_copies:
            (copy,) = output.kv_cache_block_copies
            (new,) = output.scheduled_new_reqs
            dst = new.block_ids[0][0] if wrong == "a block of the request" else copy.dst_block_id + 1
            output.kv_cache_block_copies = [KVCacheBlockCopy(copy.src_block_id, dst)]

    driver = rh.drive(rh.build(), tamper=wrong_block)
    shared = h.distinct_prompt(5, 50)
    driver.add(request("a", shared))
    driver.run(20)
    driver.add(request("b", shared[:48] + h.distinct_prompt(9, 10)))
    with pytest.raises(error, match=match):
        driver.run(20)


def test_pp2_the_last_stage_with_two_batches_in_flight() -> None:
    """Pipeline parallelism 2, two batches in flight (`step_with_batch_queue`): the runner plays
    the last stage (its process group is one process, so it is the first stage too, and builds
    every input from its own bookkeeping); decode steps hold at most max_num_seqs // 2."""
    driver = rh.drive(rh.build(pipeline_parallel_size=2, max_num_seqs=4), max_in_flight=2)
    for i in range(4):
        driver.add(request(f"q{i}", h.distinct_prompt(60 + i, 20), max_tokens=6))
    driver.run(200)
    assert driver.finished == {"q0", "q1", "q2", "q3"}
    assert driver.coverage.max_decode_batch == 2, driver.coverage


def test_pp2_the_last_stage_with_one_batch_in_flight() -> None:
    """Pipeline parallelism 2 with one batch in flight (`step`, as the engine core runs it when
    its batch queue holds one): each step's output comes back before the next is scheduled, so
    every decode step may take all of max_num_seqs."""
    driver = rh.drive(rh.build(pipeline_parallel_size=2, max_num_seqs=4))
    for i in range(4):
        driver.add(request(f"q{i}", h.distinct_prompt(60 + i, 20), max_tokens=6))
    driver.run(200)
    assert driver.finished == {"q0", "q1", "q2", "q3"}
    assert driver.coverage.max_decode_batch >= 2 and driver.coverage.decode_steps >= 5, driver.coverage


def test_a_landed_async_kv_load() -> None:
    """A connector that holds a block of every prompt and loads it asynchronously over two
    steps: the request waits holding its blocks, and when the load lands it comes to the runner
    as a new request whose first 32 tokens are computed, and the runner feeds the rest from
    there. (The harness has no worker side of the connector: vLLM's `has_kv_transfer_group()` is
    false in the runner, as on a worker whose connector moves no data; the runner's connector
    calls are outside this test.)"""
    from tests.v1.core.utils import mock_kv

    built = rh.build(use_kv_connector=mock_kv(32, True), prefix_caching=False)
    driver = rh.drive(built, async_load_steps=2)
    driver.add(request("l", h.distinct_prompt(40, 50), max_tokens=4))
    driver.run(40)
    assert driver.finished == {"l"}
    first = next(s for s in driver.steps if "l" in s.num_scheduled_tokens)
    assert first.num_computed_before["l"] == 32, first
    assert driver.steps.index(first) >= 2, "the load landed before its steps"
    assert driver.coverage.prefill_steps >= 2 and driver.coverage.copies == 0, driver.coverage


@with_the_pipeline_peer
@pytest.mark.parametrize("in_flight", [1, 2])
def test_pp2_a_non_last_stage(in_flight: int) -> None:
    """Pipeline parallelism 2, the runner as the first stage, which is not the last (a peer
    process is the last stage): it takes no sampled tokens and builds each decode's input from the
    tokens the scheduler sends back (`new_token_ids`), which every step checks against the
    request's real tokens."""
    with rh.first_of_two_pipeline_stages():
        built = rh.build(pipeline_parallel_size=2, max_num_seqs=4)
        driver = rh.drive(built, max_in_flight=in_flight)
        for i in range(4):
            driver.add(request(f"q{i}", h.distinct_prompt(70 + i, 20), max_tokens=6))
        driver.run(200)
    assert driver.finished == {"q0", "q1", "q2", "q3"}
    cov = driver.coverage
    assert cov.decode_steps >= 5 and cov.non_last_stage_steps == cov.prefill_steps + cov.decode_steps, cov


@with_the_pipeline_peer
def test_pp2_a_non_last_stage_with_ngram_drafts() -> None:
    """As above with ngram drafts (k=3, some accepted) and two batches in flight: each payload
    the scheduler sends back starts before the computed count by the drafts a verify may have
    accepted (docs/runner-contract.md, section 4), and the runner's input ids still match."""
    accepted = {"d0": 0, "d1": 2, "d2": 3}
    with rh.first_of_two_pipeline_stages():
        built = rh.build(
            pipeline_parallel_size=2, max_num_seqs=4, num_speculative_tokens=3, speculative_method="ngram"
        )
        driver = rh.drive(built, max_in_flight=2, accept=lambda req_id, n: accepted[req_id])
        for i in range(3):
            driver.add(request(f"d{i}", h.distinct_prompt(80 + i, 20), max_tokens=14))
        driver.run(300)
    assert driver.finished == {"d0", "d1", "d2"}
    assert driver.coverage.draft_rows >= 6 and driver.coverage.non_last_stage_steps > 0, driver.coverage


@with_the_pipeline_peer
def test_a_short_payload_to_a_non_last_stage_is_caught() -> None:
    """The checks can fail on a non-last stage: the drafts workload with every payload the
    scheduler sends back cut to its last token (a stage that misses the drafts a verify accepted
    feeds stale tokens)."""

    def last_token_only(output: Any) -> None:
        cached = output.scheduled_cached_reqs
        cached.new_token_ids = [ids[-1:] for ids in cached.new_token_ids]

    accepted = {"d0": 0, "d1": 2, "d2": 3}
    with rh.first_of_two_pipeline_stages():
        built = rh.build(
            pipeline_parallel_size=2, max_num_seqs=4, num_speculative_tokens=3, speculative_method="ngram"
        )
        driver = rh.drive(
            built, max_in_flight=2, accept=lambda req_id, n: accepted[req_id], tamper=last_token_only
        )
        for i in range(3):
            driver.add(request(f"d{i}", h.distinct_prompt(80 + i, 20), max_tokens=14))
        with pytest.raises(AssertionError, match="input ids"):
            driver.run(300)
