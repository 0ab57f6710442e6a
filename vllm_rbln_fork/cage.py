"""The cage the watcher runs a new vLLM release's code in (docs/building.md, "The watcher's cage").

bubblewrap (``bwrap``), at OS depth: the whole file system read-only (``--ro-bind / /``), a
private ``/tmp`` (a tmpfs), a fresh ``/dev`` and ``/proc``, and namespaces of its own for
PIDs, IPC, the network, UTS, cgroups and the user (``--unshare-all``): the caged code sees no
process outside the cage (no ``/proc/<ppid>/environ``), reaches no network, and every
process it starts dies with the cage (bwrap is the PID namespace's first process; when the
tier's own process ends, the kernel kills the rest). Only the folders given as ``writable``
are bound read-write. bwrap is started under ``env -i`` with the environment given and
nothing else: ``--clearenv`` would still leave the caller's environment readable in
``/proc/1/environ`` (bwrap's own, PID 1 inside).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from . import log, proc
from .errors import ForkError

PACKAGE = "bubblewrap"


def bwrap() -> str:
    """The ``bwrap`` binary, or the refusal naming its package and the way out."""
    found = shutil.which("bwrap")
    if found is None:
        raise ForkError(
            f"the scheduler tier runs the new release's unreviewed code in a bubblewrap cage, and bwrap "
            f"is not installed: install the {PACKAGE} package (apt-get install -y {PACKAGE}), or move "
            "with --no-tier and run the tier on a machine of its own. The tier never runs uncaged."
        )
    return found


def install_for_tests() -> None:
    """The tooling and e2e tiers drive the watcher, so they need bwrap: a fresh machine gets the
    package here (as root, with apt-get), the way the run makes its own tool env; elsewhere the
    run stops before any tier, naming the package."""
    if shutil.which("bwrap"):
        return
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ForkError(
            f"the tooling and e2e tiers test the watcher's cage, bubblewrap, and bwrap is not installed: "
            f"install the {PACKAGE} package (apt-get install -y {PACKAGE}) and run again"
        )
    log.info(f"installing {PACKAGE} (bwrap, the watcher's cage: docs/building.md) with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    hint = f"install the {PACKAGE} package by hand (apt-get install -y {PACKAGE}) and run again"
    proc.run(["apt-get", "update", "-qq"], env=env, hint=hint)
    proc.run(["apt-get", "install", "-y", "-qq", PACKAGE], env=env, hint=hint)
    bwrap()  # installed, or the refusal


def caged(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    readable: Iterable[Path] = (),
    writable: Iterable[Path] = (),
) -> list[str]:
    """The command line running ``argv`` in the cage, in ``cwd``, with ``env`` alone.

    ``readable``: folders under ``/tmp`` the run reads (``/tmp`` itself is a fresh tmpfs in the
    cage), bound read-only again; ``writable``: the only folders bound read-write (each made
    here if missing)."""
    binds: list[str] = []
    for path in readable:
        binds += ["--ro-bind", str(path), str(path)]
    for path in writable:
        path.mkdir(parents=True, exist_ok=True)
        binds += ["--bind", str(path), str(path)]
    return [
        "env",
        "-i",
        *(f"{name}={value}" for name, value in env.items()),
        bwrap(),
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--tmpfs",
        "/dev/shm",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        *binds,
        "--unshare-all",
        # bwrap started by root keeps every capability inside its user namespace, and with
        # CAP_SYS_ADMIN there `mount -o remount,bind,rw /` makes the read-only binds writable.
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--chdir",
        str(cwd),
        "--",
        *argv,
    ]
