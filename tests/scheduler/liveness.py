"""Random scheduler workloads run to completion, and the liveness invariants.

Shared by `test_liveness_property.py` (a few hundred examples in the suite)
and `bench/liveness_soak.py` (thousands). A `Workload` is plain data; the
hypothesis strategy `workloads()` draws one; `run_workload` drives the real
scheduler (the RBLN one, or upstream's `Scheduler`, both with the backport)
through `sched_harness.Driver` and returns what happened; `check` asserts the
invariants against the bound of `step_bound`.

The step bound. Every request's pool need fits the pool (`Workload` sizes the
pool so), so the scheduler can always make progress. Count the steps a run
can take:

* a prefill step runs one chunk of one request (RBLN: exactly one; upstream:
  at least one); a request's prefill (its prompt, or after a preemption its
  prompt and the outputs it had) takes at most `cdiv(prompt + max_tokens,
  chunk)` chunks, plus one step for a chunk cut short by the sub-block/prefix
  alignment;
* a decode step advances at least one running request by at least one token
  (the head of the running list: FCFS preempts from the tail, and a request
  alone always fits), so the decode steps of one pass over a request are at
  most `max_tokens`;
* an async KV load waits `ASYNC_LOAD_STEPS` steps, and one step admits it;
* a preemption throws away at most one pass (prefill + decodes + load) of
  the victim, which is then redone.

So with `P_r` preemptions of request `r` the run ends within
`sum_r (1 + P_r) * (cdiv(prompt_r + max_tokens_r, chunk) + 1 + max_tokens_r
+ ASYNC_LOAD_STEPS + 1)` steps after the last arrival, and `P_r` itself is
bounded by `MAX_PREEMPTIONS` (asserted): a request is preempted only as the
victim of a request that was admitted through a gate that covered its next
step, and at most `MAX_PREEMPTIONS_IN_A_ROW` times before it emits a token.
The hard step cap of a run takes `P_r = MAX_PREEMPTIONS` for every request;
the check then recomputes the bound with the measured `P_r`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sched_harness as h

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

ASYNC_LOAD_STEPS = 1
# A request preempted more often than this before it emits a token again is
# the signature of the admission livelock (the no-backport variant preempts
# the new prompt 3 times in a row).
MAX_PREEMPTIONS_IN_A_ROW = 2
MAX_PREEMPTIONS = 8
MAX_MODEL_LEN = 512
SHARED_PREFIX_BASE = 40000


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class RequestSpec:
    prompt_len: int
    max_tokens: int
    priority: int = 0
    # The step (of the driver) at which the request is added.
    arrival_step: int = 0
    # Whether its prompt starts with the workload's shared prefix.
    shares_prefix: bool = False


@dataclass(frozen=True)
class Workload:
    block_size: int
    chunk: int
    # Usable blocks beyond the largest single request's need.
    spare_blocks: int
    num_spec_tokens: int  # 0: no spec decoding
    policy: str  # "fcfs" | "priority"
    # None: no connector; else (external tokens matched, async load).
    connector: tuple[int, bool] | None
    prefix_caching: bool
    shared_prefix_len: int
    accept_seed: int
    requests: tuple[RequestSpec, ...]

    def request_need_blocks(self, spec: RequestSpec) -> int:
        """Blocks one request can hold at once, at most: its whole sequence,
        the drafts and the lookahead of its last step, and one block of
        slack for a prefix hit that ends inside a block."""
        slots = spec.prompt_len + spec.max_tokens + 2 * self.num_spec_tokens + 1
        return cdiv(slots, self.block_size) + 1

    @property
    def num_usable_blocks(self) -> int:
        return max(self.request_need_blocks(r) for r in self.requests) + self.spare_blocks

    def prompt(self, index: int) -> list[int]:
        spec = self.requests[index]
        prefix = [SHARED_PREFIX_BASE + i for i in range(self.shared_prefix_len)] if spec.shares_prefix else []
        prefix = prefix[: spec.prompt_len - 1]
        return prefix + h.distinct_prompt(index + 1, spec.prompt_len - len(prefix))

    def pass_steps(self, spec: RequestSpec) -> int:
        """Steps one pass over a request can take (see the module docstring)."""
        return (
            cdiv(spec.prompt_len + spec.max_tokens, self.chunk) + 1 + spec.max_tokens + ASYNC_LOAD_STEPS + 1
        )

    def step_bound(self, preemptions: dict[str, int] | None = None) -> int:
        last_arrival = max(r.arrival_step for r in self.requests)
        total = 0
        for i, spec in enumerate(self.requests):
            num_preempted = MAX_PREEMPTIONS if preemptions is None else preemptions.get(f"r{i}", 0)
            total += (1 + num_preempted) * self.pass_steps(spec)
        return last_arrival + total


@dataclass
class Outcome:
    steps: int
    finished: set[str]
    preemptions: dict[str, int]
    max_in_a_row: dict[str, int]
    mixed_steps: list[int]
    multi_prefill_steps: list[int]
    free_blocks: int
    usable_blocks: int
    requests_left: bool
    blocks_in_use: list[int] = field(default_factory=list)


def make_scheduler(workload: Workload, rbln: bool, scheduler_cls: Any = None) -> Scheduler:
    from sched_harness import create_scheduler
    from tests.v1.core.utils import mock_kv

    kwargs: dict[str, Any] = {}
    if workload.num_spec_tokens:
        kwargs.update(num_speculative_tokens=workload.num_spec_tokens, speculative_method="ngram")
    if workload.connector is not None:
        matched, is_async = workload.connector
        kwargs["use_kv_connector"] = mock_kv(matched, is_async)
    if scheduler_cls is None and rbln:
        scheduler_cls = h._rbln_scheduler_cls()
    return create_scheduler(
        scheduler_cls=scheduler_cls,
        block_size=workload.block_size,
        num_blocks=workload.num_usable_blocks + 1,
        max_num_seqs=8,
        max_num_batched_tokens=workload.chunk,
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=workload.prefix_caching,
        scheduling_policy=workload.policy,  # type: ignore[arg-type]
        **kwargs,
    )


def run_workload(
    workload: Workload,
    rbln: bool = True,
    scheduler_cls: Any = None,
    max_steps: int | None = None,
    progress_guarantee: bool = True,
) -> Outcome:
    """Drive the workload until every request finished or the hard cap.
    `progress_guarantee=False` turns the RBLN scheduler's guarantee off."""
    scheduler = make_scheduler(workload, rbln, scheduler_cls)
    if rbln and not progress_guarantee:
        h.set_progress_guarantee(scheduler, False)
    rng = random.Random(workload.accept_seed)
    driver = h.Driver(
        scheduler,
        accept=lambda req_id, num_drafts: rng.randint(0, num_drafts),
        async_load_steps=ASYNC_LOAD_STEPS,
    )
    requests = [
        h.make_request(
            f"r{i}",
            workload.prompt(i),
            max_tokens=spec.max_tokens,
            priority=spec.priority,
            arrival_time=float(i),
            hash_block_size=workload.block_size,
        )
        for i, spec in enumerate(workload.requests)
    ]
    cap = workload.step_bound() if max_steps is None else max_steps
    in_a_row: dict[str, int] = {}
    max_in_a_row: dict[str, int] = {}
    outputs_seen: dict[str, int] = {}
    blocks_in_use: list[int] = []
    usable = h.num_usable_blocks(scheduler)
    step = 0
    while step < cap:
        for i, spec in enumerate(workload.requests):
            if spec.arrival_step == step:
                driver.add(requests[i])
        if step > max(r.arrival_step for r in workload.requests) and not scheduler.has_requests():
            break
        record = driver.step()
        step += 1
        blocks_in_use.append(usable - record.num_free_blocks_after)
        for request in requests:
            req_id = request.request_id
            if request.num_output_tokens > outputs_seen.get(req_id, 0):
                outputs_seen[req_id] = request.num_output_tokens
                in_a_row[req_id] = 0
        for req_id in record.preempted_req_ids:
            in_a_row[req_id] = in_a_row.get(req_id, 0) + 1
            max_in_a_row[req_id] = max(max_in_a_row.get(req_id, 0), in_a_row[req_id])
    return Outcome(
        steps=step,
        finished=set(driver.finished),
        preemptions=dict(driver.preemptions),
        max_in_a_row=max_in_a_row,
        mixed_steps=[i for i, s in enumerate(driver.steps) if s.prefill_req_ids and s.decode_req_ids],
        multi_prefill_steps=[i for i, s in enumerate(driver.steps) if len(s.prefill_req_ids) > 1],
        free_blocks=scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        usable_blocks=usable,
        requests_left=scheduler.has_requests(),
        blocks_in_use=blocks_in_use,
    )


