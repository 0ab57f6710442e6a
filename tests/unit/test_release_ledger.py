"""fork-releases.toml: a number is looked up without writing, and recorded only once."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.releases import record_release, release_number


def test_a_number_is_not_written_until_it_is_recorded(tmp_path: Path) -> None:
    ledger = tmp_path / "fork-releases.toml"
    pin = Pin.parse("1.0")
    assert release_number(ledger, pin, "a" * 40) == (1, True)
    assert not ledger.exists()
    record_release(ledger, pin, 1, "a" * 40)
    record_release(ledger, pin, 1, "a" * 40)  # the same entry again: nothing changes
    assert release_number(ledger, pin, "a" * 40) == (1, False)
    assert release_number(ledger, pin, "b" * 40) == (2, True)
    assert len(tomllib.loads(ledger.read_text())["release"]) == 1


@pytest.mark.parametrize(("n", "tree"), [(1, "b" * 40), (2, "a" * 40)])
def test_a_number_or_tree_taken_meanwhile_is_refused(tmp_path: Path, n: int, tree: str) -> None:
    ledger = tmp_path / "fork-releases.toml"
    pin = Pin.parse("1.0")
    record_release(ledger, pin, 1, "a" * 40)
    before = ledger.read_text()
    with pytest.raises(ForkError, match="changed while this build ran"):
        record_release(ledger, pin, n, tree)
    assert ledger.read_text() == before


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    who = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    env = {**os.environ, **who, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False)


def _merge_keeping_both_sides(tmp_path: Path, theirs: tuple[int, str], ours: tuple[int, str]) -> Path:
    """A project whose ledger has +rbln.1; branch `a` and main each record one more release,
    then main merges `a` and the conflict is resolved by keeping both sides' lines."""
    repo = tmp_path / "project"
    repo.mkdir()
    ledger = repo / "fork-releases.toml"
    pin = Pin.parse("1.0")
    record_release(ledger, pin, 1, "1" * 40)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "ledger"]):
        _git(repo, *args)
    _git(repo, "checkout", "-qb", "a")
    record_release(ledger, pin, *theirs)
    _git(repo, "commit", "-qam", "a built")
    _git(repo, "checkout", "-q", "main")
    record_release(ledger, pin, *ours)
    _git(repo, "commit", "-qam", "main built")
    merged = _git(repo, "merge", "-q", "a")
    assert merged.returncode != 0 and "CONFLICT" in merged.stdout, merged.stdout + merged.stderr
    text = ledger.read_text()
    assert "<<<<<<<" in text
    ledger.write_text(
        "".join(line for line in text.splitlines(True) if line[:7] not in ("<<<<<<<", "=======", ">>>>>>>"))
    )
    return repo


def test_a_merge_that_keeps_both_lines_of_one_label_is_refused_naming_both(tmp_path: Path) -> None:
    """Issue 30: both branches built a new tree and took +rbln.2; keeping both lines gave the
    label to two trees, and the build read the first silently."""
    repo = _merge_keeping_both_sides(tmp_path, theirs=(2, "a" * 40), ours=(2, "b" * 40))
    ledger = repo / "fork-releases.toml"
    lines = ledger.read_text().splitlines()
    ours_at = next(i for i, line in enumerate(lines, 1) if "b" * 40 in line)
    theirs_at = next(i for i, line in enumerate(lines, 1) if "a" * 40 in line)
    for call in (
        lambda: release_number(ledger, Pin.parse("1.0"), "c" * 40),
        lambda: record_release(ledger, Pin.parse("1.0"), 3, "c" * 40),
    ):
        with pytest.raises(ForkError) as refused:
            call()
        message = str(refused.value)
        assert f"b{'b' * 39} (line {ours_at})" in message and f"a{'a' * 39} (line {theirs_at})" in message
        assert "vllm 1.0+rbln.2" in message and "a" * 40 in message and "b" * 40 in message
        assert "Keep the line main had" in message
    assert "c" * 40 not in ledger.read_text()  # nothing recorded


def test_a_merge_that_keeps_one_tree_under_two_numbers_is_refused(tmp_path: Path) -> None:
    repo = _merge_keeping_both_sides(tmp_path, theirs=(3, "a" * 40), ours=(2, "a" * 40))
    with pytest.raises(
        ForkError, match=r"both give tree a{40} of vllm 1.0 a number, \+rbln.2 \(line \d+\) and \+rbln.3"
    ):
        release_number(repo / "fork-releases.toml", Pin.parse("1.0"), "a" * 40)


