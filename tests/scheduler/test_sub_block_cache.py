"""Sub-block prefix caching in the RBLN scheduler (docs/sub-block-cache.md).

The real patched scheduler and KV cache manager, driven through vLLM's own
harness. A request A runs first; a request B sharing a prefix with it then
hits A's cached blocks. With sub-block caching the hit may end on a
sub-block boundary inside a block (upstream's fine-grained hash hits); that
tail block is copied to a private block before B writes to it
(copy-on-write), never shared for writing, and every block is free at the end.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sched_harness as h

BLOCK = h.BLOCK_SIZE  # 16
# The prefill chunk: at most the block (vllm-rbln's rule, block >= chunk >=
# sub-block). Sub-blocks of 4 and 8 are below it, which the harness's
# platform declares its device can take (`h.chunks_may_cross_kv_blocks`).
CHUNK = 16


def make_scheduler(
    settings: dict[str, Any] | None,
    *,
    num_blocks: int = 20,
    prefix_caching: bool = True,
    chunk: int = CHUNK,
    kv_connector: Any = None,
    num_spec_tokens: int | None = None,
    kv_cache_spec: Any = None,
) -> Any:
    """The RBLN scheduler on one KV cache group: `kv_cache_spec`, or the
    harness's full attention."""
    from sched_harness import create_scheduler

    return create_scheduler(
        scheduler_cls=h.rbln_scheduler_factory(settings),  # type: ignore[arg-type]
        kv_cache_spec=kv_cache_spec,
        block_size=BLOCK,
        num_blocks=num_blocks,
        max_num_batched_tokens=chunk,
        max_num_seqs=4,
        max_model_len=256,
        enable_prefix_caching=prefix_caching,
        use_kv_connector=kv_connector,
        num_speculative_tokens=num_spec_tokens,
        speculative_method="ngram" if num_spec_tokens else None,
    )


def layout_spec(layout: str) -> Any:
    """One KV cache group's spec: `full`, the harness's full attention (None
    asks for it), or `mla`, a latent of one KV head (DeepSeek-V2's 512 + 64);
    both served by vLLM's FullAttentionManager."""
    if layout == "full":
        return None
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)


# Rule 3's KV cache layouts: every hit and copy-on-write case holds for each.
over_layouts = pytest.mark.parametrize("layout", ["full", "mla"])


def prompt(length: int, seed: int = 1) -> list[int]:
    return h.distinct_prompt(seed, length)


def run_shared_prefix(
    sub_block_size: int | None,
    first_len: int,
    shared_len: int,
    second_len: int,
    *,
    a_running: bool = False,
    kv_cache_spec: Any = None,
) -> tuple[Any, h.Driver, h.StepRecord, int]:
    """A runs (to the end, or just its prefill if `a_running`); then B, whose
    prompt shares A's first `shared_len` tokens, is admitted. Returns the
    scheduler, driver, B's admission step and B's hit (tokens not scheduled)."""
    settings = None if sub_block_size is None else h.sub_block_settings(sub_block_size)
    hash_size = BLOCK if sub_block_size is None else sub_block_size
    scheduler = make_scheduler(settings, kv_cache_spec=kv_cache_spec)
    driver = h.Driver(scheduler)
    a_prompt = prompt(first_len, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=1 if not a_running else 8, hash_block_size=hash_size))
    if a_running:
        prefill_steps(driver, "A", first_len)  # A keeps running (decoding)
        assert "A" not in driver.finished
    else:
        driver.run(10, until=["A"])
        assert "A" in driver.finished
    b_prompt = a_prompt[:shared_len] + prompt(second_len - shared_len, seed=2)
    driver.add(h.make_request("B", b_prompt, max_tokens=2, hash_block_size=hash_size))
    record = driver.step()
    assert "B" in record.prefill_req_ids
    hit = record.num_computed_before["B"]
    return scheduler, driver, record, hit


def prefill_steps(driver: h.Driver, req_id: str, prompt_len: int) -> None:
    """Step until `req_id`'s prompt is prefilled (chunks of CHUNK tokens)."""
    for _ in range(-(-prompt_len // CHUNK)):
        driver.step()
    assert driver.scheduler.requests[req_id].num_computed_tokens >= prompt_len


def extends_a(sub_block_size: int, first_len: int, second_len: int) -> tuple[int, int, int, int, int, bool]:
    """A case where B's prompt extends A's whole prompt: B hits to the last sub-block boundary
    of A's prompt (every boundary of A's blocks is an entry)."""
    hit = first_len // sub_block_size * sub_block_size
    return (sub_block_size, first_len, first_len, second_len, hit, hit % BLOCK != 0)


@over_layouts
@pytest.mark.parametrize(
    ("sub_block_size", "first_len", "shared_len", "second_len", "expected_hit", "copied"),
    [
        # No shared prefix: no hit.
        (4, 26, 0, 30, 0, False),
        # B extends A's whole prompt: it hits to A's prompt's last sub-block boundary at
        # every pin (upstream's own rule registers one entry per prompt, which from 0.32.0
        # is one sub-block short of a prompt ending on a boundary: 16 and 8 for the first
        # two), copied when that ends inside a block. 20 tokens, sub-block 4: 20, copied.
        extends_a(4, 20, 30),
        # 12 tokens, no whole block: 12, copied.
        extends_a(4, 12, 30),
        # 26 tokens: 24, sub-block 4 or 8, copied.
        extends_a(4, 26, 40),
        extends_a(8, 26, 40),
        # Sub-block 8 rounds A's 20-token prompt down to 16: a whole block.
        extends_a(8, 20, 30),
        # Siblings: B leaves A's prompt inside one of A's blocks, and hits the sub-blocks
        # before it (upstream's one entry per prompt gave the whole blocks only: 0, 16,
        # 16, 16). Inside A's first, full block:
        (4, 26, 13, 30, 12, True),
        # Inside A's second block, full (A has 40 tokens): a block and 3 sub-blocks; at
        # sub-block 8, the siblings (24 of a block shared) at block 16.
        (4, 40, 29, 40, 28, True),
        (8, 40, 25, 40, 24, True),
        # Inside A's last, partial block, before its prompt's last boundary (24).
        (4, 26, 22, 30, 20, True),
        # Whole blocks only: a block-aligned shared prefix.
        (4, 32, 32, 40, 32, False),
        # Whole-block caching (sub-block off) hits 16 of the same 26.
        (None, 26, 26, 40, 16, False),
    ],
)
def test_sub_block_hits(
    layout: str,
    sub_block_size: int | None,
    first_len: int,
    shared_len: int,
    second_len: int,
    expected_hit: int,
    copied: bool,
) -> None:
    """Shown failing for `mla` before MLA joined rule 3: a size given was
    refused ("supports one full-attention KV cache group, got
    ['MLAAttentionSpec']")."""
    scheduler, driver, record, hit = run_shared_prefix(
        sub_block_size, first_len, shared_len, second_len, kv_cache_spec=layout_spec(layout)
    )
    group_spec = scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    assert type(group_spec).__name__ == {"full": "FullAttentionSpec", "mla": "MLAAttentionSpec"}[layout]
    assert hit == expected_hit
    manager = scheduler.kv_cache_manager
    b_blocks = manager.get_blocks("B").blocks[0]
    if copied:
        # The partial tail block: copied to B's private block, which is B's
        # block in the table; the source is A's cached block.
        tail_idx = expected_hit // BLOCK
        assert len(record.block_copies) == 1
        src, dst = record.block_copies[0]
        assert b_blocks[tail_idx].block_id == dst != src
        assert manager.block_pool.blocks[src].block_hash is not None
    else:
        assert record.block_copies == []
    driver.run(20)
    assert driver.finished == {"A", "B"}
    h.assert_all_blocks_free(scheduler)


@over_layouts
def test_tail_block_is_never_shared_for_writing_with_a_running_request(layout: str) -> None:
    """A is still running (decoding into its tail block) when B hits a
    sub-block of that tail: B gets a copy, the full blocks are shared."""
    scheduler, driver, record, hit = run_shared_prefix(
        4, 26, 26, 40, a_running=True, kv_cache_spec=layout_spec(layout)
    )
    assert hit == 24
    manager = scheduler.kv_cache_manager
    a_blocks = manager.get_blocks("A").blocks[0]
    b_blocks = manager.get_blocks("B").blocks[0]
    # The whole block is shared (read-only prefix); the tail is not.
    assert b_blocks[0] is a_blocks[0] and a_blocks[0].ref_cnt == 2
    assert b_blocks[1] is not a_blocks[1]
    assert record.block_copies == [(a_blocks[1].block_id, b_blocks[1].block_id)]
    assert a_blocks[1].ref_cnt >= 1
    # No block of B beyond the shared prefix is in any other request's table.
    assert not {b.block_id for b in b_blocks[1:]} & {a.block_id for a in a_blocks}
    driver.run(30)
    assert driver.finished == {"A", "B"}
    h.assert_all_blocks_free(scheduler)


@over_layouts
def test_a_sibling_hits_a_running_request_s_block_before_the_divergence(layout: str) -> None:
    """A is still running (decoding into its partial block) when B, which leaves A's prompt
    two tokens before its end, hits the sub-blocks of that block before the divergence
    (20 tokens, sub-block 4): B gets a copy, A keeps writing its own block."""
    scheduler, driver, record, hit = run_shared_prefix(
        4, 26, 22, 40, a_running=True, kv_cache_spec=layout_spec(layout)
    )
    assert hit == 20
    manager = scheduler.kv_cache_manager
    a_blocks = manager.get_blocks("A").blocks[0]
    b_blocks = manager.get_blocks("B").blocks[0]
    assert b_blocks[0] is a_blocks[0]
    assert record.block_copies == [(a_blocks[1].block_id, b_blocks[1].block_id)]
    assert not {b.block_id for b in b_blocks[1:]} & {a.block_id for a in a_blocks}
    driver.run(30)
    assert driver.finished == {"A", "B"}
    h.assert_all_blocks_free(scheduler)


def test_generated_tokens_are_indexed_by_sub_block() -> None:
    """A's prompt (20 tokens) and its generated tokens fill A's second block to 27 tokens:
    a prompt that repeats A's prompt and 6 of its generated tokens hits the 24 of them
    that end on a sub-block boundary (not only A's prompt's 20)."""
    scheduler = make_scheduler(h.sub_block_settings(4))
    driver = h.Driver(scheduler)
    a_prompt = prompt(20, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=8, hash_block_size=4))
    driver.run(20, until=["A"])
    b_prompt = a_prompt + [h.SAMPLED_TOKEN] * 6 + prompt(10, seed=2)
    driver.add(h.make_request("B", b_prompt, max_tokens=2, hash_block_size=4))
    record = driver.step()
    assert record.num_scheduled_tokens["B"] == len(b_prompt) - 24
    assert len(record.block_copies) == 1
    driver.run(20)
    assert "B" in driver.finished
    h.assert_all_blocks_free(scheduler)


def test_the_sub_block_entries_go_with_their_block() -> None:
    """Every sub-block boundary of A's blocks is an entry of the block that holds it, and
    nothing else holds any: when the pool hands A's blocks to other requests, the entries
    are gone with them, and a sibling of A then hits nothing."""
    scheduler = make_scheduler(h.sub_block_settings(4), num_blocks=5)  # 4 usable
    pool = scheduler.kv_cache_manager.block_pool
    driver = h.Driver(scheduler)
    a_prompt = prompt(26, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=1, hash_block_size=4))
    driver.run(10, until=["A"])
    # Block 0: 3 interior boundaries and its full hash; block 1: 26 tokens, 2 boundaries.
    assert len(pool.cached_block_hash_to_block) == 6
    assert sum(block.block_hash is not None for block in pool.blocks) == 2
    driver.add(h.make_request("C", prompt(60, seed=3), max_tokens=1, hash_block_size=4))
    driver.run(10, until=["C"])
    # C took every block: A's entries went with them; C's 15 boundaries are what is left.
    assert len(pool.cached_block_hash_to_block) == 60 // 4
    driver.add(h.make_request("B", a_prompt[:13] + prompt(17, seed=2), max_tokens=1, hash_block_size=4))
    record = driver.step()
    # No hit (A's 12 tokens would be one): B prefills from its start, a chunk at a time.
    assert record.num_computed_before["B"] == 0
    assert record.num_scheduled_tokens["B"] == CHUNK
    driver.run(10)
    h.assert_all_blocks_free(scheduler)


