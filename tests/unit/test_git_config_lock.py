"""The cache repo's pinned git config (gitrepo.CONFIG) is written only when it differs, and
then under a lock: two builds sharing one cache open its repo at once (hostile review:
test_review_real failed with FileExistsError on upstream.git/config.lock)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from vllm_rbln_fork.gitrepo import CONFIG, Repo

REPO_ROOT = Path(__file__).resolve().parents[2]

OPENER = """
import sys, time
from pathlib import Path
from vllm_rbln_fork.gitrepo import Repo
root, start = Path(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
for i in range(int(sys.argv[3])):
    Repo(root / f"r{i}.git")
"""


def test_a_configured_repo_opens_while_another_process_writes_its_config(tmp_path: Path) -> None:
    path = tmp_path / "upstream.git"
    Repo(path)
    lock = path / "config.lock"
    lock.write_text("")  # another process (git, or another build) is writing the config
    repo = Repo(path)  # nothing to write: no need for the lock
    assert repo.out("config", "rerere.enabled") == "true"
    assert lock.exists()  # the other process's lock is left alone


def test_two_processes_make_and_configure_the_same_repos_at_once(tmp_path: Path) -> None:
    start = time.time() + 3  # both past their imports, then at the same moment
    count = 20
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(tmp_path), str(start), str(count)],
            cwd=REPO_ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    for i in range(count):
        repo = Repo(tmp_path / f"r{i}.git")
        assert all(repo.out("config", key) == value for key, value in CONFIG.items())


def test_a_cache_repo_that_is_not_a_repo_is_an_error_naming_it_and_the_way_out(tmp_path: Path) -> None:
    """upstream.git there, not empty, with no HEAD (a deletion interrupted half way, files put
    there by hand): a clear error naming the directory and the way out (it is a cache: remove
    it), the directory left as it was, and no lock file left beside it."""
    import pytest

    from vllm_rbln_fork.errors import ForkError

    path = tmp_path / "upstream.git"
    (path / "objects" / "pack").mkdir(parents=True)
    (path / "objects" / "pack" / "pack-1.pack").write_bytes(b"left")
    with pytest.raises(ForkError) as err:
        Repo(path)
    message = " ".join(str(err.value).split())
    assert str(path) in message and "no HEAD" in message and f"rm -rf {path}" in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["upstream.git"]  # no lock, nothing aside
    assert (path / "objects" / "pack" / "pack-1.pack").read_bytes() == b"left"
    # The way out works: removed, it is made again.
    import shutil

    shutil.rmtree(path)
    assert Repo(path).out("config", "rerere.enabled") == "true"


def test_a_repo_another_process_made_meanwhile_is_not_called_damaged(tmp_path: Path) -> None:
    """Repo() looks for HEAD, then (before its lock) refuses a non-empty folder without one.
    Between the two another process may rename its new repo into place: what the refusal
    then finds is a whole repo, and it must let it be (this test's two-process one failed
    so under load: 'is there but is not a git repository (no HEAD)')."""
    from vllm_rbln_fork.gitrepo import _refuse_damaged

    made = Repo(tmp_path / "made.git")  # what the other process's rename leaves
    _refuse_damaged(made.path)
    assert Repo(made.path).git_dir == made.git_dir
