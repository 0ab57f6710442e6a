"""Test kit for the internal index: synthetic wheels, real servers on 127.0.0.1, fresh venvs.

Imported by ``tests/e2e/conftest.py`` and, by path, by ``tests/tooling/test_publish*.py``
(the suite has no packages: ``--import-mode=importlib``).

Every installer run here is isolated from the machine's own configuration: no pip
config file (``PIP_CONFIG_FILE=/dev/null``), no ``PIP_*``/``UV_*`` variables (this
machine sets ``PIP_FIND_LINKS`` and an extra index in its global pip.conf), no cache.
Tests then check the server's log, so an install that came from elsewhere fails.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import socketserver
import subprocess
import sys
import threading
import time
import venv
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from vllm_rbln_fork.wheel import pack_wheel

REQUIRES_PYTHON = ">=3.9,<4"


def make_wheel(
    out_dir: Path,
    version: str = "0.31.0+rbln.1",
    *,
    body: str = "",
    requires_python: str = REQUIRES_PYTHON,
    tag: str = "py3-none-any",
    requires: Sequence[str] = (),
) -> Path:
    """A tiny wheel named like ours: ``vllm-<version>-<tag>.whl`` (pure unless ``tag`` says
    otherwise; a binary tag changes only the name and WHEEL, as a stand-in for our binary wheel).

    It holds ``vllm/__init__.py`` and ``vllm/_rbln_build.py`` (a MANIFEST, as the real
    build writes); ``body`` changes the bytes without changing the name; ``requires`` are its
    ``Requires-Dist``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / f"src-{version}-{abs(hash(body))}"
    pkg = src / "vllm"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n{body}\n')
    manifest = {"pin": version.split("+")[0], "wheel_version": version, "schema": 1}
    (pkg / "_rbln_build.py").write_text(
        f"import json\n\nMANIFEST_JSON = {json.dumps(manifest)!r}\nMANIFEST = json.loads(MANIFEST_JSON)\n"
    )
    dist_info = src / f"vllm-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {version}\nSummary: synthetic test wheel\nRequires-Python: {requires_python}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    (dist_info / "WHEEL").write_text(
        f"Wheel-Version: 1.0\nGenerator: indexkit\nRoot-Is-Purelib: {str(tag == 'py3-none-any').lower()}\n"
        f"Tag: {tag}\n"
    )
    return pack_wheel(src, out_dir / f"vllm-{version}-{tag}.whl", 1_700_000_000)


