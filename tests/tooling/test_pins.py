"""Several supported pins from one checkout (pins.toml, series/<pin>, patches/<pin>/), and
conflict resolutions recorded once and reused (rerere/), on the synthetic upstream.

1.3 and 2.3 rewrote the backport's line the same way (GATE_1_3), so carrying the 1.0
series onto either meets the same conflict: the one a move meets at 0.32.0 and again
at 0.33.0.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from moves import RESOLVED, move_by_hand, per_pin_layout

from vllm_rbln_fork.errors import SeriesError
from vllm_rbln_fork.gitrepo import Repo
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.review import review
from vllm_rbln_fork.supported import listed_pins, series_file_for, series_pins, supported_pins
from vllm_rbln_fork.workflow import export


def test_a_resolution_recorded_at_one_pin_is_reused_at_the_next_on_a_fresh_machine(
    fork: Any, publish_release: Callable[[str], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_release("2.3")
    before = {
        p: p.read_bytes() for p in [fork.project.series_file, *fork.project.patches_dir.glob("*.patch")]
    }
    tree = move_by_hand(fork, "1.3")
    written = export(tree, fork.project).changed
    records = [w for w in written if w.startswith("rerere/")]
    assert len(records) == 1 and (fork.project.root / records[0] / "postimage").is_file()
    for path, data in before.items():  # 2.3 is carried from the 1.0 series again
        path.write_bytes(data)
    shutil.rmtree(fork.project.work_dir)

    # Without the record (the control: what the reuse saves), the move to 2.3 stops.
    kept = tmp_path / "kept-records"
    shutil.move(fork.project.rerere_dir, kept)
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "machine-2"))
    stopped = review(Pin.parse("2.3"), fork.spec(), fork.project, write=True)
    assert stopped.conflict_tree is not None and not stopped.carried_all and stopped.reused == ()
    assert "<<<<<<<" in (stopped.conflict_tree / "vllm/core/gate.py").read_text()

    # With it, on another fresh cache, every patch is carried and the file is the hand resolution.
    shutil.rmtree(stopped.conflict_tree)  # the control's tree, thrown away (a carry never removes one)
    shutil.move(kept, fork.project.rerere_dir)
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "machine-3"))
    result = review(Pin.parse("2.3"), fork.spec(), fork.project, write=True)
    assert result.carried_all and result.reused == ("vllm/core/gate.py",)
    assert result.conflict_tree is not None
    gate = (result.conflict_tree / "vllm/core/gate.py").read_text()
    assert RESOLVED in gate and "<<<<<<<" not in gate
    assert "resolved from recorded resolutions" in result.instructions
    assert result.next_commands[0].startswith("python build.py export --dir")


def _per_pin_project(fork: Any) -> None:
    """Turn the fork's one series (on 1.0) into the per-pin layout with pins 1.0 and 1.3."""
    per_pin_layout(fork, '[pin."1.0"]\ntest-lock = "test.lock"\n[pin."1.3"]\ntest-lock = "test.lock"\n')


def test_each_supported_pin_builds_its_own_series_and_other_pins_carry_the_newest(fork: Any) -> None:
    _per_pin_project(fork)
    tree = move_by_hand(fork, "1.3")
    written = export(tree, fork.project).changed
    assert "series/1.3" in written and "series/1.0" not in written
    entries = [
        line for line in (fork.project.root / "series" / "1.3").read_text().splitlines() if line[:1] != "#"
    ]
    # Both patches touch upstream's gate.py. The backport's lines were rewritten at 1.3: its own
    # form. The padding patch's only moved: the shared file applies there, and 1.3 names it.
    assert entries == ["1.3/count-one-more-slot-at-admission.patch", "add-rbln-padding.patch"]
    assert (fork.project.patches_dir / "count-one-more-slot-at-admission.patch").is_file()  # 1.0's

    for pin in ("1.0", "1.3"):
        result = build(Pin.parse(pin), fork.spec(), fork.project)
        assert result.manifest.series_exported_against == pin  # its own series: nothing carried
        assert [p.name for p in result.manifest.applied] == [
            "count-one-more-slot-at-admission.patch",
            "add-rbln-padding.patch",
        ]
    assert [str(s.pin) for s in supported_pins(fork.project)] == ["1.0", "1.3"]
    assert series_file_for(fork.project, Pin.parse("9.9")) == fork.project.root / "series" / "1.3"
    assert series_file_for(fork.project, Pin.parse("1.0")) == fork.project.root / "series" / "1.0"


