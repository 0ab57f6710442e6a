"""``build.py --pin X --review`` on the synthetic upstream's 2.x family (see conftest.py).

The series, exported against 2.0, has four patches:

1. count-one-more-slot-at-admission (backport): gate.py, ``needed = prompt_tokens + 1``
2. add-rbln-padding (rbln): gate.py, ``return 16``
3. reserve-a-lookahead-block-in-the-pool (backport): blocks.py, two changes, calls ``blocks_for``
4. add-the-rbln-pool (rbln): a new file; calls ``free_blocks(..., used=...)``, overrides ``Pool.take``
"""

from __future__ import annotations

import difflib

import pytest
from checks import assert_well_formed_html

from vllm_rbln_fork import cli
from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.review import Review, contained_backports, review
from vllm_rbln_fork.review.render import html_page, markdown, summary_lines, write_reports
from vllm_rbln_fork.workflow import checkout, export

BACKPORT = "count-one-more-slot-at-admission.patch"
PADDING = "add-rbln-padding.patch"
LOOKAHEAD = "reserve-a-lookahead-block-in-the-pool.patch"
POOL = "add-the-rbln-pool.patch"


def _review(fork, pin: str, **kw) -> Review:
    return review(Pin.parse(pin), fork.spec(), fork.project, **kw)


def _status(result: Review) -> dict[str, str]:
    return {p.name: p.status for p in result.patches}


def _one(result: Review, name: str):
    return next(p for p in result.patches if p.name == name)


def _snapshot(project: Project) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in [project.series_file, *project.patches_dir.glob("*.patch")]}


def test_the_series_is_authored_as_expected(review_fork) -> None:
    names = [
        line for line in review_fork.project.series_file.read_text().splitlines() if not line.startswith("#")
    ]
    assert names == [BACKPORT, PADDING, LOOKAHEAD, POOL]


def test_same_pin_is_all_clean_and_ready(review_fork) -> None:
    result = _review(review_fork, "2.0")
    assert set(_status(result).values()) == {"clean"}
    assert result.verdict == "ready" and result.exit_code == 0
    assert [p.mark for p in result.patches] == ["="] * 4


def test_context_drift_and_clean(review_fork) -> None:
    result = _review(review_fork, "2.1")
    assert _status(result) == {
        BACKPORT: "context drift",
        PADDING: "context drift",
        LOOKAHEAD: "clean",
        POOL: "clean",
    }
    drift = _one(result, BACKPORT)
    assert drift.mark == "!" and "own lines identical" in drift.mark_note and not drift.own_interdiff
    # The context moved: upstream's new docstring is in the interdiff, not in the own lines.
    assert "whole prompt fits in the free slots" in drift.interdiff
    assert result.exit_code == 0
    assert result.next_commands[0].startswith("python build.py --pin 2.1 --review --write")


def test_upstreamed_backport_suggests_the_trailer(review_fork) -> None:
    result = _review(review_fork, "2.2")
    backport = _one(result, BACKPORT)
    assert backport.status == "upstreamed" and backport.mark == "<"
    assert "already in vllm 2.2" in backport.reason
    assert any("Applied-Upstream: 2.2" in n for n in backport.notes)
    assert result.exit_code == 0  # the build drops it by itself; --write removes it from the series


def test_dropped_by_trailer(review_fork) -> None:
    patch = review_fork.project.patches_dir / BACKPORT
    text = patch.read_text()
    patch.write_text(
        text.replace(
            "Origin: backport, example/vllm#1", "Origin: backport, example/vllm#1\nApplied-Upstream: 2.1"
        )
    )
    result = _review(review_fork, "2.1")
    backport = _one(result, BACKPORT)
    assert backport.status == "dropped" and backport.reason.startswith("Applied-Upstream: 2.1")
    assert backport.mark == "<"
    assert result.counts["dropped"] == 1 and result.exit_code == 0


