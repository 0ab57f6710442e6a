"""Recorded resolutions (rerere/) are the project's, not the cache repo's: a corrected
record replays as corrected and is not overwritten on export, export saves only the records
its own carry made or reused, and ``forget`` removes a record for good (docs/patch-workflow.md).

On the synthetic upstream: 1.3 and 2.3 rewrote the backport's line the same way, so carrying
the 1.0 series onto either meets the same conflict (tests/tooling/test_pins.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from moves import RESOLVED, move_by_hand

from vllm_rbln_fork import resolutions
from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.gitrepo import Repo
from vllm_rbln_fork.paths import upstream_repo_dir
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.review import review
from vllm_rbln_fork.workflow import export

CORRECTED = "    needed = 2 * prompt_tokens + 2\n"


def _record_the_move_to_1_3(fork: Any) -> tuple[str, dict[Path, bytes]]:
    """Move to 1.3 by hand and export: one record in rerere/. Then put the 1.0 series back
    (2.3 is carried from it) and return the record's id."""
    before = {
        p: p.read_bytes() for p in [fork.project.series_file, *fork.project.patches_dir.glob("*.patch")]
    }
    written = export(move_by_hand(fork, "1.3"), fork.project).changed
    records = [w for w in written if w.startswith("rerere/")]
    assert len(records) == 1
    for path, data in before.items():
        path.write_bytes(data)
    shutil.rmtree(fork.project.work_dir)
    return records[0].removeprefix("rerere/"), before


def _carry_to_2_3(fork: Any) -> Any:
    return review(Pin.parse("2.3"), fork.spec(), fork.project, write=True)


def _rr_cache() -> Path:
    return upstream_repo_dir() / "rr-cache"


def test_a_corrected_record_replays_as_corrected_and_export_keeps_it(
    fork: Any, publish_release: Callable[[str], None]
) -> None:
    publish_release("2.3")
    record_id, _ = _record_the_move_to_1_3(fork)
    postimage = fork.project.rerere_dir / record_id / "postimage"
    assert RESOLVED in postimage.read_text()
    # The maintainer corrects the record; the cache repo still has the old one.
    postimage.write_text(postimage.read_text().replace(RESOLVED, CORRECTED))
    assert RESOLVED in (_rr_cache() / record_id / "postimage").read_text()

    result = _carry_to_2_3(fork)
    assert result.carried_all and result.reused == ("vllm/core/gate.py",)
    assert result.conflict_tree is not None
    gate = (result.conflict_tree / "vllm/core/gate.py").read_text()
    assert CORRECTED in gate and RESOLVED not in gate
    export(result.conflict_tree, fork.project)
    assert CORRECTED in postimage.read_text()


def test_export_saves_only_the_records_of_its_own_carry(
    fork: Any, publish_release: Callable[[str], None]
) -> None:
    publish_release("2.3")
    record_id, _ = _record_the_move_to_1_3(fork)
    # A record some other carry in the same cache repo made (another pin's move, not exported).
    other = _rr_cache() / ("ab" * 20)
    other.mkdir()
    (other / "preimage").write_text("<<<<<<<\nx\n=======\ny\n>>>>>>>\n")
    (other / "postimage").write_text("x and y\n")

    result = _carry_to_2_3(fork)
    assert result.conflict_tree is not None
    written = export(result.conflict_tree, fork.project).changed
    assert not any(w.startswith("rerere/") for w in written)  # the reused record is unchanged
    assert sorted(p.name for p in fork.project.rerere_dir.iterdir()) == [record_id]
    assert resolutions.tracked(Repo(result.conflict_tree, bare=False), result.conflict_tree) == {record_id}


def test_a_forgotten_record_is_not_replayed_here_or_on_another_machine(
    fork: Any,
    publish_release: Callable[[str], None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish_release("2.3")
    record_id, _ = _record_the_move_to_1_3(fork)
    # Another machine loads the record (its carry to 2.3 reuses it) before it is forgotten.
    here = upstream_repo_dir()
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "machine-2"))
    assert _carry_to_2_3(fork).carried_all
    shutil.rmtree(fork.project.work_dir)
    assert (upstream_repo_dir() / "rr-cache" / record_id / "postimage").is_file()

    with pytest.raises(ForkError, match="at least 4 leading hex digits"):
        resolutions.forget(fork.project.rerere_dir, [record_id[:3]])
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(here.parent))
    out = _forget_cli(fork, record_id, monkeypatch, capsys)
    assert f"removed rerere/{record_id}" in out and "commit the removal" in out, out
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "machine-2"))
    assert not (fork.project.rerere_dir / record_id).exists()
    assert not (here / "rr-cache" / record_id).exists()

    # On machine 2 the next carry stops at the conflict: its copy was dropped on load.
    stopped = _carry_to_2_3(fork)
    assert stopped.conflict_tree is not None and not stopped.carried_all and stopped.reused == ()
    assert "<<<<<<<" in (stopped.conflict_tree / "vllm/core/gate.py").read_text()
    # And here too.
    shutil.rmtree(fork.project.work_dir)
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(here.parent))
    assert upstream_repo_dir() == here
    again = _carry_to_2_3(fork)
    assert not again.carried_all and again.reused == ()


