"""What a build leaves when it is killed, fails or meets a damaged cache: pins.lock and
fork-releases.toml are written only once the wheel is built, under the project's lock, and
dist/ last; a killed build's scratch is swept by the next one, a damaged cache entry is a
miss, and one label never names two trees."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import time
import tomllib
from pathlib import Path

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.paths import hash_memo_dir, wheel_cache_dir
from vllm_rbln_fork.pins import Pin, PinsLock
from vllm_rbln_fork.pipeline import build


def _releases(fork) -> list[dict[str, object]]:
    path = fork.project.releases_file
    return tomllib.loads(path.read_text())["release"] if path.exists() else []


def _text(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def test_a_cache_hit_never_gives_a_label_the_ledger_gives_another_tree(fork, recorder) -> None:
    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    tree, n = first.manifest.patched_tree, first.manifest.fork_release
    # A colleague released another tree as the same number; the pull brought their ledger.
    ledger = fork.project.releases_file
    ledger.write_text(ledger.read_text().replace(tree, "c" * 40))
    again = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert not again.cached
    assert again.manifest.fork_release == n + 1 and f"+rbln.{n + 1}-" in again.wheel.name
    assert {"pin": "1.0", "n": n + 1, "tree": tree} in _releases(fork)
    assert any(f"gives its tree +rbln.{n + 1}" in w for w in recorder.messages("warn"))
    third = build(Pin.parse("1.0"), fork.spec(), fork.project)  # the relabelled wheel is a hit
    assert third.cached and third.manifest.fork_release == n + 1


def test_an_empty_or_corrupt_cached_manifest_is_a_miss(fork, recorder) -> None:
    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    [entry] = [p for p in wheel_cache_dir().iterdir() if (p / "manifest.json").exists()]
    for broken in ("", "{not json", '{"pin": "1.0"}'):
        (entry / "manifest.json").write_text(broken)
        again = build(Pin.parse("1.0"), fork.spec(), fork.project)
        assert not again.cached and again.manifest.wheel_sha256 == first.manifest.wheel_sha256
    assert any("unreadable manifest.json" in w for w in recorder.messages("warn"))


def test_a_hash_memo_that_cannot_be_written_does_not_fail_the_build(fork, isolated_cache, recorder) -> None:
    shutil.rmtree(hash_memo_dir(), ignore_errors=True)
    hash_memo_dir().write_text("a file where the memo's folder goes: every write to it fails")
    result = build(Pin.parse("1.1"), fork.spec(), fork.project)
    assert result.wheel.is_file()
    assert any("cannot remember the sha256" in w for w in recorder.messages("warn"))


def test_a_dist_that_cannot_be_written_is_named_and_the_built_wheel_waits_in_the_cache(fork) -> None:
    """dist/ is written last: the wheel is built and its number and hash recorded (under the
    project's lock), so the way out the message names is a cache hit with the same label."""
    # As root (the CI), a read-only folder is writable: a file where dist/ goes fails the same way.
    lock = fork.project.pins_lock
    fork.project.dist_dir.write_text("not a folder")
    with pytest.raises(ForkError, match=r"cannot write vllm-1\.1\+rbln\.1-.*into .*dist.*writable"):
        build(Pin.parse("1.1"), fork.spec(), fork.project)
    assert PinsLock(lock).get(Pin.parse("1.1")) is not None
    (recorded,) = [r for r in _releases(fork) if r["pin"] == "1.1"]
    fork.project.dist_dir.unlink()
    result = build(Pin.parse("1.1"), fork.spec(), fork.project)  # the way out the message names
    assert result.cached and result.wheel.is_file()
    assert recorded == {"pin": "1.1", "n": 1, "tree": result.manifest.patched_tree}


class _Forward:
    """The reporter of the build in the child: every message to the test, through a queue."""

    def __init__(self, queue: multiprocessing.Queue) -> None:
        self.queue = queue

    def phase_start(self, phase: str) -> None: ...
    def phase_end(self, phase: str, seconds: float) -> None: ...
    def message(self, level: str, text: str) -> None:
        self.queue.put(text)

    def progress(self, task: str, done: int, total: int | None) -> None: ...


def _build_with_cache(root: str, cache: str, url: str, queue: multiprocessing.Queue) -> None:
    from vllm_rbln_fork import log
    from vllm_rbln_fork.project import Project
    from vllm_rbln_fork.source import SourceSpec

    os.environ["VLLM_RBLN_FORK_CACHE"] = cache
    log.set_reporter(_Forward(queue))
    try:
        build(Pin.parse("1.1"), SourceSpec("index", url), Project(Path(root)))
        queue.put("child: built")
    except ForkError as exc:
        queue.put(f"child: refused: {exc}")


def test_two_builds_of_one_project_with_two_caches_record_one_at_a_time(fork, tmp_path) -> None:
    """Issue 30: two builds of one project whose caches differ (VLLM_RBLN_FORK_CACHE, as
    bench/bench_build.py sets it) hold two build locks. The other build (here the test, under
    the project's lock) records the number this one was built with for its own tree: this one
    waits for the lock, then refuses with nothing in dist/, rather than putting its wheel there
    first and refusing after."""
    from vllm_rbln_fork.files import held
    from vllm_rbln_fork.releases import record_release, release_number

    ledger, pin = fork.project.releases_file, Pin.parse("1.1")
    n = release_number(ledger, pin, "f" * 40)[0]  # the number any new tree of 1.1 gets next
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    args = (str(fork.project.root), str(tmp_path / "other-cache"), fork.index.url, queue)
    child = ctx.Process(target=_build_with_cache, args=args)
    said: list[str] = []

    def read_until(*ends: str) -> None:
        while not said or not any(end in said[-1] for end in ends):
            said.append(queue.get(timeout=120))

    with held(fork.project.lock_file):
        child.start()
        read_until("waiting", "child: built", "child: refused: ")
        record_release(ledger, pin, n, "f" * 40)  # what the other build records meanwhile
    read_until("child: built", "child: refused: ")
    child.join()
    assert any("is recording its release" in s and "waiting" in s for s in said), said
    assert said[-1].startswith("child: refused: ") and "changed while this build ran" in said[-1], said
    assert list(fork.project.dist_dir.glob("vllm-1.1+*")) == []
    assert [r for r in _releases(fork) if r["pin"] == "1.1"] == [{"pin": "1.1", "n": n, "tree": "f" * 40}]


class _StopAtWheel:
    """The reporter of the build in the child: says when the wheel build starts, then waits
    there (to be killed)."""

    def __init__(self, queue: multiprocessing.Queue) -> None:
        self.queue = queue

    def phase_start(self, phase: str) -> None:
        if phase.startswith("build wheel"):
            self.queue.put(phase)
            time.sleep(300)

    def phase_end(self, phase: str, seconds: float) -> None: ...
    def message(self, level: str, text: str) -> None: ...
    def progress(self, task: str, done: int, total: int | None) -> None: ...


def _build_until_killed(root: str, cache: str, url: str, queue: multiprocessing.Queue) -> None:
    from vllm_rbln_fork import log
    from vllm_rbln_fork.project import Project
    from vllm_rbln_fork.source import SourceSpec

    os.environ["VLLM_RBLN_FORK_CACHE"] = cache
    log.set_reporter(_StopAtWheel(queue))
    build(Pin.parse("1.1"), SourceSpec("index", url), Project(Path(root)))


def test_a_sigkilled_build_records_nothing_and_the_next_sweeps_its_scratch(
    fork, isolated_cache, recorder
) -> None:
    lock, ledger = fork.project.pins_lock, fork.project.releases_file
    before = (_text(lock), _text(ledger))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(
        target=_build_until_killed, args=(str(fork.project.root), str(isolated_cache), fork.index.url, queue)
    )
    child.start()
    try:
        assert queue.get(timeout=120).startswith("build wheel")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    assert child.exitcode == -signal.SIGKILL
    assert (_text(lock), _text(ledger)) == before
    [scratch] = (isolated_cache / "tmp").glob("build-*")  # the unpacked 1.1 sdist, left behind
    result = build(Pin.parse("1.1"), fork.spec(), fork.project)
    assert result.wheel.is_file() and not scratch.exists()
    assert list((isolated_cache / "tmp").iterdir()) == []
    assert any(str(scratch) in m and "killed" in m for m in recorder.messages("info"))


def test_a_wheel_cache_entry_a_killed_build_was_filling_is_swept(fork, recorder) -> None:
    """A build killed inside _store leaves wheels/.<key>-XXXX (tempfile.mkdtemp's folder, a
    wheel half-copied into it); the next build, a cache hit too, removes it."""
    import tempfile

    first = build(Pin.parse("1.0"), fork.spec(), fork.project)
    [entry] = [p for p in wheel_cache_dir().iterdir() if not p.name.startswith(".")]
    filling = Path(tempfile.mkdtemp(prefix=f".{entry.name[:12]}-", dir=wheel_cache_dir()))
    (filling / first.wheel.name).write_bytes(first.wheel.read_bytes()[:1000])
    again = build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert again.cached and not filling.exists()
    assert [p.name for p in wheel_cache_dir().iterdir()] == [entry.name]
    assert any(str(filling) in m and "killed" in m for m in recorder.messages("info"))


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache-hit", "no-cache"])
def test_locked_refuses_a_build_that_would_record_a_hash_or_a_label(fork, use_cache: bool) -> None:
    """Issue 30: the release job built a label the committed ledger lacked (tagged before
    fork-releases.toml was committed), published it, and threw the entry away; main later gave
    the number to another tree. With --locked such a build is refused, nothing written."""
    from vllm_rbln_fork.errors import WouldRecord

    lock, ledger, pin = fork.project.pins_lock, fork.project.releases_file, Pin.parse("1.1")

    def unchanged_after_refusal(match: str) -> None:
        before = (_text(lock), _text(ledger), sorted(fork.project.dist_dir.glob("*")))
        with pytest.raises(WouldRecord, match=match):
            build(pin, fork.spec(), fork.project, use_cache=use_cache, locked=True)
        assert (_text(lock), _text(ledger), sorted(fork.project.dist_dir.glob("*"))) == before

    # 1.1's sdist hash is not in pins.lock yet.
    unchanged_after_refusal(r"--locked: pins\.lock has no sha256 for 1\.1, .*commit what it records to main")
    built = build(pin, fork.spec(), fork.project)  # the way out: build, commit, release from there
    committed = ledger.read_text()
    # Tagged before the ledger was committed: the release sees a ledger without 1.1's number.
    ledger.write_text("".join(line for line in committed.splitlines(True) if '"1.1"' not in line))
    for path in fork.project.dist_dir.glob("*"):
        path.unlink()
    unchanged_after_refusal(
        rf"fork-releases\.toml has no number for vllm 1\.1's patched tree {built.manifest.patched_tree} "
        r"\(this build would record it as \+rbln\.1\)"
    )
    ledger.write_text(committed)
    again = build(pin, fork.spec(), fork.project, use_cache=use_cache, locked=True)
    assert again.wheel.name == built.wheel.name and again.wheel.read_bytes() == built.wheel.read_bytes()
    assert ledger.read_text() == committed