def test_gate_counts_the_copy_on_write_block() -> None:
    """B's sub-block hit (24 tokens) needs its whole block (shared, held by A),
    a copy-on-write block for the tail, and blocks for the rest: the gate
    refuses B with one block fewer than that and admits it with exactly that.
    The same prompt cut back to whole blocks needs the same count (the CoW
    block replaces the tail block it copies)."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks

    scheduler = make_scheduler(h.sub_block_settings(4), num_blocks=8)
    driver = h.Driver(scheduler)
    a_prompt = prompt(26, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=30, hash_block_size=4))
    prefill_steps(driver, "A", 26)
    manager = scheduler.kv_cache_manager
    b = h.make_request("B", a_prompt + prompt(14, seed=2), max_tokens=2, hash_block_size=4)
    blocks, num_hit, _ = manager.get_computed_blocks(b)
    assert num_hit == 24 and len(blocks.blocks[0]) == 2
    # 40 tokens + 1 decode token = 41 slots = 3 blocks: 1 shared + CoW + 1 new.
    free = manager.block_pool.get_num_free_blocks()

    def gate(num_hit: int, hit_blocks: KVCacheBlocks) -> int:
        return manager.coordinator.get_num_blocks_to_allocate(
            request_id="B",
            num_tokens=41,
            new_computed_blocks=hit_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=num_hit,
            num_local_computed_tokens=num_hit,
            num_tokens_main_model=41,
            apply_admission_cap=True,
        )

    assert gate(num_hit, blocks) == 2  # the CoW block and one new block
    whole = manager.truncate_computed_blocks(blocks, 16)
    assert gate(16, whole) == 2  # two new blocks
    assert free >= 2


# --- The configuration: vllm-rbln 0.12.0's rules (docs/sub-block-cache.md).


def assert_the_public_rule_agrees(scheduler: Any, size: int | None, platform_yes: bool) -> None:
    """The fork's `sub_block_size_in_use`, which a model runner asks (vllm-rbln's, through the
    adoption patch), answers what the scheduler decided, on the platform it was built on
    (`platform_yes`: one that declares chunks may cross KV blocks, the harness's default)."""
    from vllm.v1.core.sched.rbln_sub_block import sub_block_size_in_use

    with h.chunks_may_cross_kv_blocks() if platform_yes else contextlib.nullcontext():
        assert sub_block_size_in_use(scheduler.vllm_config, scheduler.kv_cache_config) == size


def assert_sub_blocks(scheduler: Any, size: int, *, platform_yes: bool = True) -> None:
    assert scheduler.sub_block_cache.enabled
    assert scheduler.sub_block_cache.sub_block_size == size
    assert scheduler.hash_block_size == size
    assert scheduler.kv_cache_manager.coordinator.enable_partial_hash_hits
    assert_the_public_rule_agrees(scheduler, size, platform_yes)


def assert_whole_blocks(scheduler: Any, *, platform_yes: bool = True) -> None:
    assert not scheduler.sub_block_cache.enabled
    assert scheduler.hash_block_size == BLOCK
    assert not scheduler.kv_cache_manager.coordinator.enable_partial_hash_hits
    assert_the_public_rule_agrees(scheduler, None, platform_yes)


@pytest.mark.parametrize(
    "settings",
    [None, {}, {"enable_sub_block_cache": True}, {"sub_block_size": None}],
    ids=["untouched", "empty", "switch-only", "size-none"],
)
def test_on_by_default_at_the_prefill_chunk(settings: dict[str, Any] | None) -> None:
    """Prefix caching on and a block larger than the prefill chunk: sub-block
    caching is on at the chunk, with no setting at all (vllm-rbln's default).
    Shown failing before the rules: `untouched`, `empty` and `size-none`
    resolved to whole blocks (the switch defaulted to off)."""
    assert_sub_blocks(make_scheduler(settings, chunk=8), 8)


def test_on_by_default_for_mla() -> None:
    """An MLA model (one group of `MLAAttentionSpec`) takes the default too.
    Shown failing before MLA joined rule 3: it stayed with whole blocks."""
    assert_sub_blocks(make_scheduler(None, chunk=8, kv_cache_spec=layout_spec("mla")), 8)


@pytest.mark.parametrize(
    ("chunk", "prefix_caching", "switch"),
    [(16, True, True), (64, True, True), (8, False, True), (8, True, False)],
    ids=["chunk-equals-block", "chunk-above-block", "no-prefix-caching", "switched-off"],
)
def test_the_default_stays_with_whole_blocks_where_it_does_not_fit(
    chunk: int, prefix_caching: bool, switch: bool
) -> None:
    """Without a `sub_block_size`, a configuration the chunk does not fit
    runs with whole blocks and no error: a run that never asked for
    sub-blocks never fails over them. Shown failing before the rules:
    `chunk-above-block` was refused ("takes the prefill chunk size ...
    exceeds") with `enable_sub_block_cache` on."""
    scheduler = make_scheduler({"enable_sub_block_cache": switch}, chunk=chunk, prefix_caching=prefix_caching)
    assert_whole_blocks(scheduler)


@pytest.mark.parametrize(
    ("size", "chunk", "message"),
    [
        # Rule 1: block >= chunk >= sub-block.
        (8, 64, "needs block_size >= max_num_batched_tokens >= sub_block_size, got 16 >= 64 >= 8"),
        (16, 8, "got 16 >= 8 >= 16"),
        (32, 16, "got 16 >= 16 >= 32"),
        # Rule 2: smaller than the block, and a divisor of it.
        (16, 16, "smaller than the KV block size (16) that divides it, got 16"),
        (6, 8, "that divides it, got 6"),
        # Neither a size nor a number.
        (0, 16, "sub_block_size=0 is not a positive number of tokens"),
        (True, 16, "sub_block_size=True is not a positive number of tokens"),
    ],
)
def test_a_size_outside_the_rules_is_refused(size: Any, chunk: int, message: str) -> None:
    """A size given is used or refused, naming the rule and the way out.
    Shown failing before the rules: 8 with chunk 64 and 16 with chunk 16
    (and 16 with chunk 8) were accepted."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        make_scheduler({"sub_block_size": size}, chunk=chunk)
    assert message in str(error.value)
    if size and size is not True:
        assert f"sub_block_size={size}:" in str(error.value)
        assert "turn sub-block caching off (enable_sub_block_cache=False)" in str(error.value)


def outside_rule_3(layout: str) -> list[Any]:
    """KV cache groups rule 3 keeps out: a subclass of MLA with another job
    (extract_hidden_states' cache), alone and next to full attention."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        HiddenStateCacheSpec,
        KVCacheGroupSpec,
    )

    shape: dict[str, Any] = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": 64, "dtype": torch.float32}
    if layout == "hisparse-source":
        # A full-attention spec whose role gives it another manager (HiSparseSourceManager):
        # the spec class alone would pass, the manager is not one the sub-block forms replace.
        from vllm.v1.kv_cache_interface import KVCacheGroupRole

        return [KVCacheGroupSpec(["full"], FullAttentionSpec(**shape), role=KVCacheGroupRole.HISPARSE_SOURCE)]
    hidden = KVCacheGroupSpec(["hidden"], HiddenStateCacheSpec(**shape))
    if layout == "hidden-state":
        return [hidden]
    return [KVCacheGroupSpec(["full"], FullAttentionSpec(**shape)), hidden]


def on_groups(scheduler_cls: Callable[..., Any], groups: list[Any]) -> Callable[..., Any]:
    """`scheduler_cls` built on a KV cache config of `groups` (the harness
    makes one group, of the spec it is given)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    def make(*, kv_cache_config: Any, **kwargs: Any) -> Any:
        config = KVCacheConfig(
            num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )
        return scheduler_cls(kv_cache_config=config, **kwargs)

    return make


@pytest.mark.parametrize(
    ("layout", "names"),
    [
        ("hidden-state", "['HiddenStateCacheSpec']"),
        ("full-and-hidden-state", "['FullAttentionSpec', 'HiddenStateCacheSpec']"),
        ("hisparse-source", "['FullAttentionSpec served by HiSparseSourceManager']"),
    ],
)
def test_a_kv_cache_layout_outside_rule_3(layout: str, names: str) -> None:
    """Rule 3: groups of full attention, MLA or a sliding window, by exact spec
    class. A size given on any other layout is refused, naming the classes; the
    default stays with whole blocks and says why. (A sliding window alone, and
    next to full attention, were refused here before issue 29's part 1b.)"""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    groups = outside_rule_3(layout)
    rule = (
        "sub-block prefix caching supports KV cache groups of full attention, MLA or a "
        "sliding window (spec class exactly one of ['FullAttentionSpec', 'MLAAttentionSpec', "
        f"'SlidingWindowSpec']), got {names}"
    )
    with pytest.raises(SubBlockCacheConfigError) as error:
        make_scheduler_with(on_groups(h.rbln_scheduler_factory({"sub_block_size": 4}), groups))
    assert f"sub_block_size=4: {rule}" in str(error.value)
    default = make_scheduler_with(on_groups(h.rbln_scheduler_factory(None), groups), chunk=8)
    assert_whole_blocks(default)
    assert default.sub_block_cache.whole_blocks_because == rule


@pytest.mark.parametrize(
    ("settings", "prefix_caching", "off"),
    [
        ({"enable_sub_block_cache": False, "sub_block_size": 4}, True, "enable_sub_block_cache"),
        ({"sub_block_size": 4}, False, "enable_prefix_caching"),
    ],
)
def test_a_size_with_sub_block_caching_off_is_refused(
    settings: dict[str, Any], prefix_caching: bool, off: str
) -> None:
    """Shown failing before the rules: with the switch off the size was
    dropped without a word."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        make_scheduler(settings, prefix_caching=prefix_caching)
    message = f"sub_block_size=4 asks for sub-block prefix caching, and {off}=False turns it off"
    assert message in str(error.value)


def test_a_sub_block_below_the_chunk_needs_the_platform_to_say_yes() -> None:
    """Rule 4: a sub-block below the prefill chunk lets the next chunk start
    inside a KV block and write into two. The CPU platform's answer
    (`supports_prefill_chunk_across_kv_blocks()`, vLLM's default) is no:
    refused, naming the platform and the way out; the same settings on a
    platform that says yes run. The size equal to the chunk needs no
    answer. Shown failing before the rules (and the hook): accepted on any
    platform."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    plain = h.rbln_scheduler_factory({"sub_block_size": 4}, chunks_cross_kv_blocks=False)
    with pytest.raises(SubBlockCacheConfigError) as error:
        make_scheduler_with(plain)
    message = str(error.value)
    assert "sub_block_size=4: a sub_block_size below max_num_batched_tokens=16" in message
    assert "supports_prefill_chunk_across_kv_blocks() is False" in message
    assert "set sub_block_size=16 (the prefill chunk), or leave it unset" in message
    assert_sub_blocks(make_scheduler({"sub_block_size": 4}), 4)
    equal = h.rbln_scheduler_factory({"sub_block_size": 8}, chunks_cross_kv_blocks=False)
    assert_sub_blocks(make_scheduler_with(equal, chunk=8), 8, platform_yes=False)


def test_a_platform_that_cannot_answer_stops_only_a_size_that_needs_the_answer() -> None:
    """Issue 28: vllm-rbln answers with `is_cr13()`, which raises RuntimeError on a host
    whose NPU name is unknown (a compile-only worker). The scheduler asks only where the
    answer matters, a sub-block size below the chunk, as vllm-rbln does: sub-block caching
    off, prefix caching off, and the default size (the chunk) start on such a platform; a
    size below the chunk gets the platform's own error. Shown failing before: every
    construction asked, and all of them raised."""
    import vllm.platforms as platforms

    base = type(platforms.current_platform)

    def unknown_npu(cls: type) -> bool:
        raise RuntimeError("no RBLN device name is known on this host")

    mute = type("UnknownNPU", (base,), {"supports_prefill_chunk_across_kv_blocks": classmethod(unknown_npu)})
    previous = platforms._current_platform
    platforms._current_platform = mute()
    try:
        for settings, prefix_caching, chunk in (
            ({"enable_sub_block_cache": False}, True, CHUNK),
            ({}, False, CHUNK),
            ({}, True, CHUNK),
            ({}, True, 8),  # the default: sub-blocks of the chunk, 8
            ({"sub_block_size": 8}, True, 8),
        ):
            plain = h.rbln_scheduler_factory(settings, chunks_cross_kv_blocks=False)
            make_scheduler_with(plain, chunk=chunk, enable_prefix_caching=prefix_caching)
        below = h.rbln_scheduler_factory({"sub_block_size": 4}, chunks_cross_kv_blocks=False)
        with pytest.raises(RuntimeError, match="no RBLN device name is known"):
            make_scheduler_with(below)
    finally:
        platforms._current_platform = previous


def slot_taking_drafter() -> tuple[str, dict[str, Any], int]:
    """A drafter that takes slots of every step: its name in the refusal, the
    `create_scheduler` keywords that make it, and the slots it takes. Up to
    vLLM 0.33.0, ngram with parallel drafting (its 3 tokens take 2 slots); from
    0.34.0 `parallel_drafting` has no effect and only the autoregressive draft
    model takes a slot (one: `StandaloneARSpeculatorConfig`)."""
    if not h.ONE_RUNNER_FORM:
        spec = {"num_speculative_tokens": 3, "speculative_method": "ngram", "parallel_drafting": True}
        return "ngram with parallel drafting", spec, 2
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    draft = SpeculativeConfig(
        method="draft_model",
        model="facebook/opt-125m",  # its config, from tests/fixtures/hf
        num_speculative_tokens=3,
        target_model_config=ModelConfig(model="facebook/opt-125m", max_model_len=256),
        target_parallel_config=ParallelConfig(),
    )
    return "draft_model", {"speculative_config": draft}, 1


def test_a_drafter_that_takes_slots_counts_as_a_sub_block_below_the_chunk() -> None:
    """Issue 33: a drafter that takes slots of every step (`slot_taking_drafter`)
    makes upstream's scheduler give a prefill that many tokens fewer than the chunk,
    so chunks of 8 are 6 (or 7) tokens and the third crosses the 16-token block, as a
    sub-block below the chunk lets a chunk do. So it needs the platform's yes (rule
    4): on a platform that cannot, the default stays with whole blocks, and a size
    given is refused naming the drafter; ngram without parallel drafting takes no
    slot and keeps sub-blocks of the chunk. Shown failing before the rule: sub-blocks
    of 8 on the platform that cannot."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    name, slot_taking, slots = slot_taking_drafter()
    no_slot = {"num_speculative_tokens": 3, "speculative_method": "ngram"}

    def build(settings: dict[str, Any], *, platform_yes: bool, spec: dict[str, Any] = slot_taking) -> Any:
        factory = h.rbln_scheduler_factory(settings, chunks_cross_kv_blocks=platform_yes)
        return make_scheduler_with(factory, chunk=8, **spec)

    crossing = build({}, platform_yes=True)
    assert crossing.vllm_config.speculative_config.max_num_new_slots_for_drafting == slots
    assert_sub_blocks(crossing, 8)
    driver = h.Driver(crossing)
    driver.add(h.make_request("long", prompt(40), max_tokens=4, hash_block_size=8))
    steps = [driver.step() for _ in range(3)]
    assert [step.num_scheduled_tokens for step in steps] == [{"long": 8 - slots}] * 3
    # The third chunk writes into two KV blocks.
    starts = [step.num_computed_before["long"] for step in steps]
    assert starts == [0, 8 - slots, 2 * (8 - slots)]
    assert starts[2] < 16 < starts[2] + 8 - slots

    drafter = f"the {name} drafter takes {slots} slot(s) of every step"
    default = build({}, platform_yes=False)
    assert_whole_blocks(default, platform_yes=False)
    assert drafter in default.sub_block_cache.whole_blocks_because
    with pytest.raises(SubBlockCacheConfigError) as error:
        build({"sub_block_size": 8}, platform_yes=False)
    message = str(error.value)
    assert f"sub_block_size=8: {drafter}" in message
    chunks = f"prefill chunks of {8 - slots} tokens"
    assert f"{chunks} stop starting on multiples of max_num_batched_tokens=8" in message
    assert "supports_prefill_chunk_across_kv_blocks() is False" in message
    assert "use a drafter that takes no slot" in message
    assert_sub_blocks(build({}, platform_yes=False, spec=no_slot), 8, platform_yes=False)


def test_the_platform_hook_defaults_to_no() -> None:
    """vLLM's `Platform` answers no unless a platform says otherwise."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    assert Platform.supports_prefill_chunk_across_kv_blocks() is False
    assert current_platform.supports_prefill_chunk_across_kv_blocks() is False


def make_scheduler_with(scheduler_cls: Any, chunk: int = CHUNK, num_blocks: int = 20, **kwargs: Any) -> Any:
    from sched_harness import create_scheduler

    return create_scheduler(
        scheduler_cls=scheduler_cls,
        block_size=BLOCK,
        num_blocks=num_blocks,
        max_num_batched_tokens=chunk,
        max_num_seqs=4,
        max_model_len=256,
        **{"enable_prefix_caching": True, **kwargs},
    )


@dataclass(frozen=True)
class PlatformSettings:
    """A platform's own `additional_config` object, as vllm-rbln's platform
    passes its `RBLNConfig` (fields `enable_sub_block_cache`, default True,
    and `sub_block_size`, default None, under those names); vLLM asks any
    such object for `compute_hash`."""

    enable_sub_block_cache: bool = True
    sub_block_size: int | None = None

    def compute_hash(self) -> str:
        return "platform-settings"


@pytest.mark.parametrize(
    ("settings", "chunk", "expected"),
    [
        (PlatformSettings(), 8, 8),
        (PlatformSettings(sub_block_size=4), 16, 4),
        (PlatformSettings(enable_sub_block_cache=False), 8, None),
        (PlatformSettings(), 16, None),
    ],
    ids=["default", "size", "switched-off", "chunk-equals-block"],
)
def test_settings_are_read_from_a_platform_object(
    settings: PlatformSettings, chunk: int, expected: int | None
) -> None:
    """vllm-rbln's platform replaces `additional_config` by its own object:
    its fields are read as the keys of a dict are. Shown failing before:
    `default` and `size` ran with whole blocks (a non-dict was read as no
    settings, with the switch off by default)."""
    scheduler = make_scheduler_with(h.rbln_scheduler_factory(settings), chunk=chunk)
    assert scheduler.vllm_config.additional_config is settings
    if expected is None:
        assert_whole_blocks(scheduler)
    else:
        assert_sub_blocks(scheduler, expected)


def test_a_bad_size_on_a_platform_object_is_refused() -> None:
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError, match="got 16 >= 16 >= 32"):
        make_scheduler_with(h.rbln_scheduler_factory(PlatformSettings(sub_block_size=32)))


# --- With a KV connector: a local sub-block tail and a remote hit.


@pytest.mark.parametrize(
    ("remote", "local", "external"),
    [
        # The connector's hit, in tokens past the block-aligned local hit (16)
        # it is shown. 16 more (to 32) is strictly longer than the local
        # sub-block tail (8 tokens, to 24): the tail is dropped, the load
        # covers it, nothing is copied.
        (16, 16, 16),
        # 8 more (to 24) is no longer than the tail: the local sub-block hit
        # is kept (with its copy-on-write tail) and nothing is loaded.
        (8, 24, 0),
    ],
)
def test_connector_with_a_local_sub_block_tail(remote: int, local: int, external: int) -> None:
    from tests.v1.core.utils import mock_kv

    scheduler = make_scheduler(h.sub_block_settings(4), kv_connector=mock_kv(remote, False))
    driver = h.Driver(scheduler)
    a_prompt = prompt(26, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=1, hash_block_size=4))
    driver.run(10, until=["A"])
    b_prompt = a_prompt + prompt(14, seed=2)
    driver.add(h.make_request("B", b_prompt, max_tokens=2, hash_block_size=4))
    record = driver.step()
    assert record.num_computed_before["B"] == local + external
    b_blocks = scheduler.kv_cache_manager.get_blocks("B").blocks[0]
    assert b_blocks[0].block_hash is not None  # the whole block: a local hit
    if external:
        assert record.block_copies == []
    else:
        assert [dst for _, dst in record.block_copies] == [b_blocks[1].block_id]
    driver.run(20)
    assert "B" in driver.finished
    h.assert_all_blocks_free(scheduler)


# --- The retry without the sub-block match.


def test_admission_retries_once_without_the_sub_block_match() -> None:
    """B's 24-token sub-block hit on A's finished (free but cached) blocks
    costs the gate both cached blocks (they leave the free queue) and a
    copy-on-write block; cut back to the whole block it costs one block less.
    With exactly that many free blocks, B is admitted in the same step with
    the whole-block hit instead of waiting."""
    scheduler = make_scheduler(h.sub_block_settings(4), num_blocks=4)  # 3 usable
    driver = h.Driver(scheduler)
    a_prompt = prompt(26, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=1, hash_block_size=4))
    driver.run(10, until=["A"])
    h.assert_all_blocks_free(scheduler)
    # 40 tokens + 1 decode token: 3 blocks. Sub-block hit: 2 cached blocks
    # touched + CoW + 1 new = 4 > 3. Whole-block hit: 1 cached + 2 new = 3.
    driver.add(h.make_request("B", a_prompt + prompt(14, seed=2), max_tokens=2, hash_block_size=4))
    record = driver.step()
    assert record.prefill_req_ids == ["B"] and record.num_computed_before == {"B": 16}
    assert record.block_copies == []
    driver.run(20)
    assert "B" in driver.finished
    h.assert_all_blocks_free(scheduler)


