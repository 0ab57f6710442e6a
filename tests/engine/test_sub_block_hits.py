"""Case 2: sub-block prefix hits in the engine, with the worker's copy-on-write copies.

Each later prompt extends an earlier one to a point inside a KV block (block 32, earlier
prompts of 88 tokens = 2 blocks + 1 sub-block of 16 + 8 tokens). Whole-block caching can
reuse 64 tokens of it; sub-block caching reuses what the earlier prompt's partial entry
covers, 80 tokens at every pin (``tests/support/upstream_rules.py``), by copying the partial
block before the new request writes into it. More hits, and the same tokens: if the
worker's copy were not made (or made wrong), the extending requests would attend to the
wrong KV and their greedy outputs would differ.

The sub-block is the prefill chunk (16 tokens, ``max_num_batched_tokens``), vllm-rbln's
default and the only size below the block that a platform answering no to
``supports_prefill_chunk_across_kv_blocks()`` (the CPU platform here) takes. The
whole-block run has the same chunk, with sub-block caching switched off.

The first three extensions are sent after their earlier prompt finished. There, a missing
copy-on-write in the scheduler (the extension writing straight into the earlier prompt's
shared tail block) changes no token: nobody reads the slots it overwrites. So a third kind
of request is sent together with the prompt it extends: it hits that prompt's tail block
while the prompt is still decoding into it. Without the copy the two write the same slots,
and the extension reads the other request's KV. The no-cow variant
(``tests/engine/variants/no-cow.patch``, applied over the installed wheel) shows that
this case sees it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_kit import BLOCK, NGRAM, RBLN, VOCAB, first_difference, run, variant_site
from upstream_rules import partial_entry_tokens

rng = random.Random(7)


def words(count: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(count)]


EARLIER_LEN = 88
EARLIER = [words(EARLIER_LEN) for _ in range(3)]
# Sent one by one: each extension after the prompt it extends has finished.
SEQUENTIAL = [*EARLIER, *(p + words(30) for p in EARLIER)]
# Sent together: the RBLN scheduler prefills RUNNING (88 tokens), then HITTING (its
# extension) in the next step, which hits RUNNING's tail block while RUNNING decodes.
RUNNING = words(EARLIER_LEN)
HITTING = RUNNING + words(30)
PROMPTS = [*SEQUENTIAL, RUNNING, HITTING]
BATCHES = [1] * len(SEQUENTIAL) + [2]
SUB_BLOCK = 16
COMMON = dict(
    scheduler_cls=RBLN, speculative_config=NGRAM, enable_prefix_caching=True, max_num_batched_tokens=SUB_BLOCK
)
SUB_BLOCKS = {"sub_block_size": SUB_BLOCK}
WHOLE_BLOCKS = {"enable_sub_block_cache": False}
# Each earlier prompt decodes 8 tokens: its KV ends at token 95, so its third block never
# fills and keeps its partial entry. Whole blocks: 64 tokens of it.
WHOLE_HIT = EARLIER_LEN // BLOCK * BLOCK
NO_COW = Path(__file__).resolve().parent / "variants" / "no-cow.patch"


@pytest.fixture(scope="module")
def no_cow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return variant_site(NO_COW, tmp_path_factory.mktemp("no-cow"))


def test_sub_block_hits_raise_the_hit_count_and_keep_the_tokens(model: Path, no_cow: Path) -> None:
    whole = run(model, PROMPTS, 8, batches=BATCHES, **COMMON, additional_config=WHOLE_BLOCKS)
    sub = run(model, PROMPTS, 8, batches=BATCHES, **COMMON, additional_config=SUB_BLOCKS)

    assert sub.tokens == whole.tokens, first_difference(whole.tokens, sub.tokens)
    whole_hits, sub_hits = whole.metrics["vllm:prefix_cache_hits"], sub.metrics["vllm:prefix_cache_hits"]
    # Four extensions, each hitting its earlier prompt: whole blocks, or up to its partial entry.
    # (Read here, not at import: outside the engine venv there is no vllm, and the session
    # fixture says how to run the tier.)
    SUB_HIT = partial_entry_tokens(EARLIER_LEN, SUB_BLOCK)  # 80 at every pin
    assert SUB_HIT > WHOLE_HIT and SUB_HIT % BLOCK, "the hits must end inside a block"
    assert whole_hits == 4 * WHOLE_HIT, whole.metrics
    assert sub_hits == 4 * SUB_HIT, sub.metrics

    # The same sub-block run without copy-on-write: the same hits, and other tokens for
    # the request that hit a running request's tail block (and only there).
    variant = run(model, PROMPTS, 8, batches=BATCHES, site=no_cow, **COMMON, additional_config=SUB_BLOCKS)
    assert variant.vllm_file.startswith(str(no_cow)), variant.vllm_file
    assert variant.metrics["vllm:prefix_cache_hits"] == 4 * SUB_HIT, variant.metrics
    assert variant.tokens[: len(SEQUENTIAL)] == whole.tokens[: len(SEQUENTIAL)]
    assert variant.tokens[-1] != whole.tokens[-1], "no-cow: the hitting request's tokens did not change"