def test_the_series_lint_finds_a_label_given_to_two_trees(tmp_path: Path) -> None:
    """The pre-commit hook (`build.py lint --only series`) catches the merge at its commit."""
    from vllm_rbln_fork.project import Project
    from vllm_rbln_fork.testing.series_lint import problems

    repo = _merge_keeping_both_sides(tmp_path, theirs=(2, "a" * 40), ours=(2, "b" * 40))
    (repo / "series").write_text("# Exported-Against: vllm 1.0\n")
    (repo / "patches").mkdir()
    (found,) = problems(Project(repo))
    assert (
        found.startswith("fork-releases.toml: both give vllm 1.0+rbln.2")
        and "one label names one tree" in found
    )


def test_a_merge_resolved_with_the_other_side_s_ledger_is_refused_by_the_lint(tmp_path: Path) -> None:
    """L2: main released +rbln.2 (tree b), branch `a` took +rbln.2 for tree a; the merge resolved
    with `git checkout --theirs` reads well (one label, one tree) but has lost main's line, and
    tree a would then be built as the published +rbln.2. The lint names the line and the way out."""
    from vllm_rbln_fork.project import Project
    from vllm_rbln_fork.testing.series_lint import problems

    repo = _merge_keeping_both_sides(tmp_path, theirs=(2, "a" * 40), ours=(2, "b" * 40))
    (repo / "series").write_text("# Exported-Against: vllm 1.0\n")
    (repo / "patches").mkdir()
    assert _git(repo, "checkout", "--theirs", "fork-releases.toml").returncode == 0
    assert "b" * 40 not in (repo / "fork-releases.toml").read_text()
    (found,) = problems(Project(repo))
    assert found.startswith(f"fork-releases.toml: main gave vllm 1.0+rbln.2 to tree {'b' * 40} (main, ")
    assert f"this ledger gives it to tree {'a' * 40}: a label never moves" in found
    assert f'n = 2, tree = "{"b" * 40}"' in found and "delete the other side's line" in found

    # Committed so (CI lints the merge on main): main's first parent still holds the line.
    _git(repo, "add", "-A")
    assert _git(repo, "commit", "-qm", "merge a").returncode == 0
    (found,) = problems(Project(repo))
    assert f"main gave vllm 1.0+rbln.2 to tree {'b' * 40} (main before the merge" in found

    # Mended as the message says, in a commit after the merge: nothing to say.
    _git(repo, "checkout", "-q", "HEAD^1", "--", "fork-releases.toml")
    assert problems(Project(repo)) == []
    assert _git(repo, "commit", "-qam", "mend the ledger").returncode == 0
    assert problems(Project(repo)) == []

    # A label main dropped altogether is named too.
    record_release(repo / "fork-releases.toml", Pin.parse("1.0"), 3, "c" * 40)
    _git(repo, "commit", "-qam", "main built")
    text = (repo / "fork-releases.toml").read_text()
    (repo / "fork-releases.toml").write_text("".join(x for x in text.splitlines(True) if "c" * 40 not in x))
    (found,) = problems(Project(repo))
    assert f"main gave vllm 1.0+rbln.3 to tree {'c' * 40}" in found and "this ledger lacks it" in found
    _git(repo, "checkout", "-q", "--", "fork-releases.toml")

    # A branch left main before +rbln.3: main's later lines are not asked of it until it merges
    # main; merging main in with the branch's own file (--ours) drops +rbln.3 and is named.
    _git(repo, "checkout", "-qb", "late", "HEAD^1")
    record_release(repo / "fork-releases.toml", Pin.parse("1.0"), 3, "d" * 40)
    _git(repo, "commit", "-qam", "late built")
    assert problems(Project(repo)) == []
    assert _git(repo, "merge", "-q", "main").returncode != 0
    assert _git(repo, "checkout", "--ours", "fork-releases.toml").returncode == 0
    (found,) = problems(Project(repo))
    assert f"main gave vllm 1.0+rbln.3 to tree {'c' * 40} (main, being merged" in found


def test_the_lint_outside_a_checkout_checks_the_ledger_alone(tmp_path: Path) -> None:
    from vllm_rbln_fork.project import Project
    from vllm_rbln_fork.testing.series_lint import problems

    record_release(tmp_path / "fork-releases.toml", Pin.parse("1.0"), 1, "a" * 40)
    (tmp_path / "series").write_text("# Exported-Against: vllm 1.0\n")
    (tmp_path / "patches").mkdir()
    assert problems(Project(tmp_path)) == []