# --- Connectors that key their store on block hashes (issue 14, bug 4).


def offloading_connector(children: int = 0) -> Any:
    """The real OffloadingConnector with its CPU spec (1 MiB of CPU blocks),
    or a MultiConnector holding it after `children` Mock connectors."""
    from vllm.config import KVTransferConfig

    offloading = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20},
    }
    if not children:
        return KVTransferConfig(**offloading)
    mock = {
        "kv_connector": "MockKVConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"matched_tokens": 0, "is_async": False},
    }
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": [mock] * children + [offloading]},
    )


def _assert_names_the_ways_out(message: str, what: str, sub_block_size: int) -> None:
    """A sub-block refusal names what it refuses, the setting, and the ways out."""
    assert what in message
    assert f"sub_block_size={sub_block_size}" in message
    assert "turn sub-block caching off (enable_sub_block_cache=False)" in message


def make_with(
    settings: dict[str, Any] | None, configure: Callable[[Any], None], chunk: int = CHUNK, **kwargs: Any
) -> Any:
    """The RBLN scheduler in vLLM's unit harness, its `vllm_config` first changed by `configure`."""
    rbln = h.rbln_scheduler_factory(settings)

    def factory(*, vllm_config: Any, **kwargs: Any) -> Any:
        configure(vllm_config)
        return rbln(vllm_config=vllm_config, **kwargs)

    return make_scheduler_with(factory, chunk, **kwargs)


