"""Drive a real (patched) vLLM scheduler step by step, as a model runner would.

Built on vLLM's own scheduler test harness (`tests/v1/core/utils.py` of the
pin's source tree: `create_scheduler`, the `MockKVConnector` of
`tests/v1/kv_connector/unit/utils.py`) and on the real `Scheduler`,
`KVCacheManager` and block pool; nothing here mocks them. What is simulated
is the other side of `schedule()`: the model runner's `ModelRunnerOutput`
(sampled tokens, accepted drafts, finished async KV loads) and the drafter's
`DraftTokenIds`.

This module is imported by the tests (the conftest puts the source tree's
`tests` package in place) and is also run as a script by the fault-injection
proofs, in a subprocess whose `PYTHONPATH` holds a variant tree: then
`python sched_harness.py matrix <source-tree>` prints the livelock matrix's
outcomes as JSON.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Run as a script too (the livelock matrix): the shared kits of tests/support first.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
from kv_event_replay import EventReplay
from kv_oracle import KVOracle
from vllm_release import vllm_release

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

RBLN_SCHEDULER = "vllm.v1.core.sched.rbln_scheduler.RBLNScheduler"
SOURCE_TREE_ENV = "VLLM_RBLN_SOURCE_TREE"
VARIANT_TREES_ENV = "VLLM_RBLN_VARIANT_TREES"

# The livelock's geometry (docs/livelock.md, shared design admission-livelock.md).
BLOCK_SIZE = 16
NUM_SPEC_TOKENS = 3
PREFILL_CHUNK = 16
# Token id the simulated model samples; never EOS (50256), so requests stop
# at max_tokens.
SAMPLED_TOKEN = 1000
DRAFT_TOKEN = 7


def load_vllm_test_harness(source_tree: str | Path) -> None:
    """Make `tests.v1.core.utils` importable from the pin's source tree.

    The source tree's `tests` package is registered under its own name from
    its own path, so neither this repository's `tests/` directory nor
    anything else on `sys.path` can shadow it, and `vllm` itself stays
    whatever the environment provides (the installed wheel, or a tree put on
    `PYTHONPATH`).
    """
    tests_dir = Path(source_tree) / "tests"
    init = tests_dir / "v1" / "core" / "utils.py"
    if not init.is_file():
        raise RuntimeError(
            f"{tests_dir} holds no v1/core/utils.py: {SOURCE_TREE_ENV} must name "
            "a checkout of the patched vLLM source tree (with its tests/)"
        )
    loaded = sys.modules.get("tests")
    if loaded is not None:
        paths = [Path(entry).resolve() for entry in getattr(loaded, "__path__", [])]
        if paths == [tests_dir.resolve()]:
            return
        if getattr(loaded, "__file__", None) is not None:
            raise RuntimeError(f"another 'tests' package is already imported: {loaded}")
        # A namespace package, or the empty parent module pytest's importlib
        # mode makes for this repository's tests/ (which has no __init__.py):
        # the source tree's package takes the name; the entries for this
        # repository's own test modules stay in sys.modules under theirs.
    spec = importlib.util.spec_from_file_location(
        "tests",
        tests_dir / "__init__.py",
        submodule_search_locations=[str(tests_dir)],
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tests"] = module
    spec.loader.exec_module(module)


def load_harness_from_env() -> str | None:
    """`load_vllm_test_harness` of the tree `VLLM_RBLN_SOURCE_TREE` names; the sentence to
    fail every test with when it cannot (a conftest reports it per test), else None."""
    import os

    tree = os.environ.get(SOURCE_TREE_ENV)
    if not tree:
        return (
            f"{SOURCE_TREE_ENV} is not set: point it at a checkout of "
            "the patched vLLM source tree (it provides vLLM's tests/v1/core/utils.py)"
        )
    try:
        load_vllm_test_harness(tree)
    except RuntimeError as error:
        return str(error)
    return None


# vLLM 0.34.0 sends a resumed request as new, its tokens in `prefill_token_ids`: the V2
# model runner's form, the only one from then on (`use_v2_model_runner`,
# `CachedRequestData.resumed_req_ids` and `.all_token_ids` are gone).
ONE_RUNNER_FORM = vllm_release() >= (0, 34)
# What asks the harness for a V1 model runner's output (vllm-rbln's runner is one).
V1_RUNNER: dict[str, Any] = {} if ONE_RUNNER_FORM else {"use_v2_model_runner": False}


def create_scheduler(*, scheduler_cls: Any = None, **kwargs: Any) -> Scheduler:
    """vLLM's `tests/v1/core/utils.create_scheduler`, taking `scheduler_cls` at
    every pin. Its `scheduler_cls` parameter is new in vLLM 0.31.0; at an older
    pin the class is built on the `VllmConfig`, KV cache config and
    structured-output manager that `create_scheduler` made, with the
    arguments 0.31.0's passes its class (`block_size`, `log_stats=True`)."""
    import inspect

    from tests.v1.core import utils

    parameters = inspect.signature(utils.create_scheduler).parameters
    if "scheduler_cls" in parameters:
        return utils.create_scheduler(scheduler_cls=scheduler_cls, **kwargs)
    base = utils.create_scheduler(**kwargs)
    if scheduler_cls is None:
        return base
    scheduler = scheduler_cls(
        vllm_config=base.vllm_config,
        kv_cache_config=base.kv_cache_config,
        block_size=kwargs.get("block_size", parameters["block_size"].default),
        log_stats=True,
        structured_output_manager=base.structured_output_manager,
    )
    scheduler.use_v2_model_runner = base.use_v2_model_runner
    return scheduler


