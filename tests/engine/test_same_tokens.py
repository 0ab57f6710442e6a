"""Case 1: greedy outputs are identical, request by request, whatever the scheduler does.

The reference is upstream's ``Scheduler`` with no spec decode and no prefix caching. The
RBLN scheduler with ngram drafts (3 tokens), and with prefix caching plus sub-block caching
on top, must produce the same tokens, both with a roomy KV pool and with one so small that
requests are preempted (and the preemptions are counted, not assumed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_kit import (
    COUNTING,
    COUNTING_UPSTREAM,
    NGRAM,
    Outcome,
    assert_same_tokens,
    prompts_with_shared_prefixes,
    run,
)

PROMPTS = prompts_with_shared_prefixes(seed=1, count=16)
MAX_TOKENS = 32
PRESSURE_BLOCKS = 10  # max_model_len 256 needs 8 blocks of 32; 16 requests of up to 6 blocks

CONFIGS = {
    "rbln-ngram": dict(scheduler_cls=COUNTING, speculative_config=NGRAM, enable_prefix_caching=False),
    "rbln-ngram-prefix-sub-block": dict(
        scheduler_cls=COUNTING,
        speculative_config=NGRAM,
        enable_prefix_caching=True,
        # The sub-block is the prefill chunk: the CPU platform takes no smaller one.
        max_num_batched_tokens=16,
        additional_config={"sub_block_size": 16},
    ),
}
REFERENCE = dict(scheduler_cls=COUNTING_UPSTREAM, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def reference(model: Path) -> Outcome:
    outcome = run(model, PROMPTS, MAX_TOKENS, **REFERENCE)
    assert outcome.preemptions == [], "the roomy reference must not preempt"
    return outcome


@pytest.mark.parametrize("pressure", [False, True], ids=["roomy", "kv-pressure"])
@pytest.mark.parametrize("config", ["upstream", *CONFIGS])
def test_same_tokens(model: Path, reference: Outcome, config: str, pressure: bool) -> None:
    if config == "upstream" and not pressure:
        outcome = reference  # the reference itself; its own run is the fixture's
    else:
        kwargs = REFERENCE if config == "upstream" else CONFIGS[config]
        extra = {"num_gpu_blocks_override": PRESSURE_BLOCKS} if pressure else {}
        outcome = run(model, PROMPTS, MAX_TOKENS, **kwargs, **extra)
    assert len(outcome.tokens) == len(PROMPTS) and all(len(t) == MAX_TOKENS for t in outcome.tokens)
    assert_same_tokens(outcome, reference, config)
    if pressure:
        assert outcome.preemptions, f"{config}: the small pool ({PRESSURE_BLOCKS} blocks) preempted nothing"
    else:
        assert outcome.preemptions == []
    if "ngram" in config:  # drafts were really made and used, not silently dropped
        assert outcome.metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0
    if "prefix" in config and not pressure:
        assert outcome.metrics["vllm:prefix_cache_hits"] > 0