def make_with_transfer_config(
    settings: dict[str, Any] | None, kv_transfer_config: Any, chunk: int = CHUNK, **kwargs: Any
) -> Any:
    def configure(vllm_config: Any) -> None:
        vllm_config.kv_transfer_config = kv_transfer_config
        # As vLLM's config does for a connector without HMA support (the
        # Mock child of the MultiConnector); one full-attention group needs
        # no hybrid manager.
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True

    return make_with(settings, configure, chunk, **kwargs)


def offload_keys(
    scheduler: Any, prompts: dict[str, list[int]], hash_block_size: int
) -> dict[str, list[bytes]]:
    """The keys the OffloadingConnector computes for each prompt's blocks
    (at admission, from `request.block_hashes`)."""
    driver = h.Driver(scheduler)
    for req_id, tokens in prompts.items():
        driver.add(h.make_request(req_id, tokens, max_tokens=2, hash_block_size=hash_block_size))
    keys: dict[str, list[bytes]] = {}
    states = scheduler.connector.connector_scheduler._req_status
    for _ in range(12):
        driver.step()
        for req_id, state in states.items():
            if state.group_states[0].offload_keys:
                keys[req_id] = list(state.group_states[0].offload_keys)
    assert keys.keys() == prompts.keys()
    return keys


