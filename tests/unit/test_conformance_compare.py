"""The conformance comparison on hand-made outcome tables, and the files it reads."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from vllm_rbln_fork.testing.expectations import load_cannot_run, load_expected
from vllm_rbln_fork.testing.outcomes import (
    ConformanceError,
    ExpectedDifference,
    compare,
    parse_junit,
    render_report,
)

BLOCK_ALIGNED = "tests/v1/core/test_scheduler.py::test_admission[32]"
OTHER = "tests/v1/core/test_prefix_caching.py::test_hit"

BASE = {BLOCK_ALIGNED: "passed", OTHER: "passed"}


def listed(
    test: str = BLOCK_ALIGNED, unpatched: str = "passed", patched: str = "failed"
) -> ExpectedDifference:
    return ExpectedDifference(
        test=test,
        unpatched=unpatched,
        patched=patched,
        patch="cover-the-first-spec-decode-step-in-the-full-sequence-admission.patch",
        why="the backport makes admission need one more block for a block-aligned prompt",
    )


def test_no_difference_and_nothing_listed_passes() -> None:
    result = compare(BASE, dict(BASE), [])
    assert result.ok
    assert result.differences == ()


def test_unlisted_difference_fails() -> None:
    result = compare(BASE, {**BASE, BLOCK_ALIGNED: "failed"}, [])
    assert not result.ok
    assert [(p.kind, p.test) for p in result.problems] == [("unlisted", BLOCK_ALIGNED)]
    assert result.differences[0].expected is None


def test_listed_difference_passes() -> None:
    result = compare(BASE, {**BASE, BLOCK_ALIGNED: "failed"}, [listed()])
    assert result.ok
    (difference,) = result.differences
    assert (difference.test, difference.unpatched, difference.patched) == (BLOCK_ALIGNED, "passed", "failed")
    assert difference.listed


def test_stale_listed_difference_fails() -> None:
    result = compare(BASE, dict(BASE), [listed()])
    assert not result.ok
    assert [(p.kind, p.test) for p in result.problems] == [("stale", BLOCK_ALIGNED)]


def test_listed_difference_with_other_outcomes_fails() -> None:
    result = compare(BASE, {**BASE, BLOCK_ALIGNED: "error"}, [listed()])
    assert [p.kind for p in result.problems] == ["mismatch"]


def test_only_the_unlisted_one_fails_among_several() -> None:
    patched = {BLOCK_ALIGNED: "failed", OTHER: "skipped"}
    result = compare(BASE, patched, [listed()])
    assert [(p.kind, p.test) for p in result.problems] == [("unlisted", OTHER)]
    assert len(result.differences) == 2


def test_a_test_on_one_side_only_is_a_difference() -> None:
    added = "tests/v1/core/test_new.py::test_x"
    result = compare(BASE, {**BASE, added: "passed"}, [])
    assert [(d.test, d.unpatched, d.patched) for d in result.differences] == [(added, "absent", "passed")]
    assert not result.ok
    assert compare(BASE, {**BASE, added: "passed"}, [listed(added, "absent", "passed")]).ok


def test_a_listed_test_that_no_longer_exists_is_stale() -> None:
    gone = "tests/v1/core/test_scheduler.py::test_removed_upstream"
    result = compare(BASE, BASE, [listed(gone)])
    assert [(p.kind, p.test) for p in result.problems] == [("stale", gone)]


def test_listing_a_test_twice_is_an_error() -> None:
    with pytest.raises(ConformanceError, match="twice"):
        compare(BASE, BASE, [listed(), listed()])


def test_load_expected_reads_entries_checks_patches_and_pins(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "a.patch").write_text("")
    toml = tmp_path / "expected-differences.toml"
    toml.write_text(
        f"""
[[difference]]
test = "{BLOCK_ALIGNED}"
unpatched = "passed"
patched = "failed"
patch = "a.patch"
why = "one more block"

