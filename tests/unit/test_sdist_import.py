"""The one-pass sdist import: the files it writes, the tree it streams into git (the same
tree ``git add --all`` of those files gives), and the patched tree written over it."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from vllm_rbln_fork.apply import checkout_into, materialize
from vllm_rbln_fork.errors import UnsafeSource
from vllm_rbln_fork.gitrepo import IDENTITY, Identity, Repo
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.source import unpack_sdist
from vllm_rbln_fork.upstream import import_tree, record_import, tree_import

MEMBERS: list[tuple[str, bytes | None, int]] = [  # (name, bytes or None for a directory, mode)
    ("vllm-1.0", None, 0o755),
    ("vllm-1.0/setup.py", b"print('setup')\n", 0o644),
    ("vllm-1.0/tools/run.sh", b"#!/bin/sh\necho hi\n", 0o775),
    ("vllm-1.0/vllm/a file with spaces.py", b"x = 1\n", 0o664),
    ("vllm-1.0/vllm/\u00fcnicode.py", b"y = 2\n", 0o644),
    ("vllm-1.0/vllm/empty.py", b"", 0o644),
    ("vllm-1.0/vllm/twice.py", b"first\n", 0o644),
    ("vllm-1.0/vllm/twice.py", b"second, the one tar keeps\n", 0o644),
    ("vllm-1.0/./vllm/dotted.py", b"z = 3\n", 0o644),
]


def _sdist(path: Path, members: list[tuple[str, bytes | None, int]], mtime: int = 1_700_000_000) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for i, (name, data, mode) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, mtime + i
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _files(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), os.access(p, os.X_OK))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_streamed_tree_is_the_tree_git_add_makes_of_the_same_files(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo.git")
    sdist = _sdist(tmp_path / "vllm-1.0.tar.gz", MEMBERS)
    with tree_import(repo) as (importer, tree):
        top, epoch = unpack_sdist(sdist, tmp_path / "src", importer.add)
    assert top == tmp_path / "src" / "vllm-1.0" and epoch == 1_700_000_000 + len(MEMBERS) - 1
    assert _files(top)["vllm/twice.py"] == (b"second, the one tar keeps\n", False)
    assert _files(top)["tools/run.sh"][1] and not _files(top)["setup.py"][1]
    added = import_tree(repo, Pin.parse("1.0"), top, epoch, "a tree", tmp_path / "index", canonical=False)
    assert tree[0] == repo.tree_of(added.commit)
    assert repo.out("for-each-ref", "refs/rbln-import") == ""  # the scratch ref is gone


def test_a_link_in_an_sdist_is_refused_and_nothing_is_imported(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo.git")
    sdist = tmp_path / "vllm-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo("vllm-1.0/setup.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
        link = tarfile.TarInfo("vllm-1.0/link")
        link.type, link.linkname = tarfile.SYMTYPE, "setup.py"
        tar.addfile(link)
    with pytest.raises(UnsafeSource, match="a link or special file"), tree_import(repo) as (importer, _):
        unpack_sdist(sdist, tmp_path / "src", importer.add)
    assert repo.out("for-each-ref") == ""


def test_materialize_writes_what_the_series_changed_as_a_checkout_would(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo.git")
    sdist = _sdist(tmp_path / "vllm-1.0.tar.gz", MEMBERS)
    with tree_import(repo) as (importer, tree):
        top, epoch = unpack_sdist(sdist, tmp_path / "src", importer.add)
    upstream = record_import(repo, Pin.parse("1.0"), tree[0], epoch, "test", canonical=True)
    # The patched commit: one file changed, one deleted, one added executable, one made executable.
    work = tmp_path / "work"
    checkout_into(repo, upstream.commit, work, tmp_path / "index-work")
    (work / "setup.py").write_text("print('patched')\n")
    (work / "vllm" / "empty.py").unlink()
    (work / "vllm" / "new").mkdir()
    (work / "vllm" / "new" / "tool.sh").write_text("#!/bin/sh\n")
    (work / "vllm" / "new" / "tool.sh").chmod(0o755)
    (work / "vllm" / "dotted.py").chmod(0o755)
    env = {"GIT_WORK_TREE": str(work), "GIT_INDEX_FILE": str(tmp_path / "index-work")}
    repo.run("add", "--all", ".", env=env, cwd=work)
    patched_tree = repo.out("write-tree", env=env).strip()
    head = repo.commit_tree(patched_tree, [upstream.commit], "patch\n", Identity(*IDENTITY, date="@0 +0000"))
    materialize(repo, top, upstream.commit, head)
    assert _files(top) == _files(work)


def test_an_interrupted_import_leaves_no_unfinished_pack(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo.git")
    members: list[tuple[str, bytes | None, int]] = [
        (f"vllm-1.0/vllm/m{i}.py", os.urandom(50_000), 0o644) for i in range(40)
    ]
    whole = _sdist(tmp_path / "whole.tar.gz", members).read_bytes()
    truncated = tmp_path / "vllm-1.0.tar.gz"
    truncated.write_bytes(whole[: len(whole) * 3 // 4])
    with pytest.raises(UnsafeSource, match="truncated or corrupt"), tree_import(repo) as (importer, _):
        unpack_sdist(truncated, tmp_path / "src", importer.add)
    assert list((repo.git_dir / "objects" / "pack").glob("tmp_*")) == []
    assert repo.out("for-each-ref") == ""


def _dirs(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir())


def test_materialize_turns_a_directory_into_a_file_and_a_file_into_a_directory(tmp_path: Path) -> None:
    """The series replaces a package by a module (vllm/pkg/ -> vllm/pkg) and a module by a
    package (vllm/mod -> vllm/mod/__init__.py), and deletes the only file of a directory: the
    tree is then the one a checkout writes (no raw IsADirectoryError, no empty directory)."""
    members: list[tuple[str, bytes | None, int]] = [
        ("vllm-1.0/setup.py", b"print('setup')\n", 0o644),
        ("vllm-1.0/vllm/pkg/__init__.py", b"", 0o644),
        ("vllm-1.0/vllm/pkg/deep/inner.py", b"a = 1\n", 0o644),
        ("vllm-1.0/vllm/mod", b"b = 2\n", 0o644),
        ("vllm-1.0/vllm/gone/only.py", b"c = 3\n", 0o644),
    ]
    repo = Repo(tmp_path / "repo.git")
    with tree_import(repo) as (importer, tree):
        top, epoch = unpack_sdist(
            _sdist(tmp_path / "vllm-1.0.tar.gz", members), tmp_path / "src", importer.add
        )
    upstream = record_import(repo, Pin.parse("1.0"), tree[0], epoch, "test", canonical=True)
    work = tmp_path / "work"
    checkout_into(repo, upstream.commit, work, tmp_path / "index-work")
    import shutil

    shutil.rmtree(work / "vllm" / "pkg")
    (work / "vllm" / "pkg").write_text("now a module\n")
    (work / "vllm" / "mod").unlink()
    (work / "vllm" / "mod").mkdir()
    (work / "vllm" / "mod" / "__init__.py").write_text("now a package\n")
    shutil.rmtree(work / "vllm" / "gone")
    env = {"GIT_WORK_TREE": str(work), "GIT_INDEX_FILE": str(tmp_path / "index-work")}
    repo.run("add", "--all", ".", env=env, cwd=work)
    head = repo.commit_tree(
        repo.out("write-tree", env=env).strip(),
        [upstream.commit],
        "patch\n",
        Identity(*IDENTITY, date="@0 +0000"),
    )
    materialize(repo, top, upstream.commit, head)
    assert _files(top) == _files(work)
    assert _dirs(top) == _dirs(work)
    # And back again (a tree written by the other direction).
    materialize(repo, top, head, upstream.commit)
    fresh = tmp_path / "fresh"
    checkout_into(repo, upstream.commit, fresh, tmp_path / "index-fresh")
    assert _files(top) == _files(fresh) and _dirs(top) == _dirs(fresh)


def test_the_build_lock_sweeps_the_unfinished_packs_a_killed_import_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast-import killed outright (SIGKILL, a lost machine) cannot remove its tmp_pack_*
    file. Every pack writer of the cache repo runs under the build lock, so whoever takes it
    removes them, however young; an import then goes on as usual."""
    from vllm_rbln_fork.paths import upstream_repo_dir
    from vllm_rbln_fork.pipeline import build_lock

    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "cache"))
    repo = Repo(upstream_repo_dir())
    packs = repo.git_dir / "objects" / "pack"
    packs.mkdir(parents=True, exist_ok=True)
    left = [packs / "tmp_pack_Ab12Cd", packs / "tmp_idx_Ef34Gh"]
    for path in left:
        path.write_bytes(os.urandom(1000))

    with build_lock():
        assert [p.exists() for p in left] == [False, False]
        with tree_import(repo) as (importer, tree):
            unpack_sdist(_sdist(tmp_path / "vllm-1.0.tar.gz", MEMBERS), tmp_path / "src", importer.add)
    assert tree[0]  # the import itself went on
