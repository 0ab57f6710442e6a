"""Sub-block prefix caching in the RBLN scheduler (docs/sub-block-cache.md).

The real patched scheduler and KV cache manager, driven through vLLM's own
harness. A request A runs first; a request B sharing a prefix with it then
hits A's cached blocks. With sub-block caching the hit may end on a
sub-block boundary inside a block (upstream's fine-grained hash hits); that
tail block is copied to a private block before B writes to it
(copy-on-write), never shared for writing, and every block is free at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sched_harness as h
from upstream_rules import partial_entry_tokens

BLOCK = h.BLOCK_SIZE  # 16
# Large enough that a prompt prefills in one step.
CHUNK = 64


def make_scheduler(
    settings: dict[str, Any] | None,
    *,
    num_blocks: int = 20,
    prefix_caching: bool = True,
    chunk: int = CHUNK,
    kv_connector: Any = None,
    num_spec_tokens: int | None = None,
) -> Any:
    from tests.v1.core.utils import create_scheduler

    return create_scheduler(
        scheduler_cls=h.rbln_scheduler_factory(settings),  # type: ignore[arg-type]
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


def prompt(length: int, seed: int = 1) -> list[int]:
    return h.distinct_prompt(seed, length)


def run_shared_prefix(
    sub_block_size: int | None,
    first_len: int,
    shared_len: int,
    second_len: int,
    *,
    a_running: bool = False,
) -> tuple[Any, h.Driver, h.StepRecord, int]:
    """A runs (to the end, or just its prefill if `a_running`); then B, whose
    prompt shares A's first `shared_len` tokens, is admitted. Returns the
    scheduler, driver, B's admission step and B's hit (tokens not scheduled)."""
    settings = None if sub_block_size is None else h.sub_block_settings(sub_block_size)
    hash_size = BLOCK if sub_block_size is None else sub_block_size
    scheduler = make_scheduler(settings)
    driver = h.Driver(scheduler)
    a_prompt = prompt(first_len, seed=1)
    driver.add(h.make_request("A", a_prompt, max_tokens=1 if not a_running else 8, hash_block_size=hash_size))
    if a_running:
        driver.step()  # A's prefill; A keeps running (decoding)
        assert "A" not in driver.finished
    else:
        driver.run(10, until=["A"])
        assert "A" in driver.finished
    b_prompt = a_prompt[:shared_len] + prompt(second_len - shared_len, seed=2)
    driver.add(h.make_request("B", b_prompt, max_tokens=2, hash_block_size=hash_size))
    record = driver.step()
    assert "B" in record.prefill_req_ids
    hit = second_len - record.num_scheduled_tokens["B"]
    return scheduler, driver, record, hit


def extends_a(sub_block_size: int, first_len: int, second_len: int) -> tuple[int, int, int, int, int, bool]:
    """A case where B's prompt extends A's whole prompt: B hits what A's partial entry covers."""
    hit = partial_entry_tokens(first_len, sub_block_size)
    return (sub_block_size, first_len, first_len, second_len, hit, hit % BLOCK != 0)


@pytest.mark.parametrize(
    ("sub_block_size", "first_len", "shared_len", "second_len", "expected_hit", "copied"),
    [
        # No shared prefix: no hit.
        (4, 26, 0, 30, 0, False),
        # B extends A's whole prompt: it hits up to A's partial entry (upstream's rule,
        # tests/support/upstream_rules.py: at 0.31.0 the prompt's last sub-block boundary;
        # from 0.32.0 the last one below its end, one sub-block shorter for a prompt ending
        # on a boundary), copied when that ends inside a block. At 0.31.0 / from 0.32.0:
        # 20 tokens, sub-block 4: 20, copied / 16, a whole block.
        extends_a(4, 20, 30),
        # 12 tokens, no whole block: 12 / 8, copied at both.
        extends_a(4, 12, 30),
        # 26 tokens: 24 at both, sub-block 4 or 8, copied.
        extends_a(4, 26, 40),
        extends_a(8, 26, 40),
        # Sub-block 8 rounds A's 20-token prompt down to 16 at both: a whole block.
        extends_a(8, 20, 30),
        # Whole blocks only: a block-aligned shared prefix.
        (4, 32, 32, 40, 32, False),
        # Whole-block caching (sub-block off) hits 16 of the same 26.
        (None, 26, 26, 40, 16, False),
    ],
)
def test_sub_block_hits(
    sub_block_size: int | None,
    first_len: int,
    shared_len: int,
    second_len: int,
    expected_hit: int,
    copied: bool,
) -> None:
    scheduler, driver, record, hit = run_shared_prefix(sub_block_size, first_len, shared_len, second_len)
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


def test_tail_block_is_never_shared_for_writing_with_a_running_request() -> None:
    """A is still running (decoding into its tail block) when B hits a
    sub-block of that tail: B gets a copy, the full blocks are shared."""
    scheduler, driver, record, hit = run_shared_prefix(4, 26, 26, 40, a_running=True)
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
    driver.step()
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


def test_sub_block_size_none_takes_the_prefill_chunk() -> None:
    scheduler = make_scheduler({"enable_sub_block_cache": True, "sub_block_size": None}, chunk=8)
    assert scheduler.sub_block_cache.enabled
    assert scheduler.sub_block_cache.sub_block_size == 8
    assert scheduler.hash_block_size == 8
    assert scheduler.kv_cache_manager.coordinator.enable_partial_hash_hits


