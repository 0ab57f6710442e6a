"""vllm_rbln_fork.adopting: the adoption patches are listed and applied, or refused whole.

On a tiny plugin tree made here (two files), with patches made by git as the real ones are
(`git format-patch`); the real series is checked for what it names."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_rbln_fork.adopting import ADOPTING, VLLM_RBLN, adoption_patches, apply_adoption_patches
from vllm_rbln_fork.errors import PatchDoesNotApply, SeriesError
from vllm_rbln_fork.pins import Pin


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _release(tmp_path: Path) -> tuple[Path, Path]:
    """A plugin's unpacked release, and a folder of two patches against it (with a series)."""
    src = tmp_path / "src"
    (src / "plugin").mkdir(parents=True)
    (src / "plugin" / "runner.py").write_text("copies = output.kv_cache_copy_ops\n")
    (src / "plugin" / "platform.py").write_text("scheduler_cls = 'plugin.scheduler.Scheduler'\n")
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "release")
    (src / "plugin" / "runner.py").write_text("copies = output.kv_cache_block_copies\n")
    _git(src, "commit", "-qam", "Read the copies")
    (src / "plugin" / "platform.py").write_text(
        "scheduler_cls = 'vllm.v1.core.sched.rbln_scheduler.RBLNScheduler'\n"
    )
    _git(src, "commit", "-qam", "Name the scheduler")
    patches = tmp_path / "adopting" / "plugin-1.0"
    patches.mkdir(parents=True)
    _git(src, "format-patch", "-q", "--zero-commit", "-o", str(patches), "HEAD~2")
    names = sorted(p.name for p in patches.glob("*.patch"))
    (patches / "series").write_text("# order\n" + "\n".join(names) + "\n")
    _git(src, "reset", "-q", "--hard", "HEAD~2")
    release = tmp_path / "release"
    release.mkdir()
    (release / "plugin").mkdir()
    for name in ("runner.py", "platform.py"):
        (release / "plugin" / name).write_text((src / "plugin" / name).read_text())
    return release, patches


def test_the_patches_apply_in_series_order(tmp_path: Path) -> None:
    release, patches = _release(tmp_path)
    listed = adoption_patches("plugin-1.0", root=patches.parent)
    assert [p.name for p in listed.patches] == sorted(p.name for p in patches.glob("*.patch"))
    apply_adoption_patches(release, listed)
    assert (release / "plugin" / "runner.py").read_text() == "copies = output.kv_cache_block_copies\n"
    assert "rbln_scheduler.RBLNScheduler" in (release / "plugin" / "platform.py").read_text()


def test_a_patch_that_does_not_apply_leaves_the_tree_as_it_was(tmp_path: Path) -> None:
    release, patches = _release(tmp_path)
    before = {p.name: p.read_text() for p in (release / "plugin").iterdir()}
    (release / "plugin" / "platform.py").write_text("scheduler_cls = 'something else'\n")
    before["platform.py"] = "scheduler_cls = 'something else'\n"
    listed = adoption_patches("plugin-1.0", root=patches.parent)
    with pytest.raises(
        PatchDoesNotApply,
        match=r"the adoption patch 0002-Name-the-scheduler\.patch does not apply to .*release",
    ):
        apply_adoption_patches(release, listed)
    assert {p.name: p.read_text() for p in (release / "plugin").iterdir()} == before


def test_a_patch_inside_a_checkout_applies_to_the_tree_not_the_checkout(tmp_path: Path) -> None:
    """A site-packages folder under some git work tree: git must not take that tree's root."""
    _git(tmp_path, "init", "-q")
    release, patches = _release(tmp_path / "inner")
    apply_adoption_patches(release, adoption_patches("plugin-1.0", root=patches.parent))
    assert (release / "plugin" / "runner.py").read_text() == "copies = output.kv_cache_block_copies\n"


def test_a_series_naming_a_missing_patch_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "plugin-1.0"
    folder.mkdir()
    (folder / "series").write_text("gone.patch\n")
    with pytest.raises(SeriesError, match="names gone.patch, which is not in"):
        adoption_patches("plugin-1.0", root=tmp_path)
    with pytest.raises(SeriesError, match="has no series file"):
        adoption_patches("other-1.0", root=tmp_path)


