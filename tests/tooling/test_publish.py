"""Publishing to a static folder index: pages, immutability, yank, locking.

Synthetic wheels named like ours (``vllm-0.31.0+rbln.1-py3-none-any.whl``); no server here
(``test_publish_serve.py`` serves the folder to pip).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import indexkit as kit  # tests/support, put on sys.path by tests/tooling/conftest.py
import pytest
from pypi_simple import IndexPage, ProjectPage

from vllm_rbln_fork import log
from vllm_rbln_fork.errors import ForkError, IndexConflict, WheelError
from vllm_rbln_fork.publish import publish, yank
from vllm_rbln_fork.publish.folder import regenerate
from vllm_rbln_fork.publish.wheelfacts import read_wheel

WHEEL = "vllm-0.31.0+rbln.1-py3-none-any.whl"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return kit.make_wheel(tmp_path / "dist")


@pytest.fixture
def index(tmp_path: Path) -> Path:
    return tmp_path / "index"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _anchor(html_text: str, filename: str) -> str:
    [tag] = [t for t in re.findall(r"<a [^>]*>[^<]*</a>", html_text) if f">{filename}<" in t]
    return tag


def test_folder_layout_and_html_page(wheel: Path, index: Path) -> None:
    result = publish(wheel, str(index))

    stored = index / "files" / WHEEL
    assert stored.read_bytes() == wheel.read_bytes()
    assert result.sha256 == _sha256(wheel) and result.filename == WHEEL and not result.already_published
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read("vllm-0.31.0+rbln.1.dist-info/METADATA")
    metadata_file = index / "files" / (WHEEL + ".metadata")
    assert metadata_file.read_bytes() == metadata  # PEP 658: the METADATA, byte for byte

    page = (index / "simple" / "vllm" / "index.html").read_text()
    tag = _anchor(page, WHEEL)
    assert f'href="../../files/vllm-0.31.0%2Brbln.1-py3-none-any.whl#sha256={_sha256(wheel)}"' in tag
    assert 'data-requires-python="&gt;=3.9,&lt;4"' in tag  # HTML-escaped
    meta_hash = hashlib.sha256(metadata).hexdigest()
    assert f'data-core-metadata="sha256={meta_hash}"' in tag  # PEP 714
    assert f'data-dist-info-metadata="sha256={meta_hash}"' in tag  # PEP 658, for older clients
    assert "data-yanked" not in tag
    assert '<meta name="pypi:repository-version" content="1.1">' in page

    # An independent parser reads the same facts, and the link resolves into files/.
    base = "http://index.example/simple/vllm/"
    [pkg] = ProjectPage.from_html("vllm", page, base_url=base).packages
    assert pkg.url == "http://index.example/files/vllm-0.31.0%2Brbln.1-py3-none-any.whl"
    assert pkg.digests == {"sha256": _sha256(wheel)}
    assert pkg.requires_python == ">=3.9,<4"
    assert pkg.has_metadata and pkg.metadata_digests == {"sha256": meta_hash}
    assert not pkg.is_yanked

    root = (index / "simple" / "index.html").read_text()
    assert [p for p in IndexPage.from_html(root).projects] == ["vllm"]
    assert 'href="vllm/"' in root


def test_json_pages(wheel: Path, index: Path) -> None:
    publish(wheel, str(index))
    data = json.loads((index / "simple" / "vllm" / "index.json").read_text())

    assert data["meta"] == {"api-version": "1.1"}
    assert data["name"] == "vllm" and data["versions"] == ["0.31.0+rbln.1"]
    [entry] = data["files"]
    assert entry["filename"] == WHEEL
    assert entry["url"] == "../../files/vllm-0.31.0%2Brbln.1-py3-none-any.whl"
    assert entry["hashes"] == {"sha256": _sha256(wheel)}
    assert entry["requires-python"] == ">=3.9,<4"
    meta_hash = _sha256(index / "files" / (WHEEL + ".metadata"))
    assert entry["core-metadata"] == entry["dist-info-metadata"] == {"sha256": meta_hash}
    assert entry["size"] == wheel.stat().st_size
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", entry["upload-time"])
    assert entry["yanked"] is False

    [pkg] = ProjectPage.from_json_data(data, base_url="http://index.example/simple/vllm/").packages
    assert pkg.size == wheel.stat().st_size and pkg.upload_time is not None
    assert pkg.url.endswith("/files/vllm-0.31.0%2Brbln.1-py3-none-any.whl")

    root = json.loads((index / "simple" / "index.json").read_text())
    assert root == {"meta": {"api-version": "1.1"}, "projects": [{"name": "vllm"}]}


def test_versions_are_sorted_and_both_formats_agree(tmp_path: Path, index: Path) -> None:
    for n in (10, 2, 1):
        publish(kit.make_wheel(tmp_path / f"d{n}", f"0.31.0+rbln.{n}"), str(index))
    publish(kit.make_wheel(tmp_path / "next", "0.32.0+rbln.1"), str(index))

    data = json.loads((index / "simple" / "vllm" / "index.json").read_text())
    assert data["versions"] == ["0.31.0+rbln.1", "0.31.0+rbln.2", "0.31.0+rbln.10", "0.32.0+rbln.1"]
    html_files = [
        p.filename
        for p in ProjectPage.from_html("vllm", (index / "simple/vllm/index.html").read_text()).packages
    ]
    assert html_files == [f["filename"] for f in data["files"]]


def test_republishing_the_same_bytes_is_a_no_op(
    wheel: Path, index: Path, tmp_path: Path, recorder: log.RecordingReporter
) -> None:
    publish(wheel, str(index))
    before = kit.snapshot(index)
    rebuilt = kit.make_wheel(tmp_path / "rebuilt")  # a reproducible rebuild: same bytes
    assert rebuilt.read_bytes() == wheel.read_bytes()

    result = publish(rebuilt, str(index))

    assert result.already_published
    assert kit.snapshot(index) == before
    assert any("already published with the same bytes" in m for m in recorder.messages("info"))


def test_different_bytes_under_a_published_name_conflict_and_change_nothing(
    wheel: Path, index: Path, tmp_path: Path
) -> None:
    publish(wheel, str(index))
    publish(kit.make_wheel(tmp_path / "other", "0.31.0+rbln.2"), str(index))
    before = kit.snapshot(index)
    impostor = kit.make_wheel(tmp_path / "impostor", body="# rebuilt with other patches")
    assert impostor.name == WHEEL and impostor.read_bytes() != wheel.read_bytes()

    with pytest.raises(IndexConflict) as err:
        publish(impostor, str(index))

    assert WHEEL in str(err.value) and "never replaced" in str(err.value)
    assert kit.snapshot(index) == before


BINARY_TAG = "cp38-abi3-manylinux_2_28_x86_64"


@pytest.mark.parametrize("first", ["pure", "binary"])
def test_a_pure_and_a_binary_wheel_of_one_version_are_refused_in_one_index(
    first: str, index: Path, tmp_path: Path
) -> None:
    """pip takes the binary wheel whenever its tags fit, so one index holding both kinds of
    a version cannot say which one `vllm==<version>` installs. Other versions mix freely."""
    pure = kit.make_wheel(tmp_path / "pure")
    binary = kit.make_wheel(tmp_path / "binary", tag=BINARY_TAG)
    other = kit.make_wheel(tmp_path / "other", "0.31.0+rbln.2", tag=BINARY_TAG)
    published, refused = (pure, binary) if first == "pure" else (binary, pure)
    publish(published, str(index))
    publish(other, str(index))
    before = kit.snapshot(index)

    with pytest.raises(IndexConflict) as err:
        publish(refused, str(index))

    text = str(err.value)
    assert f"already has {published.name}, the {first} wheel of vllm 0.31.0+rbln.1" in text
    assert "pip prefers a binary wheel" in text and "separate indexes" in text
    assert kit.snapshot(index) == before


def test_a_second_spelling_of_a_published_version_is_refused(
    wheel: Path, index: Path, tmp_path: Path
) -> None:
    """0.31+rbln.1 is 0.31.0+rbln.1 to PEP 440: pip could take either file for it."""
    publish(wheel, str(index))
    before = kit.snapshot(index)
    other = kit.make_wheel(tmp_path / "other", "0.31+rbln.1")
    with pytest.raises(IndexConflict, match=r"already has vllm-0\.31\.0\+rbln\.1-.*PEP 440 holds equal"):
        publish(other, str(index))
    assert kit.snapshot(index) == before


def test_yank_marks_html_and_json_and_keeps_the_file(wheel: Path, index: Path) -> None:
    publish(wheel, str(index))
    reason = 'admission bug, use "rbln.2" & later <see #12>'

    yank(str(index), WHEEL, reason)

    tag = _anchor((index / "simple" / "vllm" / "index.html").read_text(), WHEEL)
    assert 'data-yanked="admission bug, use &quot;rbln.2&quot; &amp; later &lt;see #12&gt;"' in tag
    data = json.loads((index / "simple" / "vllm" / "index.json").read_text())
    assert data["files"][0]["yanked"] == reason
    [pkg] = ProjectPage.from_html("vllm", (index / "simple/vllm/index.html").read_text()).packages
    assert pkg.is_yanked and pkg.yanked_reason == reason
    assert (index / "files" / WHEEL).read_bytes() == wheel.read_bytes()
    assert (index / "files" / (WHEEL + ".metadata")).is_file()

    # Publishing the same bytes again does not un-yank it.
    assert publish(wheel, str(index)).already_published
    assert json.loads((index / "simple" / "vllm" / "index.json").read_text())["files"][0]["yanked"] == reason


def test_yank_without_reason_and_errors(wheel: Path, index: Path) -> None:
    publish(wheel, str(index))
    yank(str(index), WHEEL, "")
    assert 'data-yanked=""' in (index / "simple" / "vllm" / "index.html").read_text()
    assert json.loads((index / "simple" / "vllm" / "index.json").read_text())["files"][0]["yanked"] is True

    with pytest.raises(ForkError, match="no published wheel"):
        yank(str(index), "vllm-0.31.0+rbln.9-py3-none-any.whl", "x")
    with pytest.raises(ForkError, match="not a published index"):
        yank(str(index.parent / "elsewhere"), WHEEL, "x")
    assert not (index.parent / "elsewhere").exists()
    with pytest.raises(ForkError, match="not a file name"):
        yank(str(index), f"../files/{WHEEL}", "x")
    with pytest.raises(ForkError, match="server's own tools"):
        yank("http://127.0.0.1:9/", WHEEL, "x")


def test_yanking_a_wheel_s_metadata_is_refused_and_names_the_wheel(wheel: Path, index: Path) -> None:
    """C3: ``yank <wheel>.metadata`` said "yanked" and the wheel stayed installable."""
    publish(wheel, str(index))
    pages = {p: p.read_bytes() for p in (index / "simple").rglob("*") if p.is_file()}
    with pytest.raises(ForkError) as err:
        yank(str(index), WHEEL + ".metadata", "bad build")
    assert f"the metadata of {WHEEL}, not a wheel; nothing was yanked" in str(err.value)
    assert f"build.py yank {WHEEL} --from {index}" in str(err.value)
    assert {p: p.read_bytes() for p in (index / "simple").rglob("*") if p.is_file()} == pages
    assert not list((index / ".index-state").glob("*.metadata.json"))


def test_upload_time_survives_regeneration(wheel: Path, index: Path, tmp_path: Path) -> None:
    publish(wheel, str(index))
    first = json.loads((index / "simple" / "vllm" / "index.json").read_text())["files"][0]["upload-time"]
    publish(kit.make_wheel(tmp_path / "two", "0.31.0+rbln.2"), str(index))
    files = json.loads((index / "simple" / "vllm" / "index.json").read_text())["files"]
    assert files[0]["upload-time"] == first


def test_regenerate_indexes_a_wheel_copied_in_by_hand(wheel: Path, index: Path, tmp_path: Path) -> None:
    publish(wheel, str(index))
    other = kit.make_wheel(tmp_path / "hand", "0.31.0+rbln.2")
    (index / "files" / other.name).write_bytes(other.read_bytes())

    regenerate(index)

    assert (index / "files" / (other.name + ".metadata")).is_file()
    data = json.loads((index / "simple" / "vllm" / "index.json").read_text())
    assert [f["filename"] for f in data["files"]] == [WHEEL, other.name]
    before = kit.snapshot(index)
    regenerate(index)
    assert kit.snapshot(index) == before  # pages are deterministic


def test_refuses_what_is_not_a_good_wheel(tmp_path: Path, index: Path) -> None:
    bad_name = tmp_path / "vllm.whl"
    bad_name.write_bytes(b"")
    with pytest.raises(WheelError, match="not a wheel file name"):
        publish(bad_name, str(index))
    not_zip = tmp_path / WHEEL
    not_zip.write_bytes(b"not a zip")
    with pytest.raises(WheelError, match="not a zip file"):
        publish(not_zip, str(index))
    liar = kit.make_wheel(tmp_path / "liar", "0.31.0+rbln.3")
    renamed = liar.with_name("vllm-0.31.0+rbln.4-py3-none-any.whl")
    liar.rename(renamed)
    with pytest.raises(WheelError, match="contradicts itself"):
        read_wheel(renamed)
    assert not (index / "files").exists()


def test_upload_url_with_credentials_is_refused(wheel: Path) -> None:
    with pytest.raises(ForkError) as err:
        publish(wheel, "https://alice:s3cret@wheels.internal.example/")
    assert "s3cret" not in str(err.value) and "TWINE_PASSWORD" in str(err.value)


_PUBLISHER = """
import json, sys
from pathlib import Path
from vllm_rbln_fork.errors import IndexConflict
from vllm_rbln_fork.publish import publish
try:
    result = publish(Path(sys.argv[1]), sys.argv[2])
    print(json.dumps({"ok": True, "noop": result.already_published}))