@functools.cache
def _takes_req_id_to_index() -> bool:
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    return "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}


def runner_output(req_ids: list[str], sampled: list[list[int]], **fields: Any) -> Any:
    """vLLM's `ModelRunnerOutput` for a step of `req_ids`, at every pin: up to 0.33.0
    it also takes the required `req_id_to_index`, which 0.34.0 dropped (rows are
    `req_ids`' order)."""
    from vllm.v1.outputs import ModelRunnerOutput

    if _takes_req_id_to_index():
        fields["req_id_to_index"] = {req_id: i for i, req_id in enumerate(req_ids)}
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
        **fields,
    )


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    priority: int = 0,
    arrival_time: float | None = None,
    hash_block_size: int = BLOCK_SIZE,
    num_hash_lookahead_tokens: int = 0,
    cache_salt: str | None = None,
) -> Request:
    """A request as `tests.v1.core.utils.create_requests` makes one, with the
    prompt, length and priority chosen per request. `hash_block_size` is the
    prefix-hash granularity, as the engine core hashes requests: the
    scheduler's `hash_block_size` (the sub-block size when sub-block caching
    is on); `num_hash_lookahead_tokens`, the tokens after each block its hash
    covers (the `VllmConfig`'s, vLLM 0.34.0 on: an EAGLE drafter's); `cache_salt`,
    the request's salt (an extra key of its first block's hash)."""
    from tests.v1.core.utils import EOS_TOKEN_ID, create_requests
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    # create_requests initialises the prefix-cache hash seed once per process.
    create_requests(num_requests=1, num_tokens=1)
    sampling_params = SamplingParams(max_tokens=max_tokens)
    sampling_params.update_from_generation_config({}, EOS_TOKEN_ID)
    kwargs: dict[str, Any] = {}
    if arrival_time is not None:
        kwargs["arrival_time"] = arrival_time
    if cache_salt is not None:
        kwargs["cache_salt"] = cache_salt
    # The lookahead is an argument from vLLM 0.34.0 on; earlier hashers have none.
    lookahead = {"num_hash_lookahead_tokens": num_hash_lookahead_tokens} if num_hash_lookahead_tokens else {}
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(hash_block_size, sha256, **lookahead),
        priority=priority,
        **kwargs,
    )


def distinct_prompt(seed: int, length: int) -> list[int]:
    """A prompt sharing no block with another seed's (no accidental prefix hit)."""
    return [(seed * 7919 + i) % 30000 + 1 for i in range(length)]


def named_request(req_id: str, prompt_len: int, max_tokens: int, **kwargs: Any) -> Request:
    """A request with a distinct prompt seeded by its id (`make_request`'s
    keywords pass through)."""
    seed = sum(ord(c) * 31**i for i, c in enumerate(req_id)) % 1000
    return make_request(req_id, distinct_prompt(seed, prompt_len), max_tokens, **kwargs)


def make_scheduler(rbln: bool = True, kv_events: bool = True, **kwargs: Any) -> Scheduler:
    """`create_scheduler` with blocks of `BLOCK_SIZE` (unless given): the
    RBLN scheduler, or upstream's `Scheduler` with `rbln=False`; KV cache events
    on (the `Driver` replays them) unless `kv_events=False`. Built by this
    module's `create_scheduler`, which takes `scheduler_cls` at every pin."""

    kwargs.setdefault("block_size", BLOCK_SIZE)
    if rbln:
        kwargs["scheduler_cls"] = rbln_scheduler_factory(
            async_scheduling=kwargs.get("async_scheduling", False)
        )
    if kv_events:
        kwargs["scheduler_cls"] = with_kv_events(
            kwargs.get("scheduler_cls"), kwargs.get("async_scheduling", False)
        )
    return create_scheduler(**kwargs)


def with_kv_events(scheduler_cls: Any, async_scheduling: bool) -> Callable[..., Scheduler]:
    """`scheduler_cls` (None: the class `create_scheduler` picks) built with KV cache
    events on, as `--kv-events-config '{"enable_kv_cache_events": true}'` turns them on;
    vLLM's null publisher until the `Driver` records them."""
    from vllm.config import KVEventsConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    cls = scheduler_cls or (AsyncScheduler if async_scheduling else Scheduler)

    def make(*, vllm_config: Any, **kwargs: Any) -> Scheduler:
        vllm_config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        return cls(vllm_config=vllm_config, **kwargs)

    return make


