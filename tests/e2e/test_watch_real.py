"""The watcher on real data: in a fresh clone without 0.34.0 (its pins.toml entry,
series/0.34.0, patches/0.34.0/ and tests/upstream/0.34.0/ removed), ``watch`` finds vLLM 0.34.0
on the index, carries the newest supported pin's series onto it (0.32.0's: 0.33.0 is retired,
pins.toml) with the records of rerere/, and rebuilds 0.34.0's series exactly: the same series
file and the same patches apart from hunk headers and blob ids. The two conflicts of that carry
(the 0.33.0 move's, in the KV cache coordinator, and the 0.34.0 move's, in the scheduler's
waiting loop) are both resolved from rerere/, and the backport 0.33.0 contains is dropped.
Nothing else is left to adapt by hand: the series' upstream files carry only hooks, and the
fork's own files read what moved between releases (``max_cache_hit_length``,
``lookahead_token_ids``, ``_make_cached_request_data``'s arguments) by what the release has.
The review still flags them (docs/rebases/README.md, "The watcher on real data").

The scheduler tier is left out (``run_tier=False``): the rest takes about a minute.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from workflow_steps import fresh_clone

from vllm_rbln_fork.paths import PROJECT_ROOT
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.source import SourceSpec
from vllm_rbln_fork.watch import Outcome, summary, watch

HEADERS = re.compile(r"^(@@ .*|index [0-9a-f]+\.\.[0-9a-f]+.*)$", re.M)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _without_headers(text: str) -> str:
    return HEADERS.sub("", text)


def test_the_watcher_rebuilds_the_0_34_0_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "watcher")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "watcher@example.invalid")
    root = fresh_clone(PROJECT_ROOT, tmp_path)
    pins = root / "pins.toml"
    text = pins.read_text()
    pins.write_text(text[: text.index('[pin."0.34.0"]')].rstrip("\n") + "\n")
    _git(root, "rm", "-rq", "series/0.34.0", "patches/0.34.0", "tests/upstream/0.34.0")
    _git(root, "commit", "-qam", "without 0.34.0")

    moved = watch(Project(root), SourceSpec.parse(None, None), release=Pin.parse("0.34.0"), run_tier=False)

    print(summary(moved))
    assert moved.outcome is Outcome.READY and moved.newest_supported == Pin.parse("0.32.0")
    assert moved.conflict_tree is None
    assert sorted(moved.reused) == ["vllm/v1/core/kv_cache_coordinator.py", "vllm/v1/core/sched/scheduler.py"]
    assert moved.statuses.get("dropped") == 1  # the CPU slot-mapping stand-in: Applied-Upstream 0.33.0
    assert (root / "series" / "0.34.0").read_text() == (PROJECT_ROOT / "series" / "0.34.0").read_text()
    real = {
        p.name: _without_headers(p.read_text()) for p in (PROJECT_ROOT / "patches" / "0.34.0").glob("*.patch")
    }
    rebuilt = {p.name: _without_headers(p.read_text()) for p in (root / "patches" / "0.34.0").glob("*.patch")}
    assert rebuilt == real
    assert any("_get_local_prefix_cache_hit" in f and "max_cache_hit_length" in f for f in moved.flagged)
    assert any("_build_block_stored_event" in f and "(breaking)" in f for f in moved.flagged)
    assert any("_make_cached_request_data" in f and "resumed_reqs" in f for f in moved.flagged)
