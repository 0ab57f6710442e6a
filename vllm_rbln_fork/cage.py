"""The cage the watcher runs a new vLLM release's code in (docs/building.md, "The watcher's cage").

bubblewrap (``bwrap``), at OS depth: the file system read-only (``--ro-bind / /``), with
``/run``, ``/var/run``, ``/home``, ``/root`` and ``$HOME`` hidden under empty tmpfs mounts (the
runner's tokens, ssh keys, ``~/.docker/config.json``, the user's tool envs, and every
file-system Unix socket there: ``/run/docker.sock``, the session buses); of them only the
folders the run reads are bound again, read-only (the running Python's ``sys.prefix`` and
``sys.base_prefix``, and the ``readable`` folders given: the project, the cage folder). A
private ``/tmp`` (a tmpfs), a fresh ``/dev`` and ``/proc``, and namespaces of its own for
PIDs, IPC, the network, UTS, cgroups and the user (``--unshare-all``): the caged code sees no
process outside the cage (no ``/proc/<ppid>/environ``), reaches no network (nor an abstract
Unix socket, which belongs to the network namespace), and every process it starts dies with
the cage (bwrap is the PID namespace's first process; when the tier's own process ends, the
kernel kills the rest). Only the folders given as ``writable`` are bound read-write. bwrap is
started under ``env -i`` with the environment given and nothing else: ``--clearenv`` would
still leave the caller's environment readable in ``/proc/1/environ`` (bwrap's own, PID 1
inside).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from . import log, proc
from .errors import ForkError

PACKAGE = "bubblewrap"

# Hidden in the cage under empty tmpfs mounts (and $HOME, wherever it is): what a runner keeps
# of its own there (tokens, ssh keys, ~/.docker/config.json, the tool envs in ~/.cache) and
# the file-system Unix sockets (/run/docker.sock, /run/user/<uid>/bus, ...), which a read-only
# bind does not close: connect() needs no write to the file system.
HIDDEN = ("/run", "/var/run", "/home", "/root")

# The probe: what the cage needs of the kernel, with the cage's own kinds of mount (a fresh
# /dev and /proc, tmpfs mounts, a read-only remount) and namespaces, run once per bwrap: a
# container may allow user namespaces and still refuse a new /proc.
PROBE = (
    "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run",
    "--remount-ro", "/run", "--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "true",
)  # fmt: skip
APPARMOR_USERNS = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")


def bwrap() -> str:
    """The ``bwrap`` binary, once it has been seen to make a cage here; else the refusal naming
    the cause and the way out."""
    found = shutil.which("bwrap")
    if found is None:
        raise ForkError(
            f"the scheduler tier runs the new release's unreviewed code in a bubblewrap cage, and bwrap "
            f"is not installed: install the {PACKAGE} package (apt-get install -y {PACKAGE}), or move "
            "with --no-tier and run the tier on a machine of its own. The tier never runs uncaged."
        )
    _probe(found)
    return found


@functools.cache
def _probe(binary: str) -> None:
    """``bwrap <PROBE>`` runs, or the refusal. A success is cached, a refusal is not (it
    raises), so a machine fixed meanwhile is probed again. A kernel, AppArmor or container that
    keeps bwrap from its namespaces or mounts would otherwise fail each caged run, inside a test."""
    try:
        done = subprocess.run(
            [binary, *PROBE], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        said, status = str(exc), None
    else:
        if done.returncode == 0:
            return
        said, status = (done.stderr or done.stdout).strip() or "(it printed nothing)", done.returncode
    ran = f"`{binary} {' '.join(PROBE)}`"
    raise ForkError(
        f"bubblewrap cannot make its cage on this machine: {ran} "
        + (f"exited {status}" if status is not None else "could not run")
        + f": {said}. {_userns_way_out()} Else move with --no-tier and run the scheduler tier "
        "on a machine of its own. The tier never runs uncaged."
    )


def _userns_way_out() -> str:
    """The likely cause of a failed probe, read from the kernel's settings, and its way out."""
    if _read(APPARMOR_USERNS) == "1":
        return (
            "AppArmor keeps unprivileged user namespaces from unconfined programs here "
            f"({APPARMOR_USERNS} is 1, Ubuntu 24.04's default): allow them with "
            "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (watch.yml's and "
            "ci.yml's cage step do so), or give bwrap an AppArmor profile with `userns`."
        )
    if _read(Path("/proc/sys/kernel/unprivileged_userns_clone")) == "0":
        return (
            "the kernel allows no unprivileged user namespaces (kernel.unprivileged_userns_clone "
            "is 0): `sudo sysctl -w kernel.unprivileged_userns_clone=1`."
        )
    if _read(Path("/proc/sys/user/max_user_namespaces")) == "0":
        return (
            "user namespaces are off (user.max_user_namespaces is 0): "
            "`sudo sysctl -w user.max_user_namespaces=15000`."
        )
    return (
        "bwrap needs user namespaces (and PID, network, IPC, UTS, cgroup ones): a container "
        "whose seccomp profile or capabilities forbid unshare(2) and mount(2) keeps them from it "
        "(run the job on a VM or host runner, or the container with a profile that allows them); "
        "with AppArmor, `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`."
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def install_for_tests() -> None:
    """The tooling and e2e tiers drive the watcher, so they need bwrap, and a bwrap that makes
    its cage here: a fresh machine gets the package here (as root, with apt-get), the way the
    run makes its own tool env; elsewhere the run stops before any tier, naming the package;
    and a bwrap the kernel keeps from its namespaces stops it, naming the cause (the probe)."""
    if shutil.which("bwrap"):
        bwrap()  # probed: the cause and the way out, before any tier
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
    bwrap()  # installed and probed, or the refusal


def hidden(home: str | None = None) -> list[Path]:
    """The folders the cage hides under empty tmpfs mounts: ``HIDDEN`` and ``$HOME``, where
    they are folders, as their links resolve (``/var/run``, a link to ``/run``, is ``/run``;
    a ``/home`` linked to ``/var/home`` is that), each unless another (or ``/tmp``, a tmpfs of
    its own) holds it already."""
    found: list[Path] = []
    home = os.environ.get("HOME", "") if home is None else home
    for name in (*HIDDEN, home):
        if not name or not os.path.isabs(name) or not os.path.isdir(name):
            continue
        path = Path(os.path.realpath(name))
        if path == Path("/") or any(path == h or h in path.parents for h in [*found, Path("/tmp")]):
            continue
        found.append(path)
    return found


def _ro_binds(readable: Iterable[Path], hiding: Sequence[Path]) -> list[Path]:
    """The folders bound read-only again over the hidden ones: the running Python
    (``sys.prefix``, ``sys.base_prefix``: the tool env and the interpreter it was made from,
    which may live under ``~/.cache`` or ``~/.pyenv``) and ``readable``; each as named and as
    its links resolve. Not one that holds a hidden folder (``/``, a ``sys.prefix`` of ``/``):
    bound again, it would show that folder again (and it is read-only already, but for them)."""
    found: list[Path] = []
    for path in [Path(sys.prefix), Path(sys.base_prefix), *readable]:
        for each in (Path(os.path.abspath(path)), path.resolve()):
            if each not in found and not any(each in h.parents for h in hiding):
                found.append(each)
    return found


def caged(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    readable: Iterable[Path] = (),
    writable: Iterable[Path] = (),
) -> list[str]:
    """The command line running ``argv`` in the cage, in ``cwd``, with ``env`` alone.

    ``readable``: the folders the run reads that the cage hides otherwise (those under ``/tmp``,
    a fresh tmpfs in the cage, and under ``HIDDEN`` and ``$HOME``), bound read-only again;
    ``writable``: the only folders bound read-write (each made here if missing). The binds go
    parents first, so a folder inside another gets its own mode (bwrap mounts in order: a later
    mount over a parent would hide an earlier one inside it)."""
    hiding = hidden()
    binds: list[tuple[Path, str]] = [(path, "--ro-bind") for path in _ro_binds(readable, hiding)]
    for path in writable:
        path.mkdir(parents=True, exist_ok=True)
        binds.append((Path(os.path.abspath(path)), "--bind"))
    mounts: list[str] = []
    for path, flag in sorted(binds, key=lambda bind: len(bind[0].parts)):  # stable: writable last
        mounts += [flag, str(path), str(path)]
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
        *(arg for path in hiding for arg in ("--tmpfs", str(path))),
        *mounts,
        # The hidden folders' tmpfs mounts read-only too, once the binds in them are made: what
        # the caged code writes goes into the writable folders alone (one bound over a hidden
        # folder itself keeps its bind's mode).
        *(arg for path in hiding if path not in {b for b, _ in binds} for arg in ("--remount-ro", str(path))),
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
