"""The build pipeline on the synthetic upstream: apply, carry, drop, lock, cache, reproducibility."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vllm_rbln_fork.paths import PROJECT_ROOT
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build


def _read(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode()


def test_build_on_the_exported_pin_applies_every_patch(fork, recorder) -> None:
    result = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert result.wheel.name == "vllm-1.0+rbln.1-py3-none-any.whl"
    gate = _read(result.wheel, "vllm/core/gate.py")
    assert "needed = prompt_tokens + 1" in gate and "return 16" in gate
    assert [p.name for p in result.manifest.applied] == [
        "count-one-more-slot-at-admission.patch",
        "add-rbln-padding.patch",
    ]
    inside = _read(result.wheel, "vllm/_rbln_build.py")
    assert result.manifest.upstream_commit in inside
    beside = json.loads(result.manifest_file.read_text())
    assert beside["wheel_sha256"] and beside["applied"][0]["origin"] == "backport, example/vllm#1"
    wheel_meta = _read(result.wheel, "vllm-1.0+rbln.1.dist-info/WHEEL")
    assert "Tag: py3-none-any" in wheel_meta and "Root-Is-Purelib: true" in wheel_meta


def test_carry_onto_a_pin_with_context_drift(fork) -> None:
    result = build(Pin.parse("1.1"), fork.spec(), fork.project)
    gate = _read(result.wheel, "vllm/core/gate.py")
    assert gate.startswith("import math")  # 1.1's own change survives
    assert "needed = prompt_tokens + 1" in gate and "return 16" in gate
    assert result.manifest.dropped == ()


def test_backport_already_upstream_is_dropped_and_said(fork, recorder) -> None:
    result = build(Pin.parse("1.2"), fork.spec(), fork.project)
    assert [p.name for p in result.manifest.applied] == ["add-rbln-padding.patch"]
    [dropped] = result.manifest.dropped
    assert dropped.name == "count-one-more-slot-at-admission.patch"
    assert "Applied-Upstream: 1.2" in dropped.reason
    assert any("dropped patches/count-one-more" in w for w in recorder.messages("warn"))


def test_same_pin_gives_same_upstream_commit_and_same_wheel_bytes(fork, tmp_path, monkeypatch) -> None:
    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    first_bytes = first.wheel.read_bytes()
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "other-cache"))
    second = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert not second.cached
    assert second.manifest.upstream_commit == first.manifest.upstream_commit
    assert second.wheel.read_bytes() == first_bytes


def test_the_same_sdist_gives_the_same_wheel_bytes_from_the_index_or_a_file(fork) -> None:
    # Regression (issue 15): source_kind inside the wheel made one release two byte-contents,
    # and publishing the second was refused with no new number to build instead.
    from vllm_rbln_fork.source import SourceSpec

    fetched = build(Pin.parse("1.0"), fork.spec(), fork.project, use_cache=False)
    sdist = fork.index.root / "simple" / "vllm" / "vllm-1.0.tar.gz"
    local = build(Pin.parse("1.0"), SourceSpec.parse(str(sdist), None), fork.project, use_cache=False)
    assert (fetched.manifest.source_kind, local.manifest.source_kind) == ("index", "sdist")  # beside
    assert local.manifest.wheel_sha256 == fetched.manifest.wheel_sha256
    assert "source_kind" not in _read(local.wheel, "vllm/_rbln_build.py")


def test_second_build_is_a_cache_hit(fork) -> None:
    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    second = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert second.cached and second.manifest.wheel_sha256 == first.manifest.wheel_sha256


def test_a_build_sweeps_the_pack_a_killed_import_left_even_when_it_imports_nothing(fork) -> None:
    """An import killed outright (SIGKILL, OOM) leaves its objects/pack/tmp_pack_*; the user
    runs again at once and that run (or any later one) may import nothing: a cache hit, or a
    pin already imported. Every pack writer of the cache repo runs under the build lock, so
    whoever takes it removes such a file, however young."""
    from vllm_rbln_fork.paths import upstream_repo_dir

    build(Pin.parse("1.0"), fork.spec(), fork.project)
    packs = upstream_repo_dir() / "objects" / "pack"
    left = [packs / "tmp_pack_Ab12Cd", packs / "tmp_idx_Ef34Gh"]
    for path in left:
        path.write_bytes(os.urandom(1000))  # written a moment ago: the killed import
    assert build(Pin.parse("1.0"), fork.spec(), fork.project).cached
    assert [p.exists() for p in left] == [False, False]


def test_a_hit_on_a_locked_pin_asks_neither_pip_nor_the_index(fork, monkeypatch) -> None:
    from vllm_rbln_fork import index_client
    from vllm_rbln_fork.source import SourceSpec

    first = build(Pin.parse("1.0"), fork.spec(), fork.project)  # records the pin in pins.lock

    def no_asking(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cache hit asked pip or the index")

    monkeypatch.setattr(index_client, "configured_index_url", no_asking)
    monkeypatch.setattr(index_client, "find_sdist", no_asking)
    second = build(Pin.parse("1.0"), SourceSpec.parse(None, None), fork.project)
    assert second.cached and second.manifest.wheel_sha256 == first.manifest.wheel_sha256


def _damage(path: Path) -> None:
    """Change one byte, keeping the size and the mtime (only the ctime tells)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with path.open("r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_hit_mends_a_damaged_wheel_in_dist_and_rebuilds_a_damaged_cached_one(fork, isolated_cache) -> None:
    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    good = first.wheel.read_bytes()
    build(Pin.parse("1.0"), fork.spec(), fork.project)  # a hit: the hashes are remembered now
    _damage(first.wheel)
    again = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert again.cached and again.wheel.read_bytes() == good
    (cached,) = (isolated_cache / "wheels").glob(f"*/{first.wheel.name}")
    _damage(cached)
    rebuilt = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert not rebuilt.cached and rebuilt.wheel.read_bytes() == good


BUILD_IN_A_COPY = """
import sys
from pathlib import Path
from vllm_rbln_fork.paths import PROJECT_ROOT
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.source import SourceSpec
result = build(Pin.parse("1.0"), SourceSpec("index", sys.argv[1]), Project(Path(sys.argv[2])))
print("cached" if result.cached else "built")
"""


def test_a_change_to_the_tool_code_is_not_hidden_by_a_cache_hit(fork, tmp_path) -> None:
    # Regression (issue 15, bug 3): the key named __version__, which never changes, so a fix
    # to the repack or the manifest was served the old wheel from the cache.
    copy = tmp_path / "tool"
    shutil.copytree(
        PROJECT_ROOT / "vllm_rbln_fork", copy / "vllm_rbln_fork", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(PROJECT_ROOT / "requirements", copy / "requirements")

    def run() -> str:
        args = [sys.executable, "-c", BUILD_IN_A_COPY, fork.index.url, str(fork.project.root)]
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(args, env=env, cwd=copy, check=True, capture_output=True, text=True)
        return done.stdout.split()[-1]

    assert run() == "built"
    assert run() == "cached"
    wheel_py = copy / "vllm_rbln_fork" / "wheel.py"
    wheel_py.write_text(wheel_py.read_text() + "\n# a fix to the repack\n")
    assert run() == "built"


def test_release_number_is_kept_per_tree_and_bumped_for_new_content(fork) -> None:
    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    patch = fork.project.patches_dir / "add-rbln-padding.patch"
    patch.write_text(patch.read_text().replace("+    return 16", "+    return 32"))
    second = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert (first.manifest.fork_release, second.manifest.fork_release) == (1, 2)
    patch.write_text(patch.read_text().replace("+    return 32", "+    return 16"))
    third = build(Pin.parse("1.0"), fork.spec(), fork.project, use_cache=False)
    assert third.manifest.fork_release == 1


def test_conflict_names_patch_file_hunk_and_a_tree_to_resolve_it(fork) -> None:
    from vllm_rbln_fork.errors import PatchDoesNotApply

    dist_before = sorted(fork.project.dist_dir.glob("*")) if fork.project.dist_dir.exists() else []
    with pytest.raises(PatchDoesNotApply) as err:
        build(Pin.parse("1.3"), fork.spec(), fork.project)
    message = str(err.value)
    assert "patches/count-one-more-slot-at-admission.patch" in message
    assert "vllm/core/gate.py: hunk at line" in message
    tree = fork.project.work_dir / "conflict-v1.3"
    assert str(tree) in message
    gate = (tree / "vllm/core/gate.py").read_text()
    assert "<<<<<<<" in gate and "needed = 2 * prompt_tokens" in gate
    after = sorted(fork.project.dist_dir.glob("*")) if fork.project.dist_dir.exists() else []
    assert after == dist_before


def _add_trailer(fork, name: str, trailer: str) -> None:
    patch = fork.project.patches_dir / name
    text = patch.read_text()
    origin = next(line for line in text.splitlines() if line.startswith("Origin: "))
    patch.write_text(text.replace(origin, f"{origin}\n{trailer}", 1))


def test_backport_dropped_by_its_applied_upstream_trailer(fork) -> None:
    _add_trailer(fork, "count-one-more-slot-at-admission.patch", "Applied-Upstream: 1.1")
    kept = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert len(kept.manifest.applied) == 2  # 1.0 is before the trailer's version
    result = build(Pin.parse("1.1"), fork.spec(), fork.project)
    [dropped] = result.manifest.dropped
    assert dropped.reason.startswith("Applied-Upstream: 1.1")
    gate = _read(result.wheel, "vllm/core/gate.py")
    assert "needed = prompt_tokens\n" in gate and "return 16" in gate


def test_rbln_patch_that_upstream_already_has_is_an_error(fork) -> None:
    from vllm_rbln_fork.errors import ForkError

    patch = fork.project.patches_dir / "count-one-more-slot-at-admission.patch"
    patch.write_text(patch.read_text().replace("Origin: backport, example/vllm#1", "Origin: rbln"))
    with pytest.raises(ForkError, match="never dropped silently"):
        build(Pin.parse("1.2"), fork.spec(), fork.project)


def test_git_ref_source(fork, tmp_path) -> None:
    import subprocess
    import tarfile

    from vllm_rbln_fork.source import SourceSpec

    with tarfile.open(fork.index.root / "simple/vllm/vllm-1.1.tar.gz") as tar:
        tar.extractall(tmp_path / "src", filter="data")
    repo = tmp_path / "src" / "vllm-1.1"
    git = ["git", "-c", "user.name=U", "-c", "user.email=u@e.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A", "-f"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "1.1"], cwd=repo, check=True)
    subprocess.run([*git, "tag", "v1.1"], cwd=repo, check=True)
    result = build(Pin.parse("1.1"), SourceSpec.parse(f"git+file://{repo}@v1.1", None), fork.project)
    assert result.manifest.source_kind == "git"
    assert "needed = prompt_tokens + 1" in _read(result.wheel, "vllm/core/gate.py")


def test_the_release_s_tree_built_from_a_local_tree_takes_neither_its_label_nor_its_file(
    fork, tmp_path
) -> None:
    """Issue 30: the same patched tree built from a local tree (--source DIR) got the index
    build's label and file name with other bytes (its upstream commit names the folder):
    dist/'s release wheel was replaced, and publishing it was refused with advice that could
    not be followed (the same tree always gets the same number). It gets a label of its own."""
    import tarfile

    from vllm_rbln_fork.files import sha256_of
    from vllm_rbln_fork.publish import publish
    from vllm_rbln_fork.source import SourceSpec

    release = build(Pin.parse("1.1"), fork.spec(), fork.project)
    release_bytes = release.wheel.read_bytes()
    index = tmp_path / "wheels"
    publish(release.wheel, str(index))
    with tarfile.open(fork.index.root / "simple/vllm/vllm-1.1.tar.gz") as tar:
        tar.extractall(tmp_path / "src", filter="data")
    local = build(Pin.parse("1.1"), SourceSpec.parse(str(tmp_path / "src" / "vllm-1.1"), None), fork.project)

    assert local.manifest.patched_tree == release.manifest.patched_tree
    assert local.manifest.fork_release == release.manifest.fork_release  # one tree, one number
    n, commit = release.manifest.fork_release, local.manifest.patched_commit
    assert local.wheel.name == f"vllm-1.1+rbln.{n}.tree.{commit[:12]}-py3-none-any.whl"
    assert local.manifest.wheel_sha256 != release.manifest.wheel_sha256
    assert release.wheel.read_bytes() == release_bytes  # dist/'s release wheel is untouched
    published = publish(local.wheel, str(index))  # beside the release, refused nothing
    assert not published.already_published
    assert sorted(p.name for p in (index / "files").glob("*.whl")) == sorted(
        [release.wheel.name, local.wheel.name]
    )
    assert sha256_of(index / "files" / release.wheel.name) == release.manifest.wheel_sha256


def test_the_same_local_tree_builds_again_after_a_touch_and_from_another_folder(fork, tmp_path) -> None:
    """L1: the same files given again with --source DIR, touched or copied to another folder,
    were refused ("imported before from a different source") with advice to delete the cache
    repo. They are the same source: the same upstream commit, label and wheel bytes."""
    import tarfile

    from vllm_rbln_fork.source import SourceSpec

    with tarfile.open(fork.index.root / "simple/vllm/vllm-1.1.tar.gz") as tar:
        tar.extractall(tmp_path / "src", filter="data")
    tree = tmp_path / "src" / "vllm-1.1"
    first = build(Pin.parse("1.1"), SourceSpec.parse(str(tree), None), fork.project)
    later = os.stat(tree / "PKG-INFO").st_mtime + 3600  # the newest mtime: a later epoch
    os.utime(tree / "PKG-INFO", (later, later))
    touched = build(Pin.parse("1.1"), SourceSpec.parse(str(tree), None), fork.project, use_cache=False)
    moved = shutil.copytree(tree, tmp_path / "elsewhere" / "vllm-1.1")
    elsewhere = build(Pin.parse("1.1"), SourceSpec.parse(str(moved), None), fork.project, use_cache=False)
    for again in (touched, elsewhere):
        assert again.manifest.upstream_commit == first.manifest.upstream_commit
        assert again.manifest.patched_commit == first.manifest.patched_commit
        assert again.wheel.name == first.wheel.name
        assert again.manifest.wheel_sha256 == first.manifest.wheel_sha256
