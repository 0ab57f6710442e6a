#!/usr/bin/env python3
"""Entry point of vllm-rbln-fork: ``python build.py --pin 0.31.0``.

Like Rust's ``x.py``, this file needs nothing but the standard library: on the
first run it makes a private virtual environment and installs the lock the command
needs into it with ``pip --require-hashes``, then re-runs itself inside it. Later
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
    """The lock a command line needs: ``build.py test ...`` the test lock, and so on."""
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    return REQUIREMENTS / LOCK_OF_COMMAND.get(command, LOCKS[0])


def tool_env_dir() -> Path:
    """``$XDG_CACHE_HOME/vllm-rbln-fork/tool-envs/<python>-<hash of the locks>``.

    Deliberately not moved by ``VLLM_RBLN_FORK_CACHE`` (which relocates the build
    caches, as tests and benchmarks do): the tooling is the same whatever is built.
    """
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256()
    for name in LOCKS:
        digest.update(name.encode() + b"\0" + (REQUIREMENTS / name).read_bytes() + b"\0")
    name = f"py{sys.version_info[0]}{sys.version_info[1]}-{digest.hexdigest()[:16]}"
    return Path(xdg) / "vllm-rbln-fork" / "tool-envs" / name


def installed_marker(env_dir: Path, lock: Path) -> Path:
    """Written once ``lock`` is wholly installed in ``env_dir``."""
    return env_dir / f".complete-{lock.stem}"


def make_venv(env_dir: Path) -> None:
    """A venv with pip, or a sentence saying what the system lacks (never a traceback)."""
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
        import ensurepip  # noqa: F401  (Debian ships it apart, in python3.X-venv)
    except ImportError:
        sys.exit(missing)
    try:
        venv.EnvBuilder(with_pip=True).create(env_dir)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(env_dir, ignore_errors=True)
        output = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else str(exc.output)
        if "ensurepip" in output:
            sys.exit(missing)
        sys.exit(
            f"build.py: making the tool environment {env_dir} failed (exit {exc.returncode}):\n"
            f"{output.strip()}\nNothing was installed; fix that and run the same command again."
        )


def ensure_tool_env(env_dir: Path, lock: Path) -> Path:
    python = env_dir / "bin" / "python"
    done = installed_marker(env_dir, lock)
    if done.exists():
        return python
    # Imported only to make an environment: a run that finds it ready re-execs at once.
    import fcntl
    import shutil
    import subprocess

    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.parent / f"{env_dir.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another build.py may be installing it
        if done.exists():
            return python
        if not any(installed_marker(env_dir, REQUIREMENTS / name).exists() for name in LOCKS):
            shutil.rmtree(env_dir, ignore_errors=True)  # a half-made env from an interrupted run
            make_venv(env_dir)
        print(f"build.py: installing {lock.relative_to(ROOT)} into {env_dir}", file=sys.stderr)
        try:
            subprocess.run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--require-hashes",
                    "-r",
                    str(lock),
                ],
                check=True,
            )
        except subprocess.CalledProcessError as exc:
            sys.exit(
                f"build.py: installing the tooling from {lock} failed (exit {exc.returncode}).\n"
                "Check that the package index is reachable, and that pip can find torch's CPU "
                "build (docs/building.md, 'The tool environment'); then run the same command again."
            )
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
