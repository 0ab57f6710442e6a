"""No wrong KV: the scenarios that handed a request KV it never computed (issues 32 and 33),
and the oracle (kv_oracle.py) that every scheduler-tier and parity-tier workload runs
under, shown failing on a wrong copy, a stale entry and an overwritten slot."""

from __future__ import annotations

from typing import Any

import pytest
import sched_harness as h
from cached_blocks import cached_blocks
from kv_oracle import KVContentsError, KVOracle


def _sub_block_scheduler(rbln: bool = True, sub_block_size: int = 4, **kwargs: Any) -> Any:
    """Blocks of 16, chunks of 16, ngram drafts (3 a step), prefix caching hashed every
    ``sub_block_size`` tokens: the RBLN scheduler's sub-block caching (declared on a platform
    whose chunks may cross KV blocks), or upstream's scheduler with the same hash size and the
    RBLN KV cache classes (`kv_cache_manager_cls`: upstream's own coordinator refuses a hash
    finer than its block), so upstream's policy drives the same sub-block entries."""
    kwargs.setdefault("max_num_batched_tokens", h.PREFILL_CHUNK)
    kwargs.setdefault("num_speculative_tokens", h.NUM_SPEC_TOKENS)
    kwargs.setdefault("speculative_method", "ngram")
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("enable_prefix_caching", True)
    if rbln:
        kwargs["scheduler_cls"] = h.rbln_scheduler_factory(
            h.sub_block_settings(sub_block_size), async_scheduling=kwargs.get("async_scheduling", False)
        )
        return h.make_scheduler(rbln=False, **kwargs)
    from vllm.v1.core.sched.rbln_kv_cache import RBLNKVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    class UpstreamPolicy(Scheduler):
        kv_cache_manager_cls = RBLNKVCacheManager

    def upstream(**scheduler_kwargs: Any) -> Any:
        if sub_block_size == h.BLOCK_SIZE:
            return Scheduler(**scheduler_kwargs)
        return UpstreamPolicy(**scheduler_kwargs, hash_block_size=sub_block_size)

    return h.make_scheduler(rbln=False, scheduler_cls=upstream, **kwargs)


# -- issue 32: an entry registered by a step that a preemption takes back -----------------


def _preempted_after_registering(rbln: bool, sub_block_size: int = 4) -> h.Driver:
    """L (priority 1) decodes alone with every draft rejected; H (priority 0) arrives at step
    3 and, once it needs a block, preempts L, which that step had scheduled (and whose
    allocation had registered the sub-block boundaries of the tokens it was about to
    compute). Then X asks for L's first 28 tokens and one more."""
    scheduler = _sub_block_scheduler(
        rbln, sub_block_size, num_blocks=6, max_num_seqs=4, scheduling_policy="priority"
    )
    driver = h.Driver(scheduler)
    hbs = scheduler.kv_cache_manager.block_pool.hash_block_size
    low = h.make_request("L", h.distinct_prompt(1, 22), 40, priority=1, hash_block_size=hbs)
    driver.add(low)
    for step in range(40):
        if step == 3:
            driver.add(h.make_request("H", h.distinct_prompt(2, 22), 40, priority=0, hash_block_size=hbs))
        record = driver.step()
        if "L" in record.preempted_req_ids:
            break
    else:
        pytest.fail("H never preempted L: the scenario's geometry changed")
    prompt = [*low.all_token_ids[:28], 4242]
    driver.add(h.make_request("X", prompt, 8, priority=0, hash_block_size=hbs))
    driver.run(200)
    return driver


@pytest.mark.parametrize(
    ("rbln", "sub_block_size"),
    # Upstream's scheduler hashing every 4 tokens over the RBLN KV cache classes read the
    # same wrong KV before the fix; with whole blocks it never did (the control).
    [(True, 4), (False, 4), (False, h.BLOCK_SIZE)],
    ids=["rbln", "upstream-sub-block", "upstream-whole-blocks"],
)
def test_a_preempted_steps_sub_block_entries_give_no_later_request_wrong_kv(
    rbln: bool, sub_block_size: int
) -> None:
    """Before the fix the RBLN case failed at the preemption step itself: "wrong entry: the
    prefix-cache entry for 28 tokens of L points at block 2, whose slot 11 does not hold
    position 27's KV" (the oracle checks every entry after each batch), and upstream hashing at
    4 failed on X's and L's reads. With the fix X still hits what L computed where the pool
    kept it (upstream's sub-block case: 16 tokens); under the RBLN policy H's blocks reuse L's,
    so X hits nothing and the entry check is the case's test."""
    driver = _preempted_after_registering(rbln, sub_block_size)
    assert driver.preemptions.get("L") and {"L", "H", "X"} <= driver.finished
    assert driver.oracle is not None and not driver.oracle.violations
    x_hit = next(s.num_computed_before["X"] for s in driver.steps if "X" in s.num_computed_before)
    if not rbln and sub_block_size == 4:
        assert x_hit > 0, "X made no hit: the scenario no longer reaches L's cached KV"


# -- issue 33: a decode-ready join copying a block a decode of the same step still writes --

MODES = {
    "sync": {},
    "pp2": {"pipeline_parallel_size": 2, "max_in_flight": 2},
    "async": {"async_scheduling": True, "max_in_flight": 2},
}


