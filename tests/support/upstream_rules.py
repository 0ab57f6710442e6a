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
