"""Upstream's default `Scheduler` with the backport (vllm-project/vllm#63288).

The full-sequence admission gate admits a request only when its prompt, its
lookahead and its first decode step (1 + num_spec_tokens) fit; with spec
decoding off the only change from vLLM 0.31.0 is the decode step's one token.
Outside the gated call `allocate_slots` is unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import sched_harness as h

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

BLOCK = h.BLOCK_SIZE
# Two usable blocks (32 slots) plus the null block.
NUM_BLOCKS = 3
USABLE_SLOTS = (NUM_BLOCKS - 1) * BLOCK


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def upstream(num_spec_tokens: int | None, **kwargs: Any) -> Scheduler:
    from sched_harness import create_scheduler

    if num_spec_tokens:
        kwargs.update(num_speculative_tokens=num_spec_tokens, speculative_method="ngram")
    scheduler = create_scheduler(block_size=BLOCK, num_blocks=NUM_BLOCKS, max_model_len=256, **kwargs)
    assert type(scheduler).__name__ == "Scheduler"
    return scheduler


def admitted(scheduler: Scheduler, prompt_len: int) -> bool:
    req = h.make_request("r", h.distinct_prompt(1, prompt_len), max_tokens=4)
    scheduler.add_request(req)
    return "r" in scheduler.schedule().num_scheduled_tokens


@pytest.mark.parametrize("num_spec_tokens", [0, 3], ids=["no-spec", "ngram3"])
@pytest.mark.parametrize("prompt_len", range(24, 34))
def test_admits_only_when_prompt_and_first_decode_step_fit(num_spec_tokens: int, prompt_len: int) -> None:
    scheduler = upstream(num_spec_tokens)
    # Upstream's lookahead for ngram is 0: the sequence is the prompt plus
    # the decode step's sampled and draft tokens.
    assert scheduler.num_lookahead_tokens == 0
    expected = prompt_len + 1 + num_spec_tokens <= USABLE_SLOTS
    assert admitted(scheduler, prompt_len) == expected


def test_without_spec_decode_only_the_plus_one_changed() -> None:
    """0.31.0 admitted a prompt iff cdiv(prompt, 16) blocks were free; now
    cdiv(prompt + 1, 16). On a 2-block pool they differ at exactly one
    length: the block-aligned 32-token prompt."""
    differing = [n for n in range(1, 48) if admitted(upstream(None), n) != (cdiv(n, BLOCK) <= NUM_BLOCKS - 1)]
    assert differing == [USABLE_SLOTS]


def gate(scheduler: Scheduler, prompt_len: int, lookahead: int, decode_step: int) -> bool:
    """Whether the scheduler's own KVCacheManager admits a fresh request."""
    req = h.make_request("g", h.distinct_prompt(2, prompt_len), max_tokens=4)
    blocks = scheduler.kv_cache_manager.allocate_slots(
        req,
        prompt_len,
        num_lookahead_tokens=lookahead,
        full_sequence_must_fit=True,
        num_decode_step_tokens=decode_step,
    )
    if blocks is not None:
        scheduler.kv_cache_manager.free(req)
    return blocks is not None


@pytest.mark.parametrize(
    ("prompt_len", "lookahead", "decode_step"),
    [(28, 0, 4), (28, 1, 4), (26, 3, 4), (25, 3, 4), (29, 3, 0), (30, 3, 0)],
)
def test_gate_counts_prompt_plus_lookahead_plus_decode_step(
    prompt_len: int, lookahead: int, decode_step: int
) -> None:
    scheduler = upstream(None)
    expected = prompt_len + lookahead + decode_step <= USABLE_SLOTS
    assert gate(scheduler, prompt_len, lookahead, decode_step) == expected


@pytest.mark.parametrize("decode_step", [0, 4, 40])
def test_ungated_allocation_ignores_the_decode_step(decode_step: int) -> None:
    scheduler = upstream(None)
    req = h.make_request("u", h.distinct_prompt(3, 20), max_tokens=4)
    blocks = scheduler.kv_cache_manager.allocate_slots(
        req, 20, num_lookahead_tokens=3, num_decode_step_tokens=decode_step
    )
    assert blocks is not None
    # 20 + 3 slots: two blocks, whatever the decode step.
    assert len(scheduler.kv_cache_manager.get_blocks("u").blocks[0]) == 2


def test_async_loads_keep_the_separate_reservation() -> None:
    """For an async KV load upstream's scheduler passes no decode step to the
    gate and reserves `_spec_decode_step_blocks()` instead (from 0.31.0; 0.30.0
    reserves only the in-flight prefills' blocks: `upstream_rules`); the
    in-flight reservation helper is unchanged."""
    from tests.v1.core.utils import mock_kv
    from upstream_rules import async_load_reserves_spec_decode_step

    scheduler = upstream(3, use_kv_connector=mock_kv(16, True))
    from tests.v1.core.utils import create_requests

    [request] = create_requests(num_requests=1, num_tokens=32)
    assert scheduler._admission_decode_step_tokens(request, load_kv_async=True) == 0
    assert scheduler._admission_decode_step_tokens(request, load_kv_async=False) == 4
    # Once its KV has landed the request holds its blocks and comes back through
    # the gate: it keeps the count it was admitted with, or it could be stranded.
    request.num_computed_tokens = 16
    assert scheduler._admission_decode_step_tokens(request, load_kv_async=False) == 0
    own_step = cdiv(1 + 3 + 0, BLOCK) if async_load_reserves_spec_decode_step() else 0
    # The hook is given upstream's reservation and, by default, keeps it (the
    # instance's hook wrapped to see what it is given).
    given: list[int] = []
    hook = scheduler._async_load_reserved_blocks
    scheduler._async_load_reserved_blocks = lambda figure: given.append(figure) or hook(figure)
    # A 32-token prompt (16 loaded) is admitted on 2 usable blocks: the gate
    # counts the prompt (2 blocks); the load's own allocation (1 block) fits
    # in free - reserved = 1.
    assert admitted(scheduler, 32) is False  # an async load schedules no tokens
    assert given == [own_step]
    req = scheduler.requests["r"]
    assert req.status.name == "WAITING_FOR_REMOTE_KVS"
