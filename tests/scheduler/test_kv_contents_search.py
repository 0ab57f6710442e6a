"""A random search for wrong KV (kv_oracle.py): random workloads driven through the RBLN
scheduler with every batch played on the oracle's pool, and upstream's scheduler on the same
workloads (whole blocks) as the control.

Workloads mix what makes a scheduler register, move or reuse a prefix-cache entry: prompts
that share prefixes of two base sequences (whole-block, sub-block and full hits, one-token
prompts and prompts one token past a cached prefix: decode-ready joins), sub-block sizes 4
and 8 or whole blocks, small pools (preemption, eviction), fcfs and priority, ngram drafts
with a random number accepted, aborts, async scheduling and pipeline parallelism (two
batches in flight), and a connector loading the first block of every prompt (sync or
async). CI runs a fixed set of derandomized examples."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import sched_harness as h
from hybrid_search import BLOCK, Req, blocks_per_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = 120
BASES = (h.distinct_prompt(11, 80), h.distinct_prompt(12, 80))


@dataclass(frozen=True)
class Workload:
    sub_block: int | None  # None: whole blocks
    mode: str  # "sync", "async", "pp2"
    policy: str
    num_spec: int
    spare_blocks: int
    connector: tuple[int, bool] | None  # (matched tokens, async load)
    accept_seed: int
    requests: tuple[Req, ...]

    def prompt(self, i: int) -> list[int]:
        return self.requests[i].prompt(i, BASES)

    @property
    def num_blocks(self) -> int:
        prompts = [self.prompt(i) for i in range(len(self.requests))]
        return blocks_per_group(prompts, self.requests, self.num_spec) + self.spare_blocks + 1


@st.composite
def workloads(draw: Any) -> Workload:
    mode = draw(st.sampled_from(["sync", "sync", "async", "pp2"]))
    reqs = []
    for _ in range(draw(st.integers(2, 6))):
        shared = draw(st.sampled_from([0, 1, 4, 8, 9, 12, 16, 20, 22, 24, 28, 32, 40]))
        reqs.append(
            Req(
                base=draw(st.integers(0, 1)),
                shared=shared,
                tail=draw(st.sampled_from([0, 0, 1, 2, 5, 11])),
                answer=draw(st.booleans()),
                max_tokens=draw(st.integers(1, 8)),
                arrival=draw(st.integers(0, 8)),
                priority=draw(st.integers(0, 1)),
                abort_at=draw(st.one_of(st.none(), st.none(), st.none(), st.integers(1, 20))),
            )
        )
    connector = None if mode != "sync" else draw(st.sampled_from([None, None, (BLOCK, False), (BLOCK, True)]))
    return Workload(
        sub_block=draw(st.sampled_from([None, 4, 8])),
        mode=mode,
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        num_spec=draw(st.sampled_from([0, 3])),
        spare_blocks=draw(st.integers(0, 4)),
        connector=connector,
        accept_seed=draw(st.integers(0, 1000)),
        requests=tuple(reqs),
    )


def make(w: Workload, rbln: bool) -> tuple[Any, int]:
    from vllm.v1.core.sched.scheduler import Scheduler

    kwargs: dict[str, Any] = dict(
        block_size=BLOCK,
        num_blocks=w.num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=BLOCK,
        max_model_len=256,
        enable_prefix_caching=True,
        scheduling_policy=w.policy,
    )
    if w.num_spec:
        # Async scheduling takes drafts only from a drafter that runs in the worker
        # (vLLM refuses the CPU "ngram"); to the scheduler both are draft slots.
        method = "ngram_gpu" if w.mode == "async" else "ngram"
        kwargs.update(num_speculative_tokens=w.num_spec, speculative_method=method)
    if w.mode == "async":
        kwargs["async_scheduling"] = True
    if w.mode == "pp2":
        kwargs["pipeline_parallel_size"] = 2
    hbs = w.sub_block or BLOCK
    if rbln:
        config = h.sub_block_settings(w.sub_block) if w.sub_block else {"enable_sub_block_cache": False}
        if w.connector is not None:
            return h.prefix_hit_connector_scheduler(*w.connector, additional_config=config, **kwargs), hbs
        kwargs["scheduler_cls"] = h.rbln_scheduler_factory(config, async_scheduling=w.mode == "async")
        return h.make_scheduler(rbln=False, **kwargs), hbs
    # The control: upstream's scheduler with whole blocks (its own caching), async form when
    # async scheduling is on.
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    cls = AsyncScheduler if w.mode == "async" else Scheduler
    if w.connector is None:
        return h.make_scheduler(rbln=False, scheduler_cls=cls, **kwargs), BLOCK
    from vllm.config import KVTransferConfig

    h._register_prefix_hit_connector()
    matched, is_async = w.connector

    def with_connector(*, vllm_config: Any, **scheduler_kwargs: Any) -> Any:
        vllm_config.kv_transfer_config = KVTransferConfig(
            kv_connector=h.PREFIX_HIT_CONNECTOR,
            kv_role="kv_both",
            kv_connector_extra_config={"matched_tokens": matched, "is_async": is_async},
        )
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
        return cls(vllm_config=vllm_config, **scheduler_kwargs)

    return h.make_scheduler(rbln=False, scheduler_cls=with_connector, **kwargs), BLOCK


def run(w: Workload, rbln: bool) -> Any:
    from vllm.v1.request import RequestStatus

    scheduler, hbs = make(w, rbln)
    rng = random.Random(w.accept_seed)
    in_flight = 1 if w.mode == "sync" else 2
    driver = h.Driver(scheduler, accept=lambda req_id, n: rng.randint(0, n), max_in_flight=in_flight)
    assert driver.oracle is not None
    requests = [
        h.make_request(
            f"r{i}",
            w.prompt(i),
            r.max_tokens,
            priority=r.priority,
            arrival_time=float(i),
            hash_block_size=hbs,
        )
        for i, r in enumerate(w.requests)
    ]
    last_arrival = max(r.arrival for r in w.requests)
    aborted: set[str] = set()
    for step in range(400):
        for i, r in enumerate(w.requests):
            if r.arrival == step:
                driver.add(requests[i])
            if r.abort_at == step and requests[i].request_id in scheduler.requests:
                scheduler.finish_requests(requests[i].request_id, RequestStatus.FINISHED_ABORTED)
                aborted.add(requests[i].request_id)
        if step > last_arrival and not scheduler.has_requests() and not driver.batches_in_flight:
            break
        if in_flight == 1:
            driver.step()
        else:
            driver.step_with_batch_queue()
    # A stall is a failure too (issue 51): every request not aborted has finished.
    unfinished = {r.request_id for r in requests} - driver.finished - aborted
    assert not unfinished, f"{sorted(unfinished)} unfinished after 400 steps"
    return driver


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(workload=workloads())
def test_the_rbln_scheduler_never_hands_out_wrong_kv(workload: Workload) -> None:
    run(workload, rbln=True)


@SETTINGS
@given(workload=workloads())
def test_upstreams_scheduler_never_hands_out_wrong_kv(workload: Workload) -> None:
    run(workload, rbln=False)