DEV = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "d@x.invalid", "GIT_COMMITTER_NAME": "Dev"} | {
    "GIT_COMMITTER_EMAIL": "d@x.invalid",
    "GIT_AUTHOR_DATE": "@1700000000 +0000",
    "GIT_COMMITTER_DATE": "@1700000000 +0000",
}
LIMIT_PATCH = "add-the-rbln-limit.patch"


def _rbln_only_patch_in_both_pins(fork: Any) -> Path:
    """1.0 and 1.3 with a patch adding an RBLN-only file (like rbln_scheduler.py), one shared
    file named by both series; returns 1.3's tree."""
    _per_pin_project(fork)
    tree = move_by_hand(fork, "1.3")
    repo = Repo(tree, bare=False)
    (tree / "vllm/core/rbln_extra.py").write_text("LIMIT = 1\n")
    repo.run("add", "-A", "-f", cwd=tree, in_work_tree=True)
    message = (
        "Add the RBLN limit\n\nThe RBLN scheduler needs a limit of its own, in a file of its own.\n\n"
        "Origin: rbln\n"
    )
    repo.run("commit", "-q", "-m", message, env=DEV, cwd=tree, in_work_tree=True)
    export(tree, fork.project)
    assert (fork.project.root / "series" / "1.3").read_text().splitlines()[-1] == LIMIT_PATCH
    # 1.0 takes the same patch (a maintainer adds the line; the file is shared).
    with (fork.project.root / "series" / "1.0").open("a") as f:
        f.write(f"{LIMIT_PATCH}\n")
    return tree


def _fix_limit(fork: Any, pin: str, dest: Path) -> Path:
    from vllm_rbln_fork.workflow import checkout

    fix = checkout(Pin.parse(pin), fork.spec(), fork.project, dest)
    (fix / "vllm/core/rbln_extra.py").write_text("LIMIT = 2\n")
    Repo(fix, bare=False).run(
        "commit", "-q", "-a", "--amend", "--no-edit", env=DEV, cwd=fix, in_work_tree=True
    )
    return fix


def _limits(fork: Any) -> dict[str, str]:
    import zipfile

    limits = {}
    for pin in ("1.0", "1.3"):
        with zipfile.ZipFile(build(Pin.parse(pin), fork.spec(), fork.project).wheel) as zf:
            limits[pin] = zf.read("vllm/core/rbln_extra.py").decode()
    return limits


def test_a_fix_to_a_shared_rbln_patch_stays_at_its_pin_unless_promoted(fork: Any, tmp_path: Path) -> None:
    """A change made (and tested) at one pin never reaches another pin's build unasked: it
    is that pin's own form, and export names the pins that keep the shared file."""
    _rbln_only_patch_in_both_pins(fork)
    shared = fork.project.patches_dir / LIMIT_PATCH
    before = shared.read_text()
    result = export(_fix_limit(fork, "1.0", tmp_path / "fix"), fork.project)
    assert result.changed == [f"patches/1.0/{LIMIT_PATCH}", "series/1.0"]
    assert result.kept_own == {LIMIT_PATCH: [Pin.parse("1.3")]} and result.promoted == {}
    assert shared.read_text() == before
    assert _limits(fork) == {"1.0": "LIMIT = 2\n", "1.3": "LIMIT = 1\n"}


def test_a_promoted_fix_to_a_shared_rbln_patch_is_made_once_for_every_pin(fork: Any, tmp_path: Path) -> None:
    """With --promote the shared file changes, for every pin whose series names it, and
    export names those pins to be tested again."""
    _rbln_only_patch_in_both_pins(fork)
    result = export(_fix_limit(fork, "1.0", tmp_path / "fix"), fork.project, promote=True)
    assert result.changed == [f"patches/{LIMIT_PATCH}"]  # one file, for both pins
    assert result.promoted == {LIMIT_PATCH: [Pin.parse("1.3")]} and result.kept_own == {}
    assert _limits(fork) == {"1.0": "LIMIT = 2\n", "1.3": "LIMIT = 2\n"}


