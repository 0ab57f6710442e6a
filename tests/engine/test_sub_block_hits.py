"""Case 2: sub-block prefix hits in the engine, with the worker's copy-on-write copies.

Each later prompt extends an earlier, finished one to a point inside a KV block (block 32,
earlier prompts of 88 tokens = 2 blocks + 3 sub-blocks of 8). Whole-block caching can reuse
64 tokens of it; sub-block caching reuses all 88, by copying the partial block before the
new request writes into it. More hits, and the same tokens: if the copy were not made (or
made wrong), the extending requests would attend to the wrong KV and their greedy outputs
would differ.
"""

from __future__ import annotations

import random
from pathlib import Path

from engine_kit import NGRAM, RBLN, VOCAB, first_difference, run

rng = random.Random(7)
EARLIER = [[rng.randrange(3, VOCAB) for _ in range(88)] for _ in range(3)]
PROMPTS = [*EARLIER, *(p + [rng.randrange(3, VOCAB) for _ in range(30)] for p in EARLIER)]
COMMON = dict(scheduler_cls=RBLN, speculative_config=NGRAM, enable_prefix_caching=True)


def test_sub_block_hits_raise_the_hit_count_and_keep_the_tokens(model: Path) -> None:
    whole = run(model, PROMPTS, 8, one_by_one=True, **COMMON)
    sub = run(model, PROMPTS, 8, one_by_one=True, **COMMON,
              additional_config={"enable_sub_block_cache": True, "sub_block_size": 8})  # fmt: skip

    assert sub.tokens == whole.tokens, first_difference(whole.tokens, sub.tokens)
    whole_hits, sub_hits = whole.metrics["vllm:prefix_cache_hits"], sub.metrics["vllm:prefix_cache_hits"]
    # Whole blocks: 64 tokens of each earlier prompt. Sub-blocks: all 88.
    assert whole_hits == 3 * 64, whole.metrics
    assert sub_hits == 3 * 88, sub.metrics
