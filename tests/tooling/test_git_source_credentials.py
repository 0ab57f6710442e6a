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
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vllm_rbln_fork.source import clone_ref

SECRET = "s3cr3t-t0ken"


@pytest.fixture()
def served_repo(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A bare repository with tag v1 served over HTTP to user ``ci`` with password SECRET;
    yields its URL and the Authorization headers the server saw."""
    work = tmp_path / "work"
    git = ["git", "-c", "user.name=U", "-c", "user.email=u@e.invalid"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "setup.py").write_text("print('hello')\n")
    subprocess.run([*git, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "v1"], check=True)
    subprocess.run([*git, "-C", str(work), "tag", "v1"], check=True)
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