except IndexConflict:
    print(json.dumps({"ok": False}))
"""


def test_concurrent_publishes_take_turns(tmp_path: Path, index: Path) -> None:
    distinct = [kit.make_wheel(tmp_path / f"w{n}", f"0.31.0+rbln.{n}") for n in (1, 2, 3)]
    rivals = [kit.make_wheel(tmp_path / f"r{n}", "0.31.0+rbln.9", body=f"# variant {n}") for n in (1, 2)]
    env = kit.isolated_env(PYTHONPATH=str(REPO_ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PUBLISHER, str(w), str(index)], env=env, stdout=subprocess.PIPE, text=True
        )
        for w in [*distinct, *rivals]
    ]
    outcomes = [json.loads(p.communicate()[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)

    assert outcomes[:3] == [{"ok": True, "noop": False}] * 3
    assert sorted(o["ok"] for o in outcomes[3:]) == [False, True]  # one rival wins, one conflicts
    winner = rivals[[o["ok"] for o in outcomes[3:]].index(True)]
    assert (index / "files" / winner.name).read_bytes() == winner.read_bytes()
    data = json.loads((index / "simple" / "vllm" / "index.json").read_text())
    assert data["versions"] == ["0.31.0+rbln.1", "0.31.0+rbln.2", "0.31.0+rbln.3", "0.31.0+rbln.9"]
    assert {f["filename"]: f["hashes"]["sha256"] for f in data["files"]}[winner.name] == _sha256(winner)
    assert not [p for p in index.rglob("*.tmp")]  # no temporary file left behind


def test_check_index_names_the_page_to_check_before_an_upload(fork, tmp_path, monkeypatch, capsys) -> None:
    """--check-index: a server whose pages are not at <URL>/simple/ (devpi, Artifactory) is
    still checked for the file, so a different file of the same name stops the upload."""
    import http.server

    from vllm_rbln_fork import cli
    from vllm_rbln_fork.project import Project

    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    pages = tmp_path / "server"
    publish(kit.make_wheel(tmp_path / "other", "1.0+rbln.1", body="# another build"), str(pages))
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(pages), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    with kit.served(server):
        check = f"http://127.0.0.1:{server.server_address[1]}/simple/"
        upload = f"http://127.0.0.1:{kit.free_port()}/"  # never reached: the check stops it first
        args = ["--pin", "1.0", "--index-url", fork.index.url, "--publish", upload, "--check-index", check]
        assert cli.main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "already has vllm-1.0+rbln.1-py3-none-any.whl with different bytes" in err
    assert "Nothing was uploaded" in err


def test_check_index_goes_with_an_upload_url(tmp_path) -> None:
    from vllm_rbln_fork import cli

    with pytest.raises(SystemExit):
        cli.main(["--pin", "1.0", "--publish", str(tmp_path), "--check-index", "http://127.0.0.1:9/"])


@pytest.mark.parametrize("pages", ["nothing listens", "404 everywhere"])
def test_an_upload_whose_index_cannot_be_read_is_refused_not_made_blind(
    wheel: Path, pages: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before an upload the index is read for this file and for the other kind (pure or
    binary) of wheel of its version. When it cannot be read, nothing is uploaded: the error
    names the page and --check-index. A wrong page root (a 404 for the index itself, not only
    for the project) is not read as "a new project"."""
    import http.server

    from vllm_rbln_fork.errors import IndexUnreachable

    seen: list[tuple[str, str]] = []

    class Server(http.server.BaseHTTPRequestHandler):
        def _answer(self, status: int) -> None:
            seen.append((self.command, self.path))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self._answer(404)

        def do_POST(self) -> None:
            self._answer(200)  # an upload server that would take the file

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setenv("TWINE_USERNAME", "release-bot")
    monkeypatch.setenv("TWINE_PASSWORD", "pw")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    with kit.served(server):
        upload = f"http://127.0.0.1:{server.server_address[1]}/"
        check = f"http://127.0.0.1:{kit.free_port()}/simple/" if pages == "nothing listens" else None
        with pytest.raises(IndexUnreachable) as err:
            publish(wheel, upload, index_url=check)
    assert [m for m, _ in seen if m == "POST"] == []  # nothing was uploaded
    message = " ".join(str(err.value).split())
    assert (check or f"{upload}simple/") in message and "--check-index" in message
    assert "Nothing was uploaded" in message


