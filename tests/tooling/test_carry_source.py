"""Which series a pin is built, checked out and reviewed from (issue 22, bugs 1 and 2): the
build and the review choose the same source pin (``supported.source_pin_for``), never carry
a newer series back onto an older pin unasked, and say which series they carried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from moves import per_pin_layout

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.gitrepo import Repo
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.review import review
from vllm_rbln_fork.workflow import checkout, export

PADDING = "add-rbln-padding.patch"
DEV = {
    "GIT_AUTHOR_NAME": "Dev",
    "GIT_AUTHOR_EMAIL": "d@x.invalid",
    "GIT_COMMITTER_NAME": "Dev",
    "GIT_COMMITTER_EMAIL": "d@x.invalid",
    "GIT_AUTHOR_DATE": "@1700000000 +0000",
    "GIT_COMMITTER_DATE": "@1700000000 +0000",
}


def lab(fork: Any, tmp_path: Path, second: str) -> None:
    """The fork's series (on 1.0) in the per-pin layout, and a move to ``second`` made with
    the tool (checkout, export); both pins supported."""
    per_pin_layout(fork, f'[pin."1.0"]\ntest-lock = "test.lock"\n[pin."{second}"]\nstatus = "moving"\n')
    pins = fork.project.root / "pins.toml"
    export(checkout(Pin.parse(second), fork.spec(), fork.project, tmp_path / f"move-{second}"), fork.project)
    pins.write_text(f'[pin."1.0"]\ntest-lock = "test.lock"\n[pin."{second}"]\ntest-lock = "test.lock"\n')


def test_an_unsupported_pin_is_built_and_reviewed_from_the_newest_older_series(
    fork: Any, tmp_path: Path, recorder: Any, publish_release: Any
) -> None:
    """1.0 and 1.2 supported: 1.1, between them, carries 1.0's series forward (not 1.2's
    backwards), in the build and the review alike, and the build says which."""
    lab(fork, tmp_path, "1.2")
    result = build(Pin.parse("1.1"), fork.spec(), fork.project)
    assert result.manifest.series_exported_against == "1.0"
    assert any("carrying series/1.0, the newest supported pin older" in m for m in recorder.messages("warn"))
    assert review(Pin.parse("1.1"), fork.spec(), fork.project).old_pin == Pin.parse("1.0")
    recorder.events.clear()
    tree = checkout(Pin.parse("1.1"), fork.spec(), fork.project, tmp_path / "co-1.1")
    assert any("carrying series/1.0, the newest supported pin older" in m for m in recorder.messages("warn"))
    assert "upstream/v1.1" in Repo(tree, bare=False).out("tag", "--list")


def test_a_pin_older_than_every_supported_one_says_it_is_carried_backwards(
    fork: Any, tmp_path: Path, recorder: Any
) -> None:
    """1.1 and 1.2 supported (1.0's series gone): 1.0 has no older series to carry, so it
    carries the nearest, 1.1's, and says it goes backwards; the review chooses the same."""
    lab(fork, tmp_path, "1.1")
    root = fork.project.root
    # 1.0 retired as docs/patch-workflow.md says: 1.1 made the home of the shared patches
    # merged from 1.0, then 1.0's series goes.
    export(
        checkout(Pin.parse("1.1"), fork.spec(), fork.project, tmp_path / "rehome"), fork.project, rehome=True
    )
    (root / "pins.toml").write_text('[pin."1.1"]\ntest-lock = "test.lock"\n')
    (root / "series" / "1.0").unlink()
    result = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert result.manifest.series_exported_against == "1.1"
    assert any(
        "carrying series/1.1, the oldest supported pin, backwards" in m for m in recorder.messages("warn")
    )
    assert review(Pin.parse("1.0"), fork.spec(), fork.project).old_pin == Pin.parse("1.1")


def _change_padding_at_1_1(fork: Any, tmp_path: Path) -> None:
    """A 1.1-only change: the padding patch amended at 1.1 (its own form from now on)."""
    tree = checkout(Pin.parse("1.1"), fork.spec(), fork.project, tmp_path / "fix-1.1")
    gate = tree / "vllm/core/gate.py"
    gate.write_text(gate.read_text().replace("return 16", "return 32"))
    Repo(tree, bare=False).run(
        "commit", "-q", "-a", "--amend", "--no-edit", env=DEV, cwd=tree, in_work_tree=True
    )
    assert export(tree, fork.project).kept_own == {PADDING: [Pin.parse("1.0")]}


def test_review_write_at_the_oldest_pin_reviews_its_own_series_and_never_carries_a_newer_one_back(
    fork: Any, tmp_path: Path
) -> None:
    """lab2, after a 1.1-only change: --review --write at 1.0 (no older pin) reviews 1.0's own
    series and writes nothing of 1.1's; asked to carry 1.1's onto it (--from 1.1), --write
    refuses and writes nothing."""
    lab(fork, tmp_path, "1.1")
    _change_padding_at_1_1(fork, tmp_path)
    before = {
        p: p.read_bytes() for p in fork.project.root.rglob("*") if p.is_file() and "work" not in p.parts
    }
    result = review(Pin.parse("1.0"), fork.spec(), fork.project, write=True)
    assert result.old_pin == Pin.parse("1.0") and result.ready
    assert "return 32" not in (fork.project.patches_dir / PADDING).read_text()
    assert result.written == ()

    with pytest.raises(ForkError, match=r"--from 1\.1.*newer than 1\.0.*series/1\.0"):
        review(Pin.parse("1.0"), fork.spec(), fork.project, write=True, source=Pin.parse("1.1"))
    after = {p: p.read_bytes() for p in fork.project.root.rglob("*") if p.is_file() and "work" not in p.parts}
    assert after == before
    # Without --write the review of 1.1's series carried back is only a report: allowed.
    assert review(Pin.parse("1.0"), fork.spec(), fork.project, source=Pin.parse("1.1")).old_pin == Pin.parse(
        "1.1"
    )


def test_review_write_of_a_pin_pins_toml_does_not_list_is_refused_before_the_carry(
    fork: Any, tmp_path: Path, recorder: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """--review --write exports series/<pin>, which export refuses for an unlisted pin: the
    refusal comes first (no carry, nothing written), names pins.toml and the way out."""
    from vllm_rbln_fork import cli
    from vllm_rbln_fork.project import Project

    lab(fork, tmp_path, "1.1")
    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    assert cli.main(["--pin", "1.2", "--review", "--write", "--index-url", fork.index.url]) == 2
    out = " ".join(capsys.readouterr().err.split())
    assert 'does not list vllm 1.2: a move is marked first. Add [pin."1.2"] with status = "moving"' in out, (
        out
    )
    assert not any(kind == "phase" and "carry" in text for kind, text in recorder.events)
    assert not (fork.project.root / "series" / "1.2").exists()
    assert not (fork.project.work_dir / "review-v1.2").exists()


def test_a_fix_to_a_shared_patch_names_the_pins_whose_own_form_it_missed(
    fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Risk 13: lab2; the backport is shared at 1.0 and has its own form at 1.1 (an older
    export's, written as it was before the build merged shared patches in). Amending it at 1.0
    changed the shared file only, and export said nothing and exited 0. It now names 1.1's
    form and prints the command that redoes the move, which then carries the fix there: 1.1
    builds the shared file again (it merges there), and the own form goes."""
    from vllm_rbln_fork import cli
    from vllm_rbln_fork.project import Project
    from vllm_rbln_fork.workflow import FORMAT_PATCH

    lab(fork, tmp_path, "1.1")
    backport = "count-one-more-slot-at-admission.patch"
    moved = checkout(Pin.parse("1.1"), fork.spec(), fork.project, tmp_path / "moved")
    own = fork.project.patches_dir / "1.1" / backport
    own.parent.mkdir()
    own.write_text(Repo(moved, bare=False).run(*FORMAT_PATCH, "HEAD~1", strip=False)[1])
    series = fork.project.root / "series" / "1.1"
    series.write_text(series.read_text().replace(f"\n{backport}", f"\n1.1/{backport}"))
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "fix")
    repo = Repo(tree, bare=False)
    gate = tree / "vllm/core/gate.py"
    gate.write_text(
        gate.read_text().replace("prompt_tokens + 1\n", "prompt_tokens + 1  # counts the decode step\n")
    )
    repo.run("commit", "-q", "-a", "--fixup=HEAD~1", env=DEV, cwd=tree, in_work_tree=True)
    env = DEV | {"GIT_SEQUENCE_EDITOR": "true"}
    repo.run("rebase", "-q", "-i", "--autosquash", "upstream/v1.0", env=env, cwd=tree, in_work_tree=True)

    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    assert cli.main(["export", "--dir", str(tree)]) == 1
    out = " ".join(capsys.readouterr().err.split())
    assert "not updated count-one-more-slot-at-admission.patch changed in the shared" in out, out
    assert "patches/1.1/count-one-more-slot-at-admission.patch is the form 1.1 builds" in out, out
    assert "python build.py --pin 1.1 --review --write --from 1.0" in out, out
    assert "counts the decode step" not in own.read_text()

    result = review(Pin.parse("1.1"), fork.spec(), fork.project, write=True, source=Pin.parse("1.0"))
    assert result.wrote and not own.exists() and f"\n{backport}\n" in series.read_text()
    assert "counts the decode step" in (fork.project.patches_dir / backport).read_text()


def test_review_write_leaves_its_reports_when_the_write_fails(fork: Any, tmp_path: Path) -> None:
    """Bug 17: the reports were written after --write, so a write that failed left none. A
    damaged series of a third pin (a move under way) makes the export fail after the carry."""
    from vllm_rbln_fork.errors import SeriesError

    lab(fork, tmp_path, "1.1")
    root = fork.project.root
    (root / "pins.toml").write_text((root / "pins.toml").read_text() + '[pin."1.3"]\nstatus = "moving"\n')
    (root / "series" / "1.3").write_text("# Exported-Against: vllm 1.3\nnot-a-patch\n")
    reports = tmp_path / "reports"
    with pytest.raises(SeriesError, match=r"series/1\.3|1\.3 line 2") as failed:
        review(
            Pin.parse("1.1"),
            fork.spec(),
            fork.project,
            write=True,
            source=Pin.parse("1.0"),
            report_dir=reports,
        )
    assert failed.value.__notes__ == [f"The review's reports were written first: {reports / 'review.md'}"]
    assert (reports / "review.md").read_text().startswith("## vLLM pin review: 1.0 → 1.1")
    assert (reports / "review.html").is_file()


def test_the_review_takes_an_equal_spelling_of_a_known_pin_as_the_build_does(
    fork: Any, tmp_path: Path, recorder: Any
) -> None:
    """--pin 1.1.0 is vllm 1.1 (PEP 440) for the review as for the build and the checkout:
    the same pin reviewed, from the same series, never a refusal of the spelling."""
    lab(fork, tmp_path, "1.1")
    assert build(Pin.parse("1.1.0"), fork.spec(), fork.project).manifest.pin == "1.1"
    result = review(Pin.parse("1.1.0"), fork.spec(), fork.project, source=Pin.parse("1.0.0"))
    assert (str(result.new_pin), str(result.old_pin)) == ("1.1", "1.0")
    assert any("--pin 1.1.0 is vllm 1.1" in m for m in recorder.messages("info"))


def test_the_review_report_folder_has_the_project_s_spelling(
    fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build.py --pin 1.1.0 --review`` writes work/review-v1.1, the folder of vllm 1.1,
    never a second one for another spelling of it."""
    from vllm_rbln_fork import cli
    from vllm_rbln_fork.project import Project

    lab(fork, tmp_path, "1.1")
    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    assert cli.main(["--pin", "1.1.0", "--review", "--index-url", fork.index.url]) == 0
    assert sorted(p.name for p in fork.project.work_dir.glob("review-v*")) == ["review-v1.1"]