def test_the_real_series_names_its_three_patches() -> None:
    listed = adoption_patches()
    assert listed.release == VLLM_RBLN
    assert [p.name for p in listed.patches] == [
        "run-on-the-rbln-build-of-vllm-and-its-scheduler.patch",
        "port-to-vllm-0.31.0.patch",
        "port-to-vllm-0.34.0.patch",
    ]
    assert all(p.parent == ADOPTING / VLLM_RBLN for p in listed.patches)
    # The replaced scheduler goes by name (a deletion patch would carry its every line).
    assert listed.deletions == ("vllm_rbln/v1/core/rbln_scheduler.py",)
    assert all("deleted file mode" not in p.read_text() for p in listed.patches)


FIRST = "run-on-the-rbln-build-of-vllm-and-its-scheduler.patch"


@pytest.mark.parametrize(
    ("pin", "names"),
    [
        ("0.30.0", [FIRST]),
        ("0.31.0", [FIRST, "port-to-vllm-0.31.0.patch"]),
        ("0.33.0", [FIRST, "port-to-vllm-0.31.0.patch"]),
        ("0.34.0", [FIRST, "port-to-vllm-0.31.0.patch", "port-to-vllm-0.34.0.patch"]),
    ],
)
def test_the_real_series_gates_the_ports_on_the_pin(pin: str, names: list[str]) -> None:
    """vllm-rbln 0.12.0 is built for vLLM 0.30.0: its 0.31.0 port applies from 0.31.0 on only,
    its 0.34.0 port from 0.34.0 on only."""
    listed = adoption_patches(pin=Pin.parse(pin))
    assert [p.name for p in listed.patches] == names
    gates = (("port-to-vllm-0.31.0.patch", "vllm>=0.31.0"), ("port-to-vllm-0.34.0.patch", "vllm>=0.34.0"))
    assert listed.gated_off == tuple(gate for gate in gates if gate[0] not in names)
    assert (
        listed.fingerprint
        != adoption_patches(pin=Pin.parse("0.30.0" if pin != "0.30.0" else "0.31.0")).fingerprint
    )


def test_a_gated_patch_applies_only_at_the_pins_its_specifier_contains(tmp_path: Path) -> None:
    release, patches = _release(tmp_path)
    first, second = sorted(p.name for p in patches.glob("*.patch"))
    (patches / "series").write_text(f"{first}\n{second}   vllm>=0.31.0,<0.33\n")
    at_030 = adoption_patches("plugin-1.0", root=patches.parent, pin=Pin.parse("0.30.0"))
    assert [p.name for p in at_030.patches] == [first]
    assert at_030.gated_off == ((second, "vllm<0.33,>=0.31.0"),)
    apply_adoption_patches(release, at_030)
    assert "plugin.scheduler.Scheduler" in (release / "plugin" / "platform.py").read_text()
    assert [
        p.name for p in adoption_patches("plugin-1.0", root=patches.parent, pin=Pin.parse("0.32.0")).patches
    ] == [
        first,
        second,
    ]
    assert [
        p.name for p in adoption_patches("plugin-1.0", root=patches.parent, pin=Pin.parse("0.33.0")).patches
    ] == [first]
    assert len(adoption_patches("plugin-1.0", root=patches.parent).patches) == 2  # no pin: the whole series


@pytest.mark.parametrize(
    ("gate", "message"),
    [
        ("torch>=2", "a patch's gate is 'vllm<specifier>'"),
        ("vllm", "a patch's gate is"),
        ("vllm>=zero", "no PEP 440"),
    ],
)
def test_a_bad_gate_is_refused_by_name(tmp_path: Path, gate: str, message: str) -> None:
    folder = tmp_path / "plugin-1.0"
    folder.mkdir()
    (folder / "a.patch").write_text("")
    (folder / "series").write_text(f"a.patch {gate}\n")
    with pytest.raises(SeriesError, match=message):
        adoption_patches("plugin-1.0", root=tmp_path, pin=Pin.parse("0.30.0"))


def test_the_listed_deletions_go_after_the_patches(tmp_path: Path) -> None:
    release, patches = _release(tmp_path)
    (release / "plugin" / "scheduler.py").write_text("class Scheduler: ...\n")
    (patches / "deletes").write_text("# goes\nplugin/scheduler.py\n")
    apply_adoption_patches(release, adoption_patches("plugin-1.0", root=patches.parent))
    assert not (release / "plugin" / "scheduler.py").exists()
    assert (release / "plugin" / "runner.py").read_text() == "copies = output.kv_cache_block_copies\n"


