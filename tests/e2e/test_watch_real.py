"""The watcher on real data: in a fresh clone without 0.33.0 (its pins.toml entry,
series/0.33.0 and patches/0.33.0/ removed), ``watch`` finds vLLM 0.33.0 on the index, carries
0.32.0's series onto it with the records of rerere/, and rebuilds 0.33.0's series: the same
series file, the same patches apart from hunk headers and blob ids, but for the
adaptations outside any conflict, which the review flags (docs/rebases/README.md, "The
watcher on real data"): ``max_cache_hit_length`` in the retry patch's override, and the
``lookahead_token_ids`` the KV-events patch must pass to ``_build_block_stored_event``. A
later patch whose context holds the adapted call (the resume patch) has a 0.33.0 form of its
own in the real series for that context alone, and the KV-events patch a 0.33.0 form for its
adaptation; the rebuilt series, without the adaptations, takes the shared forms of both.

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

RETRY = "retry-a-failed-admission-once-without-its-sub-block-prefix-hit.patch"
# Its 0.33.0 form differs from the shared one only in context: the retry patch's adapted call.
RESUME = "resume-a-preempted-request-at-the-local-hit-its-kv-connector-was.patch"
ADAPTED_CALL = ("request, max_cache_hit_length", "request")
# Its 0.33.0 form passes 0.33.0's new required argument; the watcher cannot write that.
KV_EVENTS = "report-each-sub-block-prefix-cache-entry-as-one-sub-block-kv.patch"
HEADERS = re.compile(r"^(@@ .*|index [0-9a-f]+\.\.[0-9a-f]+.*)$", re.M)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _without_headers(text: str) -> str:
    return HEADERS.sub("", text)


def test_the_watcher_rebuilds_the_0_33_0_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "watcher")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "watcher@example.invalid")
    root = fresh_clone(PROJECT_ROOT, tmp_path)
    pins = root / "pins.toml"
    text = pins.read_text()
    pins.write_text(text[: text.index('[pin."0.33.0"]')].rstrip("\n") + "\n")
    _git(root, "rm", "-rq", "series/0.33.0", "patches/0.33.0")
    _git(root, "commit", "-qam", "without 0.33.0")

    moved = watch(Project(root), SourceSpec.parse(None, None), release=Pin.parse("0.33.0"), run_tier=False)

    print(summary(moved))
    assert moved.outcome is Outcome.READY and moved.newest_supported == Pin.parse("0.32.0")
    assert moved.conflict_tree is None and len(moved.reused) == 2  # both conflicts from rerere/
    real_series = (PROJECT_ROOT / "series" / "0.33.0").read_text()
    shared_forms = real_series.replace(f"0.33.0/{RESUME}", RESUME).replace(f"0.33.0/{KV_EVENTS}", KV_EVENTS)
    assert (root / "series" / "0.33.0").read_text() == shared_forms
    real = {p.name: p.read_text() for p in (PROJECT_ROOT / "patches" / "0.33.0").glob("*.patch")}
    rebuilt = {p.name: p.read_text() for p in (root / "patches" / "0.33.0").glob("*.patch")}
    assert rebuilt.keys() == real.keys() - {RESUME, KV_EVENTS}
    differ = {n for n in rebuilt if _without_headers(real[n]) != _without_headers(rebuilt[n])}
    assert differ == {RETRY}
    adapted = _without_headers(real[RETRY]).replace(", max_cache_hit_length: int | None = None", "")
    assert _without_headers(rebuilt[RETRY]) == adapted.replace(*ADAPTED_CALL)
    shared = _without_headers((root / "patches" / RESUME).read_text())
    assert shared == _without_headers(real[RESUME]).replace(*ADAPTED_CALL)
    assert any("_get_local_prefix_cache_hit" in f and "max_cache_hit_length" in f for f in moved.flagged)
    assert any("_build_block_stored_event" in f and "(breaking)" in f for f in moved.flagged)
