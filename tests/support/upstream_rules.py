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
and has no ``_spec_decode_step_blocks``. The RBLN scheduler reserves the same blocks at both: its
0.30.0 form adds that step per in-flight prefill itself (without it, at 0.30.0, a second load
took the blocks a landed load ahead of it needed, and both waited for good:
``test_async_loads.py::test_loads_under_priority_finish[5-rbln]``).

**Routed experts** (``enable_return_routed_experts``). From 0.31.0 the setting is
``AuxOutputConfig``'s, and upstream's scheduler builds an aux-output connector
(``vllm/distributed/aux_output_connector``) that sends its worker ``request.block_hashes``, one
hash per ``resolve_kv_cache_block_sizes()`` hash block, under which the worker files each
block's routed experts. 0.30.0 has no ``AuxOutputConfig`` and no such connector: the setting is
``ModelConfig``'s, and the scheduler's own ``RoutedExpertsManager``
(``vllm/model_executor/layers/fused_moe/routed_experts_capturer.py``) stores each token's routed
experts in the slot of its physical KV block (``block_id * block_size + offset``, the attention
group's KV block size; ``store_batch``) and reads a request's back through its own block ids
(``get``, with the ids ``_update_after_schedule`` snapshots in ``_re_block_ids``); building it
needs a MoE model (``_get_routed_experts_shape``: positive expert counts).
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


def routed_experts_by_block_hash(release: tuple[int, ...] | None = None) -> bool:
    """Whether ``release`` (default: the installed vLLM) files routed experts under request
    block hashes through the aux-output connector, set in ``AuxOutputConfig`` (0.31.0 and later),
    or per physical KV slot in the scheduler's ``RoutedExpertsManager``, set in ``ModelConfig``
    (0.30.0)."""
    return (installed_vllm_release() if release is None else release) >= (0, 31)