[[difference]]
test = "{OTHER}"
unpatched = "passed"
patched = "failed"
patch = "a.patch"
why = "only at another pin"
pins = ["0.32.0"]
"""
    )
    entries = load_expected(toml, "0.31.0", patches)
    assert [e.test for e in entries] == [BLOCK_ALIGNED]
    assert [e.test for e in load_expected(toml, "0.32.0", patches)] == [BLOCK_ALIGNED, OTHER]
    with pytest.raises(ConformanceError, match="not in"):
        load_expected(toml, "0.31.0", tmp_path / "no-patches")


def test_load_expected_rejects_an_unknown_outcome(tmp_path: Path) -> None:
    toml = tmp_path / "e.toml"
    toml.write_text(f'[[difference]]\ntest = "{OTHER}"\nunpatched = "ok"\npatched = "failed"\n')
    with pytest.raises(ConformanceError, match="use one of"):
        load_expected(toml, "0.31.0")


def test_load_expected_needs_a_reason(tmp_path: Path) -> None:
    toml = tmp_path / "e.toml"
    toml.write_text(
        f'[[difference]]\ntest = "{OTHER}"\nunpatched = "passed"\npatched = "failed"\npatch = "a.patch"\n'
    )
    with pytest.raises(ConformanceError, match="'why'"):
        load_expected(toml, "0.31.0")


def test_the_repository_lists_are_well_formed() -> None:
    """Every supported pin has its own lists, and they load (each patch named exists)."""
    root = Path(__file__).resolve().parents[2]
    pins = tomllib.loads((root / "pins.toml").read_text())["pin"]
    for pin in pins:
        lists = root / "tests" / "upstream" / pin
        entries = load_expected(lists / "expected-differences.toml", pin, root / "patches")
        assert all(e.why and e.patch for e in entries)
        assert all(c.reason for c in load_cannot_run(lists / "cannot-run.toml"))


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="6">
<testcase classname="tests.v1.core.test_scheduler" name="test_a[32-4]"
    file="tests/v1/core/test_scheduler.py" line="10" time="0.1"/>
<testcase classname="tests.v1.core.test_scheduler.TestGroup" name="test_b"
    file="tests/v1/core/test_scheduler.py" line="20" time="0.1"><failure message="x">x</failure></testcase>
<testcase classname="tests.v1.core.test_scheduler.TestGroup" name="test_b"
    file="tests/v1/core/test_scheduler.py" line="20" time="0.1"><error message="teardown">y</error></testcase>
<testcase classname="tests.v1.core.test_kv" name="test_c" file="tests/v1/core/test_kv.py" line="1">
    <skipped type="pytest.skip" message="s">s</skipped></testcase>
<testcase classname="tests.v1.core.test_kv" name="test_d" file="tests/v1/core/test_kv.py" line="2">
    <skipped type="pytest.xfail" message="x">x</skipped></testcase>
<testcase classname="" name="tests.v1.core.test_broken" file="tests/v1/core/test_broken.py" time="0">
    <error message="collection failure">e</error></testcase>
</testsuite></testsuites>
"""


def test_parse_junit_gives_node_ids_and_outcomes() -> None:
    assert parse_junit(JUNIT) == {
        "tests/v1/core/test_scheduler.py::test_a[32-4]": "passed",
        "tests/v1/core/test_scheduler.py::TestGroup::test_b": "error",
        "tests/v1/core/test_kv.py::test_c": "skipped",
        "tests/v1/core/test_kv.py::test_d": "xfailed",
        "tests/v1/core/test_broken.py": "error",
    }


def test_render_names_each_problem() -> None:
    from vllm_rbln_fork.testing.outcomes import ConformanceReport, SideRun

    unpatched = SideRun("unpatched", BASE, ("pytest",), 1.0, cached=True)
    patched_outcomes = {**BASE, OTHER: "failed"}
    patched = SideRun("patched", patched_outcomes, ("pytest",), 2.0, cached=False)
    report = ConformanceReport("0.31.0", unpatched, patched, compare(BASE, patched_outcomes, []), ())
    text = render_report(report)
    assert not report.ok
    assert "unlisted: " + OTHER in text
    assert "FAILED" in text