def with_eagle(
    scheduler_cls: Any, eagle_draft: str | Path, *, hash_lookahead: bool = False
) -> Callable[..., Scheduler]:
    """`scheduler_cls` (None: upstream's `Scheduler`) built with an EAGLE drafter of
    `NUM_SPEC_TOKENS` drafts: vLLM builds its `SpeculativeConfig` from the draft's
    Hugging Face config (the `eagle_draft` fixture's, no weights), attached to the
    harness's `VllmConfig` as the engine does after resolving it.

    `hash_lookahead`: the `VllmConfig`'s `num_hash_lookahead_tokens` resolved again with
    the drafter attached, as vLLM 0.34.0 resolves it (the tokens after a block its hash
    covers: EAGLE's draft KV at a block's last position reads the next token); the
    harness's config was resolved without it (0). Requests are then hashed with it
    (`make_request(num_hash_lookahead_tokens=...)`). Before 0.34.0 there is none."""
    from vllm.config import SpeculativeConfig
    from vllm.v1.core.sched.scheduler import Scheduler

    cls = scheduler_cls or Scheduler

    def make(*, vllm_config: Any, **kwargs: Any) -> Scheduler:
        vllm_config.speculative_config = SpeculativeConfig(
            method="eagle",
            model=str(eagle_draft),
            num_speculative_tokens=NUM_SPEC_TOKENS,
            target_model_config=vllm_config.model_config,
            target_parallel_config=vllm_config.parallel_config,
        )
        resolve = getattr(vllm_config, "_resolve_num_hash_lookahead_tokens", None)
        if hash_lookahead and resolve is not None:
            vllm_config.num_hash_lookahead_tokens = resolve()
        return cls(vllm_config=vllm_config, **kwargs)

    return make


class RecordingPublisher:
    """Stands where vLLM's ZMQ publisher would (`Scheduler.kv_event_publisher`): every
    `KVEventBatch` the scheduler publishes goes to the replay. The engine tier's event
    test runs the real ZMQ publisher and subscriber."""

    def __init__(self, replay: EventReplay) -> None:
        self.replay = replay

    def publish(self, events: Any) -> None:
        self.replay.apply(events.events)

    def shutdown(self) -> None:
        pass


def blocks_held(scheduler: Scheduler, req_id: str) -> int:
    """KV blocks the request holds (one KV cache group)."""
    return len(scheduler.kv_cache_manager.get_blocks(req_id).blocks[0])


@dataclass
class StepRecord:
    """What one `schedule()` call gave the step to."""

    num_scheduled_tokens: dict[str, int]
    prefill_req_ids: list[str]
    decode_req_ids: list[str]
    preempted_req_ids: set[str]
    num_free_blocks_after: int
    # Copy-on-write copies (source block id, destination block id) the step
    # hands the worker: a sub-block hit's shared tail block copied to a
    # private block before the request writes into it.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # Tokens each scheduled request had computed when the step started (for
    # a request's first step: its prefix-cache and connector hit).
    num_computed_before: dict[str, int] = field(default_factory=dict)
    # Requests whose batch samples a token (their computed tokens reach
    # the end of their known tokens): a request's first is its first token.
    sampled_req_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Batch:
    """A scheduled batch on its way through the simulated model runner."""

    output: SchedulerOutput
    record: StepRecord
    req_ids: list[str]
    sampled: list[list[int]]


