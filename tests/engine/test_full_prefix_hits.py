"""Case 4: full prefix hits: the same prompts sent twice, the second time decode-ready.

A prompt of ``k`` whole blocks and one token, sent again after it finished, hits its ``k``
blocks in the prefix cache and has one token left to compute: it is a decode (issue 21,
gap 2), and the RBLN scheduler admits all such requests into one decode batch. vLLM's real
engine runs them; every greedy token must be the same as in a plain run (upstream's
``Scheduler``, no prefix caching), both times. The hits are the engine's own counts:
``vllm:prefix_cache_hits`` and each ``RequestOutput.num_cached_tokens`` (0 the first time,
``n - 1`` the second), and the scheduler's output (each second-time request scheduled with
``n - 1`` tokens computed and one to compute).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from engine_kit import (
    BLOCK,
    COUNTING,
    COUNTING_UPSTREAM,
    NGRAM,
    VOCAB,
    Outcome,
    assert_decode_ready,
    assert_same_tokens,
    run,
)

MAX_TOKENS = 8
rng = random.Random(4)
PROMPTS = [[rng.randrange(3, VOCAB) for _ in range(k * BLOCK + 1)] for k in (1, 2, 3, 4, 5, 2, 3, 1)]
SCHEDULERS: dict[str, dict[str, Any]] = {
    "rbln": dict(scheduler_cls=COUNTING),
    "rbln-ngram": dict(scheduler_cls=COUNTING, speculative_config=NGRAM),
    "upstream": dict(scheduler_cls=COUNTING_UPSTREAM),
}


@pytest.fixture(scope="module")
def reference(model: Path) -> Outcome:
    return run(model, PROMPTS, MAX_TOKENS, scheduler_cls=COUNTING_UPSTREAM, enable_prefix_caching=False)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_full_prefix_hits_are_decode_ready_and_keep_the_tokens(
    model: Path, reference: Outcome, name: str
) -> None:
    # The second batch is sent when the first has finished.
    twice = run(model, PROMPTS * 2, MAX_TOKENS, batches=[len(PROMPTS)] * 2, **SCHEDULERS[name])
    assert_same_tokens(twice, Outcome(tokens=reference.tokens * 2, metrics={}), name)
    hits = [len(p) - 1 for p in PROMPTS]
    assert twice.num_cached_tokens == [0] * len(PROMPTS) + hits
    assert twice.metrics["vllm:prefix_cache_hits"] == sum(hits), twice.metrics
    ngram = "speculative_config" in SCHEDULERS[name]
    width = 1 + NGRAM["num_speculative_tokens"] if ngram else 1
    assert_decode_ready(twice, PROMPTS, one_batch=name.startswith("rbln"), width=width)
    if ngram:  # drafts really made and used
        assert twice.metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, twice.metrics