def test_a_deletion_of_a_missing_file_undoes_the_patches(tmp_path: Path) -> None:
    release, patches = _release(tmp_path)
    before = {p.name: p.read_text() for p in (release / "plugin").iterdir()}
    (patches / "deletes").write_text("plugin/scheduler.py\n")
    with pytest.raises(PatchDoesNotApply, match=r"has no plugin/scheduler\.py, which plugin-1\.0's deletes"):
        apply_adoption_patches(release, adoption_patches("plugin-1.0", root=patches.parent))
    assert {p.name: p.read_text() for p in (release / "plugin").iterdir()} == before


def _tree_and_outside(tmp_path: Path) -> dict[Path, bytes]:
    """Every file under ``tmp_path`` (the release and what lies beside it), by its bytes."""
    return {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def _refused_changing_nothing(tmp_path: Path, release: Path, patches: Path, error: type, match: str) -> None:
    """Applying ``patches`` to ``release`` raises ``error`` matching ``match``, and no file
    under ``tmp_path`` (the release and what lies beside it) changed."""
    before = _tree_and_outside(tmp_path)
    with pytest.raises(error, match=match):
        apply_adoption_patches(release, adoption_patches("plugin-1.0", root=patches.parent))
    assert _tree_and_outside(tmp_path) == before


@pytest.mark.parametrize("line", ["../outside.py", "plugin/../../outside.py", "/ABS/outside.py"])
def test_a_deletion_outside_the_tree_is_refused_and_nothing_changes(tmp_path: Path, line: str) -> None:
    """AD1: a deletes line with .. or an absolute path deleted a file outside the tree."""
    release, patches = _release(tmp_path)
    outside = tmp_path / "outside.py"
    outside.write_text("keep me\n")
    (patches / "deletes").write_text(line.replace("/ABS", str(tmp_path)) + "\n")
    _refused_changing_nothing(
        tmp_path, release, patches, SeriesError, r"is not a path inside the release.*correct or drop the line"
    )


def test_a_deletion_through_a_link_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    release, patches = _release(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "outside.py").write_text("keep me\n")
    (release / "linked").symlink_to(tmp_path / "elsewhere")
    (patches / "deletes").write_text("linked/outside.py\n")
    _refused_changing_nothing(
        tmp_path,
        release,
        patches,
        PatchDoesNotApply,
        r"names linked/outside\.py, outside .*nothing was applied",
    )


def test_a_deletion_listed_twice_is_refused_before_anything_changes(tmp_path: Path) -> None:
    """AD2: a line listed twice gave a raw FileNotFoundError, the patches applied, one file gone."""
    release, patches = _release(tmp_path)
    (release / "plugin" / "scheduler.py").write_text("class Scheduler: ...\n")
    (patches / "deletes").write_text("plugin/scheduler.py\n./plugin/scheduler.py\n")
    _refused_changing_nothing(
        tmp_path, release, patches, SeriesError, r"lists 'plugin/scheduler\.py' twice .*drop one of the lines"
    )
    # Made by hand, bypassing the list's reader: the applier refuses it too, before any patch.
    (patches / "deletes").unlink()
    before = _tree_and_outside(release)
    listed = adoption_patches("plugin-1.0", root=patches.parent)
    twice = replace(listed, deletions=("plugin/scheduler.py", "plugin/scheduler.py"))
    with pytest.raises(PatchDoesNotApply, match=r"names plugin/scheduler\.py more than once: nothing was"):
        apply_adoption_patches(release, twice)
    assert _tree_and_outside(release) == before


@pytest.mark.parametrize("name", ["../elsewhere.patch", "sub/a.patch", "/ABS/elsewhere.patch"])
def test_a_series_line_naming_a_patch_outside_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    """AD3: a series line may name a patch outside its folder (``../other/x.patch``)."""
    folder = tmp_path / "adopting" / "plugin-1.0"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.patch").write_text("")
    (tmp_path / "adopting" / "elsewhere.patch").write_text("")
    (folder / "series").write_text(name.replace("/ABS", str(tmp_path / "adopting")) + "\n")
    with pytest.raises(SeriesError, match=r"which is not a file in .*by its file name alone"):
        adoption_patches("plugin-1.0", root=folder.parent)
