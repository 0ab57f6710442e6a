"""The parity tier: our RBLN scheduler beside vllm-rbln 0.12.0's, workload by workload.

Runs ``drive.py`` in both sides' venvs at once (the runner's environment names them), then,
per workload of ``workloads.WORKLOADS``: ours matches or beats vllm-rbln on each figure the
workload judges, or the pair is listed in ``differences.toml`` with its reason; a listed pair
where ours no longer falls behind fails as stale. The report (the table) is written to
``VLLM_RBLN_PARITY_REPORT`` and printed by the runner. docs/parity.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import figures as fig  # noqa: E402
from workloads import WORKLOADS, Workload  # noqa: E402

REQUIRED = (
    "VLLM_RBLN_PIN",
    "VLLM_RBLN_VLLM_PYTHON",  # ours: the pin's scheduler-tier venv, our wheel installed
    "VLLM_RBLN_SOURCE_TREE",  # ours: the patched tree (its tests/ is the harness)
    "VLLM_RBLN_PARITY_PYTHON",  # vllm-rbln: the reference venv
    "VLLM_RBLN_PARITY_TREE",  # vllm-rbln: vLLM 0.30.0's unpacked sdist
    "VLLM_RBLN_PARITY_REPORT",  # where the report goes
    "VLLM_RBLN_PARITY_TRACES",  # where the vllm-rbln side's traces are kept between pins
)


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: run the tier with `python build.py test --tier parity`.", pytrace=False
        )
    return value


def _start(python: str, side: str, tree: str, out: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["VLLM_PLUGINS"] = "none"  # vllm-rbln's general plugin imports the RBLN compiler
    return subprocess.Popen(
        [python, str(HERE / "drive.py"), side, tree, str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _collect(process: subprocess.Popen[str], side: str, out: Path) -> dict[str, Any]:
    _, err = process.communicate()
    if process.returncode != 0:
        pytest.fail(f"the {side} driver failed (exit {process.returncode}):\n{err[-4000:]}", pytrace=False)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def reference_key() -> str:
    """What the vllm-rbln side's traces depend on: the driver, the workloads, the simulated
    runner (their bytes), and the reference venv and tree (their paths hold the hash of
    everything installed in them: vllm_rbln_fork/testing/parity.py)."""
    digest = hashlib.sha256()
    for path in (HERE / "drive.py", HERE / "workloads.py", HERE.parent / "scheduler" / "sched_harness.py"):
        digest.update(path.read_bytes() + b"\0")
    for name in ("VLLM_RBLN_PARITY_PYTHON", "VLLM_RBLN_PARITY_TREE"):
        digest.update(_env(name).encode() + b"\0")
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Both sides' traces. The vllm-rbln side's are the same at every pin: kept in
    ``VLLM_RBLN_PARITY_TRACES`` under ``reference_key()``, so that side runs once while its
    inputs are unchanged."""
    for name in REQUIRED:
        _env(name)
    traces = Path(_env("VLLM_RBLN_PARITY_TRACES"))
    traces.mkdir(parents=True, exist_ok=True)
    kept = traces / f"vllm-rbln-{reference_key()}.json"
    ours_out = tmp_path_factory.mktemp("parity") / "ours.json"
    ours = _start(_env("VLLM_RBLN_VLLM_PYTHON"), "ours", _env("VLLM_RBLN_SOURCE_TREE"), ours_out)
    if not kept.exists():
        partial = kept.with_suffix(f".{os.getpid()}.tmp")
        theirs = _start(_env("VLLM_RBLN_PARITY_PYTHON"), "vllm-rbln", _env("VLLM_RBLN_PARITY_TREE"), partial)
        _collect(theirs, "vllm-rbln", partial)
        partial.replace(kept)
    theirs_run = json.loads(kept.read_text())
    return {"ours": _collect(ours, "ours", ours_out), "vllm-rbln": theirs_run}


@pytest.fixture(scope="module")
def report(runs: dict[str, dict[str, Any]]) -> dict[str, list[fig.Judgement]]:
    """Judge every workload, write the report, and return the judgements by workload."""
    pin = _env("VLLM_RBLN_PIN")
    differences = fig.load_differences(fig.DIFFERENCES, pin)
    by_side = {side: {t["workload"]: t for t in run["traces"]} for side, run in runs.items()}
    results: list[tuple[Workload, dict[str, Any], dict[str, Any]]] = []
    judgements: dict[str, list[fig.Judgement]] = {}
    for w in WORKLOADS:
        ours, theirs = by_side["ours"][w.name], by_side["vllm-rbln"][w.name]
        results.append((w, ours, theirs))
        if "error" not in ours and "error" not in theirs:
            judgements[w.name] = fig.judge(w, fig.figures_of(ours, w), fig.figures_of(theirs, w), differences)
    text = fig.render(
        pin, runs["vllm-rbln"]["vllm"], results, judgements, fig.load_cannot_run(fig.CANNOT_RUN)
    )
    path = Path(_env("VLLM_RBLN_PARITY_REPORT"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.with_suffix(".json").write_text(json.dumps(runs))
    return judgements


def test_each_side_runs_its_own_vllm(runs: dict[str, dict[str, Any]]) -> None:
    """The reference side imports vLLM 0.30.0 from its venv; ours the pin's RBLN wheel."""
    assert runs["vllm-rbln"]["vllm"] == "0.30.0", runs["vllm-rbln"]["vllm_file"]
    assert runs["ours"]["vllm"].startswith(f"{_env('VLLM_RBLN_PIN')}+rbln."), runs["ours"]["vllm_file"]


@pytest.mark.parametrize("name", [w.name for w in WORKLOADS])
def test_ours_matches_or_beats_vllm_rbln(name: str, runs: dict[str, dict[str, Any]], report: Any) -> None:
    traces = {side: next(t for t in run["traces"] if t["workload"] == name) for side, run in runs.items()}
    for side, trace in traces.items():
        assert "error" not in trace, f"{side} refused {name}: {trace['error']}"
    failing = [j for j in report[name] if j.fails]
    assert not failing, "\n".join(
        f"{j.figure}: ours {j.ours}, vllm-rbln {j.theirs}: {j.verdict}"
        + (
            " (delete the entry from tests/parity/differences.toml)"
            if j.verdict is fig.Verdict.STALE
            else " (fix ours, or give its entry in tests/parity/differences.toml the new 'ours' and why)"
            if j.verdict is fig.Verdict.FURTHER_BEHIND
            else " (fix ours, or list it in tests/parity/differences.toml with the reason)"
        )
        for j in failing
    )


def test_the_lists_load() -> None:
    """differences.toml names real workloads and judged figures; cannot-run.toml has reasons."""
    fig.load_differences(fig.DIFFERENCES, _env("VLLM_RBLN_PIN"))
    assert fig.load_cannot_run(fig.CANNOT_RUN)