def test_conflict_gives_ours_theirs_base_and_the_rest_is_still_reviewed(review_fork) -> None:
    result = _review(review_fork, "2.3")
    assert _status(result)[BACKPORT] == "conflict"
    [hunk] = _one(result, BACKPORT).conflicts
    assert hunk.path == "vllm/core/gate.py" and hunk.line > 0
    assert hunk.ours.strip() == "needed = 2 * prompt_tokens"
    assert hunk.base.strip() == "needed = prompt_tokens"
    assert hunk.theirs.strip() == "needed = prompt_tokens + 1"
    assert _status(result)[PADDING] == "context drift"
    assert any("carried without " + BACKPORT in n for n in _one(result, PADDING).notes)
    assert result.verdict == "needs work" and result.exit_code == 1
    assert "--review --write" in result.next_commands[0]
    assert not (review_fork.project.work_dir / "conflict-v2.3").exists()  # only --write leaves a tree


def test_merged_when_upstream_made_half_of_a_patch(review_fork) -> None:
    result = _review(review_fork, "2.7")
    merged = _one(result, LOOKAHEAD)
    assert merged.status == "merged" and merged.mark == "!"
    assert "own +/- lines changed" in merged.mark_note
    assert "-+        self.lookahead = 1" in merged.own_interdiff  # no longer the patch's own line
    assert "+        need = blocks_for(num_tokens, self.block_size) + self.lookahead" in merged.new_diff
    assert result.exit_code == 0


def test_body_changed_under_a_clean_patch(review_fork) -> None:
    result = _review(review_fork, "2.4")
    lookahead = _one(result, LOOKAHEAD)
    assert lookahead.status == "clean"  # git is happy ...
    [change] = [s for s in lookahead.symbols if s.qualname == "blocks_for"]
    assert change.relation == "called by the patch" and change.change == "body changed"  # ... but look
    assert "-(-num_tokens // block_size)" in change.diff("2.0", "2.4")
    assert not change.flagged and result.exit_code == 0
    assert "`blocks_for` (vllm/core/blocks.py), called by the patch: **body changed**" in markdown(result)


def test_changed_signatures_of_called_and_overridden_functions_are_flagged(review_fork) -> None:
    result = _review(review_fork, "2.5")
    pool = _one(result, POOL)
    assert pool.status == "clean"
    by_name = {s.qualname: s for s in pool.symbols}
    called, overridden = by_name["free_blocks"], by_name["Pool.take"]
    assert called.relation == "called by the patch" and called.change == "signature changed"
    assert called.flagged and not called.breaking and "compatible" in called.note
    assert overridden.relation == "overridden by the patch" and overridden.flagged
    assert "added `pinned`" in overridden.note
    assert "(total: int, used: int, reserved: int=0) -> int" in called.new_signature
    assert overridden.breaking and "the override must follow" in overridden.note
    assert result.verdict == "needs work" and result.exit_code == 1
    assert result.next_commands[0].startswith("# check the flagged")


def test_a_renamed_keyword_the_patch_passes_is_breaking(review_fork) -> None:
    result = _review(review_fork, "2.6")
    [change] = [s for s in _one(result, POOL).symbols if s.qualname == "free_blocks"]
    assert change.breaking and "`used=`: no longer a parameter" in change.note
    assert result.exit_code == 1


def test_a_parameter_made_keyword_only_breaks_a_positional_call(review_fork) -> None:
    # Regression (issue 15, bug 2): the names stay, the kind changes; the lookahead backport
    # calls blocks_for(num_tokens, self.block_size), which no longer binds on 2.8.
    result = _review(review_fork, "2.8")
    [change] = [s for s in _one(result, LOOKAHEAD).symbols if s.qualname == "blocks_for"]
    assert change.change == "signature changed" and change.breaking
    assert "keyword-only" in change.note and "breaking" in change.note
    assert result.verdict == "needs work"


def test_a_parameter_made_positional_only_breaks_a_keyword_call(review_fork) -> None:
    # The RBLN pool calls free_blocks(self.total, used=self.used): `used` is positional-only on 2.9.
    result = _review(review_fork, "2.9")
    [change] = [s for s in _one(result, POOL).symbols if s.qualname == "free_blocks"]
    assert change.breaking and "positional-only" in change.note