def test_promoting_from_a_pin_not_in_pins_toml_is_refused_and_writes_nothing(fork: Any) -> None:
    from vllm_rbln_fork.errors import ForkError

    tree = _rbln_only_patch_in_both_pins(fork)
    (fork.project.root / "pins.toml").write_text(
        '[pin."1.0"]\ntest-lock = "test.lock"\n[pin."1.3"]\nstatus = "moving"\n'  # 1.3: a move
    )
    (tree / "vllm/core/rbln_extra.py").write_text("LIMIT = 3\n")
    Repo(tree, bare=False).run(
        "commit", "-q", "-a", "--amend", "--no-edit", env=DEV, cwd=tree, in_work_tree=True
    )
    files = {
        p: p.read_bytes()
        for p in [*fork.project.patches_dir.rglob("*.patch"), *fork.project.series_dir.iterdir()]
    }
    with pytest.raises(ForkError, match=r"1\.3 is not supported in pins\.toml.*Export without --promote"):
        export(tree, fork.project, promote=True)
    assert {p: p.read_bytes() for p in files} == files
    assert sorted(fork.project.patches_dir.rglob("*.patch")) == sorted(
        p for p in files if p.suffix == ".patch"
    )
    # Without --promote the change stays 1.3's own form.
    assert export(tree, fork.project).changed == [f"patches/1.3/{LIMIT_PATCH}", "series/1.3"]


def test_a_file_in_series_that_is_not_a_pin_is_ignored(fork: Any) -> None:
    series_dir = fork.project.series_dir
    series_dir.unlink()  # the fixture's single-series project: series is a file, not series/<pin>
    series_dir.mkdir()
    (series_dir / "1.0").write_text("# a pin's series\n")
    (series_dir / "1.0~").write_text("# an editor's backup\n")
    (series_dir / "README").write_text("notes\n")
    assert series_pins(fork.project) == [Pin.parse("1.0")]


def test_a_series_of_a_pin_that_pins_toml_does_not_list_is_an_error_not_used(fork: Any) -> None:
    """A series/<pin> left from an abandoned move must not beat carrying the newest series."""
    _per_pin_project(fork)
    (fork.project.root / "series" / "1.3").unlink(missing_ok=True)
    stray = fork.project.root / "series" / "1.2"
    stray.write_text((fork.project.root / "series" / "1.0").read_text())
    with pytest.raises(
        SeriesError, match=r"series/1\.2 exists, but pins\.toml does not list vllm 1\.2"
    ) as err:
        series_file_for(fork.project, Pin.parse("1.2"))
    assert 'status = "moving"' in str(err.value) and "delete series/1.2" in str(err.value)
    with pytest.raises(SeriesError, match=r"series/1\.2 exists"):
        build(Pin.parse("1.2"), fork.spec(), fork.project)

    # The way out, either: mark the move ...
    pins_toml = fork.project.root / "pins.toml"
    pins_toml.write_text(pins_toml.read_text() + '[pin."1.2"]\nstatus = "moving"\n')
    assert series_file_for(fork.project, Pin.parse("1.2")) == stray
    assert [str(s.pin) for s in supported_pins(fork.project)] == [
        "1.0",
        "1.3",
    ]  # a move is not tested by default
    # ... or drop the abandoned series: 1.2 carries the newest supported series.
    stray.unlink()
    assert series_file_for(fork.project, Pin.parse("1.2")) == fork.project.root / "series" / "1.0"


def test_a_move_is_marked_in_pins_toml_before_export_writes_its_series(fork: Any) -> None:
    _per_pin_project(fork)
    pins_toml = fork.project.root / "pins.toml"
    pins_toml.write_text('[pin."1.0"]\ntest-lock = "test.lock"\n')  # 1.3 not listed yet
    tree = move_by_hand(fork, "1.3")
    with pytest.raises(SeriesError, match=r'does not list vllm 1\.3.*\[pin\."1\.3"\] with status = "moving"'):
        export(tree, fork.project)
    assert not (fork.project.root / "series" / "1.3").exists()  # nothing written, the tree kept
    pins_toml.write_text(pins_toml.read_text() + '[pin."1.3"]\nstatus = "moving"\n')
    assert "series/1.3" in export(tree, fork.project).changed
    assert build(Pin.parse("1.3"), fork.spec(), fork.project).manifest.series_exported_against == "1.3"
    moving = {str(s.pin): s for s in listed_pins(fork.project)}["1.3"]
    assert (
        moving.status == "moving" and moving.test_lock == fork.project.root / "test.lock"
    )  # the newest supported's