@contextmanager
def served(server: socketserver.BaseServer) -> Iterator[None]:
    """``server`` answering in a thread for the ``with`` block, then shut down and closed.

    ``shutdown()`` waits for ``serve_forever`` to look at its flag, which it does once a poll
    interval: at the default half second, a test's teardown slept 0.25 s on average (20 s of
    the tooling tier's 200 s of test time went on teardowns)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (lock file included): compare before/after."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Until something listens on 127.0.0.1:port (at most 30 s), or the server died."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            text = log.read_text() if log is not None and log.exists() else ""
            raise RuntimeError(f"the server exited with {proc.returncode} before listening:\n{text}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after 30 s")


@dataclass
class Server:
    """A server subprocess on 127.0.0.1 whose log says what was fetched."""

    url: str
    log_file: Path
    proc: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def gets(self) -> list[str]:
        """Paths of the GET requests so far, as the client sent them (percent-encoded)."""
        return re.findall(r'"GET (\S+) HTTP/[\d.]+"', self.log())


@contextmanager
def _process_server(cmd: Sequence[str], port: int, log_file: Path, url: str) -> Iterator[Server]:
    with log_file.open("wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=isolated_env())
    try:
        wait_for_port(port, proc, log_file)
        yield Server(url, log_file, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def static_server(directory: Path, log_file: Path) -> Iterator[Server]:
    """``python -m http.server`` serving ``directory``: what any static host does."""
    port = free_port()
    cmd = [
        sys.executable,
        "-u",
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(directory),
    ]
    with _process_server(cmd, port, log_file, f"http://127.0.0.1:{port}") as server:
        yield server


@contextmanager
def pypiserver(packages: Path, log_file: Path) -> Iterator[Server]:
    """A real pypiserver, uploads allowed without a password, no fallback to the public index."""
    port = free_port()
    packages.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pypiserver", "run", "-v", "-p", str(port), "-i", "127.0.0.1",
        "-a", ".", "-P", ".", "--disable-fallback", "--hash-algo", "sha256", str(packages),
    ]  # fmt: skip
    with _process_server(cmd, port, log_file, f"http://127.0.0.1:{port}/") as server:
        yield server


@dataclass
class Negotiating:
    """What a negotiating static server saw: (path, Accept header, file it served)."""

    url: str
    served: list[tuple[str, str, str]] = field(default_factory=list)


@contextmanager
def negotiating_server(directory: Path) -> Iterator[Negotiating]:
    """A static server configured as ``publish``'s docstring asks: ``index.json`` on ``Accept``.

    For a directory URL it serves ``index.json`` as ``application/vnd.pypi.simple.v1+json``
    when the client prefers that, else ``index.html``; every other file as is.
    """
    state = Negotiating(url="")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(directory), **kwargs)  # type: ignore[misc, arg-type]

        def send_head(self):  # type: ignore[no-untyped-def]
            accept = self.headers.get("Accept", "")
            local = Path(self.translate_path(self.path))
            if local.is_dir() and self.path.endswith("/") and "application/vnd.pypi.simple.v1+json" in accept:
                body = (local / "index.json").read_bytes()
                state.served.append((self.path, accept, "index.json"))
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                import io

                return io.BytesIO(body)
            state.served.append((self.path, accept, local.name if local.is_file() else "index.html"))
            return super().send_head()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    with served(httpd):
        yield state


def isolated_env(**extra: str) -> dict[str, str]:
    """The environment minus anything that points pip or uv elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "PYTHONPATH"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        PIP_NO_INPUT="1",
        UV_NO_CONFIG="1",
        UV_NO_CACHE="1",
        UV_PYTHON_DOWNLOADS="never",
    )
    env.update(extra)
    return env


def fresh_venv(path: Path) -> Path:
    """A new venv without pip (pip runs from outside with ``--python``); returns its python."""
    venv.EnvBuilder(with_pip=False, clear=True).create(path)
    return path / "bin" / "python"


def run(cmd: Sequence[str | os.PathLike[str]], **env: str) -> str:
    """Run ``cmd`` isolated; return stdout+stderr; fail with the whole output."""
    result = subprocess.run(
        [str(c) for c in cmd], env=isolated_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {' '.join(map(str, cmd))}\n{result.stdout}")
    return result.stdout


def pip(python: Path, *args: str | os.PathLike[str]) -> str:
    """This interpreter's pip, installing into the venv of ``python``."""
    return run([sys.executable, "-m", "pip", "--python", python, *args])


def dry_run_report(python: Path, index: str, requirement: str, report: Path) -> dict[str, object]:
    """What pip would install for ``requirement`` from ``index`` alone (nothing is installed)."""
    pip(python, "install", "--dry-run", "--no-deps", "--index-url", index, "--report", report, requirement)
    return json.loads(report.read_text())


def installed_versions(report: dict[str, object]) -> list[str]:
    return [item["metadata"]["version"] for item in report["install"]]  # type: ignore[index, union-attr]


def venv_python(python: Path, code: str) -> str:
    return run([python, "-c", code]).strip()


def uv_binary() -> str:
    """The ``uv`` of this environment; fail (not skip) with the fix when it is missing."""
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]
    except ImportError:
        raise AssertionError(
            "uv is not installed in the test environment; add uv to requirements/test.in and run "
            "requirements/compile.sh (the upload tier installs with uv as well as pip)."
        ) from None
    return str(find_uv_bin())