@dataclass
class Driver:
    """Runs `schedule()` / `update_from_output()` like the engine core does.

    Decoding requests always carry `num_spec_tokens` drafts (the margin the
    admission gate reserves assumes every draft slot is used); the simulated
    target model accepts `accept(request_id, num_drafts)` of them.
    """

    scheduler: Scheduler
    accept: Callable[[str, int], int] = lambda req_id, num_drafts: 0
    # Async KV loads finish after this many steps (None: never on their own).
    async_load_steps: int | None = 1
    # Per request: its async KV load finishes after this many steps instead.
    load_steps: dict[str, int] = field(default_factory=dict)
    # DP prefill throttling: `schedule(throttle_prefills=throttle(step))`,
    # as the engine core calls it on a cadence (step counts from 0).
    throttle: Callable[[int], bool] | None = None
    steps: list[StepRecord] = field(default_factory=list)
    preemptions: dict[str, int] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    # vllm:num_preemptions as the engine reports it: the scheduler's count
    # (SchedulerStats.num_preempted_reqs), summed over steps.
    reported_preemptions: int = 0
    # Batches in flight at most (`EngineCore.batch_queue_size`): 1 runs
    # `step()`, more `step_with_batch_queue()`.
    max_in_flight: int = 1
    # Every batch is also played on a KV pool that keeps what each slot holds
    # (kv_oracle.py): a stale read, a wrong prefix-cache entry or an overwrite
    # raises KVContentsError. Off only where a test wants the collected
    # violations (`oracle.strict = False`).
    kv_oracle: bool = True
    oracle: KVOracle | None = None
    # With KV cache events on (`make_scheduler`'s default), every KV cache group's
    # events are replayed as a router does (kv_event_replay.py) and checked
    # against the pool after every update: KVEventContractError on a mismatch.
    events: EventReplay | None = None
    _loading: dict[str, int] = field(default_factory=dict)
    _in_flight: deque[_Batch] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.kv_oracle and self.oracle is None and KVOracle.applies(self.scheduler):
            self.oracle = KVOracle(self.scheduler, draft_token=DRAFT_TOKEN)
        scheduler = self.scheduler
        if self.events is None and scheduler.enable_kv_cache_events:
            from vllm.utils.hashing import sha256

            self.events = EventReplay(
                scheduler.kv_cache_manager.block_pool.hash_block_size,
                sha256,
                # What the engine core hashes requests with (vLLM 0.34.0 on; none before).
                num_hash_lookahead_tokens=getattr(scheduler.vllm_config, "num_hash_lookahead_tokens", 0),
            )
            scheduler.kv_event_publisher = RecordingPublisher(self.events)  # type: ignore[assignment]

    def add(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def step(self) -> StepRecord:
        """One engine-core step with one batch in flight: schedule, run, update."""
        batch = self._schedule()
        self._update(batch)
        return batch.record

    @property
    def batches_in_flight(self) -> int:
        """Batches scheduled whose output has not come back yet."""
        return len(self._in_flight)

    def step_with_batch_queue(self) -> StepRecord | None:
        """One call of `EngineCore.step_with_batch_queue` with a queue of
        `max_in_flight` batches (async scheduling keeps two; so does pipeline
        parallelism, one per stage): schedule a batch if there are requests;
        while the queue has room (and the batch scheduled work, or more
        requests wait) return without an output; else take the oldest batch's
        output and update the scheduler with it. Returns the scheduled step,
        or None when this call only took an output."""
        record = None
        if self.scheduler.has_requests():
            batch = self._schedule()
            record = batch.record
            self._in_flight.append(batch)
            if len(self._in_flight) < self.max_in_flight and (
                record.num_scheduled_tokens or self.scheduler.has_requests()
            ):
                return record
        elif not self._in_flight:
            return None
        self._update(self._in_flight.popleft())
        return record

    def _schedule(self) -> _Batch:
        scheduler = self.scheduler
        if self.throttle is None:
            output = scheduler.schedule()
        else:
            output = scheduler.schedule(throttle_prefills=self.throttle(len(self.steps)))
        record = self._record(output)
        for req_id in record.preempted_req_ids:
            self.preemptions[req_id] = self.preemptions.get(req_id, 0) + 1

        # What the simulated model will sample, decided as the batch is
        # scheduled (with batches in flight, the request moves on before its
        # output comes back): a chunk that does not reach the end of the
        # request's known tokens samples nothing.
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        for req_id in output.num_scheduled_tokens:
            request = scheduler.requests[req_id]
            req_ids.append(req_id)
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])
                continue
            drafts = output.scheduled_spec_decode_tokens.get(req_id, [])
            num_accepted = min(self.accept(req_id, len(drafts)), len(drafts))
            sampled.append([DRAFT_TOKEN] * num_accepted + [SAMPLED_TOKEN])
            record.sampled_req_ids.append(req_id)
        self.steps.append(record)
        if self.oracle is not None:
            self.oracle.execute(output, dict(zip(req_ids, sampled, strict=True)))
        return _Batch(output, record, req_ids, sampled)

    def _update(self, batch: _Batch) -> None:
        from vllm.v1.engine import EngineCoreEventType
        from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput
        from vllm.v1.request import RequestStatus

        scheduler = self.scheduler
        finished_recving: set[str] = set()
        for req_id, request in scheduler.requests.items():
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                waited = self._loading.get(req_id, 0) + 1
                self._loading[req_id] = waited
                load_steps = self.load_steps.get(req_id, self.async_load_steps)
                if load_steps is not None and waited >= load_steps:
                    finished_recving.add(req_id)
        for req_id in finished_recving:
            del self._loading[req_id]
        if self.oracle is not None:
            self.oracle.loads_landed(finished_recving)

        model_output = runner_output(
            batch.req_ids,
            batch.sampled,
            kv_connector_output=(
                KVConnectorOutput(finished_recving=finished_recving) if finished_recving else None
            ),
        )
        engine_outputs = scheduler.update_from_output(batch.output, model_output)
        if self.events is not None:
            self.events.check_pool(scheduler.kv_cache_manager.block_pool)
        for outputs in engine_outputs.values():
            stats = outputs.scheduler_stats
            counted = stats is not None and hasattr(stats, "num_preempted_reqs")
            if counted:
                self.reported_preemptions += stats.num_preempted_reqs  # type: ignore[union-attr]
            for request_output in outputs.outputs:
                if not counted:
                    # A vLLM without the scheduler's count: its front end counts
                    # the PREEMPTED events that reach it with a request's output.
                    self.reported_preemptions += sum(
                        event.type == EngineCoreEventType.PREEMPTED for event in request_output.events or ()
                    )
                if request_output.finish_reason is not None:
                    self.finished.add(request_output.request_id)

        # The drafter proposes for every request that is now decoding. Under
        # async scheduling the drafts stay in the worker (the engine core
        # never calls `update_draft_token_ids`); `AsyncScheduler` schedules
        # placeholder slots for them.
        # A request drafts once it has sampled (with batches in flight its last prefill
        # chunk counts as computed before its first token comes back).
        drafting = [
            request.request_id
            for request in scheduler.running
            if not request.is_prefill_chunk and request.num_output_tokens
        ]
        if drafting and scheduler.num_spec_tokens and not scheduler.scheduler_config.async_scheduling:
            scheduler.update_draft_token_ids(
                DraftTokenIds(
                    req_ids=drafting,
                    draft_token_ids=[[DRAFT_TOKEN] * scheduler.num_spec_tokens for _ in drafting],
                )
            )

    def run(self, max_steps: int, until: Iterable[str] | None = None) -> int:
        """Step until `until` (default: every request) finished, at most
        `max_steps` steps; returns the number of steps taken."""
        target = set(until) if until is not None else None
        for taken in range(max_steps):
            if target is not None and target <= self.finished:
                return taken
            if target is None and not self.scheduler.has_requests() and not self.batches_in_flight:
                return taken
            if self.max_in_flight > 1:
                self.step_with_batch_queue()
            else:
                self.step()
        return max_steps

    def _record(self, output: SchedulerOutput) -> StepRecord:
        scheduler = self.scheduler
        prefill: list[str] = []
        decode: list[str] = []
        computed_before: dict[str, int] = {}
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            request = scheduler.requests[req_id]
            # After schedule() the computed count includes this step. A
            # request is decoding when it starts this step with its whole
            # sequence computed but the last token: a running decode, or a
            # decode-ready admission (a landed remote load or a full prefix
            # hit), which runs with the decodes (docs/scheduler.md).
            start = request.num_computed_tokens - num_tokens
            computed_before[req_id] = start
            if start >= request.num_tokens - 1:
                decode.append(req_id)
            else:
                prefill.append(req_id)
        return StepRecord(
            num_scheduled_tokens=dict(output.num_scheduled_tokens),
            prefill_req_ids=prefill,
            decode_req_ids=decode,
            preempted_req_ids=set(output.preempted_req_ids),
            num_free_blocks_after=scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
            block_copies=[
                (copy.src_block_id, copy.dst_block_id)
                for copy in output.kv_cache_block_copies
                # vllm-rbln 0.12.0's RBLNSchedulerOutput puts them here instead
                # (the parity tier, docs/parity.md).
                or getattr(output, "kv_cache_copy_ops", None)
                or ()
            ],
            num_computed_before=computed_before,
        )


