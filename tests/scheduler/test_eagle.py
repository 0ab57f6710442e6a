"""An EAGLE drafter under the RBLN scheduler (issue 14: only ngram was
tested).

vLLM builds an EAGLE `SpeculativeConfig` from the draft model's Hugging Face
config; the `eagle_draft` fixture (conftest.py) writes a tiny Llama
`config.json` (no weights: the scheduler never loads a model) and
`sched_harness.with_eagle` attaches the config to the harness's `VllmConfig`,
as the engine does after resolving it. Upstream's lookahead
for EAGLE is `num_spec_tokens` already (ngram's is 0), so these runs check
the RBLN policy with a lookahead upstream asked for, and the async P/D case
of the design: while an async KV load is in flight the waiting loop
allocates no lookahead slots ("async P/D + EAGLE keeps the lookahead at 0"),
and the RBLN gate still counts them (tests/scheduler/test_async_loads.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sched_harness as h

SPEC = h.NUM_SPEC_TOKENS


def make(eagle_draft: Path, rbln: bool = True, **kwargs: Any) -> Any:
    from sched_harness import create_scheduler

    cls = h._rbln_scheduler_cls() if rbln else None
    kwargs.setdefault("block_size", h.BLOCK_SIZE)
    kwargs.setdefault("max_num_batched_tokens", h.PREFILL_CHUNK)
    kwargs.setdefault("max_model_len", 256)
    return create_scheduler(scheduler_cls=h.with_eagle(cls, eagle_draft), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("rbln", [True, False], ids=["rbln", "upstream"])
def test_eagle_lookahead_is_num_spec_tokens(eagle_draft: Path, rbln: bool) -> None:
    scheduler = make(eagle_draft, rbln)
    assert scheduler.vllm_config.speculative_config.use_eagle()
    assert (scheduler.num_spec_tokens, scheduler.num_lookahead_tokens) == (SPEC, SPEC)


@pytest.mark.parametrize("prompt_len", h.PROMPT_LENS)
def test_eagle_at_the_livelock_geometry(eagle_draft: Path, prompt_len: int) -> None:
    """The matrix's scenario with an EAGLE drafter: two drafting decodes hold
    4 of 6 usable blocks, the prompt arrives with 2 free; it waits for the
    decodes, runs to the end and is never preempted."""
    scheduler = make(eagle_draft, num_blocks=h.LIVELOCK_NUM_BLOCKS)
    driver = h.Driver(scheduler)
    h.start_livelock_decodes(driver)
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == h.FREE_BLOCKS_AT_ADMISSION
    driver.add(h.make_request("prompt", h.distinct_prompt(100 + prompt_len, prompt_len), h.PROMPT_MAX_TOKENS))
    driver.run(h.LIVELOCK_MAX_STEPS)
    assert driver.finished == {"decode-1", "decode-2", "prompt"}
    assert driver.preemptions == {}
    for record in driver.steps:
        assert not (record.prefill_req_ids and record.decode_req_ids)
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("rbln", [True, False], ids=["rbln", "upstream"])
def test_async_load_with_eagle_keeps_the_lookahead_at_zero(eagle_draft: Path, rbln: bool) -> None:
    """Async P/D with EAGLE: a 44-token prompt loads 32 tokens. While the
    load is in flight it holds exactly the loaded tokens' 2 blocks (no
    lookahead slot, which would take a third); once landed it prefills the
    rest with the lookahead and runs to the end."""
    from tests.v1.core.utils import mock_kv

    scheduler = make(eagle_draft, rbln, num_blocks=10, use_kv_connector=mock_kv(32, True))
    driver = h.Driver(scheduler, async_load_steps=3)
    driver.add(h.make_request("r", h.distinct_prompt(5, 44), max_tokens=4))
    manager = scheduler.kv_cache_manager
    held_while_loading = set()
    for _ in range(3):
        driver.step()
        request = scheduler.requests["r"]
        if request.status.name == "WAITING_FOR_REMOTE_KVS":
            held_while_loading.add(len(manager.get_blocks("r").blocks[0]))
    assert held_while_loading == {2}
    driver.run(30)
    assert "r" in driver.finished
    h.assert_all_blocks_free(scheduler)
