"""The conformance tier's unpatched baseline cache, on a tiny synthetic vLLM tree: a baseline
with a failure that no expected difference lists (the load, the environment) is never cached,
nor read back from the cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_rbln_fork.testing.conformance import run_conformance
from vllm_rbln_fork.testing.outcomes import ConformanceReport

SUITE_FILE = """\
import os
from pathlib import Path


def test_steady():
    assert True


def test_under_load():
    # Stands for a 60 s subprocess timeout on a loaded machine: it fails while the marker lies
    # in TMPDIR, and passes once the machine is quiet again.
    assert not (Path(os.environ["TMPDIR"]) / "loaded").exists()
"""


def _tree(root: Path) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text('__version__ = "1.0"\n')
    (root / "pyproject.toml").write_text("")
    (root / "tests" / "v1" / "core").mkdir(parents=True)
    (root / "tests" / "v1" / "core" / "test_suite.py").write_text(SUITE_FILE)
    return root


def _baselines(cache: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted((cache / "baselines").glob("*.json"))]


def test_a_baseline_with_an_unlisted_failure_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unpatched, patched = _tree(tmp_path / "unpatched"), _tree(tmp_path / "patched")
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    expected = tmp_path / "expected-differences.toml"
    expected.write_text("")
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(machine_tmp))
    cache = tmp_path / "cache"

    def run() -> ConformanceReport:
        return run_conformance(
            Path(sys.executable), patched, unpatched, "1.0", expected, tmp_path / "hf", cache, workers=0
        )

    (machine_tmp / "loaded").write_text("")  # the loaded machine: test_under_load fails on both sides
    report = run()
    assert report.unpatched.outcomes["tests/v1/core/test_suite.py::test_under_load"] == "failed"
    assert _baselines(cache) == []  # not kept: it would stand in for the unpatched side from now on

    (machine_tmp / "loaded").unlink()  # a quiet machine: the baseline runs again, passes, is kept
    report = run()
    assert not report.unpatched.cached
    [record] = _baselines(cache)
    assert set(record["outcomes"].values()) == {"passed"}
    assert run().unpatched.cached

    # A baseline with such a failure that is already in the cache (made before this rule) is not read.
    [path] = (cache / "baselines").glob("*.json")
    data = json.loads(path.read_text())
    data["outcomes"]["tests/v1/core/test_suite.py::test_under_load"] = "failed"
    path.write_text(json.dumps(data))
    report = run()
    assert not report.unpatched.cached
    assert report.unpatched.outcomes["tests/v1/core/test_suite.py::test_under_load"] == "passed"