def num_usable_blocks(scheduler: Scheduler) -> int:
    """Blocks a request can get: the pool less the null block."""
    return scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1


def assert_all_blocks_free(scheduler: Scheduler) -> None:
    manager = scheduler.kv_cache_manager
    for single_type_manager in manager.coordinator.single_type_managers:
        assert not single_type_manager.req_to_blocks, "a request still holds blocks"
    assert manager.block_pool.get_num_free_blocks() == num_usable_blocks(scheduler)


# ---------------------------------------------------------------------------
# The livelock matrix.


@dataclass(frozen=True)
class LivelockCase:
    """One case of the regression matrix of the admission livelock."""

    prompt_len: int
    # Sub-block prefix caching: None = off (no prefix caching at all, unless
    # `whole_block_caching`), else the sub-block size (prefix caching on,
    # hits on sub-block boundaries).
    sub_block_size: int | None
    kv_connector: bool
    # Beyond the design's 12 cases: prefix caching on with sub-block caching
    # off (whole-block hits), and a connector that finds `connector_hit`
    # tokens for every request (loaded synchronously, or asynchronously).
    whole_block_caching: bool = False
    connector_hit: int = 0
    connector_async: bool = False

    @property
    def hash_block_size(self) -> int:
        return BLOCK_SIZE if self.sub_block_size is None else self.sub_block_size

    @property
    def prefix_caching(self) -> bool:
        return self.sub_block_size is not None or self.whole_block_caching

    @property
    def id(self) -> str:
        sub_block = "off" if self.sub_block_size is None else str(self.sub_block_size)
        if self.whole_block_caching:
            sub_block += "-whole-block-caching"
        connector = "connector" if self.kv_connector else "no-connector"
        if self.connector_hit:
            connector += f"-hit{self.connector_hit}" + ("-async" if self.connector_async else "")
        return f"prompt{self.prompt_len}-subblock-{sub_block}-{connector}"


