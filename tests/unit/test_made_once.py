"""files.made_once: a directory made once, even by two processes at the same time."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from vllm_rbln_fork.files import made_once


def _make_slowly(directory: Path) -> None:
    # Each call is logged beside the directory: a second maker would remove the first one's work.
    with (directory.parent / "makes.log").open("a") as log:
        log.write(f"{multiprocessing.current_process().pid}\n")
    directory.mkdir(parents=True, exist_ok=True)
    time.sleep(1.0)


def _worker(directory: str) -> None:
    made_once(Path(directory), _make_slowly)


def test_two_processes_make_the_directory_once(tmp_path: Path) -> None:
    target = tmp_path / "venv"
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_worker, args=(str(target),)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert len((tmp_path / "makes.log").read_text().split()) == 1
    assert (target / ".complete").exists()


def test_an_interrupted_directory_is_made_again(tmp_path: Path) -> None:
    target = tmp_path / "tree"
    target.mkdir()
    (target / "half").write_text("")  # no .complete marker: an interrupted make
    made_once(target, lambda d: (d.mkdir(), (d / "whole").write_text("")))
    assert sorted(p.name for p in target.iterdir()) == [".complete", "whole"]
