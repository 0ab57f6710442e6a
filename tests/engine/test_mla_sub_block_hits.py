"""Sub-block prefix hits on an MLA model (DeepSeek's attention) in vLLM's CPU engine.

The RBLN scheduler takes sub-blocks for one KV cache group of ``MLAAttentionSpec`` (rule 3,
docs/sub-block-cache.md): an MLA layer caches one latent per token, as append-only as full
attention's K and V, so a hit may end at any sub-block boundary and the partial block is
copied before the new request writes into it. The copy runs in the CPU worker on the MLA
cache's own layout, so only the engine shows that it copies the right slots.

vLLM's CPU platform keeps prefix caching on for an MLA model only with its AMX MLA backend
(``CpuPlatform.check_and_update_config``: without AMX tiles it turns prefix caching off), so
the case runs on CPUs with AMX (``tests/engine/cannot-run.toml``, ``unless-cpu-has``); the
model is bfloat16 with a 576-wide latent, what that backend takes.

The shape is ``test_sub_block_hits.py``'s: prompts of 88 tokens (two blocks of 32, and 24
tokens in a third), then extensions of them sent after they finished (80 tokens hit against 64 with
whole blocks), and an extension sent with its prompt, which hits that prompt's tail block
while the prompt is still decoding into it: without the copy the two requests would write
the same slots and the extension's greedy tokens would change.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_kit import BLOCK, RBLN, VOCAB, Outcome, assert_same_tokens, run, shared_model

rng = random.Random(29)


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
COMMON = dict(
    scheduler_cls=RBLN, enable_prefix_caching=True, max_num_batched_tokens=SUB_BLOCK, dtype="bfloat16"
)
HITS_PER_EXTENSION = {"whole": EARLIER_LEN // BLOCK * BLOCK, "sub": EARLIER_LEN // SUB_BLOCK * SUB_BLOCK}
EXTENSIONS = len(EARLIER) + 1  # the sequential ones and HITTING


@pytest.fixture(scope="module")
def mla_model(model: Path) -> Path:
    """Made once a run, beside the tiny Llama (``model``'s folder is the run's shared base)."""
    return shared_model(model.parent, "tiny-deepseek-mla")


def test_mla_sub_block_hits_raise_the_hit_count_and_keep_the_tokens(mla_model: Path) -> None:
    sub = run(
        mla_model, PROMPTS, 8, batches=BATCHES, **COMMON, additional_config={"sub_block_size": SUB_BLOCK}
    )
    whole = run(
        mla_model, PROMPTS, 8, batches=BATCHES, **COMMON, additional_config={"enable_sub_block_cache": False}
    )

    for outcome in (sub, whole):
        assert "Using AMX_MLA backend" in outcome.log, "the engine did not run vLLM's AMX MLA backend"
    assert_same_tokens(sub, whole, "sub-block caching on an MLA model")
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
