"""The RBLN scheduler, counting its own preemptions (selected with ``scheduler_cls``).

vLLM's documented extension point, not a patch of vLLM: the subclasses only record each
call of upstream's ``_preempt_request`` (and each step that scheduled tokens) before doing
what they always do, so a case can compare what the scheduler did with what the metrics
report, and the benchmark can count steps. In-process engines only
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the counts live in this module.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.rbln_scheduler import RBLNScheduler
from vllm.v1.core.sched.scheduler import Scheduler

PREEMPTED: list[str] = []
PREEMPTED_BEFORE_FIRST_TOKEN = [0]
STEPS = [0]  # schedule() calls that scheduled any token: the engine steps that ran the model
# Each request's first scheduling (engine_kit.Admission's fields): the tokens computed before it
# (local prefix hits plus a connector's), the tokens scheduled, the step, the step's size.
ADMISSIONS: list[dict[str, int | str]] = []


def _count_step(output: Any) -> Any:
    if output.total_num_scheduled_tokens > 0:
        for new in output.scheduled_new_reqs:
            ADMISSIONS.append(
                {
                    "request_id": new.req_id,
                    "prompt_tokens": len(new.prompt_token_ids or []),
                    "computed": new.num_computed_tokens,
                    "scheduled": output.num_scheduled_tokens[new.req_id],
                    "step": STEPS[0],
                    "step_requests": len(output.num_scheduled_tokens),
                }
            )
        STEPS[0] += 1
    return output


class CountingRBLNScheduler(RBLNScheduler):
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return _count_step(super().schedule(*args, **kwargs))

    def _preempt_request(self, request: Any, timestamp: float, *args: Any, **kwargs: Any) -> None:
        PREEMPTED.append(request.request_id)
        if request.num_output_tokens == 0:
            PREEMPTED_BEFORE_FIRST_TOKEN[0] += 1
        super()._preempt_request(request, timestamp, *args, **kwargs)


class CountingScheduler(Scheduler):
    """Upstream's scheduler, counting the same way (the reference runs)."""

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return _count_step(super().schedule(*args, **kwargs))

    def _preempt_request(self, request: Any, timestamp: float, *args: Any, **kwargs: Any) -> None:
        PREEMPTED.append(request.request_id)
        if request.num_output_tokens == 0:
            PREEMPTED_BEFORE_FIRST_TOKEN[0] += 1
        super()._preempt_request(request, timestamp, *args, **kwargs)
