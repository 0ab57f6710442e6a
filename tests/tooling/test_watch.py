"""``build.py watch`` on the synthetic upstream: a release appears on a real local index and the
watcher starts the move on a branch; a conflicting release stops with the report and the
conflict tree; a conflict recorded in rerere/ is carried by itself (docs/patch-workflow.md).

1.1 drifts under the series (a clean 3-way carry); 1.3 rewrote the backport's line (a conflict).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from moves import RESOLVED, per_pin_layout, resolve_by_hand

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.review import review
from vllm_rbln_fork.supported import listed_pins, supported_pins
from vllm_rbln_fork.watch import Outcome, newer_release, summary, watch
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
def repo_fork(
    fork: Any,
    monkeypatch: pytest.MonkeyPatch,
    publish_release: Callable[[str], None],
    sdist_of: Callable[..., Path],
) -> Any:
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
    fork.sdist_of = sdist_of
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
    assert "; conflicts: 1 with upstream, 0 knock-on (report:" in text
    # The steps name no path of this machine (the conflict tree is a work tree of its cache's
    # repository): they are the ones a maintainer runs in a clone of their own (below).
    record = (root / "docs" / "rebases" / "v1.3.md").read_text()
    assert str(root) not in text and str(root) not in record and str(tree) not in record
    assert "python build.py --pin 1.3 --review --write --from 1.0" in text
    assert "python build.py continue --dir work/conflict-v1.3" in text
    assert "git fetch origin watch/vllm-1.3 && git switch watch/vllm-1.3" in text
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


def _serve(fork: Any, *sdists: tuple[str, str | None], yanked: dict[str, str] | None = None) -> None:
    """Exactly these sdists on the index, each (version, the release whose files it has); the
    page marks the files of ``yanked`` (file name -> reason) yanked (PEP 592's data-yanked)."""
    folder = fork.index.root / "simple" / "vllm"
    wanted = {f"vllm-{version}.tar.gz" for version, _ in sdists}
    for old in folder.glob("*.tar.gz"):
        if old.name not in wanted:
            old.unlink()
    for version, files_of in sdists:  # the ones there kept: pins.lock has their hashes
        if not (folder / f"vllm-{version}.tar.gz").exists():
            fork.index.publish(fork.sdist_of(version, fork.index.root, files_of=files_of))
    fork.index.publish(folder / f"vllm-{sdists[0][0]}.tar.gz")
    page = folder / "index.html"
    text = page.read_text()
    for name, reason in (yanked or {}).items():
        text = text.replace(f'<a href="{name}#', f'<a data-yanked="{reason}" href="{name}#')
    page.write_text(text)


def test_a_post_release_that_replaces_a_yanked_release_is_moved_to(repo_fork: Any) -> None:
    """vLLM yanked 0.2.1 and replaced it by 0.2.1.post1: a post-release is a final release (PEP
    440), and the yanked file is no candidate (PEP 592)."""
    fork = repo_fork
    _serve(fork, ("1.0", None), ("1.1", None), ("1.1.post1", "1.1"), yanked={"vllm-1.1.tar.gz": "broken"})
    moved = watch(fork.project, fork.spec(), run_tier=False)
    assert moved.outcome is Outcome.READY and moved.release == Pin.parse("1.1.post1"), summary(moved)
    assert moved.also_new == ()  # the yanked 1.1 is not offered as another new release
    assert (fork.project.root / "series" / "1.1.post1").is_file()


def test_release_names_a_post_release_and_an_exact_yanked_one(repo_fork: Any) -> None:
    fork = repo_fork
    _serve(fork, ("1.0", None), ("1.1", None), ("1.1.post1", "1.1"), yanked={"vllm-1.1.tar.gz": "broken"})
    for asked in ("1.1.post1", "1.1"):  # --release asks for one release exactly: yanked or not
        found = newer_release(fork.project, fork.index.url, Pin.parse(asked))
        assert found.target == Pin.parse(asked)
    with pytest.raises(ForkError, match=r"--release 1\.2: the index .* has no sdist of vllm 1\.2"):
        newer_release(fork.project, fork.index.url, Pin.parse("1.2"))


def test_a_yanked_pin_still_builds_with_a_warning_and_is_no_candidate(repo_fork: Any, recorder: Any) -> None:
    """A supported pin whose sdist is yanked later builds on a fresh machine (PEP 592: an exact
    pin may use a yanked file), saying why it was yanked; only the watcher skips yanked files."""
    fork = repo_fork
    shutil.rmtree(os.environ["VLLM_RBLN_FORK_CACHE"])  # a fresh machine: nothing downloaded
    _serve(
        fork,
        ("1.0", None),
        ("1.1", None),
        yanked={"vllm-1.0.tar.gz": "a bad tarball", "vllm-1.1.tar.gz": "x"},
    )
    built = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert built.wheel.is_file()
    warned = recorder.messages("warn")
    assert any("vllm-1.0.tar.gz is yanked" in w and "a bad tarball" in w for w in warned), warned
    _git(fork.project.root, "add", "-A")
    _git(fork.project.root, "commit", "-q", "-m", "the release number of the build")
    nothing = watch(fork.project, fork.spec(), run_tier=False)
    assert nothing.outcome is Outcome.NOTHING_NEW and "not newer than 1.0" in nothing.note


def test_a_local_version_on_a_mirror_is_ignored_and_hides_no_release(repo_fork: Any) -> None:
    fork = repo_fork
    _serve(fork, ("1.0", None), ("1.1", None), ("1.1+cpu", "1.1"), ("1.2+cpu", "1.2"))
    moved = watch(fork.project, fork.spec(), run_tier=False)
    assert moved.outcome is Outcome.READY and moved.release == Pin.parse("1.1"), summary(moved)
    assert moved.also_new == ()


def test_two_new_releases_move_to_the_newest_and_name_the_other(repo_fork: Any) -> None:
    fork, root = repo_fork, repo_fork.project.root
    _only_on_index(fork, "1.0", "1.1", "1.2")
    moved = watch(fork.project, fork.spec(), run_tier=False)
    assert moved.release == Pin.parse("1.2") and moved.also_new == (Pin.parse("1.1"),)
    assert "also new on the index: 1.1 (not moved to" in summary(moved)
    assert "also new on the index: 1.1" in (root / "docs" / "rebases" / "v1.2.md").read_text()


def test_a_newer_release_waits_for_the_move_under_way(repo_fork: Any) -> None:
    """1.1's move is under way (its branch) when 1.2 comes out: no second move from 1.0 that
    would ignore 1.1's resolutions; 1.2 is named, waiting. --release overrides the wait."""
    fork, root = repo_fork, repo_fork.project.root
    _only_on_index(fork, "1.0", "1.1")
    assert watch(fork.project, fork.spec(), run_tier=False).release == Pin.parse("1.1")
    _only_on_index(fork, "1.0", "1.1", "1.2")
    for where in ("watch/vllm-1.1", "main"):
        _git(root, "switch", "-q", where)
        waiting = watch(fork.project, fork.spec(), run_tier=False)
        assert waiting.outcome is Outcome.NOTHING_NEW and waiting.release is None
        assert "a move to 1.1 is under way" in waiting.note and "1.2 is newer and waiting" in waiting.note
        assert waiting.also_new == (Pin.parse("1.2"),)
        assert _git(root, "branch", "--list", "watch/vllm-1.2") == ""
        assert _git(root, "branch", "--show-current").strip() == where  # left where it was
    asked = watch(fork.project, fork.spec(), release=Pin.parse("1.2"), run_tier=False)
    assert asked.release == Pin.parse("1.2")


def test_the_move_branches_off_main_whatever_branch_it_runs_on(repo_fork: Any) -> None:
    """Run off main (a feature branch), or twice in a row (on the first move's branch): each
    move's branch starts from main, not stacked on the branch the work tree was on."""
    fork, root = repo_fork, repo_fork.project.root
    main = _git(root, "rev-parse", "main").strip()
    _git(root, "switch", "-q", "-c", "feature")
    (root / "NOTES").write_text("work in progress\n")
    _git(root, "add", "NOTES")
    _git(root, "commit", "-q", "-m", "a feature")
    _only_on_index(fork, "1.0", "1.1", "1.2")
    first = watch(fork.project, fork.spec(), release=Pin.parse("1.1"), run_tier=False)
    assert first.branch == "watch/vllm-1.1"
    assert _git(root, "rev-parse", "watch/vllm-1.1~1").strip() == main
    assert not (root / "NOTES").exists()  # the feature's file is not in the move
    second = watch(fork.project, fork.spec(), release=Pin.parse("1.2"), run_tier=False)
    assert _git(root, "rev-parse", "watch/vllm-1.2~1").strip() == main
    listed = {str(s.pin): s.status for s in listed_pins(fork.project)}
    assert listed == {"1.0": "supported", "1.2": "moving"} and second.outcome is Outcome.READY


def test_no_branch_after_an_error_leaves_nothing_moving(repo_fork: Any) -> None:
    """--no-branch writes in place; an error puts every file back, so the next run starts the
    move again instead of calling it under way."""
    fork, root = repo_fork, repo_fork.project.root
    (root / "tests" / "upstream" / "1.0").mkdir(parents=True)
    (root / "tests" / "upstream" / "1.0" / "expected.toml").write_text("[x]\n")
    _only_on_index(fork, "1.0", "1.1")
    good = (fork.index.root / "simple" / "vllm" / "vllm-1.1.tar.gz").read_bytes()
    (fork.index.root / "simple" / "vllm" / "vllm-1.1.tar.gz").write_bytes(b"not a tarball")
    pins = (root / "pins.toml").read_text()
    with pytest.raises(ForkError):
        watch(fork.project, fork.spec(), branch=False, run_tier=False)
    assert (root / "pins.toml").read_text() == pins
    assert not (root / "tests" / "upstream" / "1.1").exists() and not (root / "series" / "1.1").exists()
    assert _git(root, "status", "--porcelain") == "?? tests/\n"  # only the test's own list
    (fork.index.root / "simple" / "vllm" / "vllm-1.1.tar.gz").write_bytes(good)
    moved = watch(fork.project, fork.spec(), branch=False, run_tier=False)
    assert moved.outcome is Outcome.READY and moved.release == Pin.parse("1.1")


def test_a_late_error_removes_the_conflict_tree_and_the_next_run_starts_again(repo_fork: Any) -> None:
    """The move stops at a conflict, then its commit fails (a pre-commit hook refuses): the
    repository, the conflict tree and the review folder are as before the run, so the next run
    starts the move again, as docs/patch-workflow.md says."""
    fork, root = repo_fork, repo_fork.project.root
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'refused by a hook' >&2\nexit 1\n")
    hook.chmod(0o755)
    _only_on_index(fork, "1.0", "1.3")
    with pytest.raises(ForkError, match="refused by a hook"):
        watch(fork.project, fork.spec(), run_tier=False)
    assert not (fork.project.work_dir / "conflict-v1.3").exists()
    assert not (fork.project.work_dir / "review-v1.3").exists()
    assert _git(root, "branch", "--show-current").strip() == "main"
    assert _git(root, "branch", "--list", "watch/*") == "" and _git(root, "status", "--porcelain") == ""
    hook.unlink()
    again = watch(fork.project, fork.spec(), run_tier=False)
    assert again.outcome is Outcome.BY_HAND and again.conflict_tree is not None


def test_the_steps_at_a_conflict_work_in_a_maintainers_own_clone(
    repo_fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary's steps, run in another clone with another cache (a maintainer's machine):
    the carry makes the conflict tree there, and continue and export finish the move."""
    fork, root = repo_fork, repo_fork.project.root
    _only_on_index(fork, "1.0", "1.3")
    stopped = watch(fork.project, fork.spec(), run_tier=False)
    assert stopped.outcome is Outcome.BY_HAND
    mine = tmp_path / "maintainer"
    subprocess.run(["git", "clone", "-q", str(root), str(mine)], check=True)
    _git(mine, "switch", "-q", "watch/vllm-1.3")  # "git fetch origin watch/vllm-1.3 && git switch ..."
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "maintainer-cache"))
    project = Project(mine)
    result = review(Pin.parse("1.3"), fork.spec(), project, write=True, source=Pin.parse("1.0"))
    tree = mine / "work" / "conflict-v1.3"
    assert result.conflict_tree == tree and "<<<<<<<" in (tree / "vllm/core/gate.py").read_text()
    resolve_by_hand(tree)
    assert not continue_carry(tree).stopped
    assert "series/1.3" in export(tree, project).changed


def test_untracked_files_in_the_new_pins_lists_are_refused_not_committed(repo_fork: Any) -> None:
    fork, root = repo_fork, repo_fork.project.root
    (root / "tests" / "upstream" / "1.0").mkdir(parents=True)
    (root / "tests" / "upstream" / "1.0" / "expected.toml").write_text("[x]\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "conformance lists")
    stray = root / "tests" / "upstream" / "1.1" / "scratch.toml"
    stray.parent.mkdir()
    stray.write_text("mine\n")
    _only_on_index(fork, "1.0", "1.1")
    with pytest.raises(
        ForkError, match=r"tests/upstream/1\.1 holds files git does not track .*scratch\.toml"
    ):
        watch(fork.project, fork.spec(), run_tier=False)
    assert _git(root, "branch", "--list", "watch/*") == "" and stray.read_text() == "mine\n"
    stray.unlink()
    moved = watch(fork.project, fork.spec(), run_tier=False)
    committed = _git(root, "show", "--name-only", "--format=", "HEAD").split()
    assert "tests/upstream/1.1/expected.toml" in committed and moved.outcome is Outcome.READY


HOSTILE_BUILD_PY = """\
# The new release's code as the scheduler tier runs it. `test ... --plan FILE` plays the tool's
# own first step, outside the cage (where vLLM's setup.py runs, in the wheel's build): it
# appends a line to each project file TAMPER names and writes the plan, whose run is this file
# again. That run (vLLM's code in the tier's tests) prints what it was given, writes into every
# cache it is given, carries out the attacks ATTACK names (each line: a kind, then an absolute
# path or a secret's name; what it read is printed after LEAKED), and exits as STATUS says.
import json, os, pathlib, subprocess, sys
here = pathlib.Path(__file__).parent
if "--plan" in sys.argv:
    for name in ((here / "TAMPER").read_text().split() if (here / "TAMPER").exists() else []):
        target = here / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((target.read_text() if target.exists() else "") + "# from the release\\n")
    plan = pathlib.Path(sys.argv[sys.argv.index("--plan") + 1])
    plan.write_text(json.dumps({"argv": [sys.executable, __file__, "caged"], "cwd": str(here),
                                "env": {"VLLM_RBLN_PIN": sys.argv[sys.argv.index("--pin") + 1]}}))
    sys.exit(0)
seen = {k: os.environ.get(k, "") for k in ("XDG_CACHE_HOME", "VLLM_RBLN_FORK_CACHE", "UV_LINK_MODE",
        "VLLM_RBLN_FORK_BOOTSTRAPPED", "GITHUB_OUTPUT", "VLLM_RBLN_PIN")}
print("SEEN " + json.dumps(seen), flush=True)
xdg = pathlib.Path(seen["XDG_CACHE_HOME"] or pathlib.Path.home() / ".cache")
for planted in (xdg / "vllm-rbln-fork" / "tool-envs" / "planted",
                pathlib.Path(seen["VLLM_RBLN_FORK_CACHE"] or xdg) / "wheels" / "planted"):
    try:
        planted.parent.mkdir(parents=True, exist_ok=True)
        planted.write_text("from the release")
    except OSError as exc:
        print(f"REFUSED {planted}: {exc}", flush=True)
for line in ((here / "ATTACK").read_text().splitlines() if (here / "ATTACK").exists() else []):
    kind, arg = line.split(" ", 1)
    try:
        if kind == "environ":  # the parent's, PID 1's, every process's it can read
            for environ in sorted(pathlib.Path("/proc").glob("[0-9]*/environ")):
                try:
                    for var in environ.read_bytes().split(b"\\0"):
                        if var.startswith(arg.encode() + b"="):
                            print(f"LEAKED from {environ}: {var.decode()}", flush=True)
                except OSError:
                    pass
        elif kind == "read":  # a file of the runner's (a token, a key) by path; 0600 stops no root
            print(f"LEAKED from {arg}: {pathlib.Path(arg).read_text()}", flush=True)
        elif kind == "connect":  # a file-system Unix socket (docker's, a bus) by path
            import socket
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(arg)
                client.sendall(b"from the release\\n")
        elif kind == "append":  # $GITHUB_OUTPUT, a shared patch, another pin's series, by path
            with open(arg, "a") as out:
                out.write("outcome=0\\n")
        elif kind == "write":  # a new file in the user's tool envs, by path
            pathlib.Path(arg).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(arg).write_text("from the release")
        elif kind == "remount":  # make the read-only binds writable again, then append by path
            for point in ("/", str(here)):
                subprocess.run(["mount", "-o", "remount,bind,rw", point], check=False)
            with open(arg, "a") as out:
                out.write("# from the release\\n")
        elif kind == "daemon":  # a process left running after the tier
            subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)", arg],
                             start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        print(f"REFUSED {line}: {exc}", flush=True)
    else:
        print(f"MADE {line}", flush=True)
