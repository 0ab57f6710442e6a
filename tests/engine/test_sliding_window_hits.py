"""Issue 29, part 1b, in the engine: sub-block prefix hits on a model with full-attention
and sliding-window layers (a tiny random Gemma-2: its two layers alternate, the second with
a window of 48 tokens), which vLLM groups into two KV cache groups.

Each later prompt extends an earlier one of 88 tokens (2 blocks of 32 and 24 tokens): whole
blocks reuse 64 of them, sub-blocks of 16 (the prefill chunk) 80, copying the partial block
of each group before the new request writes into it. The window's hit at 80 needs the
window group's block 1 (positions 33-63) and its block 2 up to 80. Every greedy token must
be the whole-block run's: a copy not made, or made in the wrong group, changes them.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_kit import BLOCK, MAX_MODEL_LEN, RBLN, VOCAB, assert_same_tokens, make_model, run

rng = random.Random(11)
WINDOW = 48
SUB_BLOCK = 16
EARLIER_LEN = 88


def words(count: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(count)]


EARLIER = [words(EARLIER_LEN) for _ in range(3)]
PROMPTS = [*EARLIER, *(p + words(30) for p in EARLIER)]
COMMON = dict(scheduler_cls=RBLN, enable_prefix_caching=True, max_num_batched_tokens=SUB_BLOCK)


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine kit's model (its tokenizer), its weights and config replaced by a random
    Gemma-2's: head_dim 64 (the CPU kernel refuses 16), a full-attention layer and a
    sliding-window one."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    dest = make_model(tmp_path_factory.mktemp("gemma2"))
    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        sliding_window=WINDOW,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    Gemma2ForCausalLM(config).save_pretrained(dest, safe_serialization=True)
    return dest


def test_sliding_window_sub_block_hits_keep_the_tokens(gemma2: Path) -> None:
    sub = run(gemma2, PROMPTS, 8, one_by_one=True, **COMMON, additional_config={"sub_block_size": SUB_BLOCK})
    whole = run(
        gemma2, PROMPTS, 8, one_by_one=True, **COMMON, additional_config={"enable_sub_block_cache": False}
    )
    assert_same_tokens(sub, whole, "sub-block caching on full attention + a sliding window")
    whole_hit = EARLIER_LEN // BLOCK * BLOCK
    sub_hit = EARLIER_LEN // SUB_BLOCK * SUB_BLOCK
    assert whole.metrics["vllm:prefix_cache_hits"] == 3 * whole_hit, whole.metrics
    assert sub.metrics["vllm:prefix_cache_hits"] == 3 * sub_hit, sub.metrics