@pytest.mark.parametrize("children", [0, 1], ids=["offloading", "multi"])
@pytest.mark.parametrize("sub_block_size", [4, 8])
def test_hash_keyed_connector_with_sub_blocks_is_refused(children: int, sub_block_size: int) -> None:
    """The OffloadingConnector takes one key per 16-token block from the
    request's hashes, believing them 16 tokens apart; with sub-block hashes
    the key of tokens 0-15 is the hash of tokens 0-3 (the review's repro:
    two prompts sharing only 4 tokens got the same key). Refused at
    construction, naming the connector and the ways out."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        make_with_transfer_config(h.sub_block_settings(sub_block_size), offloading_connector(children))
    _assert_names_the_ways_out(str(error.value), "OffloadingConnector", sub_block_size)


@pytest.mark.parametrize(
    "settings", [None, h.sub_block_settings(None, enabled=False)], ids=["chunk-equals-block", "sub-block-off"]
)
def test_hash_keyed_connector_gets_one_key_per_block(settings: dict[str, Any] | None) -> None:
    """Where the request hashes are one per block, the real connector runs
    and its keys tell prompts apart exactly by their first block: equal for
    two prompts sharing tokens 0-15, different for two sharing only 0-3."""
    scheduler = make_with_transfer_config(settings, offloading_connector())
    assert type(scheduler.connector).__name__ == "OffloadingConnector"
    head = prompt(4, seed=1)
    block = head + prompt(12, seed=2)
    keys = offload_keys(
        scheduler,
        {
            "a": block + prompt(8, seed=3),
            "b": block + prompt(8, seed=4),
            "c": head + prompt(20, seed=5),
        },
        hash_block_size=BLOCK,
    )
    assert [len(k) for k in keys.values()] == [1, 1, 1]
    assert keys["a"][0] == keys["b"][0]
    assert keys["c"][0] != keys["a"][0]


# --- Everything else that keys on request hashes (defects (a) and (b) of
# the issue-14 review): the routed-experts output connector, and connectors
# nobody checked (an allowlist, not a denylist).


def with_routed_experts(settings: dict[str, Any] | None, chunk: int = CHUNK) -> Any:
    """The RBLN scheduler with `enable_return_routed_experts=True`, where the pin reads it
    (`upstream_rules.routed_experts_by_block_hash`): `AuxOutputConfig`, so upstream's
    scheduler builds its aux-output connector (0.31.0 on), or `ModelConfig`, so it builds its
    `RoutedExpertsManager` (0.30.0; the model given 8 experts, 2 a token, which the manager
    needs and the harness's OPT config lacks)."""
    from upstream_rules import routed_experts_by_block_hash

    def configure(vllm_config: Any) -> None:
        if routed_experts_by_block_hash():
            from vllm.config import AuxOutputConfig

            vllm_config.aux_output_config = AuxOutputConfig(enable_return_routed_experts=True)
            return
        model_config = vllm_config.model_config
        model_config.enable_return_routed_experts = True
        model_config.model_arch_config.num_experts = 8
        model_config.model_arch_config.num_experts_per_token = 2

    return make_with(settings, configure, chunk)


@pytest.mark.parametrize("sub_block_size", [4, 8])
def test_routed_experts_with_sub_blocks_is_refused(sub_block_size: int) -> None:
    """Routed experts are filed per whole KV block at every pin
    (`upstream_rules.routed_experts_by_block_hash`). From 0.31.0 the aux-output connector
    sends `request.block_hashes` to its worker, which files each block's routed experts under
    one hash per `resolve_kv_cache_block_sizes()` hash block: the KV block, for one group;
    with sub-block hashes block 0 would be filed under the hash of tokens 0-3. At 0.30.0 the
    scheduler's `RoutedExpertsManager` keeps them in the slots of the request's own KV blocks:
    a sub-block hit's tail block is a copy that gets the KV of the hit's tokens and none of
    their routed experts. Refused at construction, naming the setting and the ways out."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        with_routed_experts(h.sub_block_settings(sub_block_size))
    _assert_names_the_ways_out(str(error.value), "enable_return_routed_experts", sub_block_size)


@pytest.mark.parametrize(
    "settings", [None, h.sub_block_settings(None, enabled=False)], ids=["chunk-equals-block", "sub-block-off"]
)
def test_routed_experts_get_one_hash_per_block(settings: dict[str, Any] | None) -> None:
    """Where request hashes are one per block, routed experts run, filed per whole KV block
    (the premise of the refusal above). From 0.31.0 what the aux-output connector sends its
    worker is one hash per block, at the block size the worker resolves. At 0.30.0
    (`upstream_rules`) no hash is sent: the `RoutedExpertsManager` files them by slot at the
    KV block size, and reads a request's back through the block ids of its KV blocks."""
    from upstream_rules import routed_experts_by_block_hash

    # The whole 40-token prompt in one step (from 0.33.0 the metadata holds the
    # hashes of the blocks scheduled so far).
    scheduler = with_routed_experts(settings, chunk=64)
    scheduler.add_request(h.make_request("A", prompt(40, seed=1), max_tokens=2, hash_block_size=BLOCK))
    if routed_experts_by_block_hash():
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

        assert scheduler.aux_output_connector is not None
        assert resolve_kv_cache_block_sizes(scheduler.kv_cache_config, scheduler.vllm_config) == (
            BLOCK,
            BLOCK,
        )
        metadata = scheduler.schedule().aux_output_connector_metadata
        assert len(list(metadata.block_hashes["A"])) == 40 // BLOCK
        return
    manager = scheduler.routed_experts_mgr
    assert manager.block_size == BLOCK
    output = scheduler.schedule()
    (block_ids,) = output.scheduled_new_reqs[0].block_ids
    assert len(block_ids) == -(-40 // BLOCK)
    assert scheduler._re_block_ids["A"] == list(block_ids)


def module_path_connector(name: str) -> Any:
    """A KVTransferConfig loading `name` from tests/scheduler/oot_connectors.py
    through `kv_connector_module_path`, as an out-of-tree connector is."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector=name,
        kv_connector_module_path="oot_connectors",
        kv_role="kv_both",
        kv_connector_extra_config={"matched_tokens": 0, "is_async": False},
    )


@pytest.mark.parametrize("name", ["BlockHashKeyedConnector", "LMCacheConnectorV1"])
def test_unverified_connector_with_sub_blocks_is_refused(name: str) -> None:
    """An out-of-tree connector (`kv_connector_module_path`) is not known to
    key on tokens, so it is refused with sub-block hashes, also when its class
    takes the name of a checked in-tree connector. The message names the
    class and the ways out, the operator's list among them."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        make_with_transfer_config(h.sub_block_settings(4), module_path_connector(name))
    message = str(error.value)
    assert f"oot_connectors.{name} is not known to key" in message
    assert "turn sub-block caching off (enable_sub_block_cache=False)" in message
    assert 'additional_config["sub_block_verified_connectors"]' in message
    assert "lmcache_connector.LMCacheConnectorV1" in message  # the checked ones


def test_unverified_connector_inside_a_multi_connector_is_refused() -> None:
    from vllm.config import KVTransferConfig
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    child = module_path_connector("BlockHashKeyedConnector")
    multi = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "connectors": [
                {
                    "kv_connector": child.kv_connector,
                    "kv_connector_module_path": child.kv_connector_module_path,
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": child.kv_connector_extra_config,
                }
            ]
        },
    )
    with pytest.raises(SubBlockCacheConfigError, match="oot_connectors.BlockHashKeyedConnector"):
        make_with_transfer_config(h.sub_block_settings(4), multi)