def test_range_diff_marks(review_fork) -> None:
    marks = {
        pin: {p.name: p.mark for p in _review(review_fork, pin).patches} for pin in ("2.1", "2.2", "2.7")
    }
    assert marks["2.1"] == {BACKPORT: "!", PADDING: "!", LOOKAHEAD: "=", POOL: "="}
    assert marks["2.2"][BACKPORT] == "<"
    assert marks["2.7"][LOOKAHEAD] == "!"


def test_reports_markdown_and_self_contained_html(review_fork, tmp_path) -> None:
    result = _review(review_fork, "2.3")
    md, page = write_reports(result, tmp_path / "reports")
    text = md.read_text()
    assert text.startswith("## vLLM pin review: 2.0 → 2.3: **needs work**")
    assert "| ❌ conflict | 1 |" in text and "ours (upstream 2.3)" in text
    assert "### Old series against new (range-diff)" in text
    body = page.read_text()
    for _ in range(50):  # other tables in the process move difflib's process-wide counter ...
        difflib.HtmlDiff().make_table(["a"], ["b"])
    moved = difflib.HtmlDiff._default_prefix  # type: ignore[attr-defined]
    assert body == html_page(result)  # ... and the page is still the same bytes,
    assert difflib.HtmlDiff._default_prefix >= moved  # type: ignore[attr-defined]  # without resetting it
    assert 'id="difflib_chg_to0__top"' in body  # numbered from 0 on every page
    assert "<script" not in body and "http://" not in body and "https://" not in body  # self-contained

    assert_well_formed_html(body)
    assert 'class="three"' in body  # ours / base / theirs side by side


