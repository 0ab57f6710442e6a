"""The review's reader of upstream files: a file a commit does not have is absent; any other
git failure is an error, never a false "removed upstream" (issue 15)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_rbln_fork.errors import FailedProcess
from vllm_rbln_fork.gitrepo import Identity, Repo
from vllm_rbln_fork.review.symbols import Sources


def _repo_with(tmp_path: Path, files: dict[str, str]) -> tuple[Repo, str]:
    repo = Repo(tmp_path / "repo.git")
    env = {"GIT_INDEX_FILE": str(tmp_path / "index")}
    for name, text in files.items():
        source = tmp_path / "blob"
        source.write_text(text)
        blob = repo.out("hash-object", "-w", str(source)).strip()
        repo.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{name}", env=env)
    tree = repo.out("write-tree", env=env).strip()
    return repo, repo.commit_tree(tree, [], "one", Identity("t", "t@invalid", "@0 +0000"))


def test_a_file_the_commit_lacks_is_absent(tmp_path) -> None:
    repo, commit = _repo_with(tmp_path, {"vllm/a.py": "def f(): pass\n"})
    sources = Sources(repo)
    assert sources.text(commit, "vllm/a.py") == "def f(): pass\n"
    assert sources.text(commit, "vllm/gone.py") == ""
    assert sources.symbols(commit, "vllm/gone.py") == {}


def test_a_git_failure_is_an_error_not_an_absent_file(tmp_path) -> None:
    repo, commit = _repo_with(tmp_path, {"vllm/a.py": "def f(): pass\n"})
    blob = repo.out("rev-parse", f"{commit}:vllm/a.py").strip()
    (repo.git_dir / "objects" / blob[:2] / blob[2:]).unlink()  # the file is listed, its bytes lost
    with pytest.raises(FailedProcess):
        Sources(repo).text(commit, "vllm/a.py")