def test_a_first_upload_to_an_index_without_a_root_page_goes_with_new_project(
    wheel: Path, monkeypatch: pytest.MonkeyPatch, recorder: log.RecordingReporter
) -> None:
    """Gitea's and Forgejo's package registries serve only <root>/<project>/, never the root
    page itself: a 404 for the project there cannot tell a project not uploaded yet from a
    wrong page root. Without --new-project the upload is refused (and says so, naming the
    flag); with it the first upload is made and read back."""
    import http.server

    from vllm_rbln_fork.errors import IndexUnreachable

    stored: dict[str, bytes] = {}
    posts: list[str] = []

    class Gitea(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b""
            if self.path.endswith("/pypi/simple/vllm/") and stored:
                digest = hashlib.sha256(stored[WHEEL]).hexdigest()
                body = (
                    f'<html><body><a href="/files/{WHEEL}#sha256={digest}">{WHEEL}</a></body></html>'.encode()
                )
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            posts.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            stored[WHEEL] = wheel.read_bytes()  # what the form carried (the test's one wheel)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setenv("TWINE_USERNAME", "release-bot")
    monkeypatch.setenv("TWINE_PASSWORD", "pw")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gitea)
    with kit.served(server):
        upload = f"http://127.0.0.1:{server.server_address[1]}/api/packages/owner/pypi"
        with pytest.raises(IndexUnreachable) as err:
            publish(wheel, upload)
        assert posts == []
        message = " ".join(str(err.value).split())
        assert "Nothing was uploaded" in message and "--new-project" in message, message

        result = publish(wheel, upload, new_project=True)
        assert posts == ["/api/packages/owner/pypi"]
        assert result.sha256 == _sha256(wheel) and result.file_url.endswith(f"/files/{WHEEL}")

        # --new-project with a wrong page root: the upload goes (the 404 was taken for a new
        # project), and the read-back's 404 says the root may be wrong and how to name it.
        wrong = f"http://127.0.0.1:{server.server_address[1]}/api/packages/owner/pypi/wrong/"
        publish(wheel, upload, index_url=wrong, new_project=True)
    assert len(posts) == 2
    [warning] = recorder.messages("warn")
    assert "wrong page root" in warning and "--check-index" in warning, warning