PROMPT_LENS = (32, 26)
# The connector hit of the extra cases: the first block of every prompt.
CONNECTOR_HIT = 16
# Sub-block prefix caching off, and on at sub-block sizes 4 and 8.
SUB_BLOCK_SIZES: tuple[int | None, ...] = (None, 4, 8)
LIVELOCK_CASES = tuple(
    LivelockCase(prompt_len, sub_block_size, kv_connector)
    for prompt_len in PROMPT_LENS
    for sub_block_size in SUB_BLOCK_SIZES
    for kv_connector in (False, True)
)
# The cases the design's matrix does not reach (issue 14): whole-block prefix
# caching with sub-block caching off (the matrix's "off" turns prefix caching
# off altogether), and connector hits (the matrix's connector never hits; the
# production setup had an LMCache connector with hits), sync and async, with
# every caching mode.
EXTRA_LIVELOCK_CASES = tuple(
    [LivelockCase(prompt_len, None, False, whole_block_caching=True) for prompt_len in PROMPT_LENS]
    + [
        LivelockCase(
            prompt_len,
            sub_block_size,
            True,
            whole_block_caching=whole,
            connector_hit=CONNECTOR_HIT,
            connector_async=is_async,
        )
        for prompt_len in PROMPT_LENS
        for sub_block_size, whole in ((None, False), (None, True), (4, False), (8, False))
        for is_async in (False, True)
    ]
)

# The two drafting decodes. Each has a 20-token prompt and holds 2 blocks:
# its admission gate counts 20 + (1 + 3) + 3 = 27 slots (2 blocks), and its
# decode steps stay within 2 blocks (32 slots) while
# num_computed + 1 + 3 + 3 <= 32, i.e. for its first 6 output tokens. With
# every draft rejected it emits one token per decode step, so with
# max_tokens = 5 it finishes inside its 2 blocks.
DECODE_PROMPT_LEN = 20
DECODE_MAX_TOKENS = 5
DECODE_BLOCKS = 2
# The new prompt is admitted with exactly two free blocks.
FREE_BLOCKS_AT_ADMISSION = 2
# usable blocks = 2 decodes x 2 blocks + 2 free = 6; the pool also holds the
# null block.
LIVELOCK_NUM_BLOCKS = 2 * DECODE_BLOCKS + FREE_BLOCKS_AT_ADMISSION + 1
PROMPT_MAX_TOKENS = 4
# Enough for the fixed scheduler by a wide margin (it needs 9 steps); a
# livelocked one never finishes.
LIVELOCK_MAX_STEPS = 120


# The test connectors, by the `module.ClassName` the RBLN scheduler checks:
# vLLM's MockKVConnector and the prefix-hit connector below report a
# configured number of matched tokens and store nothing, so no key of theirs
# depends on the request's block hashes. Listed as checked by the operator
# (`sub_block_verified_connectors`): with sub-block caching on, the scheduler
# refuses every connector not known to key on tokens.
TEST_CONNECTORS = (
    "tests.v1.kv_connector.unit.utils.MockKVConnector",
    f"{__name__}.prefix_hit_connector_cls.<locals>.PrefixHitConnector",
)


def sub_block_settings(
    sub_block_size: int | None,
    enabled: bool = True,
    verified_connectors: tuple[str, ...] = TEST_CONNECTORS,
) -> dict[str, Any]:
    """The RBLN scheduler's sub-block settings (`VllmConfig.additional_config`),
    with the test connectors listed as checked."""
    return {
        "enable_sub_block_cache": enabled,
        "sub_block_size": sub_block_size,
        "sub_block_verified_connectors": list(verified_connectors),
    }


@contextmanager
def chunks_may_cross_kv_blocks() -> Iterator[None]:
    """vLLM's current platform (the CPU platform here) declaring that its
    device can prefill a chunk across KV blocks
    (`Platform.supports_prefill_chunk_across_kv_blocks()`), as vllm-rbln lets
    only a REBEL CR13 do. The RBLN scheduler asks it once, at construction,
    before it takes a `sub_block_size` below the prefill chunk."""
    import vllm.platforms as platforms

    base = type(platforms.current_platform)
    declared = type(
        f"{base.__name__}ChunksCrossKVBlocks",
        (base,),
        {"supports_prefill_chunk_across_kv_blocks": classmethod(lambda cls: True)},
    )
    previous = platforms._current_platform
    platforms._current_platform = declared()
    try:
        yield
    finally:
        platforms._current_platform = previous


