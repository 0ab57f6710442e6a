"""The extension points the series adds to upstream files, one contract at a time.

In vLLM's own ``tests/v1/core`` style: upstream's ``Scheduler`` through its harness, small
pools, exact outcomes. Each test overrides one hook in a throwaway subclass and shows that
``schedule()`` follows it; the default (upstream's behaviour) is the control in the same
test, so none passes by accident. The RBLN scheduler's own use of the hooks is in the other
files of this tier; these are the hooks as they could be proposed upstream.
"""

from __future__ import annotations

from typing import Any

import sched_harness as h


def _scheduler(cls: Any = None, **kwargs: Any) -> Any:
    from vllm.v1.core.sched.scheduler import Scheduler

    kwargs.setdefault("max_model_len", 256)
    return h.make_scheduler(rbln=False, kv_events=False, scheduler_cls=cls or Scheduler, **kwargs)


def _running(scheduler: Any, *req_ids: str, prompt_len: int = 8) -> h.Driver:
    """A driver whose requests have all finished their prefill and decode."""
    driver = h.Driver(scheduler)
    for req_id in req_ids:
        driver.add(h.named_request(req_id, prompt_len, 20))
    driver.step()
    assert {r.request_id for r in scheduler.running} == set(req_ids)
    return driver


def test_should_schedule_running_leaves_a_running_request_out() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    class SkipB(Scheduler):
        def _should_schedule_running(self, request: Any, num_scheduled_tokens: dict[str, int]) -> bool:
            return request.request_id != "b"

    for cls, expected in ((Scheduler, {"a", "b"}), (SkipB, {"a"})):
        driver = _running(_scheduler(cls), "a", "b")
        assert set(driver.step().num_scheduled_tokens) == expected


def test_should_schedule_waiting_and_should_admit_waiting_keep_a_request_waiting() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    class NoMoreWaiting(Scheduler):
        def _should_schedule_waiting(self, num_scheduled_tokens: dict[str, int]) -> bool:
            return not num_scheduled_tokens

    seen: list[tuple[str, int, bool]] = []

    class AdmitOnlyA(Scheduler):
        def _should_admit_waiting(self, request: Any, num_computed_tokens: int, load_kv_async: bool) -> bool:
            seen.append((request.request_id, num_computed_tokens, load_kv_async))
            return request.request_id == "a"

    for cls, expected in ((Scheduler, {"a", "b"}), (NoMoreWaiting, {"a"}), (AdmitOnlyA, {"a"})):
        driver = h.Driver(_scheduler(cls))
        driver.add(h.named_request("a", 8, 4))
        driver.add(h.named_request("b", 8, 4))
        assert set(driver.step().num_scheduled_tokens) == expected
    # False leaves the request first in its queue and ends the pass.
    assert seen == [("a", 0, False), ("b", 0, False)]


def test_the_admission_gate_counts_the_hooks_decode_step_and_reservation() -> None:
    """Four usable blocks of 16; a 32-token prompt needs two. The gate refuses it once the
    decode step it counts (`_admission_decode_step_tokens`) needs a third block past what is
    free, or once the blocks it leaves to the running requests
    (`_admission_reserved_blocks`) leave fewer than two."""
    from vllm.v1.core.sched.scheduler import Scheduler

    class LongDecodeStep(Scheduler):
        def _admission_decode_step_tokens(self, request: Any, load_kv_async: bool) -> int:
            return 3 * h.BLOCK_SIZE

    class ReserveThree(Scheduler):
        def _admission_reserved_blocks(self, request: Any) -> int:
            return 3

    for cls, admitted in ((Scheduler, True), (LongDecodeStep, False), (ReserveThree, False)):
        scheduler = _scheduler(cls, num_blocks=5)
        scheduler.scheduler_reserve_full_isl = True
        driver = h.Driver(scheduler)
        driver.add(h.named_request("p", 2 * h.BLOCK_SIZE, 4))
        assert bool(driver.step().num_scheduled_tokens) is admitted, cls.__name__


def test_should_retry_admission_tries_the_same_request_again_at_once() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    calls: list[str] = []

    class RetryOnce(Scheduler):
        def _should_retry_admission(self, request: Any, num_new_local_computed_tokens: int) -> bool:
            calls.append(request.request_id)
            return len(calls) == 1

    for cls, expected_calls in ((Scheduler, []), (RetryOnce, ["big", "big"])):
        calls.clear()
        driver = h.Driver(_scheduler(cls, num_blocks=3))  # two usable blocks
        driver.add(h.named_request("big", 3 * h.BLOCK_SIZE, 4))
        assert not driver.step().num_scheduled_tokens
        assert calls == expected_calls


def test_should_replan_step_plans_the_same_step_again() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    passes: list[bool] = []

    class ReplanOnce(Scheduler):
        def schedule(self, throttle_prefills: bool = False) -> Any:
            passes.append(self._replanning_step)  # as a subclass reads it: on entry
            return super().schedule(throttle_prefills)

        def _should_replan_step(self, num_scheduled_tokens: dict[str, int]) -> bool:
            return len(passes) == 1

    scheduler = _scheduler(ReplanOnce)
    driver = h.Driver(scheduler)
    driver.add(h.named_request("a", 8, 4))
    step = scheduler.current_step
    assert set(driver.step().num_scheduled_tokens) == {"a"}
    # The second pass was entered as a replan; the step counter moved once.
    assert passes == [False, True] and scheduler.current_step == step + 1