def test_new_project_goes_with_an_upload_url(tmp_path: Path) -> None:
    from vllm_rbln_fork import cli

    with pytest.raises(SystemExit):
        cli.main(["--pin", "1.0", "--publish", str(tmp_path), "--new-project"])


@pytest.mark.parametrize(
    "dest", ["htps://wheels.internal.example/", "ftp://wheels.example/", "file:///srv/wheels"]
)
def test_a_dest_of_another_scheme_is_refused_not_made_a_folder(
    dest: str,
    wheel: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """C1: a mistyped upload URL (``htps://``) or another scheme was a folder under the current
    directory, and the build said "published" with nothing uploaded."""
    from vllm_rbln_fork import cli

    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    for call in (lambda: publish(wheel, dest), lambda: yank(dest, wheel.name, "why")):
        with pytest.raises(ForkError, match=r"neither a folder nor an http\(s\) upload URL"):
            call()
    assert cli.main(["--pin", "1.0", "--publish", dest]) == 2  # refused before any build
    err = " ".join(capsys.readouterr().err.split())
    assert "nothing was built or published" in err and "http(s) URL" in err
    assert sorted(tmp_path.rglob("*")) == before  # no stray folder index


def test_a_folder_whose_name_has_a_colon_is_reached_with_dot_slash(
    wheel: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    publish(wheel, "./ftp:wheels")
    assert (tmp_path / "ftp:wheels" / "files" / wheel.name).is_file()