def rbln_scheduler_factory(
    additional_config: object = None,
    async_scheduling: bool = False,
    *,
    chunks_cross_kv_blocks: bool = True,
) -> Callable[..., Scheduler]:
    """`scheduler_cls` for `create_scheduler`: the RBLN scheduler, built on the
    harness's `VllmConfig` with the platform's settings (the harness has no
    parameter for them): `additional_config` (a dict is copied, a platform's
    own object passed as it is), and `async_scheduling`, which vLLM's CPU
    platform turns off whatever was asked (an RBLN platform keeps it). The
    class is the one vLLM's engine core picks for
    `scheduler_cls=RBLN_SCHEDULER` (`get_scheduler_cls`): its async form when
    async scheduling is on.

    `chunks_cross_kv_blocks`: built on a platform that declares its device can
    prefill a chunk across KV blocks (`chunks_may_cross_kv_blocks`), so that
    the tier's sub-blocks below the prefill chunk (the livelock matrix's 4 and
    8 under chunks of 16) stand for such a device, as the parity tier's
    vllm-rbln side stands for a CR13; False: the plain platform, which
    cannot."""

    def make(*, vllm_config: Any, **kwargs: Any) -> Scheduler:
        if isinstance(additional_config, dict):
            vllm_config.additional_config = dict(additional_config)
        elif additional_config is not None:
            vllm_config.additional_config = additional_config
        vllm_config.scheduler_config.async_scheduling = async_scheduling
        vllm_config.scheduler_config.scheduler_cls = RBLN_SCHEDULER
        cls = vllm_config.scheduler_config.get_scheduler_cls()
        if not chunks_cross_kv_blocks:
            return cls(vllm_config=vllm_config, **kwargs)
        with chunks_may_cross_kv_blocks():
            return cls(vllm_config=vllm_config, **kwargs)

    return make


# A connector's external store holding the first `matched_tokens` tokens of
# every prompt: vLLM's MockKVConnector, but its hit is what lies past the
# local hit it is shown (the mock reports the same hit whatever the request
# has computed, which overruns a readmitted prompt's own cached prefix).
PREFIX_HIT_CONNECTOR = "RBLNTestPrefixHitConnector"


def prefix_hit_connector_cls() -> type:
    from tests.v1.kv_connector.unit.utils import MockKVConnector

    class PrefixHitConnector(MockKVConnector):
        def get_num_new_matched_tokens(
            self, request: Any, num_computed_tokens: int
        ) -> tuple[int | None, bool]:
            stored = min(self.config.matched_tokens, request.num_prompt_tokens - 1)
            hit = max(0, stored - num_computed_tokens)
            return hit, self.config.is_async and hit > 0

    return PrefixHitConnector


def _register_prefix_hit_connector() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if PREFIX_HIT_CONNECTOR not in KVConnectorFactory._registry:
        KVConnectorFactory._registry[PREFIX_HIT_CONNECTOR] = prefix_hit_connector_cls


def prefix_hit_connector_scheduler(
    matched_tokens: int, is_async: bool, additional_config: dict[str, Any] | None = None, **kwargs: Any
) -> Scheduler:
    """The RBLN scheduler (vLLM's harness, `kwargs` passed on) with a
    connector whose store holds the first `matched_tokens` tokens of every
    prompt (at most all but its last token: a P/D decode instance's
    remote KV), loaded asynchronously or not."""
    from vllm.config import KVTransferConfig

    _register_prefix_hit_connector()
    rbln = rbln_scheduler_factory(additional_config)

    def scheduler_cls(*, vllm_config: Any, **scheduler_kwargs: Any) -> Scheduler:
        vllm_config.kv_transfer_config = KVTransferConfig(
            kv_connector=PREFIX_HIT_CONNECTOR,
            kv_role="kv_both",
            kv_connector_extra_config={"matched_tokens": matched_tokens, "is_async": is_async},
        )
        # As vLLM's config does for a connector without HMA support.
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
        return rbln(vllm_config=vllm_config, **scheduler_kwargs)

    kwargs.setdefault("block_size", BLOCK_SIZE)
    return create_scheduler(scheduler_cls=scheduler_cls, **kwargs)  # type: ignore[arg-type]