OFFLOADING_CHILD = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20},
}
OOT_CHILD = {
    "kv_connector": "BlockHashKeyedConnector",
    "kv_connector_module_path": "oot_connectors",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"matched_tokens": 0, "is_async": False},
}
MOCK_CHILD = {
    "kv_connector": "MockKVConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"matched_tokens": 0, "is_async": False},
}
OPERATOR_MULTI = "oot_connectors.OperatorMultiConnector"


def multi_connector_subclass(*children: dict[str, Any]) -> Any:
    """The operator's MultiConnector subclass (tests/scheduler/oot_connectors.py)
    holding `children`."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector="OperatorMultiConnector",
        kv_connector_module_path="oot_connectors",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": list(children)},
    )


@pytest.mark.parametrize(
    ("child", "named"),
    [(OFFLOADING_CHILD, "OffloadingConnector"), (OOT_CHILD, "oot_connectors.BlockHashKeyedConnector")],
    ids=["hash-keyed-child", "unverified-child"],
)
def test_a_listed_multi_connector_subclass_still_has_its_children_checked(
    child: dict[str, Any], named: str
) -> None:
    """The operator lists their MultiConnector subclass as checked (its own
    code); its children are checked as MultiConnector's are, so a listed
    container never carries a hash-keyed or unverified child through."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    settings = h.sub_block_settings(4, verified_connectors=(*h.TEST_CONNECTORS, OPERATOR_MULTI))
    with pytest.raises(SubBlockCacheConfigError) as error:
        make_with_transfer_config(settings, multi_connector_subclass(MOCK_CHILD, child))
    assert named in str(error.value) and OPERATOR_MULTI not in str(error.value)
    # With checked children only, it runs.
    scheduler = make_with_transfer_config(settings, multi_connector_subclass(MOCK_CHILD))
    assert type(scheduler.connector).__name__ == "OperatorMultiConnector"


def test_an_unlisted_multi_connector_subclass_is_refused_by_its_own_name() -> None:
    """Its children are fine, but its own code is not vLLM's MultiConnector:
    refused until the operator lists it, naming it and the ways out."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        make_with_transfer_config(h.sub_block_settings(4), multi_connector_subclass(MOCK_CHILD))
    assert f"{OPERATOR_MULTI} is not known to key" in str(error.value)
    assert 'additional_config["sub_block_verified_connectors"]' in str(error.value)


def test_connector_listed_as_checked_runs_with_sub_blocks() -> None:
    """The operator's list lets a connector they checked through; the same
    connector runs with whole blocks without being listed."""
    settings = h.sub_block_settings(4, verified_connectors=("oot_connectors.LMCacheConnectorV1",))
    scheduler = make_with_transfer_config(settings, module_path_connector("LMCacheConnectorV1"))
    assert type(scheduler.connector).__module__ == "oot_connectors"
    whole_blocks = h.sub_block_settings(None, enabled=False, verified_connectors=())
    scheduler = make_with_transfer_config(whole_blocks, module_path_connector("LMCacheConnectorV1"))
    assert scheduler.connector is not None


def test_checked_in_tree_connector_runs_with_sub_blocks(tmp_path: Any) -> None:
    """vLLM's ExampleConnector (it stores a prompt under a hash of its token
    ids) is on the checked list: the RBLN scheduler takes it with sub-block
    hashes and no operator list."""
    from vllm.config import KVTransferConfig

    config = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    scheduler = make_with_transfer_config(h.sub_block_settings(4, verified_connectors=()), config)
    assert type(scheduler.connector).__name__ == "ExampleConnector"


def test_the_checked_list_names_connectors_vllm_has() -> None:
    """Every entry of the allowlist is a class vLLM registers, under that
    module: a renamed or moved connector must be checked again, not pass by
    an old name."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.core.sched.rbln_sub_block import TOKEN_KEYED_CONNECTORS, qualified_name

    in_tree = [name for name in TOKEN_KEYED_CONNECTORS if name.startswith("vllm.")]
    assert len(in_tree) == 3
    for name in in_tree:
        registered = KVConnectorFactory._registry[name.rsplit(".", 1)[1]]()
        assert qualified_name(registered) == name


# --- The RBLN stack's own connectors (issue 21, gap 7): vllm-rbln 0.12.0
# registers RBLNLMCacheConnectorV1 (lmcache_rbln's, a subclass of LMCache's
# vLLM adapter: keyed on tokens) and the RblnNixl* connectors (vLLM's NIXL
# scheduler side: blocks moved by id). Loaded from stand-ins at their modules
# (tests/scheduler/rbln_stack/README.md).

RBLN_STACK = Path(__file__).resolve().parent / "rbln_stack"
RBLN_LMCACHE = "lmcache_rbln.integration.vllm.connector.RBLNLMCacheConnectorV1"
RBLN_NIXL = "vllm_rbln.distributed.kv_transfer.kv_connector.v1.rbln_nixl.connector"


@pytest.fixture
def rbln_stack(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(RBLN_STACK))
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("lmcache_rbln", "vllm_rbln")]:
        del sys.modules[name]


def rbln_connector(module: str, name: str) -> Any:
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector=name,
        kv_connector_module_path=module,
        kv_role="kv_both",
        kv_connector_extra_config={"matched_tokens": 0, "is_async": False},
    )


def test_the_rbln_lmcache_connector_runs_with_sub_blocks(rbln_stack: Any) -> None:
    """Accepted with no operator list, and listed among the checked ones.
    Shown failing before: refused as `... is not known to key the KV it stores
    on tokens`."""
    from vllm.v1.core.sched.rbln_sub_block import TOKEN_KEYED_CONNECTORS

    assert RBLN_LMCACHE in TOKEN_KEYED_CONNECTORS
    config = rbln_connector("lmcache_rbln.integration.vllm.connector", "RBLNLMCacheConnectorV1")
    scheduler = make_with_transfer_config(h.sub_block_settings(4, verified_connectors=()), config)
    assert f"{type(scheduler.connector).__module__}.RBLNLMCacheConnectorV1" == RBLN_LMCACHE
    assert_sub_blocks(scheduler, 4)