def test_a_record_exported_here_and_forgotten_elsewhere_is_not_replayed_here(
    fork: Any, publish_release: Callable[[str], None]
) -> None:
    """The author's own carry made the record (this cache never loaded it from the project);
    a colleague forgets it and the author pulls that commit: the author's cache drops it too."""
    publish_release("2.3")
    record_id, _ = _record_the_move_to_1_3(fork)
    assert (_rr_cache() / record_id / "postimage").is_file()
    shutil.rmtree(fork.project.rerere_dir / record_id)  # what pulling the colleague's forget does

    stopped = _carry_to_2_3(fork)
    assert stopped.conflict_tree is not None and not stopped.carried_all and stopped.reused == ()
    assert "<<<<<<<" in (stopped.conflict_tree / "vllm/core/gate.py").read_text()
    assert not (_rr_cache() / record_id / "postimage").exists()  # met again: a preimage only


def _forget_cli(
    fork: Any, record_id: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    from vllm_rbln_fork import cli
    from vllm_rbln_fork.project import Project

    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    assert cli.main(["forget", record_id[:8]]) == 0
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


def test_a_record_only_in_this_cache_can_be_forgotten(
    fork: Any,
    publish_release: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A carry's record not exported (so not in rerere/): forget finds it in the cache, and
    does not ask for a commit (nothing in the project changed)."""
    publish_release("2.3")
    move_by_hand(fork, "1.3")  # resolved and carried, never exported
    shutil.rmtree(fork.project.work_dir)
    (record_id,) = [p.name for p in _rr_cache().iterdir() if (p / "postimage").is_file()]
    assert not fork.project.rerere_dir.exists() or not any(fork.project.rerere_dir.iterdir())

    out = _forget_cli(fork, record_id, monkeypatch, capsys)
    assert f"removed {_rr_cache() / record_id}" in out
    assert "commit" not in out and "nothing in the project changed" in out, out
    assert not (_rr_cache() / record_id).exists()
    stopped = _carry_to_2_3(fork)
    assert not stopped.carried_all and stopped.reused == ()

    # A prefix found nowhere still names where it looked, and removes nothing.
    with pytest.raises(ForkError, match=r"rr-cache.*Nothing was removed"):
        resolutions.forget(fork.project.rerere_dir, ["abcdef12"], Repo(upstream_repo_dir()))


def _meet_twice_resolve_once(fork: Any) -> tuple[str, Path]:
    """The conflict met at 1.3 and left unresolved, then met again at 2.3 and resolved there:
    git records the second meeting as a variant (preimage.1, then postimage.1)."""
    from vllm_rbln_fork.errors import PatchDoesNotApply
    from vllm_rbln_fork.pipeline import build
    from vllm_rbln_fork.workflow import continue_carry

    with pytest.raises(PatchDoesNotApply):
        build(Pin.parse("1.3"), fork.spec(), fork.project)
    with pytest.raises(PatchDoesNotApply):
        build(Pin.parse("2.3"), fork.spec(), fork.project)
    tree = fork.project.work_dir / "conflict-v2.3"
    from moves import resolve_by_hand

    resolve_by_hand(tree)
    assert not continue_carry(tree).stopped
    (record,) = [p for p in _rr_cache().iterdir() if (p / "postimage.1").is_file()]
    assert not (record / "postimage").exists()  # the first meeting is still unresolved
    return record.name, tree


def test_a_variant_record_is_saved_by_export_and_replayed_on_another_machine(
    fork: Any, publish_release: Callable[[str], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_release("2.3")
    before = {
        p: p.read_bytes() for p in [fork.project.series_file, *fork.project.patches_dir.glob("*.patch")]
    }
    record_id, tree = _meet_twice_resolve_once(fork)
    written = export(tree, fork.project).changed
    assert f"rerere/{record_id}" in written
    saved = fork.project.rerere_dir / record_id
    assert sorted(p.name for p in saved.iterdir()) == ["postimage.1", "preimage.1"]
    assert RESOLVED in (saved / "postimage.1").read_text()

    for path, data in before.items():  # 1.3 is carried from the 1.0 series again
        path.write_bytes(data)
    shutil.rmtree(fork.project.work_dir)
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "machine-2"))
    result = review(Pin.parse("1.3"), fork.spec(), fork.project, write=True)
    assert result.carried_all and result.reused == ("vllm/core/gate.py",)


def test_a_variant_record_only_in_this_cache_can_be_forgotten(
    fork: Any,
    publish_release: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish_release("2.3")
    record_id, _ = _meet_twice_resolve_once(fork)
    shutil.rmtree(fork.project.work_dir)  # never exported
    out = _forget_cli(fork, record_id, monkeypatch, capsys)
    assert f"removed {_rr_cache() / record_id}" in out, out
    assert not (_rr_cache() / record_id).exists()
    stopped = _carry_to_2_3(fork)
    assert not stopped.carried_all and stopped.reused == ()


@pytest.mark.parametrize("again", ["build", "checkout", "review --write"])
def test_a_conflict_tree_in_progress_is_never_removed_by_another_carry(
    fork: Any, again: str, tmp_path: Path
) -> None:
    """Bug 6: a second build, checkout or --review --write of the pin removed
    work/conflict-v<pin> (worktree remove --force) with the resolution staged in it."""
    from moves import CONFLICT

    from vllm_rbln_fork.errors import PatchDoesNotApply
    from vllm_rbln_fork.pipeline import build
    from vllm_rbln_fork.workflow import checkout

    with pytest.raises(PatchDoesNotApply):
        build(Pin.parse("1.3"), fork.spec(), fork.project)
    tree = fork.project.work_dir / "conflict-v1.3"
    gate = tree / "vllm/core/gate.py"
    gate.write_text(CONFLICT.sub("    needed = 2 * prompt_tokens + 1  # by hand\n", gate.read_text()))
    Repo(tree, bare=False).run("add", "-f", "vllm/core/gate.py", cwd=tree, in_work_tree=True)

    runs = {
        "build": lambda: build(Pin.parse("1.3"), fork.spec(), fork.project),
        "checkout": lambda: checkout(Pin.parse("1.3"), fork.spec(), fork.project, tmp_path / "co"),
        "review --write": lambda: review(Pin.parse("1.3"), fork.spec(), fork.project, write=True),
    }
    with pytest.raises(ForkError) as refused:
        runs[again]()
    message = " ".join(str(refused.value).split())
    assert f"{tree} is there" in message and f"python build.py continue --dir {tree}" in message
    assert f"rm -rf {tree}" in message
    assert "# by hand" in gate.read_text()
    assert resolutions.in_progress(tree, Repo(tree, bare=False))


def test_a_resolution_never_exported_is_named_when_it_replays_not_credited_to_rerere(
    fork: Any, publish_release: Callable[[str], None]
) -> None:
    """Bug 8: a move resolved by hand and abandoned (never exported) left its record in the
    cache; the next carry replayed it and said it came from rerere/ (the project's records)."""
    publish_release("2.3")
    series = [fork.project.series_file, *fork.project.patches_dir.glob("*.patch")]
    before = {p: p.read_bytes() for p in series}
    move_by_hand(fork, "1.3")  # resolved and carried, never exported
    shutil.rmtree(fork.project.work_dir)
    (record_id,) = [p.name for p in _rr_cache().iterdir() if (p / "postimage").is_file()]

    result = _carry_to_2_3(fork)
    assert result.carried_all and result.reused == ("vllm/core/gate.py",)
    assert result.unexported == (record_id,)
    said = " ".join(result.instructions.split())
    assert "(rerere/)" not in said and "only in this cache, never exported to rerere/" in said, said
    assert f"({record_id[:12]}:" in said and "python build.py forget <id>" in said

    # Exported, the record is the project's: the next carry credits rerere/ and names nothing.
    assert result.conflict_tree is not None
    export(result.conflict_tree, fork.project)
    for path in fork.project.patches_dir.glob("*.patch"):
        path.unlink()
    for path, data in before.items():  # 2.3 is carried from the 1.0 series again
        path.write_bytes(data)
    shutil.rmtree(fork.project.work_dir)
    again = _carry_to_2_3(fork)
    assert again.unexported == () and "(rerere/)" in again.instructions
