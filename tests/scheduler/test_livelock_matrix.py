"""The admission-livelock regression matrix (docs/livelock.md).

A prompt arrives while two drafting decodes hold all but two blocks of the
pool. Block size 16, 3 ngram spec tokens (the RBLN scheduler raises the
lookahead to 3), prefill chunks of 16 tokens. The 32-token prompt needs a
third block for its last chunk (32 + 3 = 35 slots); the 26-token prompt fits
its prefill with the lookahead (26 + 3 = 29) but its first decode step needs
26 + 1 + 3 + 3 = 33 slots. With the fix, neither is admitted until the
decodes have freed their blocks; then each finishes without ever being
preempted, and every block is free at the end.
"""

from __future__ import annotations

import pytest
import sched_harness as h


@pytest.mark.parametrize("case", h.LIVELOCK_CASES, ids=lambda case: case.id)
def test_livelock_case_finishes_without_preemption(case: h.LivelockCase) -> None:
    outcome = h.run_livelock_case(case)
    assert outcome.free_blocks_at_admission == h.FREE_BLOCKS_AT_ADMISSION
    assert outcome.finished, f"{case.id}: not finished in {outcome.steps} steps"
    assert outcome.preemptions == 0, f"{case.id}: preempted {outcome.preemptions}x"
    assert outcome.all_blocks_free, f"{case.id}: blocks leaked"


@pytest.mark.parametrize("case", h.EXTRA_LIVELOCK_CASES, ids=lambda case: case.id)
def test_extra_livelock_case_finishes_without_preemption(case: h.LivelockCase) -> None:
    """Beyond the design's 12: whole-block prefix caching with sub-block
    caching off, and a connector that holds the first block of every prompt
    (loaded sync or async), with every caching mode."""
    test_livelock_case_finishes_without_preemption(case)


@pytest.mark.parametrize("prompt_len", h.PROMPT_LENS)
def test_prompt_waits_for_the_decodes_to_free_blocks(prompt_len: int) -> None:
    """The mechanism: the gate refuses the prompt while only two blocks are
    free (it needs three), so the decodes keep running; the prompt's prefill
    starts only after a decode finished and freed its blocks."""
    case = h.LivelockCase(prompt_len, None, kv_connector=False)
    scheduler = h.make_livelock_scheduler(case)
    driver = h.Driver(scheduler)
    for i in (1, 2):
        driver.add(
            h.make_request(
                f"decode-{i}",
                h.distinct_prompt(i, h.DECODE_PROMPT_LEN),
                max_tokens=h.DECODE_MAX_TOKENS,
            )
        )
    while not driver.steps or not driver.steps[-1].decode_req_ids:
        driver.step()
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 2
    driver.add(h.make_request("prompt", h.distinct_prompt(100 + prompt_len, prompt_len), max_tokens=4))
    first_prefill = None
    while "prompt" not in driver.finished:
        record = driver.step()
        if "prompt" in record.prefill_req_ids and first_prefill is None:
            first_prefill = len(driver.steps) - 1
            assert {"decode-1", "decode-2"} <= driver.finished
        if first_prefill is None:
            assert sorted(record.decode_req_ids) == ["decode-1", "decode-2"]
        assert len(driver.steps) < h.LIVELOCK_MAX_STEPS
    assert first_prefill is not None