@pytest.mark.parametrize("name", ["RblnNixlPullConnector", "RblnNixlPushConnector"])
def test_the_rbln_nixl_connectors_are_refused_by_name(rbln_stack: Any, name: str) -> None:
    """They move blocks by id, not keyed on tokens: refused with a size given,
    naming the connector, why, and the ways out; with no size the default
    stays with whole blocks and runs; listed by the operator, they run with
    sub-blocks. Shown failing before: the generic `not known to key` refusal,
    without the reason (and the default was off anyway)."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    config = rbln_connector(RBLN_NIXL, name)
    with pytest.raises(SubBlockCacheConfigError) as error:
        make_with_transfer_config(h.sub_block_settings(4, verified_connectors=()), config)
    message = str(error.value)
    assert f"the KV connector {RBLN_NIXL}.{name} (vllm-rbln's NIXL" in message
    assert "moves KV blocks by block id, not keyed on tokens" in message
    assert 'list it in additional_config["sub_block_verified_connectors"]' in message
    assert "turn sub-block caching off (enable_sub_block_cache=False)" in message

    default = make_with_transfer_config({}, config, chunk=8)
    assert_whole_blocks(default)
    assert f"{RBLN_NIXL}.{name}" in (default.sub_block_cache.whole_blocks_because or "")

    listed = h.sub_block_settings(4, verified_connectors=(f"{RBLN_NIXL}.{name}",))
    assert_sub_blocks(make_with_transfer_config(listed, config), 4)


def test_the_default_stays_with_whole_blocks_beside_a_hash_keyed_connector() -> None:
    """No size given: the real OffloadingConnector runs, with whole blocks
    (its keys stay one per block), where a size given is refused (above)."""
    scheduler = make_with_transfer_config({}, offloading_connector(), chunk=8)
    assert type(scheduler.connector).__name__ == "OffloadingConnector"
    assert_whole_blocks(scheduler)
    assert "OffloadingConnector" in (scheduler.sub_block_cache.whole_blocks_because or "")


# --- A preempted request resuming with a connector (issue 21, gap 7).


def test_a_request_resumed_with_a_connector_resumes_where_the_connector_was_told() -> None:
    """The connector is shown the block-aligned local hit. LMCache's adapter
    (lmcache 0.5.6) asserts, for a request resumed from preemption, that it
    resumes at `max(LMCache's hit, the count it was shown)`
    (`LMCacheBookkeepingConnector`, tests/scheduler/oot_connectors.py, holds
    its conditions). B's first admission keeps its sub-block hit (24 tokens,
    a first admission has no such check); preempted, B resumes at its own
    cached whole blocks (32), not at the sub-block tail past them (40).
    Shown failing before the fix: `Preempted request B has
    num_computed_tokens 40 but expected 32` from schedule() (at 0.31.0;
    from 0.32.0 B's partial entry ends at 36)."""
    import time

    from vllm.config import KVTransferConfig

    name = "LMCacheBookkeepingConnector"
    settings = h.sub_block_settings(4, verified_connectors=(f"oot_connectors.{name}",))
    config = KVTransferConfig(
        kv_connector=name,
        kv_connector_module_path="oot_connectors",
        kv_role="kv_both",
        kv_connector_extra_config={"matched_tokens": 16, "is_async": False},
    )
    # vLLM's V1 model runner, which vllm-rbln's runner is: before 0.34.0 a
    # resumed request is sent as resumed (the V2 runner's, the harness's default
    # from 0.32.0, as new); from 0.34.0, as new, with every token it has. The
    # connector checks the resume point in either form.
    scheduler = make_with_transfer_config(settings, config, **h.V1_RUNNER)
    driver = h.Driver(scheduler)
    a_prompt = prompt(26, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=1, hash_block_size=4))
    driver.run(10, until=["A"])
    driver.add(h.make_request("B", a_prompt + prompt(14, seed=2), max_tokens=8, hash_block_size=4))
    first = driver.step()
    assert first.num_computed_before == {"B": 24} and first.block_copies  # the sub-block hit
    driver.step()  # B's prefill ends: B decodes
    b = scheduler.requests["B"]
    assert b.num_output_tokens >= 1
    scheduler.running.remove(b)
    scheduler._preempt_request(b, time.monotonic())
    resumed = driver.step()
    assert resumed.num_computed_before["B"] == 32
    assert scheduler.connector.resumes_checked == 1
    driver.run(30)
    assert "B" in driver.finished
    h.assert_all_blocks_free(scheduler)


# ---------------------------------------------------------------------------
# Sliding-window layouts (issue 29, part 1b): a model whose every layer has a window (one
# SlidingWindowSpec group: Mistral with sliding_window), and full attention next to a
# sliding window (two groups: Gemma-2/3). The KV-contents oracle follows every group (a
# window's reads only inside the window) and the KV events are replayed for both.

WINDOW_LAYOUTS = ["window", "full+window"]


def window_groups(layout: str, window: int) -> list[Any]:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

    shape: dict[str, Any] = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": 64, "dtype": torch.float32}
    sliding = KVCacheGroupSpec(["sliding"], SlidingWindowSpec(**shape, sliding_window=window))
    if layout == "window":
        return [sliding]
    return [KVCacheGroupSpec(["full"], FullAttentionSpec(**shape)), sliding]


def make_window_scheduler(
    layout: str,
    window: int,
    settings: dict[str, Any] | None = None,
    *,
    num_blocks: int = 20,
    chunk: int = CHUNK,
) -> Any:
    """The RBLN scheduler (sub-blocks of 4 unless `settings` say otherwise) on a
    sliding-window layout, with KV cache events on (the Driver replays them)."""
    settings = h.sub_block_settings(4) if settings is None else settings
    scheduler_cls = h.with_kv_events(
        on_groups(h.rbln_scheduler_factory(settings), window_groups(layout, window)), False
    )
    return make_scheduler_with(scheduler_cls, chunk=chunk, num_blocks=num_blocks)


def window_driver(scheduler: Any) -> h.Driver:
    driver = h.Driver(scheduler)
    assert driver.oracle is not None, "the KV-contents oracle follows every group"
    assert driver.events is not None, "the KV events are replayed for every group"
    return driver


def shared_prefix_on_window(
    layout: str,
    window: int,
    first_len: int,
    shared_len: int,
    second_len: int,
    *,
    a_running: bool = False,
    sub_block_size: int | None = 4,
) -> tuple[Any, h.Driver, h.StepRecord, int]:
    """`run_shared_prefix` on a sliding-window layout."""
    settings = None if sub_block_size is None else h.sub_block_settings(sub_block_size)
    if sub_block_size is None:
        settings = {"enable_sub_block_cache": False}
    hash_size = BLOCK if sub_block_size is None else sub_block_size
    scheduler = make_window_scheduler(layout, window, settings)
    driver = window_driver(scheduler)
    a_prompt = prompt(first_len, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=8 if a_running else 1, hash_block_size=hash_size))
    if a_running:
        prefill_steps(driver, "A", first_len)
        assert "A" not in driver.finished
    else:
        driver.run(10, until=["A"])
        assert "A" in driver.finished
    b_prompt = a_prompt[:shared_len] + prompt(second_len - shared_len, seed=2)
    driver.add(h.make_request("B", b_prompt, max_tokens=2, hash_block_size=hash_size))
    record = driver.step()
    assert "B" in record.prefill_req_ids
    return scheduler, driver, record, record.num_computed_before["B"]


@pytest.mark.parametrize("layout", WINDOW_LAYOUTS)
@pytest.mark.parametrize(
    ("window", "first_len", "shared_len", "expected_hit"),
    [
        # A window longer than the prompts: every block in it. B extends A's 26 tokens:
        # 24, inside A's second block; a sibling leaving inside A's first block: 12.
        (64, 26, 26, 24),
        (64, 26, 13, 12),
        # A 40-token A, B leaving it after 29 tokens: 28, inside A's second block.
        (64, 40, 29, 28),
        # A window of 8 (under a block): a hit at 28 needs A's block 1 only (positions
        # 21-27); block 0 is below the window, null in B's table.
        (8, 40, 29, 28),
        # A window of 20: a hit at 28 needs blocks 0 and 1 (positions 9-27).
        (20, 40, 29, 28),
    ],
)
def test_sub_block_hits_with_a_sliding_window(
    layout: str, window: int, first_len: int, shared_len: int, expected_hit: int
) -> None:
    """A hit ends on a sub-block boundary inside a block in every group; the tail block
    of each group is copied to a private block of B's (one copy per group), the blocks
    below B's window are the null block in its sliding-window table, and every block is
    free at the end. Shown failing on main's patches: a size given was refused (rule 3,
    "got ['SlidingWindowSpec']" / "['FullAttentionSpec', 'SlidingWindowSpec']")."""
    scheduler, driver, record, hit = shared_prefix_on_window(layout, window, first_len, shared_len, 40)
    assert hit == expected_hit
    groups = scheduler.kv_cache_config.kv_cache_groups
    tables = scheduler.kv_cache_manager.get_blocks("B").blocks
    tail = hit // BLOCK
    copies = dict((dst, src) for src, dst in record.block_copies)
    assert len(record.block_copies) == len(groups)
    for group, table in zip(groups, tables, strict=True):
        assert table[tail].block_id in copies, "each group's tail block is B's private copy"
        window_size = getattr(group.kv_cache_spec, "sliding_window", None)
        if window_size is not None:
            below = max(0, hit - window_size + 1) // BLOCK
            assert all(block.is_null for block in table[:below])
            assert not any(block.is_null for block in table[below:])
    driver.run(20)
    assert driver.finished == {"A", "B"}
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("layout", WINDOW_LAYOUTS)
def test_whole_blocks_on_a_sliding_window_layout_hit_whole_blocks(layout: str) -> None:
    """The control: sub-block caching off, the same 26 tokens shared hit 16 (one block)."""
    _scheduler, driver, record, hit = shared_prefix_on_window(layout, 64, 26, 26, 40, sub_block_size=None)
    assert hit == 16 and record.block_copies == []
    driver.run(20)


