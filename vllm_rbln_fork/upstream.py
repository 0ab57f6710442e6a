"""Each pin becomes one deterministic commit in the shared cache repo.

The commit has no parent, a fixed author/committer and the source's own epoch as
its date, so the same pin gives the same commit id on every machine. Canonical
sources (the released sdist) are tagged ``upstream/v<pin>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def import_tree(
    repo: Repo, pin: Pin, tree_dir: Path, epoch: int, origin: str, index_file: Path, canonical: bool
) -> Upstream:
    """Commit every file of ``tree_dir`` (ignore rules off) and tag it.

    ``index_file`` is left describing ``tree_dir``, so the caller can apply patches to
    that directory in place (``git apply --index``) without a checkout.
    """
    env = {"GIT_WORK_TREE": str(tree_dir), "GIT_INDEX_FILE": str(index_file)}
    repo.run("add", "--all", "--force", ".", env=env, cwd=tree_dir)
    tree = repo.out("write-tree", env=env).strip()
    identity = Identity(*IDENTITY, date=f"@{epoch} +0000")
    message = f"vLLM {pin}\n\nImported from {origin}.\n"
    commit = repo.commit_tree(tree, [], message, identity)
    label = f"v{pin}" if canonical else f"v{pin}-src.{tree[:12]}"
    tag = f"refs/tags/upstream/{label}"
    existing = repo.resolve(tag)
    if existing is not None and existing != commit:
        before = repo.out("log", "-1", "--format=%b", existing).strip()
        raise ForkError(
            f"vllm {pin} was imported before from a different source ({before}); this one is "
            f"{origin}. One pin has one release: check pins.lock and the source you gave. If "
            f"the earlier import is wrong, delete the cache repo {repo.path} and run again."
        )
    repo.run("update-ref", tag, commit)
    return Upstream(pin, label, commit, epoch)
