"""The runner contract (docs/runner-contract.md): what an RBLN model runner may
rely on from the RBLN scheduler's `SchedulerOutput`, one statement per test.

Each workload runs the real patched `RBLNScheduler` through vLLM's harness
(`sched_harness.Driver`); `ContractRunner` reads every step's output the way
the contract tells a runner to (the phase from the token counts, the block
tables from the new/resumed/cached lists, the copies from
`kv_cache_block_copies`, the tokens a non-last pipeline stage is sent) and
checks what it builds against the scheduler's own state. Each workload also
asserts that the cases a statement is about happened, so no check passes on
an empty run, and the same checks fail on upstream's `Scheduler`
(`test_the_phase_statement_fails_on_upstreams_scheduler`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import sched_harness as h

BLOCK = h.BLOCK_SIZE  # 16
SPEC = h.NUM_SPEC_TOKENS  # 3


@dataclass
class ContractRunner:
    """A model runner's view of the scheduler's output, built by the contract's rules alone."""

    scheduler: Any
    # Request id -> its block table (group 0), as the runner keeps it.
    tables: dict[str, list[int]] = field(default_factory=dict)
    # Requests preempted since they were last scheduled.
    preempted: set[str] = field(default_factory=set)
    ever_scheduled: set[str] = field(default_factory=set)
    last_step: set[str] = field(default_factory=set)
    # What the workload covered (each test asserts on its own).
    prefill_steps: int = 0
    decode_steps: int = 0
    # Requests scheduled with a single prompt token left (a chunk's last token, a
    # prompt of one token, a prefix-cache or connector hit of all but one token).
    one_token_prompt_steps: int = 0
    # Of those, admissions that shared their decode step with other requests.
    joined_decode_batch: int = 0
    new: int = 0
    resumed: int = 0
    copies_in_shared_steps: int = 0
    cached_after_a_gap: int = 0
    copies: int = 0
    payloads: int = 0
    # A non-last pipeline stage's copy of each request's tokens, and by how many tokens it
    # was short of a step's input when the step's payload came (section 4).
    stage: dict[str, list[int]] = field(default_factory=dict)
    stage_lags: dict[str, set[int]] = field(default_factory=dict)

    def read(self, output: Any) -> None:
        from vllm.v1.core.sched.output import SchedulerOutput

        scheduler = self.scheduler
        # The output is upstream's own type: no subclass, no extra field to look for.
        assert type(output) is SchedulerOutput
        scheduled = output.num_scheduled_tokens
        drafts = output.scheduled_spec_decode_tokens
        self._check_lists(output)
        computed_before = self._computed_before(output)

        # 1. The phase: from the non-draft token counts alone.
        base = {r: n - len(drafts.get(r, ())) for r, n in scheduled.items()}
        if any(n > 1 for n in base.values()):
            self.prefill_steps += 1
            assert len(scheduled) == 1, f"a prefill step holds {sorted(scheduled)}"
            (req_id,) = scheduled
            assert req_id not in drafts, "a prefill carries drafts"
            request = scheduler.requests[req_id]
            assert computed_before[req_id] + scheduled[req_id] <= request.num_tokens
        elif scheduled:
            self.decode_steps += 1
            for req_id in scheduled:
                request = scheduler.requests[req_id]
                # Every token but the last is in the KV cache: a decode's input.
                assert computed_before[req_id] == request.num_tokens - 1, (
                    req_id,
                    computed_before,
                    request.num_tokens,
                )
                if request.num_output_tokens == 0:
                    # A prompt's last token, a decode's input: admitted with it (a
                    # one-token prompt, a hit of all but one token) or a chunked
                    # prompt's one-token last chunk, it joins the decode batch.
                    if len(scheduled) > 1:
                        self.joined_decode_batch += 1
                    self.one_token_prompt_steps += 1

        # 2. The block tables.
        self._apply_blocks(output)
        for req_id in scheduled:
            assert self.tables[req_id] == list(scheduler.kv_cache_manager.get_block_ids(req_id)[0]), req_id

        # 3. The copies of sub-block hits.
        # A copy belongs to a request the step admits (new, or resumed), whatever else the
        # step holds: a decode-ready admission brings its copy into a decode step.
        admitted = {data.req_id for data in output.scheduled_new_reqs} | _resumed(
            output.scheduled_cached_reqs
        )
        for copy in output.kv_cache_block_copies or ():
            self.copies += 1
            owners = [
                r
                for r in admitted
                if computed_before[r] % BLOCK
                and copy.dst_block_id == self.tables[r][computed_before[r] // BLOCK]
            ]
            assert len(owners) == 1, f"a copy to block {copy.dst_block_id} of no admitted request's hit"
            (req_id,) = owners
            if len(scheduled) > 1:
                self.copies_in_shared_steps += 1
            assert all(copy.src_block_id not in self.tables[r] for r in scheduled), (
                "a copy from a block the step holds"
            )

        # 4. What a non-last pipeline stage is sent. The stage keeps its own copy of each
        # request's tokens, from what it is sent alone: a new request's prompt, the whole list
        # of a request that sat out the last step (`all_token_ids`), and each payload, which
        # ends at the step's last token beyond the drafts (its "tip"). The stage never sees the
        # sampled tokens nor which drafts were accepted: it must be able to extend its copy to
        # the tip from the payload, and the copy must then be the request's real tokens.
        cached = output.scheduled_cached_reqs
        if scheduler.use_pp and not scheduler.scheduler_config.async_scheduling:
            assert len(cached.new_token_ids) == len(cached.req_ids)
            for data in output.scheduled_new_reqs:
                # A resumed request's prompt and outputs, from 0.34.0.
                tokens = data.prefill_token_ids if h.ONE_RUNNER_FORM else data.prompt_token_ids
                self.stage[data.req_id] = list(tokens)
            for i, req_id in enumerate(cached.req_ids):
                request = scheduler.requests[req_id]
                whole = getattr(cached, "all_token_ids", {})  # up to 0.33.0
                if req_id in whole:
                    self.stage[req_id] = list(whole[req_id])
                copy = self.stage[req_id]
                payload = list(cached.new_token_ids[i])
                tip = cached.num_computed_tokens[i] + base[req_id]
                behind = tip - len(copy)
                if behind > 0:
                    assert len(payload) >= behind, (
                        f"{req_id}: the stage's copy is {behind} tokens short of the step's input, "
                        f"and it is sent {len(payload)}"
                    )
                    copy.extend(payload[len(payload) - behind :])
                    self.stage_lags.setdefault(req_id, set()).add(behind)
                assert copy[:tip] == request.all_token_ids[:tip], (
                    f"{req_id}: the stage computes on other tokens"
                )
                self.payloads += 1
        else:
            assert cached.new_token_ids == []

        for req_id in output.preempted_req_ids or ():
            self.preempted.add(req_id)
            self.tables.pop(req_id, None)
        self.last_step = set(scheduled)

    def _check_lists(self, output: Any) -> None:
        new_ids = [data.req_id for data in output.scheduled_new_reqs]
        cached = output.scheduled_cached_reqs
        assert not set(new_ids) & set(cached.req_ids)
        assert set(new_ids) | set(cached.req_ids) == set(output.num_scheduled_tokens)
        for req_id in new_ids:
            if req_id in self.ever_scheduled:
                # With the V2 model runner (the only form from 0.34.0): a resumed
                # request comes as new, with every token it has.
                assert getattr(self.scheduler, "use_v2_model_runner", True), f"{req_id} is new twice"
                assert req_id in self.preempted, f"{req_id} is new again, never preempted"
                self.preempted.discard(req_id)
                self.resumed += 1
            else:
                # New: scheduled for the first time (an admission, a landed KV load).
                self.new += 1
        for req_id in cached.req_ids:
            assert req_id in self.ever_scheduled
            # Resumed exactly when preempted since it was last scheduled.
            assert (req_id in _resumed(cached)) == (req_id in self.preempted), req_id
            if req_id in _resumed(cached):
                self.resumed += 1
            elif req_id not in self.last_step:
                self.cached_after_a_gap += 1
        assert _resumed(cached) <= set(cached.req_ids)
        if getattr(self.scheduler, "use_v2_model_runner", True):
            assert not _resumed(cached)
        for data in output.scheduled_new_reqs:
            if h.ONE_RUNNER_FORM:  # 0.34.0: every token, a resumed request's outputs too
                request = self.scheduler.requests[data.req_id]
                assert list(data.prefill_token_ids) == list(request.all_token_ids), data.req_id
        self.ever_scheduled.update(output.num_scheduled_tokens)

    def _computed_before(self, output: Any) -> dict[str, int]:
        computed = {data.req_id: data.num_computed_tokens for data in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for req_id, value in computed.items():
            # The runner's count is the scheduler's before this step.
            request = self.scheduler.requests[req_id]
            assert value == request.num_computed_tokens - output.num_scheduled_tokens[req_id]
        return computed

    def _apply_blocks(self, output: Any) -> None:
        for data in output.scheduled_new_reqs:
            self.tables[data.req_id] = list(data.block_ids[0])
        cached = output.scheduled_cached_reqs
        for req_id, new_blocks in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if req_id in _resumed(cached):
                # Resumed: the whole table, replacing the old one.
                assert new_blocks is not None
                self.tables[req_id] = list(new_blocks[0])
                self.preempted.discard(req_id)
            elif new_blocks is not None:
                # Running: the blocks added since it was last scheduled.
                self.tables[req_id].extend(new_blocks[0])


def _resumed(cached: Any) -> set[str]:
    """The requests `cached` says were resumed: none from 0.34.0, which sends them as new."""
    return set(getattr(cached, "resumed_req_ids", ()))


class ContractDriver(h.Driver):
    """The harness's driver with a `ContractRunner` reading every step's output."""

    runner: ContractRunner

    def _record(self, output: Any) -> h.StepRecord:
        self.runner.read(output)
        return super()._record(output)


def drive(scheduler: Any, accept: Callable[[str, int], int] | None = None, **kwargs: Any) -> ContractDriver:
    runner = ContractRunner(scheduler)

    def accepting(req_id: str, num_drafts: int) -> int:
        return 0 if accept is None else min(accept(req_id, num_drafts), num_drafts)

    driver = ContractDriver(scheduler, accept=accepting, **kwargs)
    driver.runner = runner
    return driver


def make(**kwargs: Any) -> Any:
    kwargs.setdefault("max_model_len", 512)
    # vllm-rbln's runner is a V1 model runner (the harness defaults to V2 from 0.32.0).
    for key, value in h.V1_RUNNER.items():
        kwargs.setdefault(key, value)
    return h.make_scheduler(**kwargs)


def some_drafts_accepted(req_id: str, num_drafts: int) -> int:
    return sum(map(ord, req_id)) % (num_drafts + 1)


def run_mixed(scheduler: Any) -> ContractDriver:
    """Prompts of every kind the phase rule meets: chunked (16-token chunks) with a
    one-token last chunk, a one-token prompt, a prompt whose prefix-cache hit is all but
    its last token, and requests arriving while others decode; ngram drafts, some
    accepted."""
    driver = drive(scheduler, accept=some_drafts_accepted)
    shared = h.distinct_prompt(9, 17)
    driver.add(h.make_request("first", shared, max_tokens=4))
    for req_id, prompt_len, max_tokens in (("chunked-33", 33, 5), ("one", 1, 4), ("plain", 20, 9)):
        driver.add(h.named_request(req_id, prompt_len, max_tokens))
    for _ in range(6):
        driver.step()
    # A whole-block hit of 16 of its 17 tokens: one token left.
    driver.add(h.make_request("same-17", shared, max_tokens=3))
    driver.add(h.named_request("late", 40, 6))
    driver.run(300)
    assert not scheduler.has_requests()
    h.assert_all_blocks_free(scheduler)
    return driver


def mixed_scheduler(**kwargs: Any) -> Any:
    return make(
        max_num_batched_tokens=16,
        enable_prefix_caching=True,
        num_speculative_tokens=SPEC,
        speculative_method="ngram",
        **kwargs,
    )


def test_the_phase_is_told_by_the_non_draft_token_counts() -> None:
    """A step is a prefill step when some request has two or more tokens beyond its
    drafts; then it holds that one request and no drafts. Otherwise it is a decode step:
    every request has all but its last token computed. A prompt's last token (a
    one-token chunk, a one-token prompt, a hit of all but one token) is a decode by
    that rule, and joins the decode batch (a chunk's last token too)."""
    driver = run_mixed(mixed_scheduler())
    runner = driver.runner
    assert runner.prefill_steps >= 4 and runner.decode_steps >= 5
    # chunked-33's last chunk, "one" and "same-17".
    assert runner.one_token_prompt_steps >= 3
    assert runner.joined_decode_batch == runner.one_token_prompt_steps, runner


def test_the_phase_statement_fails_on_upstreams_scheduler() -> None:
    """The checks can fail: upstream's `Scheduler` puts prefills beside decodes."""
    scheduler = mixed_scheduler(rbln=False)
    with pytest.raises(AssertionError, match="a prefill step holds|shares a step"):
        run_mixed(scheduler)


@pytest.mark.parametrize(
    "v2",
    [None] if h.ONE_RUNNER_FORM else [False, True],
    ids=["one-runner-form"] if h.ONE_RUNNER_FORM else ["v1-runner", "v2-runner"],
)
def test_new_resumed_and_cached_requests(v2: bool | None) -> None:
    """`scheduled_new_reqs`: a request's first scheduling, with its whole block table.
    `scheduled_cached_reqs`: every other scheduled request; `resumed_req_ids` names the
    ones preempted since they last ran, whose `new_block_ids` replace their table; for
    the rest `new_block_ids` are the blocks added since they last ran, also after steps
    they sat out. Checked against the scheduler's block tables every step, under a pool
    small enough to preempt. With the V2 model runner a resumed request comes in
    `scheduled_new_reqs` instead, with its whole table, and `resumed_req_ids` is empty."""
    runner_form = {} if v2 is None else {"use_v2_model_runner": v2}
    scheduler = make(num_blocks=14, max_num_batched_tokens=32, **runner_form)
    driver = drive(scheduler)
    for i in range(5):
        driver.add(h.named_request(f"r{i}", 30, 40))
    driver.run(600)
    assert not scheduler.has_requests()
    runner = driver.runner
    assert sum(driver.preemptions.values()) > 0
    assert runner.new == 5
    assert runner.resumed == sum(driver.preemptions.values())
    assert runner.cached_after_a_gap > 0
    h.assert_all_blocks_free(scheduler)


def test_a_landed_kv_load_is_a_new_request_with_one_token() -> None:
    """A P/D decode side: every prompt's KV but its last token arrives from the
    connector, asynchronously. The landed request is new, starts at its loaded
    tokens, and its one token runs as a decode by the phase rule, in the decode
    batch (the three land together and share one step)."""
    from sched_harness import create_scheduler
    from vllm.config import KVTransferConfig

    h._register_prefix_hit_connector()
    rbln = h.rbln_scheduler_factory()

    def scheduler_cls(*, vllm_config: Any, **kwargs: Any) -> Any:
        vllm_config.kv_transfer_config = KVTransferConfig(
            kv_connector=h.PREFIX_HIT_CONNECTOR,
            kv_role="kv_both",
            kv_connector_extra_config={"matched_tokens": 10_000, "is_async": True},
        )
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
        return rbln(vllm_config=vllm_config, **kwargs)

    scheduler = create_scheduler(
        scheduler_cls=scheduler_cls,  # type: ignore[arg-type]
        block_size=BLOCK,
        max_model_len=512,
        **h.V1_RUNNER,
    )
    driver = drive(scheduler, async_load_steps=2)
    for i in range(3):
        driver.add(h.named_request(f"pd{i}", 40, 5))
    driver.run(100)
    assert not scheduler.has_requests()
    runner = driver.runner
    assert runner.new == 3
    assert runner.prefill_steps == 0
    assert runner.one_token_prompt_steps == 3
    assert runner.joined_decode_batch == 3


def _sub_block_scheduler(sub_block_size: int) -> Any:
    """The RBLN scheduler with sub-blocks of ``sub_block_size`` (blocks of 16, chunks of 16)."""
    from sched_harness import create_scheduler

    return create_scheduler(
        scheduler_cls=h.rbln_scheduler_factory(h.sub_block_settings(sub_block_size)),  # type: ignore[arg-type]
        block_size=BLOCK,
        num_blocks=40,
        max_num_batched_tokens=16,
        max_model_len=256,
        enable_prefix_caching=True,
        **h.V1_RUNNER,
    )


@pytest.mark.parametrize("sub_block_size", [4, 8])
def test_sub_block_copies_are_in_kv_cache_block_copies(sub_block_size: int) -> None:
    """The copy for a hit that ends inside a block is in `kv_cache_block_copies` of
    the step that admits the request, as (source, destination) block ids: the
    destination is the request's block holding the hit's end, the source a block it
    does not hold. Copy the whole block before the step's forward pass."""
    scheduler = _sub_block_scheduler(sub_block_size)
    driver = drive(scheduler)
    # The later two extend the first's whole 26-token prompt: they hit its last sub-block
    # boundary, 24 tokens at sub-block 4 and 8, which ends inside block 1.
    first = h.distinct_prompt(3, 26)
    for i, tail in enumerate((0, 14, 20)):
        prompt = first + h.distinct_prompt(50 + i, tail)
        driver.add(h.make_request(f"s{i}", prompt, max_tokens=3, hash_block_size=sub_block_size))
        driver.run(20)
    assert not scheduler.has_requests()
    assert driver.runner.copies == 2
    h.assert_all_blocks_free(scheduler)


def test_a_decode_ready_sub_block_hit_brings_its_copy_into_a_decode_step() -> None:
    """Issue 28: the statement once said a copy comes in a step holding its request alone.
    A hit of all but the last token that ends on a sub-block boundary inside a block is a
    decode-ready admission: it joins the running decode's batch with its copy. Shown failing
    with the old statement's check (`len(scheduled) == 1` for every copy)."""
    scheduler = _sub_block_scheduler(4)
    driver = drive(scheduler)
    first = h.distinct_prompt(3, 26)
    driver.add(h.make_request("cached", first, max_tokens=1, hash_block_size=4))
    driver.run(20)
    driver.add(h.make_request("decoding", h.distinct_prompt(4, 10), max_tokens=12, hash_block_size=4))
    driver.run(3)  # its prefill, then it decodes
    # 24 of 25 tokens hit (inside block 1): one token left, a decode.
    driver.add(h.make_request("joiner", [*first[:24], 4545], max_tokens=3, hash_block_size=4))
    driver.run(40)
    assert not scheduler.has_requests()
    assert driver.runner.copies == 1 and driver.runner.copies_in_shared_steps == 1


@pytest.mark.parametrize("drafts", [False, True], ids=["no-drafts", "ngram"])
def test_a_non_last_stage_gets_the_base_tokens(drafts: bool) -> None:
    """Pipeline parallel 2, sync scheduling, 16-token chunks: a non-last stage, which builds
    its copy of every request's tokens from the scheduler's output alone (the contract
    runner's section 4), always has the real tokens of each step's input.

    How far behind its copy is when a decode step comes is the scenario's: without drafts
    one token (the one sampled last step). With ngram k=3, request ppN has N of its 3
    drafts accepted every step (`some_drafts_accepted`), and every decode step follows a
    step with drafts, so the stage is N + 1 tokens short (the accepted drafts and the
    sampled token): pp0 1, pp1 2, pp2 3, pp3 4, and the payload must reach back that far (a
    request back from a step it sat out, as after the prompts' own steps, is sent its whole
    list in `all_token_ids` instead, and is not short). Upstream's
    payload (from the computed count, a token a step) leaves the stage short: shown failing
    first with the override of `_make_cached_request_data` (patch "Send a non-last pipeline
    stage the tokens it may lag by under spec decoding") taken out (pp1: the stage's copy
    is 2 tokens short of the step's input, and it is sent 1). Without PP the list is empty
    (checked in every other test)."""
    kwargs: dict[str, Any] = {"num_speculative_tokens": SPEC, "speculative_method": "ngram"} if drafts else {}
    scheduler = make(pipeline_parallel_size=2, max_num_seqs=4, max_num_batched_tokens=16, **kwargs)
    driver = drive(scheduler, accept=some_drafts_accepted)
    for i, prompt_len in enumerate((40, 20, 9, 33)):
        driver.add(h.named_request(f"pp{i}", prompt_len, 8))
    driver.run(300)
    assert not scheduler.has_requests()
    runner = driver.runner
    assert runner.payloads > 10
    if drafts:
        assert [some_drafts_accepted(f"pp{i}", SPEC) for i in range(4)] == [0, 1, 2, 3]
        # pp3's 33-token prompt ends in a one-token chunk, which runs in a decode step
        # without drafts: the step after it finds the stage 1 short.
        # From 0.34.0 a request back from a step it sat out is sent no whole list
        # (`all_token_ids` is gone): after its prompt's last step the stage is 1 short
        # (the token sampled there), and the payload reaches back to it.
        back = {1} if h.ONE_RUNNER_FORM else set()
        assert runner.stage_lags == {"pp0": {1}, "pp1": {2} | back, "pp2": {3} | back, "pp3": {1, 4}}
    else:
        assert runner.stage_lags == {f"pp{i}": {1} for i in range(4)}
    h.assert_all_blocks_free(scheduler)
