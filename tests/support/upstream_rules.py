"""Upstream vLLM's rules that differ between supported pins, as the vLLM tiers expect them.

Each rule is read in the pins' sdists and stated here once, with where it lives; the scheduler
and engine tiers derive their per-pin expectations from it. Needs only the standard library and
``packaging``: importable in every test venv.

**A waiting request stalled on the encoder budget.** When ``Scheduler.schedule()``'s waiting
loop can schedule none of a request's tokens because its encoder input does not fit
(``_try_schedule_encoder_inputs`` leaves ``num_new_tokens == 0``):

* 0.31.0 and 0.32.0 end the waiting pass there (``break``): the request stays at the head of
  its queue, uncounted, and every request behind it waits too;
* 0.33.0 requeues it through ``skip_request`` (counted in ``deferred_waiting``, put back on
  the queue it came from) and goes on to the next request ("Requeue it so it does not stall
  the requests behind it"; upstream's ``test_waiting_encoder_stall_*``).

0.30.0 ends the pass there too, and keeps its waiting requests in two queues of its own
(``waiting`` and ``skipped_waiting``), where 0.31.0 has ``waiting``, ``kv_holding_waiting``
and the step's ``deferred_waiting`` (``kv_holding_queue``, ``counted_as_deferred``).

**An async KV load's own spec decode step.** From 0.31.0 the waiting loop admits an async
load only if it fits in the free blocks less the in-flight prefills' remaining blocks and
``_spec_decode_step_blocks()``, the blocks of its own first spec decode step; 0.30.0 reserves
only the in-flight prefills' blocks (``reserved_blocks = self._inflight_prefill_reserved_blocks()``)
and has no ``_spec_decode_step_blocks``.
"""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version


def installed_vllm_release() -> tuple[int, ...]:
    """The release of the vLLM installed here (``0.32.0+rbln.4`` -> ``(0, 32, 0)``)."""
    return Version(version("vllm")).release


def stall_requeues(release: tuple[int, ...] | None = None) -> bool:
    """Whether ``release`` (default: the installed vLLM) requeues a waiting request stalled on
    the encoder budget and goes on (0.33.0 and later) rather than ending the pass (0.31.0,
    0.32.0)."""
    return (installed_vllm_release() if release is None else release) >= (0, 33)


def async_load_reserves_spec_decode_step(release: tuple[int, ...] | None = None) -> bool:
    """Whether ``release`` (default: the installed vLLM) reserves an async KV load's own spec
    decode step at admission (0.31.0 and later) or only the in-flight prefills' blocks (0.30.0)."""
    return (installed_vllm_release() if release is None else release) >= (0, 31)


def kv_holding_queue(scheduler: object) -> object:
    """The waiting queue a request holding KV blocks (a landed async load) waits on:
    ``kv_holding_waiting`` from 0.31.0 (drained first), ``skipped_waiting`` at 0.30.0 (where
    every request skipped by an earlier pass waits, an async load's included)."""
    if installed_vllm_release() >= (0, 31):
        return scheduler.kv_holding_waiting  # type: ignore[attr-defined]
    return scheduler.skipped_waiting  # type: ignore[attr-defined]


def counted_as_deferred(scheduler: object, request: object) -> bool:
    """Whether ``request`` counts in ``SchedulerStats.num_skipped_waiting_reqs``: it is in the
    step's ``deferred_waiting`` from 0.31.0, in ``skipped_waiting`` at 0.30.0."""
    if installed_vllm_release() >= (0, 31):
        return request in scheduler.deferred_waiting  # type: ignore[attr-defined]
    return any(r is request for r in scheduler.skipped_waiting)  # type: ignore[attr-defined]
