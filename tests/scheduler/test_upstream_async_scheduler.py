"""vLLM's own tests/v1/core/test_async_scheduler.py against the RBLN scheduler's async form.

Every test function of the pin's ``tests/v1/core/test_async_scheduler.py`` (the patched source
tree's) is collected here, parameters and marks as upstream wrote them. Each builds its scheduler
with the harness's ``create_scheduler(async_scheduling=True)``, which makes upstream's
``AsyncScheduler``; here (fixture ``_rbln_async_form``) that call builds the class vLLM's engine
core picks for ``scheduler_cls="vllm.v1.core.sched.rbln_scheduler.RBLNScheduler"`` with async
scheduling on (``SchedulerConfig.get_scheduler_cls``: ``RBLNAsyncScheduler``), with async
scheduling on in its config as an RBLN platform keeps it (vLLM's CPU platform turns it off).
Calls that name their own ``scheduler_cls``, or no async scheduling, are upstream's.

A test that fails because the RBLN policy differs from upstream's (one prefill a step, never
mixed with decodes) or because of the series' backport is listed, with why, in
``upstream-async-differences.toml`` and marked strict xfail: listed and passing fails (stale),
unlisted and failing fails. The upstream conformance tier runs the same file against upstream's
``AsyncScheduler`` (tests/upstream).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import sched_harness as h
import tests.v1.core.test_async_scheduler as upstream_async
from upstream_rules import installed_vllm_release

DIFFERENCES = Path(__file__).with_name("upstream-async-differences.toml")
PIN = ".".join(str(part) for part in installed_vllm_release()[:3])


def _listed_failures() -> dict[str, str]:
    entries = tomllib.loads(DIFFERENCES.read_text(encoding="utf-8")).get("failure", [])
    return {e["test"]: e["why"] for e in entries if PIN in e.get("pins", [PIN])}


LISTED = _listed_failures()
UPSTREAM_TESTS = sorted(name for name in vars(upstream_async) if name.startswith("test_"))

# Upstream's test functions, collected as this module's own.
globals().update({name: getattr(upstream_async, name) for name in UPSTREAM_TESTS})


def _rbln_create_scheduler(upstream: Any) -> Any:
    def create_scheduler(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("async_scheduling") and kwargs.get("scheduler_cls") is None:
            kwargs["scheduler_cls"] = h.rbln_scheduler_factory(async_scheduling=True)
        if not args and kwargs.get("scheduler_cls") is not None:
            # vLLM's own create_scheduler takes scheduler_cls from 0.31.0 on; the harness's
            # at every pin.
            return h.create_scheduler(**kwargs)
        return upstream(*args, **kwargs)

    return create_scheduler


@pytest.fixture(autouse=True)
def _rbln_async_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        upstream_async, "create_scheduler", _rbln_create_scheduler(upstream_async.create_scheduler)
    )
    why = LISTED.get(request.node.name)
    if why is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=" ".join(why.split())))


def test_the_listed_failures_name_upstream_tests() -> None:
    """Every listed failure names a test of the pin's file (its name before the parameters)."""
    unknown = [name for name in LISTED if name.split("[", 1)[0] not in UPSTREAM_TESTS]
    assert not unknown, f"{DIFFERENCES.name} lists tests the pin's file does not have: {unknown}"
    assert UPSTREAM_TESTS, "the pin's test_async_scheduler.py holds no test"
