"""Drain: hundreds of mixed requests under KV pressure, ngram spec decoding.

300 requests (prompts 1-120 tokens, 1-24 output tokens, arriving in waves)
share a 40-block pool (640 slots, about four average requests' worth) under
the RBLN scheduler, with 3 ngram draft tokens of which the simulated model
accepts a random number. Every request must finish within a step bound,
no step may mix a prefill with decodes, and every block must be free at
the end.
"""

from __future__ import annotations

import random

import sched_harness as h

NUM_REQUESTS = 300
NUM_BLOCKS = 41  # 40 usable
CHUNK = 64
WAVE = 30


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_drain_under_kv_pressure() -> None:
    from sched_harness import create_scheduler

    rng = random.Random(20261130)
    scheduler = create_scheduler(
        scheduler_cls=h._rbln_scheduler_cls(),
        block_size=h.BLOCK_SIZE,
        num_blocks=NUM_BLOCKS,
        max_num_seqs=16,
        max_num_batched_tokens=CHUNK,
        max_model_len=256,
        num_speculative_tokens=h.NUM_SPEC_TOKENS,
        speculative_method="ngram",
        enable_prefix_caching=True,
    )
    driver = h.Driver(scheduler, accept=lambda req_id, num_drafts: rng.randint(0, num_drafts))
    shapes = [(rng.randint(1, 120), rng.randint(1, 24)) for _ in range(NUM_REQUESTS)]
    requests = [
        h.make_request(f"r{i}", h.distinct_prompt(i, p), max_tokens=m) for i, (p, m) in enumerate(shapes)
    ]
    # Serving them one after another, one token per decode step, takes this
    # many steps; batching must not need more, preemptions included.
    step_bound = sum(cdiv(p, CHUNK) + m for p, m in shapes)

    pending = list(requests)
    while pending or scheduler.has_requests():
        for request in pending[:WAVE]:
            driver.add(request)
        pending = pending[WAVE:]
        driver.step()
        assert len(driver.steps) <= step_bound, "the drain did not converge"

    assert driver.finished == {r.request_id for r in requests}
    assert not [s for s in driver.steps if s.prefill_req_ids and s.decode_req_ids]
    assert all(len(s.prefill_req_ids) <= 1 for s in driver.steps)
    # The pool really was under pressure.
    assert min(s.num_free_blocks_after for s in driver.steps) <= 2
    h.assert_all_blocks_free(scheduler)