def _join_on_a_boundary_being_written(rbln: bool, mode: str) -> h.Driver:
    """A decodes; when its step is about to compute position 11 (its 12th token), D1 (a
    one-token prompt) and D2 (A's 12 tokens and one more) arrive. A's allocation in that
    step reaches the 12-token boundary; D2, decode-ready on a 12-token hit, joins the same
    decode batch with a copy of A's block, which runs before the forward that writes
    position 11."""
    settings = dict(MODES[mode])
    in_flight = settings.pop("max_in_flight", 1)
    scheduler = _sub_block_scheduler(
        rbln, num_blocks=40, max_num_seqs=4, num_speculative_tokens=None, speculative_method=None, **settings
    )
    driver = h.Driver(scheduler, max_in_flight=in_flight)
    hbs = scheduler.kv_cache_manager.block_pool.hash_block_size
    a = h.make_request("A", h.distinct_prompt(5, 9), 12, hash_block_size=hbs)
    driver.add(a)
    for _ in range(30):
        if driver.oracle is not None and driver.oracle._device_computed.get("A", 0) >= 11:
            break
        driver.step() if in_flight == 1 else driver.step_with_batch_queue()
    tokens = driver.oracle._tokens["A"] if driver.oracle is not None else list(a.all_token_ids)
    driver.add(h.make_request("D1", [77], 4, hash_block_size=hbs))
    driver.add(h.make_request("D2", [*tokens[:12], 4343], 4, hash_block_size=hbs))
    driver.run(60)
    return driver


@pytest.mark.parametrize("mode", list(MODES))
def test_a_decode_ready_join_never_copies_kv_a_decode_of_its_step_is_writing(mode: str) -> None:
    driver = _join_on_a_boundary_being_written(True, mode)
    assert {"A", "D1", "D2"} <= driver.finished
    assert any(step.block_copies for step in driver.steps), "D2 made no sub-block hit: the test shows nothing"
    assert driver.oracle is not None and not driver.oracle.violations


# -- the oracle itself can fail ------------------------------------------------------------


def _two_prompts_sharing_a_block() -> tuple[h.Driver, Any]:
    """A 26-token prompt, then a second that shares its first 24 tokens: the second hits 24
    tokens (inside block 1) and gets a copy of that block."""
    scheduler = _sub_block_scheduler(num_blocks=20)
    driver = h.Driver(scheduler)
    hbs = scheduler.kv_cache_manager.block_pool.hash_block_size
    first = h.distinct_prompt(3, 26)
    driver.add(h.make_request("A", first, 2, hash_block_size=hbs))
    driver.run(20)
    driver.add(h.make_request("B", [*first[:24], 99, 98, 97], 2, hash_block_size=hbs))
    return driver, scheduler


def test_the_oracle_passes_a_copied_sub_block_hit() -> None:
    driver, _ = _two_prompts_sharing_a_block()
    driver.run(20)
    assert any(step.block_copies for step in driver.steps), "no copy: the test shows nothing"
    assert driver.oracle is not None and not driver.oracle.violations


def test_the_oracle_fails_a_copy_to_the_wrong_block() -> None:
    driver, scheduler = _two_prompts_sharing_a_block()
    oracle = driver.oracle
    assert oracle is not None
    real_copy = oracle._copy

    def wrong_copy(output: Any) -> None:
        for copy in output.kv_cache_block_copies or ():
            free = scheduler.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()[-1]
            output.kv_cache_block_copies = [type(copy)(copy.src_block_id, free.block_id)]
        real_copy(output)

    oracle._copy = wrong_copy  # type: ignore[method-assign]
    with pytest.raises(KVContentsError, match="stale read: B attends position"):
        driver.run(20)


def test_the_oracle_fails_a_stale_entry() -> None:
    driver, scheduler = _two_prompts_sharing_a_block()
    oracle = driver.oracle
    assert oracle is not None
    pool = scheduler.kv_cache_manager.block_pool
    _key, block = next(cached_blocks(pool))
    block_id = block.block_id
    oracle._check_entries(set())  # every entry holds what it claims
    # The entry's block forgets its KV, as if its tokens had never been computed.
    for slot in [s for s in oracle._slots if s[0] == block_id]:
        oracle._slots[slot] = 0
    with pytest.raises(KVContentsError, match=f"wrong entry: the prefix-cache entry .* block {block_id}"):
        oracle._check_entries({block_id})


def test_the_oracle_fails_an_overwritten_slot() -> None:
    scheduler = _sub_block_scheduler(num_blocks=20)
    driver = h.Driver(scheduler)
    driver.add(h.make_request("A", h.distinct_prompt(6, 30), 6, hash_block_size=4))
    driver.add(h.make_request("B", h.distinct_prompt(7, 20), 6, hash_block_size=4))
    driver.run(4)
    oracle = driver.oracle
    assert oracle is not None
    (table_a,), (table_b,) = oracle._tables("A"), oracle._tables("B")
    assert len(table_a) >= 2 and len(table_b) >= 2, "both must be decoding in their second block"
    # B's next decode (its position 20) writes into A's second block, where A computed
    # its position 20 (A's prompt is 30 tokens) and still reads it.
    real_tables = oracle._tables

    def crossed(req_id: str) -> list[list[int]]:
        return [[table_b[0], table_a[1], *table_b[2:]]] if req_id == "B" else real_tables(req_id)

    oracle._tables = crossed  # type: ignore[method-assign]
    with pytest.raises(KVContentsError, match="overwrite: B writes position .* which A computed"):
        driver.step()


def test_the_oracle_follows_every_harness_driver() -> None:
    scheduler = _sub_block_scheduler(num_blocks=20)
    assert KVOracle.applies(scheduler) and h.Driver(scheduler).oracle is not None
