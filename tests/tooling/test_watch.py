"""``build.py watch`` on the synthetic upstream: a release appears on a real local index and the
watcher starts the move on a branch; a conflicting release stops with the report and the
conflict tree; a conflict recorded in rerere/ is carried by itself (docs/patch-workflow.md).

1.1 drifts under the series (a clean 3-way carry); 1.3 rewrote the backport's line (a conflict).
"""

from __future__ import annotations

import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from moves import RESOLVED, per_pin_layout, resolve_by_hand

from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.supported import listed_pins, supported_pins
from vllm_rbln_fork.watch import Outcome, summary, watch
from vllm_rbln_fork.workflow import continue_carry, export

IDENTITY = {
    "GIT_AUTHOR_NAME": "Watcher",
    "GIT_AUTHOR_EMAIL": "watcher@example.invalid",
    "GIT_COMMITTER_NAME": "Watcher",
    "GIT_COMMITTER_EMAIL": "watcher@example.invalid",
}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo_fork(fork: Any, monkeypatch: pytest.MonkeyPatch, publish_release: Callable[[str], None]) -> Any:
    """The fork as a per-pin project (pins.toml supports 1.0) committed in a git repository, and
    an index that has only 1.0."""
    for name, value in IDENTITY.items():
        monkeypatch.setenv(name, value)
    per_pin_layout(fork, '# the supported pins\n[pin."1.0"]\ntest-lock = "test.lock"\n')
    root = fork.project.root
    (root / ".gitignore").write_text("/work/\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "the fork at 1.0")
    fork.publish = publish_release
    _only_on_index(fork, "1.0")
    return fork


def _only_on_index(fork: Any, *versions: str) -> None:
    """Exactly these releases on the index (its page is written from the folder)."""
    folder = fork.index.root / "simple" / "vllm"
    for sdist in folder.glob("*.tar.gz"):
        if sdist.name.removeprefix("vllm-").removesuffix(".tar.gz") not in versions:
            sdist.unlink()
    for version in versions:
        if not (folder / f"vllm-{version}.tar.gz").exists():
            fork.publish(version)
    fork.index.publish(folder / f"vllm-{versions[0]}.tar.gz")


def _supported_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in [root / "series" / "1.0", *(root / "patches").glob("*.patch")]
    }


def test_a_new_release_becomes_a_moving_pin_on_a_branch(repo_fork: Any) -> None:
    fork, root = repo_fork, repo_fork.project.root
    nothing = watch(fork.project, fork.spec(), run_tier=False)
    assert nothing.outcome is Outcome.NOTHING_NEW and nothing.release is None
    assert "nothing new" in summary(nothing)
    assert _git(root, "branch", "--show-current").strip() == "main"
    before = _supported_files(root)

    _only_on_index(fork, "1.0", "1.1")  # vLLM releases 1.1
    moved = watch(fork.project, fork.spec(), run_tier=False)

    assert moved.outcome is Outcome.READY and moved.release == Pin.parse("1.1")
    assert _git(root, "branch", "--show-current").strip() == "watch/vllm-1.1"
    assert _git(root, "status", "--porcelain", "--untracked-files=no") == ""  # all committed
    assert moved.commit == _git(root, "rev-parse", "HEAD").strip()
    listed = {str(s.pin): s.status for s in listed_pins(fork.project)}
    assert listed == {"1.0": "supported", "1.1": "moving"}
    assert [str(s.pin) for s in supported_pins(fork.project)] == ["1.0"]
    assert _supported_files(root) == before  # the supported pin is untouched
    assert "# the supported pins" in (root / "pins.toml").read_text()  # its comments kept
    assert (root / "series" / "1.1").is_file() and "series/1.1" in moved.written
    assert moved.patches == 2 and moved.statuses == {"context drift": 2} and moved.reused == ()
    record = (root / "docs" / "rebases" / "v1.1.md").read_text()
    assert "Move to vLLM 1.1 (from 1.0): draft" in record and "context drift" in record
    assert moved.report is not None and moved.report.is_file()
    text = summary(moved)
    assert "**vLLM 1.1** is out" in text and "watch/vllm-1.1" in text and "Left by hand" in text
    assert "scheduler tier at 1.1: not run (--no-tier)" in text
    changed = _git(root, "diff", "--name-only", "main", "HEAD").split()
    assert "series/1.0" not in changed and "pins.toml" in changed and "series/1.1" in changed

    # The new pin builds from its own series, exported against it.
    built = build(Pin.parse("1.1"), fork.spec(), fork.project)
    assert built.manifest.series_exported_against == "1.1"

    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "the release number of the build")
    # Watching again: the move is under way, nothing new beyond it; from main too (its branch).
    again = watch(fork.project, fork.spec(), run_tier=False)
    assert again.outcome is Outcome.NOTHING_NEW and "under way" in again.note
    _git(root, "switch", "-q", "main")
    from_main = watch(fork.project, fork.spec(), run_tier=False)
    assert from_main.outcome is Outcome.NOTHING_NEW and "on branch watch/vllm-1.1" in from_main.note
    assert not (root / "series" / "1.1").exists()


