"""Each pin becomes one deterministic commit in the shared cache repo.

The commit has no parent, a fixed author/committer and the source's own epoch as
its date, so the same pin gives the same commit id on every machine. Canonical
sources (the released sdist) are tagged ``upstream/v<pin>``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .errors import ForkError
from .gitrepo import IDENTITY, Identity, Repo
from .pins import Pin


@dataclass(frozen=True)
class Upstream:
    pin: Pin
    label: str  # "v0.31.0", or "v0.31.0-src.<tree>" for a non-canonical source
    commit: str
    epoch: int

    @property
    def tag(self) -> str:
        return f"upstream/{self.label}"

    @property
    def branch(self) -> str:
        return f"rbln/{self.label}"


def find(repo: Repo, pin: Pin) -> Upstream | None:
    """The canonical upstream commit of ``pin``, if it was imported before."""
    label = f"v{pin}"
    commit = repo.resolve(f"refs/tags/upstream/{label}")
    if commit is None:
        return None
    epoch = int(repo.out("log", "-1", "--format=%ct", commit).strip())
    return Upstream(pin, label, commit, epoch)


class TreeImport:
    """Files streamed into ``git fast-import`` as they are read: one pack, no loose
    objects, no second read of the files from disk (a pin's sdist is some 7,400 files).
    Used as ``unpack_sdist``'s sink; :meth:`tree` gives the tree id ``git add --all`` of
    the same files would give (same paths, bytes and modes)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.files: dict[str, tuple[int, int]] = {}  # path -> (mode, mark)

    def add(self, path: str, mode: int, data: bytes) -> None:
        mark = len(self.files) + 1 if path not in self.files else self.files[path][1]
        self.stream.write(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)))
        self.stream.write(data)
        self.stream.write(b"\n")
        self.files[path] = (mode, mark)

    def finish(self, ref: str) -> None:
        """Commit the files to ``ref`` (a scratch ref: the caller reads the tree and
        deletes it) and end the stream."""
        lines = [f"commit {ref}", "committer import <import> 0 +0000", "data 0"]
        for path, (mode, mark) in sorted(self.files.items()):
            lines.append(f"M {'100755' if mode & 0o100 else '100644'} :{mark} {_quoted(path)}")
        self.stream.write(("\n".join(lines) + "\n\ndone\n").encode("utf-8", "surrogateescape"))


def _quoted(path: str) -> str:
    """A path as fast-import reads it: C-style quoted if it needs to be."""
    if "\n" not in path and not path.startswith('"'):
        return path
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@contextmanager
def tree_import(repo: Repo) -> Iterator[tuple[TreeImport, list[str]]]:
    """A :class:`TreeImport` to feed; after the block, the list holds the tree's id. If the
    block raises, the import is abandoned: no ref points at anything of it. Called under the
    build lock (``pipeline.prepare``), which sweeps the temporary packs that imports killed
    outright left (``pipeline.build_lock``)."""
    ref = f"refs/rbln-import/{os.getpid()}"
    result: list[str] = []
    # No deltas (--depth=0) and no zlib (pack.compression=0): a third of the CPU of the
    # defaults, for a pack of 115 MB against 45 MB for 0.31.0 (the loose objects this
    # replaces were uncompressed too: core.looseCompression=0).
    args = ("-c", "pack.compression=0", "fast-import", "--depth=0", "--quiet", "--done", "--force")
    with repo.feed(*args) as stream:
        importer = TreeImport(stream)
        yield importer, result
        importer.finish(ref)
    result.append(repo.tree_of(ref))
    repo.run("update-ref", "-d", ref)


def record_import(repo: Repo, pin: Pin, tree: str, epoch: int, origin: str, canonical: bool) -> Upstream:
    """Commit ``tree`` as ``pin``'s upstream commit (fixed identity, the source's epoch as its
    date: the same commit id on every machine) and tag it."""
    identity = Identity(*IDENTITY, date=f"@{epoch} +0000")
    message = f"vLLM {pin}\n\nImported from {origin}.\n"
    commit = repo.commit_tree(tree, [], message, identity)
    label = f"v{pin}" if canonical else f"v{pin}-src.{tree[:12]}"
    tag = f"refs/tags/upstream/{label}"
    existing = repo.resolve(tag)
    if existing is not None and existing != commit and not canonical and repo.tree_of(existing) == tree:
        # A local tree or a git ref is labelled by its tree: the same files imported before, from
        # another folder or ref or with other mtimes, are that source, and keep its commit (its
        # date and origin are the first import's), so the tree keeps one upstream commit.
        epoch = int(repo.out("log", "-1", "--format=%ct", existing).strip())
        return Upstream(pin, label, existing, epoch)
    if existing is not None and existing != commit:
        before = repo.out("log", "-1", "--format=%b", existing).strip()
        raise ForkError(
            f"vllm {pin} was imported before from a different source ({before}); this one is "
            f"{origin}. One pin has one release: check pins.lock and the source you gave. If "
            f"the earlier import is wrong, delete the cache repo {repo.path} and run again."
        )
    repo.run("update-ref", tag, commit)
    return Upstream(pin, label, commit, epoch)


def import_tree(
    repo: Repo, pin: Pin, tree_dir: Path, epoch: int, origin: str, index_file: Path, canonical: bool
) -> Upstream:
    """Commit every file of ``tree_dir`` (ignore rules off) and tag it (a local tree or a
    git ref: a canonical sdist goes through :func:`tree_import` as it is unpacked)."""
    env = {"GIT_WORK_TREE": str(tree_dir), "GIT_INDEX_FILE": str(index_file)}
    repo.run("add", "--all", "--force", ".", env=env, cwd=tree_dir)
    tree = repo.out("write-tree", env=env).strip()
    return record_import(repo, pin, tree, epoch, origin, canonical)
