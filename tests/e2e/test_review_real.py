"""``build.py --pin X --review`` of the real series, and the backport tripwire.

Runs in the tool env after the test runner built the series' pin (0.31.0); reviewing
0.32.0 / 0.33.0 downloads their sdists once (~45 MB each, then cached and recorded in
pins.lock). The assertions are about the review, not about today's verdict: the series
moves, and the review must say so correctly whatever it is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.review import STATUSES, contained_backports, review
from vllm_rbln_fork.review.render import summary_lines, write_reports
from vllm_rbln_fork.source import SourceSpec
from vllm_rbln_fork.supported import read_series_for, series_pins, source_pin_for

PROJECT = Project.default()
PINS = [str(p) for p in series_pins(PROJECT)]  # every pin with a series of its own


@pytest.mark.parametrize("pin", PINS[1:])
def test_review_the_real_series(pin: str, tmp_path: Path) -> None:
    """The review of each move between supported pins (the series of the pin before it,
    carried onto it), as a maintainer runs it."""
    source = source_pin_for(PROJECT, Pin.parse(pin))
    SERIES = read_series_for(PROJECT, source)
    result = review(Pin.parse(pin), SourceSpec.parse(None, None), PROJECT)
    print("\n".join(summary_lines(result)))
    assert [p.name for p in result.patches] == [p.name for p in SERIES.patches]
    assert all(p.status in STATUSES for p in result.patches)
    assert result.exit_code == (0 if result.verdict == "ready" else 1)
    for p in result.patches:
        if p.status in ("clean", "context drift", "merged"):
            assert p.new_diff and p.mark in "=!"
        if p.status == "conflict":
            assert p.conflicts and all(h.path for h in p.conflicts)
    # The backport edits allocate_slots: whatever its status, the review reads what
    # upstream did to it (0.32.0 added skip_zeroing_group_ids).
    backport = next(p for p in result.patches if p.patch.is_backport)
    if backport.status not in ("upstreamed", "dropped"):
        seen = {s.qualname for s in backport.symbols} | {u.split(" ")[0] for u in backport.unchanged}
        assert "KVCacheManager.allocate_slots" in seen
    md, page = write_reports(result, tmp_path)
    assert md.read_text().startswith(f"## vLLM pin review: {SERIES.exported_against} → {pin}")
    assert page.stat().st_size > 0


@pytest.mark.parametrize("pin", PINS)
def test_tripwire_no_dead_backport_at_the_series_pin(pin: str) -> None:
    """Fails once the series' pin contains a backport that is still in the series: drop
    it (or give it Applied-Upstream:). The build would drop it by itself (proven on a
    synthetic pin: tests/tooling/test_build.py::test_backport_already_upstream_is_dropped_and_said
    and tests/tooling/test_review.py::test_tripwire_detects_a_backport_the_pin_contains)."""
    series = read_series_for(PROJECT, Pin.parse(pin))
    backports = [p.name for p in series.patches if p.is_backport]
    assert backports, "the series has no backport: nothing to guard"
    dead = contained_backports(series.exported_against, SourceSpec.parse(None, None), PROJECT)
    assert dead == [], f"dead backports at vllm {series.exported_against}: {dead}"