@pytest.mark.parametrize("layout", WINDOW_LAYOUTS)
def test_a_running_request_s_tail_block_is_copied_in_every_group(layout: str) -> None:
    """A still runs (decoding into its second block) when B hits 24 of its 26 tokens:
    B's whole blocks are A's (shared read-only), its tail block in each group a copy that
    no other request holds; A keeps writing its own."""
    scheduler, driver, record, hit = shared_prefix_on_window(layout, 64, 26, 26, 40, a_running=True)
    assert hit == 24
    manager = scheduler.kv_cache_manager
    for a_table, b_table in zip(manager.get_blocks("A").blocks, manager.get_blocks("B").blocks, strict=True):
        assert b_table[0] is a_table[0] and a_table[0].ref_cnt == 2
        assert b_table[1] is not a_table[1]
        assert (a_table[1].block_id, b_table[1].block_id) in record.block_copies
        assert not {b.block_id for b in b_table[1:]} & {a.block_id for a in a_table}
    driver.run(30)
    assert driver.finished == {"A", "B"}
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("layout", WINDOW_LAYOUTS)
def test_the_window_s_blocks_leave_the_table_and_stay_cached(layout: str) -> None:
    """A 48-token prompt under a window of 8: once A has computed past a block's window,
    the block leaves A's sliding-window table (null) and goes back to the pool, its
    entries kept (free but cached); a sibling leaving A after 45 tokens then hits 44 with
    only A's block 2 from the window group (positions 37-43), copied."""
    scheduler = make_window_scheduler(layout, 8)
    driver = window_driver(scheduler)
    a_prompt = prompt(48, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=6, hash_block_size=4))
    prefill_steps(driver, "A", 48)
    driver.step()  # A's first decode: its window's start has moved past blocks 0 and 1
    sliding = len(scheduler.kv_cache_config.kv_cache_groups) - 1
    a_window_table = scheduler.kv_cache_manager.get_blocks("A").blocks[sliding]
    assert [block.is_null for block in a_window_table[:2]] == [True, True]
    driver.add(h.make_request("B", a_prompt[:45] + prompt(10, seed=2), max_tokens=2, hash_block_size=4))
    record = driver.step()
    assert record.num_computed_before["B"] == 44
    b_window_table = scheduler.kv_cache_manager.get_blocks("B").blocks[sliding]
    assert [block.is_null for block in b_window_table[:2]] == [True, True]
    assert len(record.block_copies) == len(scheduler.kv_cache_config.kv_cache_groups)
    driver.run(30)
    assert driver.finished == {"A", "B"}
    h.assert_all_blocks_free(scheduler)


def test_a_window_block_reused_cuts_the_hit_in_every_group() -> None:
    """Full attention + a window of 8. A's full-attention blocks still hold its 26-token
    prompt, but the window group's block holding A's positions 16-25 went to another
    request: B, sharing A's 26 tokens, gets no hit inside that block in either group (the
    coordinator cuts full attention's 24 to the window's), only A's first block, 16."""
    scheduler = make_window_scheduler("full+window", 8, num_blocks=8)  # 7 usable
    pool = scheduler.kv_cache_manager.block_pool
    driver = window_driver(scheduler)
    a_prompt = prompt(26, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=1, hash_block_size=4))
    driver.run(10, until=["A"])
    from vllm.v1.core.kv_cache_utils import get_group_id

    a_window_tail = next(
        block
        for block in pool.blocks
        if block.block_hash is not None
        and block.block_hash_num_tokens == 24
        and get_group_id(block.block_hash) == 1
    )
    # The pool hands that block out (to a request that needs one) and gets it back: its
    # entries go, the full-attention group's stay.
    pool.touch([a_window_tail])
    assert pool._maybe_evict_cached_block(a_window_tail)
    pool.free_blocks([a_window_tail])
    driver.add(h.make_request("B", a_prompt + prompt(14, seed=2), max_tokens=2, hash_block_size=4))
    record = driver.step()
    assert record.num_computed_before["B"] == 16
    assert record.block_copies == []
    driver.run(20)
    h.assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("layout", WINDOW_LAYOUTS)
def test_on_by_default_for_a_sliding_window_layout(layout: str) -> None:
    """The default (no size given) takes sub-blocks at the prefill chunk on these layouts
    too, as vllm-rbln 0.12.0 does; the hybrid coordinator's partial hits are on."""
    assert_sub_blocks(make_window_scheduler(layout, 32, {}, chunk=8), 8)


# KV events of sub-blocks with an EAGLE drafter and a cache salt (issue 51, item 1). From
# vLLM 0.34.0 an EAGLE drafter's block hash covers the token after the block
# (`num_hash_lookahead_tokens` = 1), and a `BlockStored` names those tokens
# (`lookahead_token_ids`) next to each hash's extra keys; the replay recomputes every
# stored hash from them (kv_event_replay.py). Before 0.34.0 nothing is hashed past a block.


class KeepingPublisher(h.RecordingPublisher):
    """The Driver's publisher, keeping every event it replays."""

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.events: list[Any] = []

    def publish(self, events: Any) -> None:
        self.events.extend(events.events)
        super().publish(events)


def test_sub_block_events_give_the_extra_keys_of_the_hash_s_lookahead(eagle_draft: Path) -> None:
    """Sub-blocks of 4 under an EAGLE drafter: A (30 tokens) runs; B shares 22 of them and
    hits A's sub-block entries to 20, inside A's second block; C has A's prompt with a
    cache salt, so it hits nothing of A's (the salt keys its first sub-block); D shares
    C's salt and 22 tokens, and hits C's entries to 20 (16 before 0.34.0, EAGLE's drop of
    a hit's last hash unit). Every `BlockStored` is recomputed
    by the replay from its tokens, extra keys (C's and D's salt on their first sub-block)
    and, at 0.34.0, the token after each sub-block; the replay equals the pool after every
    step. Shown failing with the patch's events built without the lookahead tokens (see
    the commit that added this test)."""
    from vllm.distributed.kv_events import BlockStored
    from vllm_release import vllm_release

    scheduler_cls = h.with_kv_events(
        h.with_eagle(h.rbln_scheduler_factory(h.sub_block_settings(4)), eagle_draft, hash_lookahead=True),
        False,
    )
    scheduler = make_scheduler_with(scheduler_cls, num_blocks=30)
    assert_sub_blocks(scheduler, 4)
    lookahead = scheduler.vllm_config.num_hash_lookahead_tokens if vllm_release() >= (0, 34) else 0
    assert lookahead == (1 if vllm_release() >= (0, 34) else 0)
    assert scheduler.num_spec_tokens == h.NUM_SPEC_TOKENS
    driver = h.Driver(scheduler)
    assert driver.events is not None and driver.events.num_hash_lookahead_tokens == lookahead
    publisher = KeepingPublisher(driver.events)
    scheduler.kv_event_publisher = publisher  # type: ignore[assignment]

    def request(req_id: str, tokens: list[int], salt: str | None = None) -> Any:
        return h.make_request(
            req_id,
            tokens,
            max_tokens=6,
            hash_block_size=4,
            num_hash_lookahead_tokens=lookahead,
            cache_salt=salt,
        )

    def admit(req: Any) -> tuple[int, int]:
        """The request's hit as a router reading the events finds it before the request
        runs, and as the scheduler gives it; the request then runs to the end."""
        routed = driver.events.hit_tokens(req.block_hashes)  # type: ignore[union-attr]
        driver.add(req)
        record = driver.step()
        assert req.request_id in record.prefill_req_ids
        hit = record.num_computed_before[req.request_id]
        driver.run(40, until=[req.request_id])
        assert req.request_id in driver.finished
        return routed, hit

    # B's hit: the events hold A's entries to 20 (inside A's second block). With the hash
    # lookahead the scheduler hits all of it; without (before 0.34.0) EAGLE drops the
    # hit's last hash unit, a sub-block (upstream's rule: the drafter needs the position
    # before the first computed one), which a router does not see.
    shared = (20, 20 if lookahead else 16)
    a_prompt = prompt(30, seed=1)
    b_prompt = a_prompt[:22] + prompt(18, seed=2)
    assert admit(request("A", a_prompt)) == (0, 0)
    assert admit(request("B", b_prompt)) == shared
    assert admit(request("C", a_prompt, salt="salt-1")) == (0, 0)
    assert admit(request("D", b_prompt, salt="salt-1")) == shared
    h.assert_all_blocks_free(scheduler)

    stored = [event for event in publisher.events if isinstance(event, BlockStored)]
    assert stored and {event.block_size for event in stored} == {4}
    assert driver.events.num_stored == sum(len(event.block_hashes) for event in stored)
    # The salt is an extra key of the salted requests' first sub-block, and only there.
    first = [event for event in stored if event.parent_block_hash is None]
    salted = [event for event in first if event.extra_keys and event.extra_keys[0] is not None]
    assert len(salted) == 1 and "salt-1" in salted[0].extra_keys[0]
    assert all(keys is None for event in stored for keys in (event.extra_keys or [None])[1:])
    for event in stored:
        named = getattr(event, "lookahead_token_ids", None)
        if lookahead:
            # The token after each sub-block: the next sub-block's first, for all but the last.
            assert named is not None and len(named) == len(event.block_hashes)
            tokens = event.token_ids
            assert named[:-1] == [[tokens[4 * (i + 1)]] for i in range(len(named) - 1)]
        else:
            assert named is None