def check(workload: Workload, outcome: Outcome, rbln: bool) -> None:
    """The liveness invariants (module docstring)."""
    expected = {f"r{i}" for i in range(len(workload.requests))}
    assert outcome.finished == expected and not outcome.requests_left, (
        f"unfinished after {outcome.steps} steps: {sorted(expected - outcome.finished)}; "
        f"preemptions {outcome.preemptions}"
    )
    worst_row = max(outcome.max_in_a_row.values(), default=0)
    assert worst_row <= MAX_PREEMPTIONS_IN_A_ROW, (
        f"preempted {worst_row} times in a row: {outcome.max_in_a_row}"
    )
    assert max(outcome.preemptions.values(), default=0) <= MAX_PREEMPTIONS, outcome.preemptions
    bound = workload.step_bound(outcome.preemptions)
    assert outcome.steps <= bound, f"{outcome.steps} steps > bound {bound}"
    assert outcome.free_blocks == outcome.usable_blocks, (
        f"block leak: {outcome.free_blocks} of {outcome.usable_blocks} free"
    )
    if rbln:
        assert not outcome.mixed_steps, f"steps mixing a prefill and decodes: {outcome.mixed_steps}"
        assert not outcome.multi_prefill_steps, f"steps with two prefills: {outcome.multi_prefill_steps}"