PADDING_PATCH = "add-rbln-padding.patch"


def _fix_padding_at_1_0(fork: Any, dest: Path) -> Path:
    """1.0 and 1.1 supported, both naming the shared patches (on upstream's gate.py); a fix to
    the padding patch checked out and committed at 1.0."""
    from vllm_rbln_fork.workflow import checkout

    _per_pin_project(fork)
    root = fork.project.root
    (root / "series" / "1.1").write_text((root / "series" / "1.0").read_text().replace("1.0", "1.1"))
    (root / "pins.toml").write_text(
        '[pin."1.0"]\ntest-lock = "test.lock"\n[pin."1.1"]\ntest-lock = "test.lock"\n'
    )
    fix = checkout(Pin.parse("1.0"), fork.spec(), fork.project, dest)
    gate = fix / "vllm/core/gate.py"
    gate.write_text(gate.read_text() + "\n# padded\n")
    Repo(fix, bare=False).run(
        "commit", "-q", "-a", "--amend", "--no-edit", env=DEV, cwd=fix, in_work_tree=True
    )
    return fix


def test_promote_of_a_patch_on_upstream_files_writes_the_shared_file_where_every_pin_builds_it(
    fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--promote of a fix to the padding patch (on upstream's gate.py) at 1.0: 1.1, whose series
    names the shared file, builds it (merged from 1.0, its home, where it does not apply as it
    stands), so the shared file is rewritten, export names 1.1 to be tested, and 1.1 has it."""
    from vllm_rbln_fork.workflow import checkout

    fix = _fix_padding_at_1_0(fork, tmp_path / "fix")
    build(Pin.parse("1.1"), fork.spec(), fork.project)  # the maintainer's cache has 1.1
    rc, out = _export_cli(fork, fix, monkeypatch, capsys, "--promote")
    assert rc == 0 and "not promoted" not in out, out
    assert f"promoted patches/{PADDING_PATCH}: also in the series of 1.1" in out, out
    shared = (fork.project.patches_dir / PADDING_PATCH).read_text()
    assert "# padded" in shared and "\nExported-Against: vllm 1.0\n" in shared
    assert not (fork.project.patches_dir / "1.0").exists()
    at_1_1 = checkout(Pin.parse("1.1"), fork.spec(), fork.project, tmp_path / "at-1.1")
    assert (at_1_1 / "vllm/core/gate.py").read_text().endswith("\n# padded\n")


def test_promote_of_a_patch_on_upstream_files_that_would_not_build_at_another_pin_loses_nothing(
    fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fix at 1.0 to the line of gate.py that upstream rewrote at 1.1 (its docstring) would not
    merge there: --promote keeps it as 1.0's own form, says why and what to do, and 1.1 keeps
    building the shared file."""
    fix = _fix_padding_at_1_0(fork, tmp_path / "fix")
    gate = fix / "vllm/core/gate.py"
    gate.write_text(gate.read_text().replace("if its prompt fits", "if its prompt fits, padded"))
    Repo(fix, bare=False).run(
        "commit", "-q", "-a", "--amend", "--no-edit", env=DEV, cwd=fix, in_work_tree=True
    )
    build(Pin.parse("1.1"), fork.spec(), fork.project)
    shared = fork.project.patches_dir / PADDING_PATCH
    before = shared.read_text()
    rc, out = _export_cli(fork, fix, monkeypatch, capsys, "--promote")
    assert rc == 1, out
    assert f"not promoted {PADDING_PATCH}: it would not build at vllm 1.1" in out, out
    assert "conflicts in vllm/core/gate.py" in out and "python build.py checkout --pin 1.1" in out
    assert f"own form (patches/1.0/{PADDING_PATCH}); 1.1 still builds the shared" in out
    assert shared.read_text() == before  # 1.1 still builds the shared file
    own = fork.project.patches_dir / "1.0" / PADDING_PATCH
    assert "padded" in own.read_text()  # the change is kept, as 1.0's own form
    assert f"1.0/{PADDING_PATCH}" in (fork.project.root / "series" / "1.0").read_text()

    # Asked again (the own form already written, unchanged): nothing changed at this pin, so
    # nothing is "not promoted" (an own form on upstream files is a pin's normal state).
    result = export(fix, fork.project, promote=True)
    assert result.changed == [] and result.promoted == {} and result.cannot_promote == {}
    # Without --promote, the own form already written and unchanged: nothing new to say.
    assert export(fix, fork.project).kept_own == {}


def _export_cli(
    fork: Any, tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    from vllm_rbln_fork import cli
    from vllm_rbln_fork.project import Project

    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    rc = cli.main(["export", "--dir", str(tree), *args])
    captured = capsys.readouterr()
    return rc, " ".join((captured.out + captured.err).split())


def test_promote_at_a_pin_with_own_forms_promotes_and_says_nothing_of_the_untouched_ones(
    fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """1.3 has its own form of the backport on gate.py (from its move); a fix to the shared
    RBLN-only patch made there is promoted, and the untouched own form is not "not promoted"."""
    _rbln_only_patch_in_both_pins(fork)
    own = sorted(p.name for p in (fork.project.patches_dir / "1.3").iterdir())
    assert own == ["count-one-more-slot-at-admission.patch"]
    rc, out = _export_cli(fork, _fix_limit(fork, "1.3", tmp_path / "fix"), monkeypatch, capsys, "--promote")
    assert "not promoted" not in out and rc == 0, out
    assert f"promoted patches/{LIMIT_PATCH}: also in the series of 1.0" in out
    assert _limits(fork) == {"1.0": "LIMIT = 2\n", "1.3": "LIMIT = 2\n"}

    # An untouched checkout of 1.3, asked to promote: nothing to promote, and it says so.
    shutil.rmtree(tmp_path / "fix")
    from vllm_rbln_fork.workflow import checkout

    again = checkout(Pin.parse("1.3"), fork.spec(), fork.project, tmp_path / "again")
    rc, out = _export_cli(fork, again, monkeypatch, capsys, "--promote")
    assert rc == 0 and "not promoted" not in out, out
    assert "patches/ and series are unchanged" in out and "nothing to promote" in out


def test_a_change_at_one_pin_to_a_patch_other_pins_share_is_said_without_promote(
    fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/patch-workflow.md: a changed patch other pins name is this pin's own form, and
    "Export says so and names those pins", --promote or not."""
    fix = _fix_padding_at_1_0(fork, tmp_path / "fix")
    rc, out = _export_cli(fork, fix, monkeypatch, capsys)
    assert rc == 0, out
    assert f"wrote patches/1.0/{PADDING_PATCH}" in out
    assert f"note {PADDING_PATCH} changed at this pin only: 1.1 still builds the shared" in out, out
    assert "export again with --promote" in out and "python build.py checkout --pin 1.1" in out
    # Exported again, unchanged: nothing new to say.
    rc, out = _export_cli(fork, fix, monkeypatch, capsys)
    assert rc == 0 and "note" not in out and "patches/ and series are unchanged" in out, out


def _moved_to_1_1(fork: Any, tmp_path: Path) -> Path:
    """lab2: 1.0 supported, a move to 1.1 marked, and 1.1 checked out (the 1.0 series carried
    by a plain 3-way merge: the backport's context changed, the padding patch's only moved)."""
    from vllm_rbln_fork.workflow import checkout

    _per_pin_project(fork)
    (fork.project.root / "pins.toml").write_text(
        '[pin."1.0"]\ntest-lock = "test.lock"\n[pin."1.1"]\nstatus = "moving"\n'
    )
    return checkout(Pin.parse("1.1"), fork.spec(), fork.project, tmp_path / "move")


def _entries(fork: Any, pin: str) -> list[str]:
    text = (fork.project.root / "series" / pin).read_text()
    return [line for line in text.splitlines() if line[:1] != "#"]


def test_a_move_writes_no_own_form_where_only_the_context_changed(fork: Any, tmp_path: Path) -> None:
    """lab2's move to 1.1: the padding patch only moved, the backport's context changed (its
    changed lines did not). 1.1 builds both shared files, no copy of either: the backport does
    not apply there as it stands and is merged from 1.0, its home, into the very tree the
    carry made."""
    move = _moved_to_1_1(fork, tmp_path)
    carried = Repo(move, bare=False).tree_of("HEAD")
    result = export(move, fork.project)
    assert _entries(fork, "1.1") == ["count-one-more-slot-at-admission.patch", PADDING_PATCH]
    assert not (fork.project.patches_dir / "1.1").exists()
    assert result.kept_own == {} and result.redundant == {}
    built = build(Pin.parse("1.1"), fork.spec(), fork.project)
    assert built.manifest.patched_tree == carried
    assert [p.name for p in built.manifest.applied] == [
        "count-one-more-slot-at-admission.patch",
        PADDING_PATCH,
    ]


def test_a_pin_retired_before_its_shared_patches_are_rehomed_is_a_clear_error(
    fork: Any, tmp_path: Path
) -> None:
    """1.1 merges the backport from 1.0; 1.0's series deleted without --rehome leaves nothing to
    merge from. The build says which patch, why, and the way out, and writes no dist/."""
    from vllm_rbln_fork.errors import PatchDoesNotApply

    export(_moved_to_1_1(fork, tmp_path), fork.project)
    (fork.project.root / "pins.toml").write_text('[pin."1.1"]\ntest-lock = "test.lock"\n')
    (fork.project.root / "series" / "1.0").unlink()
    dist = fork.project.root / "dist"
    before = sorted(dist.rglob("*")) if dist.exists() else []
    with pytest.raises(PatchDoesNotApply) as raised:
        build(Pin.parse("1.1"), fork.spec(), fork.project)
    message = " ".join(str(raised.value).split())
    assert "patches/count-one-more-slot-at-admission.patch does not apply as it stands" in message
    assert "there is no series/1.0 to build it from" in message and "--rehome" in message
    assert (sorted(dist.rglob("*")) if dist.exists() else []) == before


def test_export_removes_a_pin_s_own_form_that_the_shared_patch_makes_redundant_and_says_so(
    fork: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An own form equal to the shared patch but for hunk headers (left by an older export)
    goes at the next export of the pin, which says so; the pin then builds the same tree."""
    from vllm_rbln_fork.workflow import FORMAT_PATCH

    move = _moved_to_1_1(fork, tmp_path)
    export(move, fork.project)
    repo = Repo(move, bare=False)
    own = fork.project.patches_dir / "1.1" / PADDING_PATCH
    own.parent.mkdir()
    own.write_text(repo.run(*FORMAT_PATCH, "HEAD", strip=False)[1])  # 1.1's rendering of it
    assert own.read_text() != (fork.project.patches_dir / PADDING_PATCH).read_text()
    series = fork.project.root / "series" / "1.1"
    series.write_text(series.read_text().replace(f"\n{PADDING_PATCH}", f"\n1.1/{PADDING_PATCH}"))
    before = build(Pin.parse("1.1"), fork.spec(), fork.project).manifest

    rc, out = _export_cli(fork, move, monkeypatch, capsys)
    assert rc == 0, out
    assert f"redundant patches/1.1/{PADDING_PATCH}" in out and "removed" in out, out
    assert f"1.1 builds the shared patches/{PADDING_PATCH}" in out, out
    assert not own.exists() and _entries(fork, "1.1")[-1] == PADDING_PATCH
    after = build(Pin.parse("1.1"), fork.spec(), fork.project).manifest
    assert after.patched_tree == before.patched_tree


def test_an_equal_spelling_of_a_known_pin_builds_that_pin(fork, recorder) -> None:
    """--pin 1.0.0 and --pin 1 are vllm 1.0 (PEP 440): one lock entry, one ledger, one name."""
    import tomllib

    from vllm_rbln_fork.pipeline import build

    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    for spelling in ("1.0.0", "1"):
        again = build(Pin.parse(spelling), fork.spec(), fork.project)
        assert again.cached and again.wheel == first.wheel and again.manifest.pin == "1.0"
    assert list(tomllib.loads(fork.project.pins_lock.read_text())["vllm"]) == ["1.0"]
    releases = tomllib.loads(fork.project.releases_file.read_text())["release"]
    assert {r["pin"] for r in releases} == {"1.0"}
    assert any("--pin 1.0.0 is vllm 1.0" in m for m in recorder.messages("info"))


def test_a_new_pin_spelled_otherwise_than_its_sdist_is_refused(fork) -> None:
    from vllm_rbln_fork.errors import BadPin
    from vllm_rbln_fork.pipeline import build

    lock = fork.project.pins_lock.read_text()
    with pytest.raises(BadPin, match=r"--pin 1\.1\.0: vLLM spells this release 1\.1 .*Give --pin 1\.1"):
        build(Pin.parse("1.1.0"), fork.spec(), fork.project)
    assert fork.project.pins_lock.read_text() == lock
    assert not fork.project.dist_dir.exists() or not list(fork.project.dist_dir.iterdir())


BACKPORT = "count-one-more-slot-at-admission.patch"


def test_a_change_at_the_home_pin_without_promote_leaves_the_pins_merging_it_as_they_were(
    fork: Any, tmp_path: Path
) -> None:
    """1.1 merges the backport from 1.0, its home. A change to it made at 1.0 and exported
    without --promote is 1.0's own form; 1.1 goes on building the shared file, merged from
    1.0's series up to it, to the very tree it built before (a hostile review: 1.1 had
    nothing left to merge from, and every way out the message named failed too)."""
    from vllm_rbln_fork.workflow import checkout

    export(_moved_to_1_1(fork, tmp_path), fork.project)
    (fork.project.root / "pins.toml").write_text(
        '[pin."1.0"]\ntest-lock = "test.lock"\n[pin."1.1"]\ntest-lock = "test.lock"\n'
    )
    before = build(Pin.parse("1.1"), fork.spec(), fork.project).manifest.patched_tree
    fix = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "fix")
    repo = Repo(fix, bare=False)
    padding = repo.out("rev-parse", "HEAD").strip()
    repo.run("reset", "-q", "--hard", "HEAD~1", cwd=fix, in_work_tree=True)
    gate = fix / "vllm/core/gate.py"
    gate.write_text(gate.read_text().replace("prompt_tokens + 1", "prompt_tokens + 2"))
    repo.run("commit", "-q", "-a", "--amend", "--no-edit", env=DEV, cwd=fix, in_work_tree=True)
    repo.run("cherry-pick", padding, env=DEV, cwd=fix, in_work_tree=True)
    result = export(fix, fork.project)
    assert list(result.kept_own) == [BACKPORT] and f"patches/1.0/{BACKPORT}" in result.changed
    after = build(Pin.parse("1.1"), fork.spec(), fork.project, use_cache=False).manifest.patched_tree
    assert after == before
    at_1_0 = checkout(Pin.parse("1.0"), fork.spec(), fork.project, tmp_path / "at-1.0")
    assert "prompt_tokens + 2" in (at_1_0 / "vllm/core/gate.py").read_text()


def test_a_home_that_does_not_build_says_so_each_time_it_is_asked(fork: Any, tmp_path: Path) -> None:
    """A home whose series no longer builds (its padding patch damaged by hand): merging from
    it says, each time, that committing the home failed and why (a hostile review: the second
    ask said the merge needed itself, and pointed at retiring a pin)."""
    from vllm_rbln_fork.errors import PatchDoesNotApply

    export(_moved_to_1_1(fork, tmp_path), fork.project)
    (fork.project.root / "pins.toml").write_text(
        '[pin."1.0"]\ntest-lock = "test.lock"\n[pin."1.1"]\ntest-lock = "test.lock"\n'
    )
    padding = fork.project.patches_dir / PADDING_PATCH
    backport = fork.project.patches_dir / BACKPORT
    # The backport stays; the 1.0 series breaks before it: the padding patch moved first.
    series_1_0 = fork.project.root / "series" / "1.0"
    series_1_0.write_text(
        series_1_0.read_text().replace(f"{BACKPORT}\n{PADDING_PATCH}\n", f"{PADDING_PATCH}\n{BACKPORT}\n")
    )
    damaged = padding.read_text().replace("\n-    return 0\n", "\n-    return 7\n")
    assert damaged != padding.read_text()
    padding.write_text(damaged)
    assert backport.is_file()
    for _ in range(2):
        with pytest.raises(
            PatchDoesNotApply,
            match=rf"while committing series/1\.0 on vllm 1\.0 to merge patches/{BACKPORT} from: "
            rf"patches/{PADDING_PATCH} does not apply to vllm 1\.0",
        ):
            build(Pin.parse("1.1"), fork.spec(), fork.project, use_cache=False)
