#!/usr/bin/env python3
"""Entry point of vllm-rbln-fork: ``python build.py --pin 0.31.0``.

Like Rust's ``x.py``, this file needs nothing but the standard library: on the
first run it makes a private virtual environment and installs the lock the command
needs into it with uv (hashes required), then re-runs itself inside it. Later
runs find the finished environment and re-exec at once.

The locks (``requirements/``) nest, each holding the one before it:

* ``build.lock``  what ``--pin`` (and export, checkout, --review, --publish, yank) needs;
* ``test.lock``   plus pytest and the test servers: ``build.py test``;
* ``dev.lock``    plus ruff and mypy: ``build.py lint``.

One environment serves them all (keyed by the three locks' hash); a command that
needs a bigger lock installs the difference into it once.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REQUIREMENTS = ROOT / "requirements"
LOCKS = ("build.lock", "test.lock", "dev.lock")  # each holds the one before it
LOCK_OF_COMMAND = {"test": "test.lock", "lint": "dev.lock"}  # every other command: build.lock
MARKER = "VLLM_RBLN_FORK_BOOTSTRAPPED"


def lock_for(argv: list[str]) -> Path:
    """The lock a command line needs: ``build.py test ...`` the test lock, and so on. Asking
    for help (``build.py lint --help``) needs only the build lock: argparse prints it."""
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    if {"-h", "--help"} & set(argv[1:] if command else argv):
        return REQUIREMENTS / LOCKS[0]
    return REQUIREMENTS / LOCK_OF_COMMAND.get(command, LOCKS[0])


def tool_env_dir() -> Path:
    """``$XDG_CACHE_HOME/vllm-rbln-fork/tool-envs/<python>-<hash of the locks>``.

    Deliberately not moved by ``VLLM_RBLN_FORK_CACHE`` (which relocates the build
    caches, as tests and benchmarks do): the tooling is the same whatever is built.
    """
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256()
    for name in ("bootstrap.lock", *LOCKS):  # bootstrap.lock: the uv that installs them
        digest.update(name.encode() + b"\0" + (REQUIREMENTS / name).read_bytes() + b"\0")
    name = f"py{sys.version_info[0]}{sys.version_info[1]}-{digest.hexdigest()[:16]}"
    return Path(xdg) / "vllm-rbln-fork" / "tool-envs" / name


def installed_marker(env_dir: Path, lock: Path) -> Path:
    """Written once ``lock`` is wholly installed in ``env_dir``."""
    return env_dir / f".complete-{lock.stem}"


def make_venv(env_dir: Path) -> str | None:
    """A venv with pip and uv, or with pip alone where uv cannot be installed, or a sentence
    saying what the system lacks (never a traceback). Returns what ``pip config list`` printed
    for the venv, read while uv was being installed (None where it was not read)."""
    import shutil
    import subprocess
    import venv

    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    missing = (
        f"build.py: Python {version} ({sys.executable}) cannot make a virtual environment with pip: "
        "its ensurepip module is missing. On Debian and Ubuntu install it with "
        f"'sudo apt install python{version}-venv'; elsewhere install your Python's venv/ensurepip "
        "support (or use a python.org or uv-managed Python). Then run the same command again."
    )
    try:
        import ensurepip  # (Debian ships it apart, in python3.X-venv)
    except ImportError:
        sys.exit(missing)
    # ensurepip installs pip (and setuptools) with pip, compiling every module: some 20 s.
    # A pip installs uv instead (this Python's own, or the wheel ensurepip carries); uv then
    # installs pip from that wheel in a moment. Where that fails, the venv is made the usual
    # way, and install() says that pip installs the lock.
    wheels = sorted(Path(ensurepip.__file__).parent.glob("_bundled/pip-*.whl"))
    try:
        venv.EnvBuilder(with_pip=False).create(env_dir)
        python = env_dir / "bin" / "python"
        if wheels:
            made = _uv_and_pip_from(wheels[-1], python)
            if made is not None:
                return made
        venv.EnvBuilder(with_pip=True).create(env_dir)
        return None
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(env_dir, ignore_errors=True)
        output = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else str(exc.output)
        if "ensurepip" in output:
            sys.exit(missing)
        sys.exit(
            f"build.py: making the tool environment {env_dir} failed (exit {exc.returncode}):\n"
            f"{output.strip()}\nNothing was installed; fix that and run the same command again."
        )


def quickest_pip(python: Path, pip_wheel: Path) -> list[str]:
    """A pip command that installs into the venv of ``python``: this interpreter's own pip
    where it has one that takes ``--python`` (22.3 and later), since its modules are compiled
    already; else ``pip_wheel``'s, run from the file, which compiles every module it imports
    (a second more). Either reads the venv's configuration, as the venv's own pip would."""
    from importlib import metadata

    try:
        release = tuple(int(part) for part in metadata.version("pip").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        release = ()
    if release >= (22, 3):
        return [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    return [str(python), str(pip_wheel / "pip"), "--disable-pip-version-check"]


def _uv_and_pip_from(pip_wheel: Path, python: Path) -> str | None:
    """Install uv (``bootstrap.lock``) with :func:`quickest_pip`, then pip from ``pip_wheel``
    with uv; meanwhile, on the other core, read pip's configuration (``pip config list``) for
    install(). None (and nothing said: make_venv then makes the venv with ensurepip) if uv or
    pip cannot be installed; the configuration's text, or "" if pip could not say."""
    import subprocess

    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": False}
    lock = REQUIREMENTS / "bootstrap.lock"
    pip = quickest_pip(python, pip_wheel)
    config = subprocess.Popen(
        [*pip, "config", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        got_uv = subprocess.run([*pip, "install", "--quiet", "--require-hashes", "-r", str(lock)], **quiet)  # type: ignore[call-overload]
    finally:
        listed, _ = config.communicate()
    if got_uv.returncode != 0:
        return None
    uv = [str(python.parent / "uv"), "pip", "install", "--quiet", "--python", str(python), "--offline"]
    if subprocess.run([*uv, str(pip_wheel)], **quiet).returncode != 0:  # type: ignore[call-overload]
        return None
    return listed if config.returncode == 0 else ""


def install(python: Path, lock: Path, pip_config: str | None = None) -> None:
    """Install ``lock`` (hashes required) into the env of ``python``: with uv, from a cache
    shared by every env (hardlinks, no bytecode compiled up front), after installing uv
    itself with pip from ``bootstrap.lock``; with pip where uv cannot be installed.
    ``pip_config``: what ``pip config list`` printed for this env, if read already."""
    import subprocess

    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    uv = python.parent / "uv"
    if not uv.exists():
        bootstrap = REQUIREMENTS / "bootstrap.lock"
        got_uv = subprocess.run(
            [*pip, "install", "--quiet", "--require-hashes", "-r", str(bootstrap)], check=False
        )
        if got_uv.returncode != 0:
            print(
                "build.py: uv could not be installed; installing with pip instead (slower)", file=sys.stderr
            )
    if uv.exists():
        from vllm_rbln_fork.pipconfig import uv_settings  # standard library only; ROOT is on sys.path

        options, env = uv_settings(python, pip_config or None)
        command = [str(uv), "pip", "install", "--quiet", "--python", str(python), "--require-hashes"]
        done = subprocess.run([*command, *options, "-r", str(lock)], env=env, check=False)
    else:
        done = subprocess.run([*pip, "install", "--quiet", "--require-hashes", "-r", str(lock)], check=False)
    if done.returncode != 0:
        sys.exit(
            f"build.py: installing the tooling from {lock} failed (exit {done.returncode}).\n"
            "Check that the package index is reachable, and that pip can find torch's CPU "
            "build (docs/building.md, 'The tool environment'); then run the same command again."
        )


class StderrReporter:
    """vllm_rbln_fork's progress events (here: only files.held's waiting message) on stderr,
    before the tool env and its rich reporter exist."""

    def phase_start(self, name: str) -> None: ...
    def phase_end(self, name: str, seconds: float) -> None: ...
    def progress(self, task: str, done: int, total: int | None) -> None: ...
    def message(self, level: str, text: str) -> None:
        print(f"build.py: {text}", file=sys.stderr, flush=True)


def ensure_tool_env(env_dir: Path, lock: Path) -> Path:
    python = env_dir / "bin" / "python"
    done = installed_marker(env_dir, lock)
    if done.exists():
        return python
    # Imported only to make an environment: a run that finds it ready re-execs at once.
    import shutil

    # files.held, the one lock between processes: standard library only, so usable here.
    sys.path.insert(0, str(ROOT))
    from vllm_rbln_fork import log
    from vllm_rbln_fork.files import held

    log.set_reporter(StderrReporter())
    waiting = f"another build.py is making {env_dir}; waiting for it"
    with held(env_dir.parent / f"{env_dir.name}.lock", waiting):
        if done.exists():
            return python
        pip_config = None
        if not any(installed_marker(env_dir, REQUIREMENTS / name).exists() for name in LOCKS):
            shutil.rmtree(env_dir, ignore_errors=True)  # a half-made env from an interrupted run
            pip_config = make_venv(env_dir)
        print(f"build.py: installing {lock.relative_to(ROOT)} into {env_dir}", file=sys.stderr)
        install(python, lock, pip_config)
        for name in LOCKS[: LOCKS.index(lock.name) + 1]:  # a lock holds every one before it
            installed_marker(env_dir, REQUIREMENTS / name).write_text((REQUIREMENTS / name).read_text())
    return python


def run_in_tool_env(script: str, lock: Path | None = None) -> None:
    """Re-exec ``script`` (with this process's arguments) in the tool env with ``lock``
    installed (by default the lock this command line needs), unless already there."""
    lock = lock or lock_for(sys.argv[1:])
    env_dir = tool_env_dir()
    if os.environ.get(MARKER) != str(env_dir) or not installed_marker(env_dir, lock).exists():
        python = ensure_tool_env(env_dir, lock)
        os.environ[MARKER] = str(env_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        os.execv(str(python), [str(python), str(Path(script).resolve()), *sys.argv[1:]])
    sys.path.insert(0, str(ROOT))


def main() -> None:
    run_in_tool_env(__file__)
    from vllm_rbln_fork.cli import main as cli_main

    sys.exit(cli_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