def workloads(max_requests: int = 6) -> Any:
    """A hypothesis strategy drawing a `Workload`."""
    from hypothesis import strategies as st

    @st.composite
    def draw(draw: Any) -> Workload:
        block_size = draw(st.sampled_from([8, 16]))
        chunk = draw(st.sampled_from([block_size, 2 * block_size, 64]))
        num_spec = draw(st.sampled_from([0, 1, 3]))
        # The harness's MockKVConnector reports the same external hit
        # whatever the request already holds locally, so it runs without
        # prefix caching (else a readmission's local hit plus the mock's
        # would exceed the prompt), and an async load needs a hit.
        connector = draw(st.sampled_from([None, (0, False), (block_size, False), (block_size, True)]))
        min_prompt = 1 if connector is None else 2 * block_size + 1
        request_specs = draw(
            st.lists(
                st.builds(
                    RequestSpec,
                    prompt_len=st.integers(min_prompt, min_prompt + 80),
                    max_tokens=st.integers(1, 20),
                    priority=st.integers(0, 2),
                    arrival_step=st.integers(0, 12),
                    shares_prefix=st.booleans(),
                ),
                min_size=1,
                max_size=max_requests,
            )
        )
        return Workload(
            block_size=block_size,
            chunk=chunk,
            spare_blocks=draw(st.integers(0, 8)),
            num_spec_tokens=num_spec,
            policy=draw(st.sampled_from(["fcfs", "priority"])),
            connector=connector,
            prefix_caching=connector is None and draw(st.booleans()),
            shared_prefix_len=draw(st.sampled_from([0, block_size // 2, block_size, 2 * block_size + 3])),
            accept_seed=draw(st.integers(0, 2**16)),
            requests=tuple(request_specs),
        )

    return draw()