def test_select_preemption_victim_picks_who_is_preempted() -> None:
    """Three usable blocks, two decodes of one block each that both need a second: FCFS
    preempts the last running request; the hook may pick the first instead."""
    from vllm.v1.core.sched.scheduler import Scheduler

    class PreemptFirst(Scheduler):
        def _select_preemption_victim(self, request: Any) -> Any:
            return self.running[0]

    for cls, victim in ((Scheduler, "b"), (PreemptFirst, "a")):
        driver = _running(_scheduler(cls, num_blocks=4), "a", "b", prompt_len=h.BLOCK_SIZE - 1)
        preempted: set[str] = set()
        for _ in range(4):
            preempted |= driver.step().preempted_req_ids
        assert preempted == {victim}, cls.__name__


def test_a_scheduler_chooses_its_kv_cache_classes() -> None:
    """`kv_cache_manager_cls` -> `_make_coordinator` -> `block_pool_cls` and `_manager_class`:
    each link builds the class the scheduler named."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    class Pool(BlockPool):
        pass

    class Manager(FullAttentionManager):
        pass

    class Coordinator(UnitaryKVCacheCoordinator):
        block_pool_cls = Pool

        def _manager_class(self, kv_cache_group: Any) -> Any:
            return Manager

    class CacheManager(KVCacheManager):
        def _make_coordinator(self, **kwargs: Any) -> Any:
            return Coordinator(**kwargs)

    class Named(Scheduler):
        kv_cache_manager_cls = CacheManager

    default = _scheduler(enable_prefix_caching=True).kv_cache_manager
    assert type(default) is KVCacheManager
    assert type(default.coordinator) is UnitaryKVCacheCoordinator
    assert type(default.block_pool) is BlockPool
    assert type(default.coordinator.single_type_managers[0]) is FullAttentionManager
    named = _scheduler(Named, enable_prefix_caching=True).kv_cache_manager
    assert type(named) is CacheManager and type(named.coordinator) is Coordinator
    assert type(named.block_pool) is Pool and type(named.coordinator.single_type_managers[0]) is Manager
    # The scheduler still runs on them.
    driver = h.Driver(_scheduler(Named, enable_prefix_caching=True))
    driver.add(h.named_request("a", 40, 3))
    assert driver.run(20) and "a" in driver.finished


def test_the_block_pool_hooks_see_superseded_entries_and_stored_events() -> None:
    """`_queue_block_stored_event` gets the BlockStored of every new entry; with KV events
    on, a pool that keeps every event it is given reports what upstream's queues."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    given: list[Any] = []

    class Pool(BlockPool):
        def _queue_block_stored_event(self, event: Any) -> None:
            given.append(event)
            super()._queue_block_stored_event(event)

    class Coordinator(UnitaryKVCacheCoordinator):
        block_pool_cls = Pool

    class CacheManager(KVCacheManager):
        def _make_coordinator(self, **kwargs: Any) -> Any:
            return Coordinator(**kwargs)

    class Named(Scheduler):
        kv_cache_manager_cls = CacheManager

    scheduler = h.make_scheduler(
        rbln=False, scheduler_cls=Named, enable_prefix_caching=True, max_model_len=256
    )
    driver = h.Driver(scheduler)
    driver.add(h.named_request("a", 2 * h.BLOCK_SIZE + 3, 2))
    driver.run(10)
    assert given, "no BlockStored reached the hook"
    assert sum(len(e.block_hashes) for e in given) == 2  # the prompt's two full blocks
    assert driver.events is not None and driver.events.num_stored == 2  # and were published


def test_make_stats_counts_every_preemption() -> None:
    """`SchedulerStats.num_preempted_reqs`: the preemptions since the last stats, those of
    requests that never emitted a token included (the driver sums it per step, as the
    engine's loggers do)."""
    driver = _running(_scheduler(num_blocks=4), "a", "b", prompt_len=h.BLOCK_SIZE - 1)
    preempted = sum(len(driver.step().preempted_req_ids) for _ in range(4))
    assert preempted and driver.reported_preemptions == preempted


def test_a_scheduler_class_names_its_async_form() -> None:
    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.scheduler import Scheduler

    class Sync(Scheduler):
        @classmethod
        def async_scheduler_cls(cls) -> type:
            return Async

    class Async(Sync):
        pass

    class Subclass(Sync):  # inherits the name; its parent's form would drop its overrides
        pass

    def resolved(cls: type, async_scheduling: bool) -> type:
        config = SchedulerConfig(max_model_len=256, is_encoder_decoder=False, scheduler_cls=cls)
        config.async_scheduling = async_scheduling
        return config.get_scheduler_cls()

    assert resolved(Sync, True) is Async and resolved(Sync, False) is Sync
    assert resolved(Subclass, True) is Subclass


def test_a_platform_is_asked_whether_a_chunk_may_cross_a_kv_block() -> None:
    from vllm.platforms.interface import Platform

    assert Platform.supports_prefill_chunk_across_kv_blocks() is False
