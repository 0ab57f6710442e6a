"""Admission leaves the running decodes their next step (issue 21, gap 3).

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
