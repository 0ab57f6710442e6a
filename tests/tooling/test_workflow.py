"""The edit loop: checkout as git commits, export back, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.gitrepo import Repo
from vllm_rbln_fork.paths import upstream_repo_dir
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.workflow import checkout, export


def _snapshot(project) -> dict[str, bytes]:
    files = [project.series_file, *project.patches_dir.glob("*.patch")]
    return {p.name: p.read_bytes() for p in files}


def test_export_of_an_unchanged_checkout_changes_no_byte(fork, tmp_path) -> None:
    before = _snapshot(fork.project)
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "again")
    assert export(tree, fork.project).changed == []
    assert _snapshot(fork.project) == before


def test_checkout_has_one_commit_per_patch_on_the_upstream_tag(fork, tmp_path) -> None:
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "co")
    repo = Repo(tree, bare=False)
    subjects = repo.out("log", "--format=%s", "upstream/v1.0..HEAD").splitlines()
    assert subjects == ["Add RBLN padding", "Count one more slot at admission"]


def test_drop_a_patch_by_rebasing_it_away_and_exporting(fork, tmp_path) -> None:
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "co")
    repo = Repo(tree, bare=False)
    env = {"GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "d@e.invalid"}
    repo.run("rebase", "--onto", "HEAD~2", "HEAD~1", "HEAD", env=env, in_work_tree=True, cwd=tree)
    changed = export(tree, fork.project).changed
    assert "patches/count-one-more-slot-at-admission.patch (removed)" in changed
    assert fork.project.series_file.read_text().splitlines()[-1] == "add-rbln-padding.patch"
    assert not (fork.project.patches_dir / "count-one-more-slot-at-admission.patch").exists()


def test_export_refuses_a_commit_without_origin_and_writes_nothing(fork, tmp_path) -> None:
    import pytest

    from vllm_rbln_fork.errors import SeriesError

    before = _snapshot(fork.project)
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "co")
    repo = Repo(tree, bare=False)
    (tree / "vllm/core/gate.py").write_text("# changed\n")
    env = {
        "GIT_AUTHOR_NAME": "Dev",
        "GIT_AUTHOR_EMAIL": "d@e.invalid",
        "GIT_COMMITTER_NAME": "Dev",
        "GIT_COMMITTER_EMAIL": "d@e.invalid",
    }
    repo.run(
        "commit",
        "-q",
        "-a",
        "-m",
        "Quick hack\n\nNo trailers here at all, sorry.",
        env=env,
        in_work_tree=True,
        cwd=tree,
    )
    with pytest.raises(SeriesError, match="no 'Origin:' trailer"):
        export(tree, fork.project)
    assert _snapshot(fork.project) == before


def _drop_the_backport_in_a_checkout(fork, tmp_path):
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "co")
    repo = Repo(tree, bare=False)
    env = {"GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "d@e.invalid"}
    repo.run("rebase", "--onto", "HEAD~2", "HEAD~1", "HEAD", env=env, in_work_tree=True, cwd=tree)
    return tree


def test_export_removes_a_stale_patch_even_if_its_file_is_damaged(fork, tmp_path) -> None:
    # Regression (issue 15): a patch file that no longer parses made export ignore the whole
    # old series, so the patch dropped in the tree stayed in patches/.
    tree = _drop_the_backport_in_a_checkout(fork, tmp_path)
    stale = fork.project.patches_dir / "count-one-more-slot-at-admission.patch"
    stale.write_text("not a patch any more\n")
    assert "patches/count-one-more-slot-at-admission.patch (removed)" in export(tree, fork.project).changed
    assert not stale.exists()


def test_export_refuses_a_malformed_series_and_writes_nothing(fork, tmp_path) -> None:
    import pytest

    from vllm_rbln_fork.errors import SeriesError

    tree = _drop_the_backport_in_a_checkout(fork, tmp_path)
    series = fork.project.series_file
    series.write_text(series.read_text().replace(".patch\n", ".patch -p1\n", 1))
    before = _snapshot(fork.project)
    with pytest.raises(SeriesError, match=r"series line \d+: .*-p1"):
        export(tree, fork.project)
    assert _snapshot(fork.project) == before


@pytest.mark.parametrize("made", ["absent", "empty"])
def test_checkout_into_a_relative_dir_is_the_series_not_an_empty_repo(
    fork, tmp_path, monkeypatch, made
) -> None:
    """``checkout --dir work/fix`` (relative, as typed): git ran in the cache repo, so the
    clone went there and an empty repo was made at work/fix. An empty directory is fine too
    (git clone takes one); one with files in it is refused and left as it was."""
    monkeypatch.chdir(tmp_path)
    if made == "empty":
        (tmp_path / "work" / "fix").mkdir(parents=True)
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, Path("work/fix"))
    assert tree == tmp_path / "work" / "fix"
    repo = Repo(tree, bare=False)
    log = repo.run("log", "--format=%s", cwd=tree, in_work_tree=True)[1].splitlines()
    assert len(log) == 3 and (tree / "vllm" / "core" / "gate.py").is_file()
    assert not list(upstream_repo_dir().rglob("fix"))  # nothing cloned into the cache

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine\n")
    with pytest.raises(ForkError, match="busy already exists"):
        checkout(Pin.parse("1.0"), fork.spec(), fork.project, Path("busy"))
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["notes.txt"]


def _commit_with_message(fork, tmp_path, message: str):
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "msg")
    repo = Repo(tree, bare=False)
    gate = tree / "vllm/core/gate.py"
    gate.write_text(gate.read_text() + "\n# more\n")
    env = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "d@e.invalid"} | {
        "GIT_COMMITTER_NAME": "Dev",
        "GIT_COMMITTER_EMAIL": "d@e.invalid",
    }
    repo.run("commit", "-q", "-a", "--cleanup=verbatim", "-m", message, env=env, in_work_tree=True, cwd=tree)
    return tree


def test_a_dashes_line_in_a_commit_message_is_kept_and_not_a_lint_error(fork, tmp_path) -> None:
    """A '---' line of a message (a Markdown rule, a quoted mail) was read as the end of the
    message: the trailers below it vanished and lint said 'no Origin: trailer'."""
    from vllm_rbln_fork.series import read_series

    message = (
        "Mark the end of the gate\n\nThe gate's file gets a closing comment so a reader sees where it ends.\n"
        "---\nA rule above, as in a Markdown note.\n\nOrigin: rbln\n"
    )
    export(_commit_with_message(fork, tmp_path, message), fork.project)
    patch = read_series(fork.project.series_file, fork.project.patches_dir).patches[-1]
    assert patch.message == message and patch.trailer("Origin") == "rbln"
    built = build(Pin.parse("1.0"), fork.spec(), fork.project).manifest
    assert built.applied[-1].subject == "Mark the end of the gate"


def test_a_diff_git_line_in_a_commit_message_is_named_and_export_writes_nothing(fork, tmp_path) -> None:
    import pytest

    from vllm_rbln_fork.errors import SeriesError

    message = (
        "Mark the end of the gate\n\nThe gate's file gets a closing comment, as upstream's\n"
        "diff --git a/vllm/core/gate.py b/vllm/core/gate.py did it.\n\nOrigin: rbln\n"
    )
    tree = _commit_with_message(fork, tmp_path, message)
    before = _snapshot(fork.project)
    with pytest.raises(SeriesError, match=r"line 4 of its message, 'diff --git a/vllm.*start of the diff"):
        export(tree, fork.project)
    assert _snapshot(fork.project) == before


def test_a_non_ascii_subject_names_the_file_from_the_decoded_subject(fork, tmp_path) -> None:
    """format-patch writes a non-ASCII subject RFC 2047 encoded ('=?UTF-8?q?A=C3=B1adir...');
    the file was named from that ('utf-8-q-a-c3-b1adir-...')."""
    from vllm_rbln_fork.series import read_series

    message = (
        "Añadir un comentario al final de la puerta\n\n"
        "El fichero de la puerta gana un comentario final.\n\nOrigin: rbln\n"
    )
    export(_commit_with_message(fork, tmp_path, message), fork.project)
    patch = read_series(fork.project.series_file, fork.project.patches_dir).patches[-1]
    assert patch.name == "anadir-un-comentario-al-final-de-la-puerta.patch"
    assert patch.subject == "Añadir un comentario al final de la puerta"


@pytest.mark.parametrize("change", ["edited", "staged", "new file"])
def test_export_refuses_uncommitted_changes_and_writes_nothing(fork, tmp_path, change) -> None:
    from vllm_rbln_fork.errors import SeriesError

    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "co")
    gate = tree / "vllm/core/gate.py"
    if change == "new file":
        (tree / "vllm/rbln_new.py").write_text("X = 1\n")  # (the sdist's .gitignore hides vllm/core/)
    else:
        gate.write_text(gate.read_text() + "\n# not committed\n")
        if change == "staged":
            Repo(tree, bare=False).run("add", "-f", "vllm/core/gate.py", cwd=tree, in_work_tree=True)
    before = _snapshot(fork.project)
    with pytest.raises(SeriesError, match=r"not committed \(.*(gate|rbln_new)\.py.*git commit --fixup"):
        export(tree, fork.project)
    assert _snapshot(fork.project) == before


def test_a_long_subject_keeps_the_file_name_its_patch_has(fork, tmp_path) -> None:
    """format-patch folds a long subject over two header lines. The name used to come from
    the first line only; it comes from the whole subject now, but a patch already in patches/
    keeps its name (a name is a patch's identity across pins): exporting changes no byte."""
    subject = "Give the gate a closing comment that says where the admission code of the gate ends"
    why = "The gate's file gets a closing comment so a reader sees where it ends."
    message = f"{subject}\n\n{why}\n\nOrigin: rbln\n"
    export(_commit_with_message(fork, tmp_path, message), fork.project)
    from vllm_rbln_fork.series import read_series

    patch = read_series(fork.project.series_file, fork.project.patches_dir).patches[-1]
    assert (
        patch.subject == subject
        and patch.name == "give-the-gate-a-closing-comment-that-says-where-the-admission.patch"
    )
    old_name = (
        fork.project.patches_dir / "give-the-gate-a-closing-comment.patch"
    )  # as an older export named it
    (fork.project.patches_dir / patch.name).rename(old_name)
    series = fork.project.series_file
    series.write_text(series.read_text().replace(patch.name, old_name.name))
    before = _snapshot(fork.project)
    assert export(tmp_path / "msg", fork.project).changed == []
    assert _snapshot(fork.project) == before


def test_export_does_not_depend_on_the_user_s_global_git_config(fork, tmp_path, monkeypatch) -> None:
    """Bug 9: format.signoff, format.thread and diff.context in ~/.gitconfig reached the
    exported patches (Signed-off-by:, a time-dependent Message-Id:, 5-line context), and a
    ~/.gitconfig without user.email is the user's business, not the tool's."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[format]\n\tsignoff = true\n\tthread = shallow\n\tnumbered = true\n[diff]\n\tcontext = 5\n"
        "\tinterHunkContext = 9\n[user]\n\tuseConfigOnly = true\n"
    )
    for var in ("GIT_CONFIG_GLOBAL", "XDG_CONFIG_HOME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    before = _snapshot(fork.project)
    tree = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "co")
    assert export(tree, fork.project).changed == []
    assert _snapshot(fork.project) == before
