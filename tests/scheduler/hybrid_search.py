"""A random search over hybrid KV cache layouts and connectors (issue 51): the RBLN
scheduler against upstream's `Scheduler` on the same workloads, every batch played on the
KV-contents oracle (kv_oracle.py), the KV events replayed after every update, and a stall
counted as a failure.

A workload is a layout (one full-attention group, MLA, full attention next to one or two
sliding windows, a window alone, full attention next to a chunked-local group), a sub-block
size (4 or 8, or whole blocks), a mode (sync, async
scheduling, pipeline parallelism 2), a policy, drafts, a pool, an optional connector (sync or
async loads of every prompt's first block) and 2-6 requests sharing prefixes of two base
prompts. Each runs on three sides:

* ``rbln``: the RBLN scheduler with sub-block caching at the workload's size;
* ``upstream``: upstream's `Scheduler` (or `AsyncScheduler`) with its own KV cache classes,
  whole blocks (the plain control);
* ``upstream-sub``: upstream's policy over the RBLN KV cache classes hashing at the same
  sub-block size (`kv_cache_manager_cls`), which tells a fault of the RBLN policy from one of
  the sub-block KV cache classes.

`run` returns an `Outcome`: ``None`` or the first failure's kind and text. Kinds: the
oracle's (``stale read``, ``wrong entry``, ``overwrite``, ``no block``), ``events`` (the
replay of the published KV events is not the pool), ``stall`` (`STALL_STEPS` steps in a row
scheduled nothing while a request waited, no async load was in flight (a landed one counts
as waiting) and the pool had free blocks for one chunk in every group), ``unfinished`` (a
request neither finished nor aborted after `MAX_STEPS`), ``crash`` (anything else raised).

**Chunked local attention** ("full+chunked", Llama 4's layout: full attention next to a
`ChunkedLocalAttentionSpec` group of `attention_chunk_size` 8, 16, 32 or 48; vLLM does not
ask the chunk to be a multiple of the block: its manager frees and nulls only whole blocks
before the chunk, kv_oracle.py). The groups are built as a `KVCacheConfig` directly, as
vLLM builds them with the hybrid KV cache manager on (a model with `attention_chunk_size`
turns it off unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1, and its
chunked-local layers then become full attention: `VllmConfig` and the KV cache planning).
It runs on whole blocks only, at every pin (`CHUNKED_WHOLE_BLOCKS`):

* the RBLN scheduler refuses a sub-block size next to a chunked-local group: rule 3 of
  vllm/v1/core/sched/rbln_sub_block.py ("sub-block prefix caching supports KV cache groups
  of full attention, MLA or a sliding window ..."), raised as `SubBlockCacheConfigError`
  when the scheduler is built; with the size unset it stays on whole blocks;
* its reason is upstream's: `ChunkedLocalAttentionManager.find_longest_cache_hit` asserts
  the group's block size equals the hit alignment ("KV cache groups with different block
  sizes are not compatible with chunked local attention now"), so the group has no hit
  that ends inside a block, and the RBLN hybrid coordinator, built directly with a finer
  hash (the ``upstream-sub`` side), refuses the group too ("sub-block hits need
  full-attention or sliding-window groups").

`random_workload` draws whole blocks for the layout; the refusals are asserted in
test_hybrid_search.py, so neither is a silent skip.

Used by test_hybrid_search.py (a few derandomized examples in the tier) and by
bench/bench_hybrid_search.py (the long search, its table of seeds)."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sched_harness as h
from kv_oracle import KVContentsError

BLOCK = 16
CHUNK = 16
MAX_STEPS = 400
STALL_STEPS = 30
BASES = (h.distinct_prompt(11, 96), h.distinct_prompt(12, 96))

Layout = Literal["full", "mla", "full+window", "full+2windows", "window", "full+chunked"]
LAYOUTS: tuple[Layout, ...] = ("full", "mla", "full+window", "full+2windows", "window", "full+chunked")
# Attention chunks of the "full+chunked" layout (the block is 16).
CHUNKS = (8, 16, 32, 48)
# Layouts with no sub-block form (module docstring): whole blocks on every side.
CHUNKED_WHOLE_BLOCKS: tuple[Layout, ...] = ("full+chunked",)
Side = Literal["rbln", "upstream", "upstream-sub"]
SIDES: tuple[Side, ...] = ("rbln", "upstream", "upstream-sub")


@dataclass(frozen=True)
class Req:
    base: int
    shared: int  # tokens of the base prompt the prompt starts with
    tail: int  # tokens after them: its own, or the model's answer to the base prompt
    answer: bool  # the tail is what the harness's model samples (a next turn of a chat)
    max_tokens: int
    arrival: int
    priority: int
    abort_at: int | None  # step at which it is aborted, if any

    def prompt(self, i: int, bases: tuple[list[int], ...]) -> list[int]:
        """The prompt of a workload's ``i``-th request: ``shared`` tokens of its base
        prompt, then its tail."""
        own = h.distinct_prompt(100 + i, self.tail)
        if self.answer:  # the answer so far, then one token of the user's
            own = [h.SAMPLED_TOKEN] * self.tail + own[:1]
        return (bases[self.base][: self.shared] + own) or [5]


def blocks_per_group(prompts: Sequence[list[int]], requests: Sequence[Req], num_spec: int) -> int:
    """The blocks the longest request holds in one group: its prompt, its output, two
    steps of drafts and one slot more."""
    return max(
        -(-(len(p) + r.max_tokens + 2 * num_spec + 1) // BLOCK)
        for p, r in zip(prompts, requests, strict=True)
    )


@dataclass(frozen=True)
class Workload:
    layout: Layout
    windows: tuple[int, ...]  # one per sliding-window group
    sub_block: int | None  # None: whole blocks on every side
    mode: str  # "sync", "async", "pp2"
    policy: str
    num_spec: int
    spare_blocks: int
    connector: tuple[int, bool] | None  # (matched tokens, async load)
    accept_seed: int
    requests: tuple[Req, ...]
    chunk: int | None = None  # the chunked-local group's attention_chunk_size ("full+chunked")

    def prompt(self, i: int) -> list[int]:
        return self.requests[i].prompt(i, BASES)

    @property
    def num_groups(self) -> int:
        return len(self.windows) + (0 if self.layout == "window" else 1) + (self.chunk is not None)

    @property
    def num_blocks(self) -> int:
        prompts = [self.prompt(i) for i in range(len(self.requests))]
        need = blocks_per_group(prompts, self.requests, self.num_spec)
        return need * self.num_groups + self.spare_blocks + 1


@dataclass(frozen=True)
class Outcome:
    kind: str
    text: str
    step: int

    def __str__(self) -> str:
        return f"{self.kind} at step {self.step}: {self.text}"


def groups(w: Workload) -> list[Any] | None:
    """The workload's KV cache groups (None: the harness's one group, full attention or MLA
    through `kv_cache_spec`)."""
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    if w.layout in ("full", "mla"):
        return None
    shape: dict[str, Any] = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": 64, "dtype": torch.float32}
    out = [] if w.layout == "window" else [KVCacheGroupSpec(["full"], FullAttentionSpec(**shape))]
    for i, window in enumerate(w.windows):
        out.append(KVCacheGroupSpec([f"sliding{i}"], SlidingWindowSpec(**shape, sliding_window=window)))
    if w.chunk is not None:
        out.append(
            KVCacheGroupSpec(["chunked"], ChunkedLocalAttentionSpec(**shape, attention_chunk_size=w.chunk))
        )
    return out


def _mla_spec() -> Any:
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)


def _on_groups(scheduler_cls: Callable[..., Any], kv_groups: list[Any]) -> Callable[..., Any]:
    from vllm.v1.kv_cache_interface import KVCacheConfig

    def make(*, kv_cache_config: Any, **kwargs: Any) -> Any:
        config = KVCacheConfig(
            num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[], kv_cache_groups=kv_groups
        )
        return scheduler_cls(kv_cache_config=config, **kwargs)

    return make


def _with_connector(scheduler_cls: Callable[..., Any], matched: int, is_async: bool) -> Callable[..., Any]:
    from vllm.config import KVTransferConfig

    h._register_prefix_hit_connector()

    def make(*, vllm_config: Any, **kwargs: Any) -> Any:
        vllm_config.kv_transfer_config = KVTransferConfig(
            kv_connector=h.PREFIX_HIT_CONNECTOR,
            kv_role="kv_both",
            kv_connector_extra_config={"matched_tokens": matched, "is_async": is_async},
        )
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
        return scheduler_cls(vllm_config=vllm_config, **kwargs)

    return make


def hash_block_size(w: Workload, side: Side) -> int:
    return BLOCK if side == "upstream" or w.sub_block is None else w.sub_block


def make(w: Workload, side: Side) -> Any:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    is_async = w.mode == "async"
    base: Callable[..., Any]
    if side == "rbln":
        config = h.sub_block_settings(w.sub_block) if w.sub_block else {"enable_sub_block_cache": False}
        base = h.rbln_scheduler_factory(config, async_scheduling=is_async)
    else:
        cls: type = AsyncScheduler if is_async else Scheduler
        if side == "upstream-sub" and w.sub_block:
            from vllm.v1.core.sched.rbln_kv_cache import RBLNKVCacheManager

            cls = type(f"UpstreamPolicy{cls.__name__}", (cls,), {"kv_cache_manager_cls": RBLNKVCacheManager})
            size = w.sub_block
            policy_cls = cls

            def base(**kwargs: Any) -> Any:
                return policy_cls(**kwargs, hash_block_size=size)
        else:
            base = cls
    if w.connector is not None:
        base = _with_connector(base, *w.connector)
    kv_groups = groups(w)
    if kv_groups is not None:
        base = _on_groups(base, kv_groups)
    kwargs: dict[str, Any] = dict(
        block_size=BLOCK,
        num_blocks=w.num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=CHUNK,
        max_model_len=256,
        enable_prefix_caching=True,
        scheduling_policy=w.policy,
    )
    if w.layout == "mla":
        kwargs["kv_cache_spec"] = _mla_spec()
    if w.num_spec:
        kwargs.update(
            num_speculative_tokens=w.num_spec, speculative_method="ngram_gpu" if is_async else "ngram"
        )
    if is_async:
        kwargs["async_scheduling"] = True
    if w.mode == "pp2":
        kwargs["pipeline_parallel_size"] = 2
    return h.create_scheduler(scheduler_cls=h.with_kv_events(base, is_async), **kwargs)


def _chunk_fits(scheduler: Any) -> bool:
    """The pool has free blocks (evictable ones included) for one chunk in every group."""
    num_groups = len(scheduler.kv_cache_config.kv_cache_groups)
    per_chunk = -(-CHUNK // BLOCK) + 1
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks() >= num_groups * per_chunk


def run(w: Workload, side: Side, *, raise_errors: bool = False) -> tuple[Outcome | None, h.Driver | None]:
    """Run the workload on one side; the first failure, and the driver (None if the
    scheduler could not be built)."""
    from kv_event_replay import KVEventContractError
    from vllm.v1.request import RequestStatus

    scheduler = make(w, side)
    rng = random.Random(w.accept_seed)
    in_flight = 1 if w.mode == "sync" else 2
    driver = h.Driver(scheduler, accept=lambda req_id, n: rng.randint(0, n), max_in_flight=in_flight)
    assert driver.oracle is not None, "the KV-contents oracle follows every layout of the search"
    assert driver.events is not None, "the KV events are replayed on every side"
    hbs = hash_block_size(w, side)
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
    aborted: set[str] = set()
    last_arrival = max(r.arrival for r in w.requests)
    empty = 0
    step = 0
    try:
        for step in range(MAX_STEPS):
            for i, r in enumerate(w.requests):
                if r.arrival == step:
                    driver.add(requests[i])
                if r.abort_at == step and requests[i].request_id in scheduler.requests:
                    scheduler.finish_requests(requests[i].request_id, RequestStatus.FINISHED_ABORTED)
                    aborted.add(requests[i].request_id)
            if step > last_arrival and not scheduler.has_requests() and not driver.batches_in_flight:
                break
            before = len(driver.steps)
            if in_flight == 1:
                driver.step()
            else:
                driver.step_with_batch_queue()
            scheduled = len(driver.steps) > before and driver.steps[-1].num_scheduled_tokens
            # A load still in flight excuses an empty step; one that has landed does not
            # (its request waits, ready to run: it counts as waiting).
            loading = any(
                r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                and r.request_id not in scheduler.finished_recving_kv_req_ids
                for r in scheduler.requests.values()
            )
            waiting = len(scheduler.waiting) + len(getattr(scheduler, "skipped_waiting", ()))
            if scheduled or loading or not scheduler.has_requests():
                empty = 0
            else:
                empty += 1
            if empty >= STALL_STEPS and waiting and _chunk_fits(scheduler):
                pool = scheduler.kv_cache_manager.block_pool
                return Outcome(
                    "stall",
                    f"{empty} steps scheduled nothing with {waiting} request(s) waiting, "
                    f"{len(scheduler.running)} running and {pool.get_num_free_blocks()} blocks free",
                    step,
                ), driver
    except KVContentsError as error:
        if raise_errors:
            raise
        violation = driver.oracle.violations[-1] if driver.oracle.violations else None
        return Outcome(violation.kind if violation else "oracle", str(error), step), driver
    except KVEventContractError as error:
        if raise_errors:
            raise
        return Outcome("events", str(error), step), driver
    except Exception as error:
        if raise_errors:
            raise
        return Outcome(
            "crash", f"{type(error).__name__}: {error} | {traceback.format_exc(limit=-3)}", step
        ), driver
    unfinished = {r.request_id for r in requests} - driver.finished - aborted
    if unfinished:
        return Outcome("unfinished", f"{sorted(unfinished)} after {MAX_STEPS} steps", step), driver
    return None, driver


# -- the workloads ---------------------------------------------------------------------------


def random_workload(
    rng: random.Random, *, layouts: tuple[Layout, ...], connector: bool | None = None
) -> Workload:
    """A workload drawn from ``rng`` (the bench's seeds; the tier's hypothesis strategy draws
    the same fields). ``connector``: always, never, or (None) one in three sync workloads."""
    layout = rng.choice(layouts)
    mode = rng.choice(["sync", "sync", "async", "pp2"])
    windows: tuple[int, ...] = ()
    if layout in ("full+window", "window"):
        windows = (rng.choice([8, 12, 20, 32, 48]),)
    elif layout == "full+2windows":
        windows = (rng.choice([8, 20]), rng.choice([32, 48]))
    chunk = rng.choice(CHUNKS) if layout == "full+chunked" else None
    # A connector runs with one KV cache group: the harness's connector turns the hybrid KV
    # cache manager off, and upstream's `Scheduler._connector_finished` asserts one group
    # (a drawn connector next to two groups crashed both sides: the simulation's error).
    with_connector = (
        connector
        if connector is not None
        else (mode == "sync" and rng.random() < 1 / 3 and layout in ("full", "mla"))
    )
    reqs = []
    for _ in range(rng.randint(2, 6)):
        reqs.append(
            Req(
                base=rng.randint(0, 1),
                shared=rng.choice([0, 1, 4, 8, 9, 12, 16, 20, 22, 24, 28, 32, 40, 47, 48, 60]),
                tail=rng.choice([0, 0, 1, 2, 5, 11, 20]),
                answer=rng.random() < 0.5,
                max_tokens=rng.randint(1, 12),
                arrival=rng.randint(0, 10),
                priority=rng.randint(0, 1),
                abort_at=rng.choice([None, None, None, rng.randint(1, 25)]),
            )
        )
    sub_block = rng.choice([4, 4, 8])
    return Workload(
        layout=layout,
        windows=windows,
        sub_block=None if layout in CHUNKED_WHOLE_BLOCKS else sub_block,
        mode=mode,
        policy=rng.choice(["fcfs", "priority"]),
        num_spec=rng.choice([0, 3]),
        spare_blocks=rng.randint(0, 4),
        connector=(rng.choice([BLOCK, 2 * BLOCK, 20]), rng.random() < 0.5) if with_connector else None,
        accept_seed=rng.randint(0, 1000),
        requests=tuple(reqs),
        chunk=chunk,
    )