def make_livelock_scheduler(case: LivelockCase, progress_guarantee: bool = True) -> Scheduler:
    from tests.v1.core.utils import mock_kv
    from vllm.config import KVTransferConfig

    settings = None if case.sub_block_size is None else sub_block_settings(case.sub_block_size)
    scheduler_cls: Any = rbln_scheduler_factory(settings)
    if case.connector_hit:
        _register_prefix_hit_connector()
        rbln = scheduler_cls

        def scheduler_cls(*, vllm_config: Any, **kwargs: Any) -> Scheduler:
            vllm_config.kv_transfer_config = KVTransferConfig(
                kv_connector=PREFIX_HIT_CONNECTOR,
                kv_role="kv_both",
                kv_connector_extra_config={
                    "matched_tokens": case.connector_hit,
                    "is_async": case.connector_async,
                },
            )
            # As vLLM's config does for a connector without HMA support.
            vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
            return rbln(vllm_config=vllm_config, **kwargs)

    scheduler = create_scheduler(
        scheduler_cls=scheduler_cls,
        block_size=BLOCK_SIZE,
        num_blocks=LIVELOCK_NUM_BLOCKS,
        # Prefill chunks of 16 tokens: both prompts take two chunks.
        max_num_batched_tokens=PREFILL_CHUNK,
        max_model_len=256,
        num_speculative_tokens=NUM_SPEC_TOKENS,
        speculative_method="ngram",
        # Sub-block caching "off": no prefix caching at all, so no cache hit
        # can let a later admission attempt succeed (or fail) by luck.
        enable_prefix_caching=case.prefix_caching,
        # A connector that finds nothing: the admission runs the connector's
        # code path with the same block numbers (the extra cases: a hit).
        use_kv_connector=mock_kv(0, False) if case.kv_connector and not case.connector_hit else None,
    )
    set_progress_guarantee(scheduler, progress_guarantee)
    return scheduler


def start_livelock_decodes(driver: Driver, hash_block_size: int = BLOCK_SIZE) -> None:
    """The livelock geometry's two drafting decodes: add them, prefill both
    (two chunks each, one prefill per step) and run one decode step."""
    for i in (1, 2):
        driver.add(
            make_request(
                f"decode-{i}",
                distinct_prompt(i, DECODE_PROMPT_LEN),
                max_tokens=DECODE_MAX_TOKENS,
                hash_block_size=hash_block_size,
            )
        )
    while not driver.steps or not driver.steps[-1].decode_req_ids:
        driver.step()
        assert len(driver.steps) <= 8, "the decodes did not start"


def set_progress_guarantee(scheduler: Scheduler, enabled: bool) -> None:
    """Turn the RBLN scheduler's progress guarantee (a lone prefill that
    cannot get blocks preempts a decode, not itself) on or off."""
    assert hasattr(scheduler, "preempt_decode_for_prefill"), "this tree has no progress guarantee"
    scheduler.preempt_decode_for_prefill = enabled  # type: ignore[attr-defined]


def _rbln_scheduler_cls() -> type[Scheduler]:
    from vllm.v1.core.sched.rbln_scheduler import RBLNScheduler

    return RBLNScheduler


@dataclass(frozen=True)
class LivelockOutcome:
    case_id: str
    finished: bool
    preemptions: int
    all_blocks_free: bool
    # Free blocks when the new prompt's admission was first attempted.
    free_blocks_at_admission: int
    steps: int
    # Preemptions of the two decodes (the progress guarantee's victims).
    decode_preemptions: int = 0

    @property
    def passed(self) -> bool:
        return self.finished and self.preemptions == 0 and self.all_blocks_free


def run_livelock_case(case: LivelockCase, progress_guarantee: bool = True) -> LivelockOutcome:
    scheduler = make_livelock_scheduler(case, progress_guarantee)
    assert num_usable_blocks(scheduler) == 6
    driver = Driver(scheduler)
    start_livelock_decodes(driver, case.hash_block_size)
    decodes = [r for r in scheduler.running if r.request_id.startswith("decode-")]
    assert len(decodes) == 2 and all(r.spec_token_ids for r in decodes)
    free_at_admission = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    prompt = make_request(
        "prompt",
        distinct_prompt(100 + case.prompt_len, case.prompt_len),
        max_tokens=PROMPT_MAX_TOKENS,
        hash_block_size=case.hash_block_size,
    )
    driver.add(prompt)
    steps = driver.run(LIVELOCK_MAX_STEPS)
    finished = "prompt" in driver.finished and not scheduler.has_requests()
    all_free = True
    try:
        assert_all_blocks_free(scheduler)
    except AssertionError:
        all_free = False
    return LivelockOutcome(
        case_id=case.id,
        finished=finished,
        preemptions=driver.preemptions.get("prompt", 0),
        all_blocks_free=all_free,
        free_blocks_at_admission=free_at_admission,
        steps=steps,
        decode_preemptions=sum(n for r, n in driver.preemptions.items() if r.startswith("decode-")),
    )


def _main(argv: list[str]) -> int:
    guarantee = "--no-progress-guarantee" not in argv
    extra = "--extra" in argv
    argv = [arg for arg in argv if arg not in ("--no-progress-guarantee", "--extra")]
    if len(argv) != 3 or argv[1] != "matrix":
        print(
            f"usage: {argv[0]} matrix <vllm-source-tree> [--no-progress-guarantee] [--extra]",
            file=sys.stderr,
        )
        return 2
    load_vllm_test_harness(argv[2])
    cases = LIVELOCK_CASES + (EXTRA_LIVELOCK_CASES if extra else ())
    outcomes = [run_livelock_case(case, guarantee).__dict__ for case in cases]
    import vllm

    print(json.dumps({"vllm": vllm.__file__, "outcomes": outcomes}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
