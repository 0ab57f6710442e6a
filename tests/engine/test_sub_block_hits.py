"""Case 2: sub-block prefix hits in the engine, with the worker's copy-on-write copies.

Each later prompt extends an earlier one to a point inside a KV block (block 32, earlier
prompts of 88 tokens = 2 blocks + 1 sub-block of 16 + 8 tokens). Whole-block caching can
reuse 64 tokens of it; sub-block caching reuses the 80 tokens up to its last sub-block
boundary, by copying the partial block before the new request writes into it. Siblings go
further: a prompt that leaves an earlier one inside one of its blocks hits the sub-blocks
before the divergence (60 shared tokens: 48 hit, against 32 with whole blocks; every
sub-block boundary of a block is an entry, not only a prompt's last). More hits, and the
same tokens: if the worker's copy were not made (or made wrong), the requests that hit would
attend to the wrong KV and their greedy outputs would differ.

The sub-block is the prefill chunk (16 tokens, ``max_num_batched_tokens``), vllm-rbln's
default and the only size below the block that a platform answering no to
``supports_prefill_chunk_across_kv_blocks()`` (the CPU platform here) takes. The
whole-block run has the same chunk, with sub-block caching switched off.

The first extensions are sent after their earlier prompt finished. There, a missing
copy-on-write in the scheduler (the extension writing straight into the earlier prompt's
shared tail block) changes no token: nobody reads the slots it overwrites. So a third kind
of request is sent together with the prompt it extends: it hits that prompt's tail block
while the prompt is still decoding into it. Without the copy the two write the same slots,
and the extension reads the other request's KV. The no-cow variant
(``tests/engine/variants/no-cow.patch``, applied over the installed wheel) shows that
this case sees it. A sibling is sent so too: it hits the sub-blocks of a running prompt's
tail block before their divergence.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_kit import BLOCK, NGRAM, RBLN, VOCAB, Outcome, assert_same_tokens, run, variant_site

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
# (Drawn after RUNNING and HITTING, which keep the tokens they had before the siblings came:
# with them the no-cow variant's overwritten slots change the greedy output.)
# Siblings, sent one by one: the second leaves the first after 60 tokens, inside its second
# (full) block.
SIBLING_BASE = words(EARLIER_LEN)
SIBLINGS = [SIBLING_BASE, SIBLING_BASE[:60] + words(30)]
# The same with a sibling that leaves RUNNING_BASE after 84 tokens, inside its tail block.
RUNNING_BASE = words(EARLIER_LEN)
RUNNING_SIBLING = RUNNING_BASE[:84] + words(30)
PROMPTS = [*SEQUENTIAL, *SIBLINGS, RUNNING, HITTING, RUNNING_BASE, RUNNING_SIBLING]
BATCHES = [1] * (len(SEQUENTIAL) + len(SIBLINGS)) + [2, 2]
# The no-cow variant runs without the siblings: a sibling hits inside a block its source
# filled, and without the copy it fills that block again, which the pool refuses (a block
# cached full is never cached again): the run would stop, not show other tokens.
VARIANT_PROMPTS = [*SEQUENTIAL, RUNNING, HITTING]
VARIANT_BATCHES = [1] * len(SEQUENTIAL) + [2]
SUB_BLOCK = 16
COMMON = dict(
    scheduler_cls=RBLN, speculative_config=NGRAM, enable_prefix_caching=True, max_num_batched_tokens=SUB_BLOCK
)
SUB_BLOCKS = {"sub_block_size": SUB_BLOCK}
WHOLE_BLOCKS = {"enable_sub_block_cache": False}
VARIANT = dict(COMMON, additional_config=SUB_BLOCKS)
# Each earlier prompt decodes 8 tokens: its KV ends at token 95, so its third block never
# fills. Whole blocks: 64 tokens of it, 32 of the sibling's 60, 64 of the running sibling's 84.
WHOLE_HIT = EARLIER_LEN // BLOCK * BLOCK
WHOLE_HITS = 4 * WHOLE_HIT + 32 + 64
# Sub-blocks: 80 of an earlier prompt's 88, 48 of the sibling's 60, 80 of the running one's 84.
SUB_HIT = EARLIER_LEN // SUB_BLOCK * SUB_BLOCK
SUB_HITS = 4 * SUB_HIT + 48 + 80
NO_COW = Path(__file__).resolve().parent / "variants" / "no-cow.patch"


@pytest.fixture(scope="module")
def no_cow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return variant_site(NO_COW, tmp_path_factory.mktemp("no-cow"))


@pytest.fixture(scope="module")
def sub(model: Path) -> Outcome:
    """The sub-block run, its KV events published over ZMQ and followed by a router."""
    return run(model, PROMPTS, 8, batches=BATCHES, kv_events=True, **COMMON, additional_config=SUB_BLOCKS)


def test_sub_block_hits_raise_the_hit_count_and_keep_the_tokens(
    model: Path, no_cow: Path, sub: Outcome
) -> None:
    whole = run(model, PROMPTS, 8, batches=BATCHES, **COMMON, additional_config=WHOLE_BLOCKS)

    assert_same_tokens(sub, whole, "sub-block caching")
    whole_hits, sub_hits = whole.metrics["vllm:prefix_cache_hits"], sub.metrics["vllm:prefix_cache_hits"]
    # Four extensions, each hitting its earlier prompt, and two siblings: whole blocks, or
    # every sub-block they share.
    assert SUB_HIT > WHOLE_HIT and SUB_HIT % BLOCK, "the hits must end inside a block"
    assert whole_hits == WHOLE_HITS, whole.metrics
    assert sub_hits == SUB_HITS, sub.metrics

    # The same sub-block run without copy-on-write (no siblings): the same hits, and other
    # tokens for the request that hit a running request's tail block (and only there).
    variant = run(model, VARIANT_PROMPTS, 8, batches=VARIANT_BATCHES, site=no_cow, **VARIANT)
    assert variant.vllm_file.startswith(str(no_cow)), variant.vllm_file
    assert variant.metrics["vllm:prefix_cache_hits"] == 4 * SUB_HIT, variant.metrics
    assert variant.tokens[: len(SEQUENTIAL)] == sub.tokens[: len(SEQUENTIAL)]
    hitting = PROMPTS.index(HITTING)
    assert variant.tokens[-1] != sub.tokens[hitting], "no-cow: the hitting request's tokens did not change"


def test_the_kv_events_are_sub_blocks_a_router_reads_as_the_scheduler_hits(sub: Outcome) -> None:
    """The event contract (docs/runner-contract.md, "KV events") on vLLM's ZMQ publisher and a
    subscriber decoding its msgspec batches (engine_kit.KVEventRouter): every BlockStored in
    sub-blocks, each hash computable from its tokens, every BlockRemoved of an entry stored,
    the replay equal to the scheduler's pool after each batch of prompts (checked in the
    run), and the router's hit for each prompt sent alone, from the events before it, equal
    to the engine's own hit (RequestOutput.num_cached_tokens)."""
    assert sub.kv_events["batches"] > 0 and sub.kv_events["stored"] > 0, sub.kv_events
    starts = [sum(BATCHES[:b]) for b in range(len(BATCHES))]
    alone = [start for start, size in zip(starts, BATCHES, strict=True) if size == 1]
    expected = [sub.num_cached_tokens[i] for i in alone]
    assert [sub.router_hits[i] for i in alone] == expected, (sub.router_hits, sub.num_cached_tokens)
    assert sum(expected) > 0 and any(hit % BLOCK for hit in expected), "no sub-block hit to read"
