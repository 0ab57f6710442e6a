"""Upstream conformance: vLLM's own tests/v1/core/ on the patched tree, compared with the unpatched one.

Runs in the tool's environment; the vLLM tests run in a subprocess with the python of a vLLM
venv. The test runner sets:

* ``VLLM_RBLN_VLLM_PYTHON``: python of a venv with vLLM's dependencies (and pytest,
  pytest-xdist, pytest-asyncio, tblib);
* ``VLLM_RBLN_SOURCE_TREE``: the patched tree (a checkout of the patched branch, with the
  sdist's tests/);
* ``VLLM_RBLN_UPSTREAM_TREE``: the unpatched tree of the same pin (the unpacked sdist);

and optionally ``VLLM_RBLN_PIN`` (default: read from the unpatched tree's vllm/_version.py),
``VLLM_RBLN_CONFORMANCE_WORKERS`` (pytest-xdist workers, default 2; 0 runs serially) and
``VLLM_RBLN_CONFORMANCE_NO_CACHE=1`` (run the unpatched side even when its outcomes are cached).
A missing variable fails the test: a tier that silently skips proves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_rbln_fork import log
from vllm_rbln_fork.paths import PROJECT_ROOT, cache_root
from vllm_rbln_fork.testing.conformance import run_conformance, tree_version
from vllm_rbln_fork.testing.outcomes import render_report

HERE = Path(__file__).resolve().parent
REQUIRED = ("VLLM_RBLN_VLLM_PYTHON", "VLLM_RBLN_SOURCE_TREE", "VLLM_RBLN_UPSTREAM_TREE")


def _required_env() -> dict[str, Path]:
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        pytest.fail(
            f"the upstream conformance tier needs {', '.join(missing)}: set VLLM_RBLN_VLLM_PYTHON to "
            "the python of a venv with vLLM's dependencies, VLLM_RBLN_SOURCE_TREE to the patched tree "
            "and VLLM_RBLN_UPSTREAM_TREE to the pin's unpacked sdist (see docs/conformance.md).",
            pytrace=False,
        )
    return {name: Path(os.environ[name]) for name in REQUIRED}


def _pin(upstream: Path) -> str:
    if pin := os.environ.get("VLLM_RBLN_PIN"):
        return pin
    version = tree_version(upstream)
    if version is None:
        pytest.fail(
            f"cannot read the pin from {upstream}/vllm/_version.py; set VLLM_RBLN_PIN.", pytrace=False
        )
    return version.split("+")[0]


def test_upstream_core_tests_conform() -> None:
    env = _required_env()
    upstream = env["VLLM_RBLN_UPSTREAM_TREE"]
    recorder = log.RecordingReporter()
    log.set_reporter(recorder)
    no_cache = os.environ.get("VLLM_RBLN_CONFORMANCE_NO_CACHE") == "1"
    report = run_conformance(
        python=env["VLLM_RBLN_VLLM_PYTHON"],
        patched_tree=env["VLLM_RBLN_SOURCE_TREE"],
        unpatched_tree=upstream,
        pin=_pin(upstream),
        expected=HERE / _pin(upstream) / "expected-differences.toml",
        hf_home=PROJECT_ROOT / "tests" / "fixtures" / "hf",
        baseline_cache=None if no_cache else cache_root() / "conformance",
        cannot_run=HERE / _pin(upstream) / "cannot-run.toml",
        patches_dir=PROJECT_ROOT / "patches",
        workers=int(os.environ.get("VLLM_RBLN_CONFORMANCE_WORKERS", "2")),
        logs_dir=cache_root() / "conformance" / "logs",
    )
    text = render_report(report)
    print(text)  # shown with -rA or -s, and kept in the junit output of the tool's own suite
    assert report.ok, text
    assert not report.patched.cached