def test_sub_block_cache_off_is_upstream_whole_block_caching() -> None:
    scheduler = make_scheduler({"enable_sub_block_cache": False, "sub_block_size": 4})
    assert not scheduler.sub_block_cache.enabled
    assert scheduler.hash_block_size == BLOCK
    assert not scheduler.kv_cache_manager.coordinator.enable_partial_hash_hits
    # Upstream's own scheduler with the same harness: whole-block hashing.
    from tests.v1.core.utils import create_scheduler

    upstream = create_scheduler(block_size=BLOCK, enable_prefix_caching=True)
    assert upstream.hash_block_size == BLOCK
    assert not upstream.kv_cache_manager.coordinator.enable_partial_hash_hits


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"enable_sub_block_cache": True, "sub_block_size": 6}, "does not divide the KV block size (16)"),
        ({"enable_sub_block_cache": True, "sub_block_size": 32}, "exceeds the KV block size (16)"),
        ({"enable_sub_block_cache": True, "sub_block_size": 0}, "not a positive number"),
        (
            {"enable_sub_block_cache": True},
            "takes the prefill chunk size (max_num_batched_tokens=64), exceeds",
        ),
    ],
)
def test_bad_sub_block_sizes_are_refused(settings: dict[str, Any], message: str) -> None:
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        make_scheduler(settings)
    assert message in str(error.value)


def test_sub_block_cache_needs_prefix_caching() -> None:
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError, match="needs prefix caching"):
        make_scheduler(h.sub_block_settings(4), prefix_caching=False)


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
    assert record.num_scheduled_tokens["B"] == 40 - local - external
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
    assert record.num_scheduled_tokens == {"B": 40 - 16}
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
    assert "turn sub-block caching off" in message and "sub_block_size=16" in message


def make_with(settings: dict[str, Any] | None, configure: Callable[[Any], None]) -> Any:
    """The RBLN scheduler in vLLM's unit harness, its `vllm_config` first changed by `configure`."""
    from tests.v1.core.utils import create_scheduler

    rbln = h.rbln_scheduler_factory(settings)

    def factory(*, vllm_config: Any, **kwargs: Any) -> Any:
        configure(vllm_config)
        return rbln(vllm_config=vllm_config, **kwargs)

    return create_scheduler(
        scheduler_cls=factory,  # type: ignore[arg-type]
        block_size=BLOCK,
        num_blocks=20,
        max_num_batched_tokens=CHUNK,
        max_model_len=256,
        enable_prefix_caching=True,
    )


def make_with_transfer_config(settings: dict[str, Any] | None, kv_transfer_config: Any) -> Any:
    def configure(vllm_config: Any) -> None:
        vllm_config.kv_transfer_config = kv_transfer_config
        # As vLLM's config does for a connector without HMA support (the
        # Mock child of the MultiConnector); one full-attention group needs
        # no hybrid manager.
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True

    return make_with(settings, configure)


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
    "settings", [None, h.sub_block_settings(BLOCK)], ids=["sub-block-off", "sub-block-equals-block"]
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


def with_routed_experts(settings: dict[str, Any] | None) -> Any:
    """The RBLN scheduler with `enable_return_routed_experts=True`, so
    upstream's scheduler builds its aux-output connector."""
    from vllm.config import AuxOutputConfig

    def configure(vllm_config: Any) -> None:
        vllm_config.aux_output_config = AuxOutputConfig(enable_return_routed_experts=True)

    return make_with(settings, configure)


@pytest.mark.parametrize("sub_block_size", [4, 8])
def test_routed_experts_with_sub_blocks_is_refused(sub_block_size: int) -> None:
    """The aux-output connector sends `request.block_hashes` to its worker,
    which files each block's routed experts under one hash per
    `resolve_kv_cache_block_sizes()` hash block: the KV block, for one group.
    With sub-block hashes block 0 would be filed under the hash of tokens
    0-3. Refused at construction, naming the setting and the ways out."""
    from vllm.v1.core.sched.rbln_sub_block import SubBlockCacheConfigError

    with pytest.raises(SubBlockCacheConfigError) as error:
        with_routed_experts(h.sub_block_settings(sub_block_size))
    _assert_names_the_ways_out(str(error.value), "enable_return_routed_experts", sub_block_size)


@pytest.mark.parametrize(
    "settings", [None, h.sub_block_settings(BLOCK)], ids=["sub-block-off", "sub-block-equals-block"]
)
def test_routed_experts_get_one_hash_per_block(settings: dict[str, Any] | None) -> None:
    """Where request hashes are one per block, the aux-output connector runs,
    and what it sends its worker is one hash per block, at the block size the
    worker resolves (the premise of the refusal above)."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    scheduler = with_routed_experts(settings)
    assert scheduler.aux_output_connector is not None
    assert resolve_kv_cache_block_sizes(scheduler.kv_cache_config, scheduler.vllm_config) == (BLOCK, BLOCK)
    scheduler.add_request(h.make_request("A", prompt(40, seed=1), max_tokens=2, hash_block_size=BLOCK))
    metadata = scheduler.schedule().aux_output_connector_metadata
    assert len(list(metadata.block_hashes["A"])) == 40 // BLOCK


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
    assert "turn sub-block caching off" in message and "sub_block_size=16" in message
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
    whole_blocks = h.sub_block_settings(BLOCK, verified_connectors=())
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

    for name in TOKEN_KEYED_CONNECTORS:
        registered = KVConnectorFactory._registry[name.rsplit(".", 1)[1]]()
        assert qualified_name(registered) == name