sys.exit(int((here / "STATUS").read_text()))
"""


@pytest.fixture
def hostile_tier(repo_fork: Any, home_folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fork with a build.py whose ``test`` plays the unreviewed release, and a user cache
    (``XDG_CACHE_HOME``) and step-outputs file of the test's own, under ``$HOME`` (``home_folder``,
    not ``/tmp``); its STATUS file is the tier's exit."""
    tmp_path = home_folder
    root = repo_fork.project.root
    (root / "build.py").write_text(HOSTILE_BUILD_PY)
    (root / "STATUS").write_text("0")
    (root / ".gitignore").write_text("/work/\n/STATUS\n/TAMPER\n/ATTACK\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "build.py")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.setenv("VLLM_RBLN_FORK_BOOTSTRAPPED", str(tmp_path / "user-cache" / "tool-env"))
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "step-outputs"))  # as on the forge
    _only_on_index(repo_fork, "1.0", "1.1")
    return tmp_path / "user-cache"


def _seen(out: str) -> dict[str, str]:
    [line] = [line for line in out.splitlines() if line.startswith("SEEN ")]
    return dict(json.loads(line.removeprefix("SEEN ")))


def test_the_new_release_runs_caged_and_nothing_it_wrote_is_kept(
    repo_fork: Any, hostile_tier: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The scheduler tier runs the unreviewed release's code: in a tool env, build cache and test
    venv of its own (a fresh XDG_CACHE_HOME and VLLM_RBLN_FORK_CACHE, build.py's re-exec marker
    dropped), removed afterwards; its run in the cage gets the plan's variables and no other:
    the user's cache and the build cache are untouched."""
    fork = repo_fork
    moved = watch(fork.project, fork.spec())
    assert moved.outcome is Outcome.READY and moved.tier_passed is True, moved.tier
    seen = _seen(capfd.readouterr().out)
    assert seen["VLLM_RBLN_PIN"] == "1.1"  # the plan's variable
    # None of the caller's: no re-exec marker, no step outputs, no caches (the plan names none).
    assert seen["VLLM_RBLN_FORK_BOOTSTRAPPED"] == seen["GITHUB_OUTPUT"] == seen["XDG_CACHE_HOME"] == ""
    assert not list(hostile_tier.rglob("planted"))
    assert not list(Path(os.environ["VLLM_RBLN_FORK_CACHE"]).rglob("planted"))


def _still_running(token: str) -> list[int]:
    """The processes holding ``token`` that outlive the cage. When bwrap (the PID namespace's
    first process) ends, the kernel kills the rest, but reaping them takes a moment: a caged
    daemon was still listed right after bwrap returned and gone 50 ms later. So wait for them
    to go, up to 10 s; one still there then was left running."""
    deadline = time.monotonic() + 10
    while (found := _running(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _running(token: str) -> list[int]:
    """The processes whose command line holds ``token``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if token.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


class _Served:
    """A file-system Unix socket the test serves (as docker serves /run/docker.sock): what
    connected to it, and what it was sent."""

    def __init__(self, path: Path) -> None:
        self.path, self.heard = path, []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen()
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self.heard.append(conn.recv(1024))
                except OSError:
                    self.heard.append(b"")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._server.close()
        self.path.unlink(missing_ok=True)


def _run_socket_folder() -> Path:
    """Where under /run the test may serve a socket (root's /run, or the user's /run/user/<uid>)."""
    for folder in (Path("/run"), Path(f"/run/user/{os.getuid()}")):
        if folder.is_dir() and not folder.is_symlink() and os.access(folder, os.W_OK):
            return folder
    pytest.skip("no folder under /run is writable here, so no socket can be served there")


@pytest.mark.parametrize(
    "attack",
    [
        "environ",
        "github-output",
        "tool-envs",
        "shared-patch",
        "other-series",
        "remount",
        "daemon",
        "home-secret",
        "home-socket",
        "run-socket",
        "work-append",
    ],
)
def test_the_caged_release_reaches_no_secret_output_cache_patch_or_lasting_process(
    repo_fork: Any,
    hostile_tier: Path,
    home_folder: Path,
    attack: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """W3/W4: the release's code, run by the scheduler tier, (a) read the watcher's secrets in
    /proc/<ppid>/environ (and /proc/1/environ), (b) appended to $GITHUB_OUTPUT, (c) wrote by
    absolute path into the user's tool envs, a shared patch or another pin's series, (d) left a
    process running. Review finding 2: (e) it read a 0600 file under $HOME (the runner's token;
    as root, 0600 stops nothing) and (f) connected to a Unix socket served under $HOME or /run
    (as /run/docker.sock is); finding 4: (g) it appended to a file outside /tmp, in the
    project's work dir (every target but the project's is outside /tmp: under $HOME). In the
    bubblewrap cage each has no effect, and the tier still passes."""
    from vllm_rbln_fork.paths import PROJECT_ROOT

    fork, root = repo_fork, repo_fork.project.root
    secret = "planted-secret-52"
    monkeypatch.setenv("WATCH_SECRET_52", secret)
    shared = sorted((root / "patches").glob("*.patch"))[0]
    token = f"left-running-{os.getpid()}-{attack}"
    kept = home_folder / "runner-token"  # 0600, as the runner's credentials are
    kept.write_text("token-kept-in-home-52\n")
    kept.chmod(0o600)
    work = PROJECT_ROOT / "work" / home_folder.name  # the project's work dir: outside /tmp and $HOME
    work.mkdir(parents=True)
    (work / "notes").write_text("")
    served = None
    if attack in ("home-socket", "run-socket"):
        folder = home_folder if attack == "home-socket" else _run_socket_folder()
        served = _Served(folder / f"{home_folder.name}.sock")
    target = {
        "environ": "environ WATCH_SECRET_52",
        "github-output": f"append {os.environ['GITHUB_OUTPUT']}",
        "tool-envs": f"write {hostile_tier / 'vllm-rbln-fork' / 'tool-envs' / 'env-x' / 'bin' / 'python'}",
        "shared-patch": f"append {shared}",
        "other-series": f"append {root / 'series' / '1.0'}",
        "remount": f"remount {shared}",
        "daemon": f"daemon {token}",
        "home-secret": f"read {kept}",
        "home-socket": f"connect {served.path if served else ''}",
        "run-socket": f"connect {served.path if served else ''}",
        "work-append": f"append {work / 'notes'}",
    }[attack]
    (root / "ATTACK").write_text(target + "\n")
    Path(os.environ["GITHUB_OUTPUT"]).write_text("")
    before = _supported_files(root)
    try:
        moved = watch(fork.project, fork.spec())
        left = _still_running(token)
    finally:
        for pid in _running(token):
            os.kill(pid, 9)
        if served:
            served.close()
        noted = (work / "notes").read_text()
        shutil.rmtree(work)
    out = capfd.readouterr().out
    assert moved.outcome is Outcome.READY and moved.tier_passed is True, moved.tier
    assert secret not in out and "LEAKED" not in out and "token-kept-in-home-52" not in out
    assert Path(os.environ["GITHUB_OUTPUT"]).read_text() == ""
    assert not (hostile_tier / "vllm-rbln-fork" / "tool-envs").exists()
    assert _supported_files(root) == before
    assert _git(root, "show", "--name-only", "--format=", "HEAD").split().count(shared.name) == 0
    assert left == []
    assert served is None or served.heard == [], served.heard  # no connection reached the socket
    assert noted == ""
    assert f"MADE {target}" in out or f"REFUSED {target}" in out  # the attack was made


def test_without_bwrap_the_watcher_refuses_and_names_the_package(
    repo_fork: Any, hostile_tier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bubblewrap: the watcher refuses before anything changes, naming the package and the
    way out (--no-tier); it never runs the tier uncaged."""
    fork, root = repo_fork, repo_fork.project.root
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    head = _git(root, "rev-parse", "HEAD")
    with pytest.raises(ForkError, match=r"install the bubblewrap package .*--no-tier"):
        watch(fork.project, fork.spec())
    assert _git(root, "rev-parse", "HEAD") == head and _git(root, "branch", "--list", "watch/*") == ""


@pytest.mark.parametrize("tampered", ["shared-patch", "series/1.0", "rerere-record", "pins.toml"])
def test_a_tier_that_changes_another_pins_files_is_refused_and_nothing_is_kept(
    repo_fork: Any, hostile_tier: Path, tampered: str
) -> None:
    """W1: the new release's code, run by the scheduler tier in the work tree the move is
    committed from, edited a supported pin's shared patch; `git add --all -- patches ...`
    committed it and the summary did not say so. The move is now refused (the watcher's error)
    naming the file, and everything is put back."""
    fork, root = repo_fork, repo_fork.project.root
    shared = sorted((root / "patches").glob("*.patch"))[0].relative_to(root).as_posix()
    name = {
        "shared-patch": shared,
        "series/1.0": "series/1.0",
        "rerere-record": "rerere/0123abcd/postimage",
        "pins.toml": "pins.toml",
    }[tampered]
    (root / "TAMPER").write_text(name)
    before = _supported_files(root)
    head = _git(root, "rev-parse", "HEAD")
    with pytest.raises(ForkError, match=rf"changed {re.escape(name)}, which are not vllm 1.1's own files"):
        watch(fork.project, fork.spec())
    assert _supported_files(root) == before
    assert _git(root, "branch", "--list", "watch/*") == "" and _git(root, "rev-parse", "HEAD") == head
    assert _git(root, "status", "--porcelain") == ""


def test_a_tier_that_cannot_start_is_the_watchers_error_not_work_by_hand(
    repo_fork: Any, hostile_tier: Path
) -> None:
    """build.py test exits 2 (the tool's error: an index out of reach, a broken lock): nothing
    is committed, no branch is left, the move is not "under way"; exit 1 (tests failed) is
    work by hand."""
    fork, root = repo_fork, repo_fork.project.root
    (root / "STATUS").write_text("2")
    with pytest.raises(ForkError, match=r"scheduler tier at vllm 1\.1 could not run .* exited 2"):
        watch(fork.project, fork.spec())
    assert (
        _git(root, "branch", "--list", "watch/*") == ""
        and _git(root, "branch", "--show-current").strip() == "main"
    )
    (root / "STATUS").write_text("1")
    failed = watch(fork.project, fork.spec())
    assert failed.outcome is Outcome.BY_HAND and failed.tier_passed is False


def test_the_work_by_hand_commit_passes_the_projects_own_pre_commit_hook(
    repo_fork: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the project's pre-commit hook installed (docs/building.md), the commit of a move that
    stopped at a conflict (a moving pin with no series yet) passes the series lint."""
    from vllm_rbln_fork.paths import PROJECT_ROOT

    fork, root = repo_fork, repo_fork.project.root
    for name in ("build.py", ".pre-commit-config.yaml"):
        shutil.copy(PROJECT_ROOT / name, root / name)
    for name in ("requirements", "vllm_rbln_fork"):
        shutil.copytree(PROJECT_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "the project's tooling and hooks")
    tool_bin = Path(sys.executable).parent
    subprocess.run([tool_bin / "pre-commit", "install"], cwd=root, check=True, capture_output=True)
    monkeypatch.setenv("PATH", f"{tool_bin}{os.pathsep}{os.environ['PATH']}")
    _only_on_index(fork, "1.0", "1.3")
    stopped = watch(fork.project, fork.spec(), run_tier=False)
    assert stopped.outcome is Outcome.BY_HAND and stopped.commit is not None
    assert stopped.commit == _git(root, "rev-parse", "watch/vllm-1.3").strip()
    assert _git(root, "status", "--porcelain", "--untracked-files=no") == ""


def test_the_tier_may_add_the_new_pins_lines_to_the_ledgers_and_nothing_else() -> None:
    """The scheduler tier builds the new pin's wheel, which records its sdist hash (pins.lock)
    and its release number (fork-releases.toml): those lines are the new pin's own."""
    from vllm_rbln_fork.watch import _ledgers_agree

    lock = b'[vllm."1.0"]\nfilename = "vllm-1.0.tar.gz"\nsha256 = "aa"\n'
    grown = lock + b'\n[vllm."1.1"]\nfilename = "vllm-1.1.tar.gz"\nsha256 = "bb"\n'
    assert _ledgers_agree("pins.lock", lock, grown, Pin.parse("1.1"))
    assert not _ledgers_agree("pins.lock", lock, grown.replace(b'"aa"', b'"cc"'), Pin.parse("1.1"))
    assert not _ledgers_agree("pins.lock", lock, grown, Pin.parse("1.2"))
    ledger = b'release = [\n    { pin = "1.0", n = 1, tree = "a" },\n]\n'
    added = ledger.replace(b"]\n", b'    { pin = "1.1", n = 1, tree = "b" },\n]\n')
    assert _ledgers_agree("fork-releases.toml", ledger, added, Pin.parse("1.1"))
    assert not _ledgers_agree(
        "fork-releases.toml", ledger, added.replace(b'tree = "a"', b'tree = "z"'), Pin.parse("1.1")
    )
    assert not _ledgers_agree("fork-releases.toml", ledger, added, Pin.parse("1.2"))


HOSTILE_SETUP_PY = """\
# The new release's setup.py, run by the wheel's build hook: it looks for a secret in every
# /proc/*/environ, writes by absolute path outside its tree, leaves a process running, and fails.
import pathlib, subprocess, sys
for environ in sorted(pathlib.Path("/proc").glob("[0-9]*/environ")):
    try:
        if b"WATCH_SECRET_52=" in environ.read_bytes():
            print(f"LEAKED from {environ}", flush=True)
    except OSError:
        pass
try:
    pathlib.Path(sys.argv[0]).resolve().parent.parent.joinpath("outside").write_text("from setup.py")
    print("MADE outside", flush=True)
except OSError as exc:
    print(f"REFUSED outside: {exc}", flush=True)
subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)", "TOKEN"],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
sys.exit(3)
"""


def test_the_release_s_setup_py_builds_caged_and_reaches_no_secret_file_or_lasting_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """W3/W4 for the wheel's build: the watcher's first step (``--plan``) builds the new
    release's wheel with its own setup.py. Under the watcher (``VLLM_RBLN_FORK_CAGE``, which
    :func:`caged_env` sets) the build hook runs in bubblewrap: setup.py finds no secret of the
    caller's, writes nothing outside its tree and the wheel's folder, and leaves no process."""
    from vllm_rbln_fork.wheel import CAGE_ENV, build_wheel

    token = f"setup-py-left-running-{os.getpid()}"
    tree, out = tmp_path / "tree", tmp_path / "out"
    tree.mkdir()
    out.mkdir()
    (tree / "setup.py").write_text(HOSTILE_SETUP_PY.replace("TOKEN", token))
    (tmp_path / "cage").mkdir()
    monkeypatch.setenv(CAGE_ENV, str(tmp_path / "cage"))
    monkeypatch.setenv("WATCH_SECRET_52", "planted-secret-52")
    try:
        with pytest.raises(ForkError) as failed:  # setup.py exits 3; its output is in the error
            build_wheel(tree, "1.0", 0, None, out)  # type: ignore[arg-type]
        left = _still_running(token)
    finally:
        for pid in _running(token):
            os.kill(pid, 9)
    captured = capfd.readouterr()
    said = str(failed.value) + captured.out + captured.err
    assert "LEAKED" not in said and not (tmp_path / "outside").exists()
    assert "MADE outside" in said or "REFUSED outside" in said  # setup.py ran
    assert left == []
