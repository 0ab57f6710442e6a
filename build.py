#!/usr/bin/env python3
"""Entry point of vllm-rbln-fork: ``python build.py --pin 0.31.0``.

Like Rust's ``x.py``, this file needs nothing but the standard library: on the
first run it makes a private virtual environment from ``requirements/tools.lock``
(keyed by the lock's hash, under the user cache dir) and then re-runs itself
inside it. Later runs find the finished environment and re-exec at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
LOCK_FILE = ROOT / "requirements" / "tools.lock"
MARKER = "VLLM_RBLN_FORK_BOOTSTRAPPED"


def tool_env_dir() -> Path:
    """``$XDG_CACHE_HOME/vllm-rbln-fork/tool-envs/<python>-<lock hash>``.

    Deliberately not moved by ``VLLM_RBLN_FORK_CACHE`` (which relocates the build
    caches, as tests and benchmarks do): the tooling is the same whatever is built.
    """
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()[:16]
    name = f"py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    return Path(xdg) / "vllm-rbln-fork" / "tool-envs" / name


def ensure_tool_env(env_dir: Path) -> Path:
    python = env_dir / "bin" / "python"
    done = env_dir / ".complete"
    if done.exists():
        return python
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.parent / f"{env_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build.py may be installing it
        if done.exists():
            return python
        shutil.rmtree(env_dir, ignore_errors=True)  # a half-made env from an interrupted run
        print(f"build.py: first run: installing the tooling into {env_dir}", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(env_dir)
        try:
            subprocess.run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "-r",
                    str(LOCK_FILE),
                ],
                check=True,
            )
        except subprocess.CalledProcessError as exc:
            sys.exit(
                f"build.py: installing the tooling from {LOCK_FILE} failed (exit {exc.returncode}).\n"
                "Check that the package index is reachable, then run the same command again."
            )
        done.write_text(LOCK_FILE.read_text())
    return python


def run_in_tool_env(script: str) -> None:
    """Re-exec ``script`` (with this process's arguments) in the tool env, unless already there."""
    env_dir = tool_env_dir()
    if os.environ.get(MARKER) != str(env_dir):
        python = ensure_tool_env(env_dir)
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
