"""The engine core's DP load-balancing stats (issue 14, bug 1).

The engine core publishes each rank's request counts to the DP coordinator
from `_maybe_publish_request_counts` (vllm/v1/engine/core.py, in
`EngineCoreProc` and `DPEngineCoreProc`), building the stats positionally:
`SchedulerStats(*scheduler.get_request_counts(), ...)`, and the coordinator
balances on `num_waiting_reqs`. A field inserted before `num_waiting_reqs`
(the preemption count once was) takes the waiting count, and every rank
reports 0 waiting. The preemption count is keyword-only and last, so no
positional construction can bind it.

These tests run the engine core's own functions on a real scheduler and send
the stats through the real msgpack encoder and decoder, as they travel to the
coordinator. The engine core is built without its `__init__`, which loads a
model through an executor (compiled kernels this venv does not have); the
functions under test read only the attributes set here. The engine tier
(tests/engine) runs the whole engine on vLLM's CPU build.
"""

from __future__ import annotations

import queue
from typing import Any

import pytest
import sched_harness as h


def _scheduler_with_counts(rbln: bool) -> Any:
    """A scheduler with 1 running and 2 waiting requests."""
    from sched_harness import create_scheduler

    kwargs: dict[str, Any] = {}
    if rbln:
        kwargs["scheduler_cls"] = h._rbln_scheduler_cls()
    scheduler = create_scheduler(
        block_size=h.BLOCK_SIZE, num_blocks=4, max_num_batched_tokens=64, max_model_len=64, **kwargs
    )
    driver = h.Driver(scheduler)
    # Each 40-token request needs 3 of the 3 usable blocks: one runs.
    for i in range(3):
        driver.add(h.make_request(f"r{i}", h.distinct_prompt(i, 40), max_tokens=8))
    driver.step()
    assert scheduler.get_request_counts() == (1, 2)
    return scheduler


def _published_stats(core_cls: type, scheduler: Any, **attributes: Any) -> Any:
    """Run `core_cls._maybe_publish_request_counts` and decode what it sent."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    core = object.__new__(core_cls)
    core.publish_dp_lb_stats = True
    core.last_counts = None
    core.scheduler = scheduler
    core.output_queue = queue.Queue()
    for name, value in attributes.items():
        setattr(core, name, value)
    core._maybe_publish_request_counts()
    client_index, outputs = core.output_queue.get_nowait()
    assert client_index == -1
    # What the coordinator receives (vllm/v1/engine/coordinator.py decodes
    # EngineCoreOutputs and reads scheduler_stats.num_waiting_reqs).
    frames = MsgpackEncoder().encode(outputs)
    decoded = MsgpackDecoder(EngineCoreOutputs).decode(frames)
    return decoded.scheduler_stats


@pytest.mark.parametrize("rbln", [False, True], ids=["upstream", "rbln"])
def test_engine_core_publishes_the_waiting_count(rbln: bool) -> None:
    from vllm.v1.engine.core import EngineCoreProc

    stats = _published_stats(EngineCoreProc, _scheduler_with_counts(rbln))
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (1, 2)
    assert stats.num_preempted_reqs == 0


@pytest.mark.parametrize("rbln", [False, True], ids=["upstream", "rbln"])
def test_dp_engine_core_publishes_the_waiting_count(rbln: bool) -> None:
    from vllm.v1.engine.core import DPEngineCoreProc

    stats = _published_stats(DPEngineCoreProc, _scheduler_with_counts(rbln), step_counter=7, current_wave=2)
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (1, 2)
    assert (stats.step_counter, stats.current_wave) == (7, 2)
    assert stats.num_preempted_reqs == 0


def test_the_preemption_count_cannot_be_bound_by_position() -> None:
    import dataclasses

    from vllm.v1.metrics.stats import SchedulerStats

    fields = {f.name: f for f in dataclasses.fields(SchedulerStats)}
    assert fields["num_preempted_reqs"].kw_only
    positional = [f.name for f in dataclasses.fields(SchedulerStats) if not f.kw_only]
    # Upstream's positional order, which the engine core relies on.
    assert positional[:2] == ["num_running_reqs", "num_waiting_reqs"]


def test_make_stats_reports_preemptions_with_the_counts() -> None:
    """The scheduler's own stats (built with keywords) carry the count and
    the waiting requests side by side."""
    from sched_harness import create_scheduler

    scheduler = create_scheduler(block_size=16, num_blocks=5, max_num_batched_tokens=16, max_model_len=256)
    driver = h.Driver(scheduler)
    driver.add(h.make_request("old", h.distinct_prompt(1, 14), max_tokens=40))
    driver.step()
    driver.add(h.make_request("new", h.distinct_prompt(2, 40), max_tokens=4))
    preempted = 0
    for _ in range(60):
        record = driver.step()
        if record.preempted_req_ids:
            preempted = len(record.preempted_req_ids)
            break
    assert preempted == 1
    # The engine core asks for stats after the step; the preempted request waits.
    stats = scheduler.make_stats()
    assert stats is not None
    running, waiting = scheduler.get_request_counts()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (running, waiting)
    assert waiting >= 1