def test_cli_exit_codes_and_report_paths(review_fork, monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(Project, "default", classmethod(lambda cls: review_fork.project))
    url = review_fork.index.url
    assert (
        cli.main(["--pin", "2.1", "--review", "--index-url", url, "--report-dir", str(tmp_path / "r")]) == 0
    )
    assert capsys.readouterr().out.strip() == str(tmp_path / "r" / "review.md")
    assert cli.main(["--pin", "2.3", "--review", "--index-url", url]) == 1
    assert (review_fork.project.work_dir / "review-v2.3" / "review.html").is_file()
    assert cli.main(["--pin", "9.9", "--review", "--index-url", url]) == 2
    assert "no sdist" in capsys.readouterr().err


def test_write_refreshes_the_series_for_the_new_pin_deterministically(review_fork, tmp_path) -> None:
    result = _review(review_fork, "2.2", write=True)
    assert result.wrote and f"patches/{BACKPORT} (removed)" in result.written
    assert "series" in result.written
    series = review_fork.project.series_file.read_text()
    assert "# Exported-Against: vllm 2.2" in series and BACKPORT not in series
    after = _snapshot(review_fork.project)
    # The refreshed series is clean on its pin, and --write again changes no byte.
    again = _review(review_fork, "2.2", write=True)
    assert set(_status(again).values()) == {"clean"} and again.written == ()
    assert _snapshot(review_fork.project) == after
    # ... and it is what checkout + export at 2.2 gives.
    tree = checkout(Pin.parse("2.2"), review_fork.spec(), review_fork.project, tmp_path / "co")
    assert export(tree, review_fork.project).changed == []
    assert result.next_commands[0] == "git diff series patches/"


def test_write_on_conflict_leaves_a_work_tree_and_keeps_the_series(review_fork) -> None:
    before = _snapshot(review_fork.project)
    result = _review(review_fork, "2.3", write=True)
    tree = review_fork.project.work_dir / "conflict-v2.3"
    assert result.conflict_tree == tree and not result.wrote
    assert "<<<<<<<" in (tree / "vllm/core/gate.py").read_text()
    assert "python build.py continue --dir" in result.instructions
    assert result.next_commands[1:3] == (
        f"python build.py continue --dir {tree}",
        f"python build.py export --dir {tree}",
    )
    assert _snapshot(review_fork.project) == before
    assert result.exit_code == 1


def test_tripwire_detects_a_backport_the_pin_contains(review_fork) -> None:
    # The real series has the same test at its own pin (tests/e2e/test_review_real.py); the
    # build's automatic drop is test_build.py::test_backport_already_upstream_is_dropped_and_said.
    assert contained_backports(Pin.parse("2.0"), review_fork.spec(), review_fork.project) == []
    [(name, reason)] = contained_backports(Pin.parse("2.2"), review_fork.spec(), review_fork.project)
    assert name == BACKPORT and "Applied-Upstream: 2.2" in reason


def _relabel_as_rbln(fork, name: str) -> None:
    patch = fork.project.patches_dir / name
    text = patch.read_text()
    origin = next(line for line in text.splitlines() if line.startswith("Origin: "))
    patch.write_text(text.replace(origin, "Origin: rbln", 1))


def test_write_never_drops_an_rbln_patch_upstream_seems_to_have(review_fork) -> None:
    # Regression (issue 15, bug 1): 2.2 contains the change of the first patch; labelled
    # `Origin: rbln` it must never be dropped, so the review refuses like the build does and
    # --write leaves patches/ and series as they were.
    _relabel_as_rbln(review_fork, BACKPORT)
    before = _snapshot(review_fork.project)
    with pytest.raises(ForkError, match=rf"patches/{BACKPORT} \(Origin: rbln\) changes nothing"):
        _review(review_fork, "2.2", write=True)
    assert _snapshot(review_fork.project) == before
    with pytest.raises(ForkError, match="never dropped silently"):
        contained_backports(Pin.parse("2.2"), review_fork.spec(), review_fork.project)


def test_the_html_range_diff_is_escaped(review_fork) -> None:
    """The range-diff table went into the page as it was: its '<' marks (a patch upstream
    has) were raw HTML."""
    body = html_page(_review(review_fork, "2.2"))
    table = body.split("<h2>Old series against new (range-diff)</h2>", 1)[1].split("</pre>", 1)[0]
    [line] = [line for line in table.splitlines() if BACKPORT in line]
    assert " &lt; " in line and " < " not in line, line


def _commit(tree, subject: str) -> None:
    import subprocess

    message = f"{subject}\n\nWhy it exists, for the test.\n\nOrigin: rbln\nForwarded: no\n"
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message]
    for args in (["add", "--force", "--all"], commit):
        done = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_knock_on_conflict_names_the_patch_it_follows_from(review_fork, tmp_path) -> None:
    """At 2.3 upstream changed the gate's line. A patch that edits it and writes a fork file of
    its own conflicts with upstream; a later patch that edits only that fork file (and writes
    a text file) conflicts too, the file not being there without the first; a third that edits
    only the text file conflicts in turn. Both later ones follow from the first, the root of
    the chain, whatever the file's kind: one resolution, not three."""
    tree = checkout(Pin.parse("2.0"), review_fork.spec(), review_fork.project, tmp_path / "co")
    gate = tree / "vllm/core/gate.py"
    gate.write_text(gate.read_text().replace("needed = prompt_tokens + 1", "needed = prompt_tokens + 2"))
    (tree / "vllm/core/margin.py").write_text("MARGIN = 2\n")
    _commit(tree, "Widen the gate and name its margin")
    (tree / "vllm/core/margin.py").write_text("MARGIN = 2  # tokens past the prompt\n")
    (tree / "vllm/core/margin.txt").write_text("two tokens\n")
    _commit(tree, "Widen the margin once more")
    (tree / "vllm/core/margin.txt").write_text("two tokens past the prompt\n")
    _commit(tree, "Say what the margin is")
    export(tree, review_fork.project)

    result = _review(review_fork, "2.3")
    root = "widen-the-gate-and-name-its-margin.patch"
    widen, margin, note = (
        _one(result, root),
        _one(result, "widen-the-margin-once-more.patch"),
        _one(result, "say-what-the-margin-is.patch"),
    )
    assert widen.status == margin.status == note.status == "conflict"
    assert widen.knock_on_from == () and _one(result, BACKPORT).knock_on_from == ()
    assert margin.knock_on_from == (root,)
    assert note.knock_on_from == (root,)  # the root, not the knock-on between; a .txt file too
    assert result.conflict_kinds == "2 with upstream, 2 knock-on"
    assert f"knock-on: follows from {root} not being carried" in "\n".join(summary_lines(result))
    assert "**Knock-on conflict**" in markdown(result) and "Knock-on conflict" in html_page(result)
