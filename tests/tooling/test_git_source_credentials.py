"""--source git+https://user:secret@host/...: the secret reaches the server, never a command line.

A real git clone over HTTP from a real server on 127.0.0.1 (git's "dumb" protocol: the bare
repository's files, served by http.server behind basic auth). ``GIT_TRACE`` records every
command git runs, with its arguments, as ``ps`` would show them to any user of the machine.
"""

from __future__ import annotations

import base64
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.paths import upstream_repo_dir
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.pipeline import build
from vllm_rbln_fork.source import SourceSpec, clone_ref

SECRET = "s3cr3t-t0ken"


@pytest.fixture()
def served_repo(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A bare repository with tag v1 served over HTTP to user ``ci`` with password SECRET;
    yields its URL and the Authorization headers the server saw."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "setup.py").write_text("print('hello')\n")
    with serve(work, "v1", tmp_path) as served:
        yield served


@contextmanager
def serve(work: Path, tag: str, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """``work``'s files committed and tagged ``tag``, served as above."""
    git = ["git", "-c", "user.name=U", "-c", "user.email=u@e.invalid"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "add", "-A", "-f"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", tag], check=True)
    subprocess.run([*git, "-C", str(work), "tag", tag], check=True)
    bare = tmp_path / "served" / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)

    seen: list[str] = []
    wanted = "Basic " + base64.b64encode(f"ci:{SECRET}".encode()).decode()

    class BasicAuth(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            if self.headers.get("Authorization") != wanted:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(BasicAuth, directory=str(tmp_path / "served")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://ci:{SECRET}@127.0.0.1:{server.server_address[1]}/repo.git", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_secret_authenticates_the_clone_but_is_on_no_command_line(
    served_repo: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = served_repo
    trace = tmp_path / "git-trace.log"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")  # a missing credential fails, never prompts

    tree, _epoch = clone_ref(url, "v1", tmp_path / "clone")

    assert (tree / "setup.py").read_text() == "print('hello')\n"
    commands = trace.read_text()
    assert "remote-http" in commands and "127.0.0.1" in commands  # the trace saw the fetch
    assert SECRET not in commands
    assert seen and all(header.startswith("Basic ") for header in seen), seen  # sent up front


@pytest.mark.parametrize(
    "source", [f"git+https://ci:{SECRET}@host/org/repo.git", f"git+https://{SECRET}@host/r"]
)
def test_a_git_url_with_user_info_but_no_ref_is_refused_with_the_secret_hidden(source: str) -> None:
    # Split at its last '@', the user info's, this was the URL 'https://ci:SECRET' at ref
    # 'host/org/repo.git': git got the secret as its URL, and so did the error it printed.
    with pytest.raises(ForkError, match=r"no @REF follows the repository's path.*git\+URL@REF") as refused:
        SourceSpec.parse(source, None)
    assert SECRET not in str(refused.value) and "***@host/" in str(refused.value)


@pytest.mark.parametrize(
    "source",
    [
        f"git+https://ci:p#{SECRET}@host/org/r.git@v1",
        f"git+https://ci:p?{SECRET}@host/org/r.git@v1",
        f"git+https://ci:p/{SECRET}@host/org/r.git@v1",
        f"git+https://ci:12#{SECRET}@host/org/r.git@v1",  # a port-like start: '@' in the fragment
        f"git+https://ci:12/{SECRET}@host/org/r.git@v1",  # a port-like start: '@' in the path
        f"git+https://ci:12?{SECRET}@host/org/r.git@v1",  # a port-like start: '@' in the query
        f"git+ssh://ci:123?{SECRET}@host/org/r.git@v1",
        f"git+https://ci:p#{SECRET}@host/org/r.git",  # and no @REF
    ],
)
def test_a_password_with_a_raw_delimiter_is_refused_unshown(source: str) -> None:
    # Its '#', '?' or '/' ends the authority inside the password: urlsplit saw no user info,
    # so git got the URL, password and all, as an argument, and urls.redact did not hide it in
    # the log, the messages or the recorded source (commit, manifest in dist/).
    with pytest.raises(ForkError, match=r"Percent-encode them in the user info") as refused:
        SourceSpec.parse(source, None)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    "source", [f"git+ssh://ci:{SECRET}@host/r.git@v1", f"git+ftp://ci:{SECRET}@host/r@v1"]
)
def test_a_password_outside_https_is_refused_unshown(source: str) -> None:
    # Only an http(s) password goes to git as a header; elsewhere the URL, password and all,
    # was git's (and ssh's) argument.
    with pytest.raises(ForkError, match=r"would go to git's command line.*credential helper") as refused:
        SourceSpec.parse(source, None)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    ("source", "location", "ref"),
    [
        (f"git+https://ci:{SECRET}@host/r.git@v1", f"https://ci:{SECRET}@host/r.git", "v1"),
        ("git+https://ci:p@ss@host/r@refs/tags/v1", "https://ci:p@ss@host/r", "refs/tags/v1"),
        ("git+git@host:org/r.git@v1", "git@host:org/r.git", "v1"),  # scp-like: no '://'
        ("git+https://host:8443/org/r.git@v1", "https://host:8443/org/r.git", "v1"),
        ("git+https://ci:p%23q@host/r.git@v1", "https://ci:p%23q@host/r.git", "v1"),  # encoded
    ],
)
def test_the_ref_is_what_follows_the_urls_path(source: str, location: str, ref: str) -> None:
    assert SourceSpec.parse(source, None) == SourceSpec("git", location, ref)


def test_a_build_from_a_git_url_records_it_without_its_secret(fork, tmp_path: Path) -> None:
    """The import's commit message (in the cache repo) and the manifest beside the wheel (in
    dist/) name the source: with its user name, never its password."""
    import tarfile

    with tarfile.open(fork.index.root / "simple/vllm/vllm-1.1.tar.gz") as tar:
        tar.extractall(tmp_path / "src", filter="data")
    with serve(tmp_path / "src" / "vllm-1.1", "v1.1", tmp_path) as (url, _seen):
        result = build(Pin.parse("1.1"), SourceSpec.parse(f"git+{url}@v1.1", None), fork.project)
    shown = url.replace(SECRET, "***")
    assert result.manifest.source_file == shown
    assert SECRET not in result.manifest_file.read_text()
    messages = subprocess.run(
        ["git", "-C", str(upstream_repo_dir()), "log", "--all", "--format=%B"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert f"Imported from git {shown} at v1.1." in messages and SECRET not in messages


@pytest.mark.parametrize(
    "param", ["?token=", "?ref=x&auth[token]=", "#access_token=", "?jwt=", "#session=", "?code="]
)
def test_a_secret_in_a_git_urls_query_is_refused_before_anything_shows_it(
    served_repo: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, param: str
) -> None:
    # git hands its remote helper the URL, query and all, as an argument: nothing keeps this
    # secret off the command line but not running git. And the source is refused as it is
    # read: the build logs "import git source URL" before it clones, and `redact` does not
    # know every name (?jwt=), so a refusal at clone time came after the log showed it.
    url, seen = served_repo
    trace = tmp_path / "git-trace.log"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    with pytest.raises(
        ForkError, match=r"git would put it on its command line.*USER:TOKEN@ before the host"
    ) as refused:
        SourceSpec.parse(f"git+{url}{param}q-{SECRET}@v1", None)
    assert SECRET not in str(refused.value)
    assert not trace.exists() and seen == []


def test_a_user_name_alone_has_gits_credential_helper_asked_for_its_password(
    served_repo: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """https://ci@host/r means "ci's password, from the credential helper", as git reads it:
    nothing is sent up front (no Basic "ci:" with an empty password), and the helper is asked
    for ci's password, the name off the command line all the same (it may be a token)."""
    url, seen = served_repo
    named = url.replace(f"ci:{SECRET}@", "ci@")
    asked = tmp_path / "helper-was-asked"
    helper = (
        f'!f() {{ test "$1" = get || exit 0; cat > {asked}; '
        f"grep -qx username=ci {asked} && echo password={SECRET}; }}; f"
    )
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")  # the user's own helper, as in their ~/.gitconfig
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "credential.helper")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", helper)
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")
    trace = tmp_path / "git-trace.log"
    monkeypatch.setenv("GIT_TRACE", str(trace))

    tree, _epoch = clone_ref(named, "v1", tmp_path / "clone")

    assert (tree / "setup.py").read_text() == "print('hello')\n"
    assert "username=ci" in asked.read_text().splitlines()
    assert seen[0] == "" and "Basic " + base64.b64encode(f"ci:{SECRET}".encode()).decode() in seen, seen
    assert "ci@" not in trace.read_text()