def test_a_conflicting_release_stops_with_the_report_and_the_conflict_tree(repo_fork: Any) -> None:
    fork, root = repo_fork, repo_fork.project.root
    before = _supported_files(root)
    _only_on_index(fork, "1.0", "1.3")
    stopped = watch(fork.project, fork.spec(), run_tier=False)

    assert stopped.outcome is Outcome.BY_HAND and stopped.release == Pin.parse("1.3")
    assert stopped.stopped_at == "Count one more slot at admission"
    assert stopped.unresolved == ("vllm/core/gate.py",)
    tree = stopped.conflict_tree
    assert tree is not None and "<<<<<<<" in (tree / "vllm/core/gate.py").read_text()
    assert stopped.report is not None and "conflict" in stopped.report.read_text()
    assert not (root / "series" / "1.3").exists()  # nothing carried is written
    assert _supported_files(root) == before
    assert "not run: the carry stopped" in stopped.tier
    text = summary(stopped)
    assert "needs a hand" in text and "**stopped** at `Count one more slot at admission`" in text
    assert f"python build.py continue --dir {tree}" in text
    # The branch holds the mark and the draft, so the maintainer goes on from it.
    assert _git(root, "branch", "--show-current").strip() == "watch/vllm-1.3"
    assert {s.status for s in listed_pins(fork.project) if str(s.pin) == "1.3"} == {"moving"}
    assert (root / "docs" / "rebases" / "v1.3.md").is_file()

    # By hand, as the summary says: resolve, continue, export. The resolution goes to rerere/.
    resolve_by_hand(tree)
    assert not continue_carry(tree).stopped
    written = export(tree, fork.project).changed
    assert "series/1.3" in written and any(w.startswith("rerere/") for w in written)


def test_a_recorded_resolution_lets_the_watcher_carry_a_conflicting_release(repo_fork: Any) -> None:
    fork, root = repo_fork, repo_fork.project.root
    _only_on_index(fork, "1.0", "1.3")
    stopped = watch(fork.project, fork.spec(), run_tier=False)
    assert stopped.conflict_tree is not None
    resolve_by_hand(stopped.conflict_tree)
    continue_carry(stopped.conflict_tree)
    export(stopped.conflict_tree, fork.project)
    # Keep only the record, as a project that met this conflict at another pin would.
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "the move, finished by hand")
    _git(root, "switch", "-q", "main")
    _git(root, "checkout", "-q", "watch/vllm-1.3", "--", "rerere")
    _git(root, "commit", "-q", "-m", "rerere: the 1.3 resolution")
    _git(root, "branch", "-q", "-D", "watch/vllm-1.3")
    _git(root, "clean", "-q", "-ffdx", "work")  # -ff: the conflict tree is a git work tree

    assert not (root / "series" / "1.3").exists()
    moved = watch(fork.project, fork.spec(), run_tier=False)
    assert moved.outcome is Outcome.READY and moved.reused == ("vllm/core/gate.py",)
    assert moved.conflict_tree is None and (root / "series" / "1.3").is_file()
    wheel = build(Pin.parse("1.3"), fork.spec(), fork.project).wheel
    with zipfile.ZipFile(wheel) as z:
        assert RESOLVED in z.read("vllm/core/gate.py").decode()  # the hand resolution, replayed
    assert "conflicts resolved from `rerere/`: 1" in summary(moved)


def test_a_move_that_fails_leaves_the_repository_as_it_was(repo_fork: Any) -> None:
    """An error during the move (here: the new release's sdist on the index is not a tarball)
    is raised, and the repository is back on the branch it started from, clean, with no
    watch/ branch: the next run starts the move again instead of calling it under way."""
    from vllm_rbln_fork.errors import ForkError

    fork, root = repo_fork, repo_fork.project.root
    _only_on_index(fork, "1.0", "1.1")
    (fork.index.root / "simple" / "vllm" / "vllm-1.1.tar.gz").write_bytes(b"not a tarball")
    head = _git(root, "rev-parse", "HEAD")
    with pytest.raises(ForkError):
        watch(fork.project, fork.spec(), run_tier=False)
    assert _git(root, "branch", "--show-current").strip() == "main"
    assert _git(root, "rev-parse", "HEAD") == head
    assert _git(root, "status", "--porcelain") == ""
    assert _git(root, "branch", "--list", "watch/*") == ""
