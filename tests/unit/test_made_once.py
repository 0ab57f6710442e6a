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


def test_held_is_the_one_lock_it_says_when_it_waits_and_can_refuse_to_wait(tmp_path: Path) -> None:
    """files.held: exclusive or shared flock; says ``waiting`` only when it has to wait."""
    import threading

    from vllm_rbln_fork import log
    from vllm_rbln_fork.files import held

    recorder = log.RecordingReporter()
    log.set_reporter(recorder)
    lock = tmp_path / "x.lock"
    with held(lock, "never said"):
        with held(lock, wait=False) as got:
            assert got is False
        with held(lock, shared=True, wait=False) as got:
            assert got is False
    with held(lock, shared=True), held(lock, shared=True, wait=False) as got:
        assert got is True  # shared holders share
    assert recorder.messages("info") == []

    taken, release = threading.Event(), threading.Event()

    def other_holder() -> None:
        with held(lock):
            taken.set()
            release.wait(10)

    thread = threading.Thread(target=other_holder)
    thread.start()
    taken.wait(10)
    threading.Timer(0.3, release.set).start()
    with held(lock, "waiting for the other holder") as got:
        assert got is True and release.is_set()
    thread.join()
    assert recorder.messages("info") == ["waiting for the other holder"]
