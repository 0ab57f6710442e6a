"""Sub-block prefix hits on a model with full-attention and sliding-window layers in vLLM's
CPU engine (issue 29, part 1b).

A tiny random Gemma-2 (``engine_kit.make_window_model``: a full-attention layer and one with
a window of 48 tokens) has two KV cache groups sharing one block pool. The RBLN scheduler
takes sub-blocks for both (rule 3, docs/sub-block-cache.md): a hit may end at any sub-block
boundary, and each group's partial block is copied before the new request writes into it.
The copies run in the CPU worker on each layer's own cache, so only the engine shows that
both groups' KV is right.

The shape is ``test_mla_sub_block_hits.py``'s: prompts of 88 tokens (two blocks of 32 and
24 tokens in a third), then extensions of them sent after they finished (80 tokens hit
against 64 with whole blocks; the window's hit at 80 needs its blocks 1 and 2, block 0 below
the window), and an extension sent with its prompt, which hits that prompt's tail block while
the prompt is still decoding into it: without the copy the two requests write the same
slots, and the extension's greedy tokens change (shown with ``variants/no-cow.patch``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_kit import BLOCK, RBLN, VOCAB, Outcome, assert_same_tokens, run, shared_model

rng = random.Random(11)


def words(count: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(count)]


EARLIER_LEN = 88
EARLIER = [words(EARLIER_LEN) for _ in range(2)]
SEQUENTIAL = [*EARLIER, *(p + words(30) for p in EARLIER)]
RUNNING = words(EARLIER_LEN)
HITTING = RUNNING + words(30)  # sent with RUNNING: hits its tail block while RUNNING decodes
PROMPTS = [*SEQUENTIAL, RUNNING, HITTING]
BATCHES = [1] * len(SEQUENTIAL) + [2]
SUB_BLOCK = 16  # the prefill chunk: the one size below the block the CPU platform takes
COMMON = dict(scheduler_cls=RBLN, enable_prefix_caching=True, max_num_batched_tokens=SUB_BLOCK)
SUB_BLOCKS = {"sub_block_size": SUB_BLOCK}
WHOLE_BLOCKS = {"enable_sub_block_cache": False}
HITS_PER_EXTENSION = {"whole": EARLIER_LEN // BLOCK * BLOCK, "sub": EARLIER_LEN // SUB_BLOCK * SUB_BLOCK}
EXTENSIONS = len(EARLIER) + 1  # the sequential ones and HITTING


@pytest.fixture(scope="module")
def window_model(model: Path) -> Path:
    """Made once a run, beside the tiny Llama (``model``'s folder is the run's shared base)."""
    return shared_model(model.parent, "tiny-gemma2-window")


def test_sliding_window_sub_block_hits_raise_the_hit_count_and_keep_the_tokens(window_model: Path) -> None:
    sub = run(window_model, PROMPTS, 8, batches=BATCHES, **COMMON, additional_config=SUB_BLOCKS)
    whole = run(window_model, PROMPTS, 8, batches=BATCHES, **COMMON, additional_config=WHOLE_BLOCKS)

    assert_same_tokens(sub, whole, "sub-block caching on full attention + a sliding window")
    assert HITS_PER_EXTENSION["sub"] % BLOCK, "the sub-block hits must end inside a block"
    hits = {"sub": sub.metrics["vllm:prefix_cache_hits"], "whole": whole.metrics["vllm:prefix_cache_hits"]}
    assert hits == {kind: EXTENSIONS * per for kind, per in HITS_PER_EXTENSION.items()}, (
        sub.metrics,
        whole.metrics,
    )
    assert_hit_tokens(sub, HITS_PER_EXTENSION["sub"])


def assert_hit_tokens(outcome: Outcome, per_extension: int) -> None:
    """Each extension (and only they) reports the hit in its own output."""
    expected = [0] * len(EARLIER) + [per_extension] * len(EARLIER) + [0, per_extension]
    assert outcome.num_cached_tokens == expected, outcome.num_cached_tokens
