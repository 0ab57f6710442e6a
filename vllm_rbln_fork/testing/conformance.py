"""Upstream conformance: vLLM's own ``tests/v1/core/`` as the referee of the patch series.

The same upstream tests (the pin's sdist ``tests/``, taken from the unpatched tree) run twice
in a vLLM venv: once with the unpatched tree's ``vllm`` package first on ``PYTHONPATH``, once
with the patched tree's. Outcomes are compared test by test against
``tests/upstream/expected-differences.toml``; the run fails on any difference that is not
listed there and on any listed difference that no longer happens, so the list cannot rot.

Both runs use the same copy of the tests (the *referee*), kept in a directory that holds
``tests/`` and ``pyproject.toml`` only: pytest puts that directory first on ``sys.path``, so
no ``vllm`` package shadows the one on ``PYTHONPATH``, and vLLM's own ``tests`` package
resolves (it would clash with ours if it ran in our process; it never does).

The unpatched outcomes may be cached per pin, keyed by the content of the unpatched tree's
``vllm/``, the referee tests, the plugin, the Hugging Face fixtures, the tests that cannot
run, and the venv's installed packages but vllm (``_baseline_key``; what it leaves out is in
docs/conformance.md); the record keeps the command that produced it. The patched side always
runs.

Both sides load ``conformance_plugin`` (copied beside the referee tests), which gives every
test vLLM's own ``skip_global_cleanup`` marker: see that module for why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import log, proc
from ..errors import FailedProcess
from ..files import tree_id, write_atomic
from .expectations import load_cannot_run, load_expected
from .outcomes import (
    SUITE,
    CannotRun,
    ConformanceError,
    ConformanceReport,
    ExpectedDifference,
    SideRun,
    compare,
    parse_junit,
)

# pytest: 0 all passed, 1 some tests failed; anything else means the run itself broke.
_PYTEST_RAN = (0, 1)
_CACHE_FORMAT = 3
# Loaded into both sides' pytest (-p): the file is copied beside the referee tests.
PLUGIN = Path(__file__).with_name("conformance_plugin.py")
_PLUGIN_MODULE = "rbln_conformance_plugin"
# The environment a vLLM test run sees: nothing of the caller's but these names.
_PASSED_THROUGH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "CUDA_VISIBLE_DEVICES")
# (CUDA_VISIBLE_DEVICES: the runner's no_gpu_triton_env, which vLLM 0.34.0 on needs.)


# ---------------------------------------------------------------------------------------------
# Running one side.


def tree_version(tree: Path) -> str | None:
    """``__version__`` of ``tree``'s ``vllm/_version.py`` (as setuptools-scm writes it), if any."""
    version_file = tree / "vllm" / "_version.py"
    if not version_file.is_file():
        return None
    match = re.search(r"^__version__\s*=.*?['\"]([^'\"]+)['\"]", version_file.read_text(), re.MULTILINE)
    return match.group(1) if match else None


def _check_tree(tree: Path, label: str, pin: str) -> None:
    if not (tree / "vllm" / "__init__.py").is_file():
        raise ConformanceError(f"the {label} tree {tree} has no vllm/ package; give a vLLM source tree.")
    version = tree_version(tree)
    if version is None:
        log.warn(f"the {label} tree {tree} has no vllm/_version.py; vLLM will call itself 'dev'.")
    elif version.split("+")[0] != pin:
        raise ConformanceError(f"the {label} tree {tree} is vLLM {version}, not the pin {pin}.")


def _referee(unpatched_tree: Path, work: Path) -> Path:
    """A directory holding only the pin's ``tests/``, ``pyproject.toml`` (pytest's config) and
    our pytest plugin."""
    if not (unpatched_tree / SUITE).is_dir():
        raise ConformanceError(f"the unpatched tree {unpatched_tree} has no {SUITE}/; use the pin's sdist.")
    referee = work / "referee"
    referee.mkdir()
    shutil.copytree(unpatched_tree / "tests", referee / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(unpatched_tree / "pyproject.toml", referee / "pyproject.toml")
    # pytest's working directory is first on sys.path, so ``-p`` finds the plugin there.
    shutil.copy2(PLUGIN, referee / f"{_PLUGIN_MODULE}.py")
    return referee


def _env(tree: Path, hf_home: Path, pycache: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSED_THROUGH_ENV if k in os.environ}
    env.update(
        PYTHONPATH=str(tree),
        # Byte code goes to our cache, never into the trees (an unpacked sdist stays untouched).
        PYTHONPYCACHEPREFIX=str(pycache),
        HF_HOME=str(hf_home),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


def _check_vllm_resolves(python: Path, referee: Path, env: Mapping[str, str], tree: Path) -> None:
    origin = (
        proc.run(
            [python, "-c", "import importlib.util; print(importlib.util.find_spec('vllm').origin)"],
            cwd=referee,
            env=env,
            hint=f"{python} cannot find a vllm package; is it the python of a venv with vLLM's dependencies?",
        )
        .strip()
        .splitlines()[-1]
    )
    expected = (tree / "vllm" / "__init__.py").resolve()
    if Path(origin).resolve() != expected:
        raise ConformanceError(
            f"with PYTHONPATH={tree}, {python} imports vllm from {origin}, not {expected}: "
            "something (a .pth file, an editable install) puts another vllm first."
        )


def _pytest_command(python: Path, junit: Path, cannot_run: Sequence[CannotRun], workers: int) -> list[str]:
    cmd = [
        str(python), "-m", "pytest", SUITE,
        "-p", "no:cacheprovider",
        "-p", _PLUGIN_MODULE,
        "-q", "-rfE",
        f"--junitxml={junit}",
        "-o", "junit_family=xunit1",
        "-o", "junit_logging=no",
        # A module that fails to import is one error among the outcomes, not the end of the run.
        "--continue-on-collection-errors",
    ]  # fmt: skip
    if workers > 0:
        cmd += ["-n", str(workers)]
    for entry in cannot_run:
        cmd += ["--deselect", entry.test]
    return cmd


@dataclass(frozen=True)
class _Setup:
    """What both sides share."""

    python: Path
    referee: Path
    hf_home: Path
    cannot_run: tuple[CannotRun, ...]
    workers: int
    work: Path
    pycache: Path
    logs_dir: Path | None


def _run_side(label: str, tree: Path, setup: _Setup) -> SideRun:
    python, referee, work, workers, logs_dir = (
        setup.python, setup.referee, setup.work, setup.workers, setup.logs_dir
    )  # fmt: skip
    env = _env(tree, setup.hf_home, setup.pycache)
    _check_vllm_resolves(python, referee, env, tree)
    junit = work / f"{label}.xml"
    cmd = _pytest_command(python, junit, setup.cannot_run, workers)
    how = "serially" if workers <= 0 else f"on {workers} workers"
    log.info(f"running {SUITE} against the {label} tree {tree} {how}")
    start = time.perf_counter()
    try:
        output = proc.run(cmd, cwd=referee, env=env)
    except FailedProcess as e:
        if e.returncode not in _PYTEST_RAN or not junit.is_file():
            raise
        output = e.output
    seconds = time.perf_counter() - start
    outcomes = parse_junit(junit.read_text(encoding="utf-8"))
    if not outcomes:
        raise ConformanceError(f"pytest reported no test of {SUITE} for the {label} tree:\n{output[-3000:]}")
    log_file = None
    if logs_dir is not None:
        logs_dir.mkdir(parents=True, exist_ok=True)
        log_file = logs_dir / f"{label}.log"
        write_atomic(log_file, output)
        write_atomic(logs_dir / f"{label}.xml", junit.read_text(encoding="utf-8"))
    counts = ", ".join(f"{n} {o}" for o, n in sorted(Counter(outcomes.values()).items()))
    log.info(f"{label}: {counts} in {seconds:.0f} s")
    return SideRun(label, outcomes, tuple(cmd), seconds, cached=False, log_file=log_file)


def _installed_packages(python: Path) -> str:
    return proc.run(
        [python, "-m", "pip", "freeze", "--all"], hint=f"{python} has no pip to list its packages."
    )


def packages_digest(freeze: str) -> str:
    """A hash of ``pip freeze`` output without vllm's own line: the installed vllm (the RBLN
    wheel of the moment, named by its path and sha256) is shadowed by the tree under test,
    which ``_check_vllm_resolves`` checks, so a new wheel must not void the unpatched
    outcomes; every other package may change them."""
    others = [
        line
        for line in freeze.splitlines()
        if re.split(r"\s*(?:==|@|===)\s*", line.strip(), maxsplit=1)[0].lower() != "vllm"
    ]
    return hashlib.sha256("\n".join(others).encode()).hexdigest()


def _baseline_key(
    pin: str,
    python: Path,
    unpatched_tree: Path,
    referee: Path,
    hf_home: Path,
    cannot_run: Sequence[CannotRun],
) -> dict[str, str]:
    return {
        "format": str(_CACHE_FORMAT),
        "pin": pin,
        "vllm": tree_id(unpatched_tree, "vllm"),
        "tests": tree_id(referee, "tests"),
        "plugin": hashlib.sha256(PLUGIN.read_bytes()).hexdigest(),
        "hf_fixtures": tree_id(hf_home, "hub"),
        "cannot_run": hashlib.sha256("\n".join(sorted(c.test for c in cannot_run)).encode()).hexdigest(),
        "packages": packages_digest(_installed_packages(python)),
        # Decides whether vLLM 0.34.0 on can start on the CPU at all (the runner's no_gpu_triton_env).
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"),
    }


def _cached_baseline(cache_file: Path, key: Mapping[str, str]) -> SideRun | None:
    try:
        record = json.loads(cache_file.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if record.get("key") != dict(key):
        return None
    log.info(f"unpatched outcomes of {key['pin']} from the cache {cache_file}")
    return SideRun(
        "unpatched",
        dict(record["outcomes"]),
        tuple(record["command"]),
        float(record["seconds"]),
        cached=True,
    )


def unexplained_failures(run: SideRun, expectations: Sequence[ExpectedDifference]) -> list[str]:
    """Tests that failed (or errored) on ``run`` where no expected difference lists that
    outcome for the unpatched side: the environment or the load, not the series."""
    explained = {e.test for e in expectations if run.outcomes.get(e.test) == e.unpatched}
    return sorted(t for t, o in run.outcomes.items() if o in ("failed", "error") and t not in explained)


def _usable_as_baseline(run: SideRun, expectations: Sequence[ExpectedDifference], what: str) -> bool:
    """Only a baseline whose every failure is listed may be cached or read from the cache: a
    failure of the load or the environment kept there would hide the same test's outcome
    on the patched side in every later run."""
    unexplained = unexplained_failures(run, expectations)
    if unexplained:
        shown = ", ".join(unexplained[:5]) + (
            f" and {len(unexplained) - 5} more" if len(unexplained) > 5 else ""
        )
        log.warn(
            f"{what} the unpatched outcomes: {len(unexplained)} failure(s) that no expected difference "
            f"lists ({shown}). A failure of the environment goes in cannot-run.toml with its reason; "
            "a load-induced one (a subprocess timeout) goes away on a quieter run."
        )
    return not unexplained


def _store_baseline(cache_file: Path, key: Mapping[str, str], run: SideRun, tree: Path) -> None:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "key": dict(key),
        "tree": str(tree),
        "command": list(run.command),
        "cwd": "a directory holding only the pin's tests/, pyproject.toml and our pytest plugin",
        "env": {"PYTHONPATH": str(tree), "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": run.seconds,
        "outcomes": dict(sorted(run.outcomes.items())),
    }
    write_atomic(cache_file, json.dumps(record, indent=1) + "\n")


def _changed_suite_files(patched_tree: Path, unpatched_tree: Path) -> tuple[str, ...]:
    """Files of the suite that the series adds, removes or changes (they do not referee it)."""

    def files(root: Path) -> dict[str, bytes]:
        base = root / SUITE
        return {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).digest()
            for p in base.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    if not (patched_tree / SUITE).is_dir():
        return ()
    mine, theirs = files(patched_tree), files(unpatched_tree)
    return tuple(sorted(p for p in set(mine) | set(theirs) if mine.get(p) != theirs.get(p)))


def run_conformance(
    python: Path,
    patched_tree: Path,
    unpatched_tree: Path,
    pin: str,
    expected: Path,
    hf_home: Path,
    baseline_cache: Path | None,
    *,
    cannot_run: Path | None = None,
    patches_dir: Path | None = None,
    workers: int = 2,
    logs_dir: Path | None = None,
) -> ConformanceReport:
    """Run the pin's ``tests/v1/core/`` against both trees and compare them test by test.

    ``python`` is the interpreter of a venv holding vLLM's dependencies (an installed vllm
    there is shadowed by each tree). ``hf_home`` holds ``hub/models--*/snapshots/*/config.json``
    for every model the suite names. ``baseline_cache``, when given, is a directory where the
    unpatched outcomes are kept per pin. ``cannot_run`` lists tests deselected on both sides;
    ``patches_dir`` checks that each expected difference names an existing patch;
    ``workers`` is pytest-xdist's ``-n`` (0 runs serially); ``logs_dir`` keeps each side's
    pytest output and JUnit report.
    """
    patched_tree, unpatched_tree = Path(patched_tree).resolve(), Path(unpatched_tree).resolve()
    if not Path(python).exists():
        raise ConformanceError(f"{python} does not exist; give the python of a venv with vLLM's deps.")
    if patched_tree == unpatched_tree:
        raise ConformanceError(f"the patched and unpatched trees are the same directory ({patched_tree}).")
    _check_tree(unpatched_tree, "unpatched", pin)
    _check_tree(patched_tree, "patched", pin)
    if not (hf_home / "hub").is_dir():
        raise ConformanceError(f"{hf_home} has no hub/; give the tests/fixtures/hf directory.")
    expectations = load_expected(expected, pin, patches_dir)
    skipped = load_cannot_run(cannot_run) if cannot_run is not None else ()
    changed = _changed_suite_files(patched_tree, unpatched_tree)
    if changed:
        log.warn(
            f"the series changes {len(changed)} file(s) of {SUITE} ({', '.join(changed)}); "
            "the pin's own tests referee it, so those changes are not run here."
        )
    with log.phase(f"conformance {pin}"), tempfile.TemporaryDirectory(prefix="vllm-rbln-conformance-") as tmp:
        work = Path(tmp)
        referee = _referee(unpatched_tree, work)
        for entry in skipped:
            if not (referee / entry.test.split("::")[0]).exists():
                raise ConformanceError(
                    f"{cannot_run} lists {entry.test}, which is not in the pin's tests; remove it."
                )
        # A private copy: huggingface_hub may write locks or metadata under HF_HOME.
        hf_copy = work / "hf"
        shutil.copytree(hf_home, hf_copy)
        setup = _Setup(
            python=python,
            referee=referee,
            hf_home=hf_copy,
            cannot_run=skipped,
            workers=workers,
            work=work,
            pycache=(baseline_cache or work) / "pycache",
            logs_dir=logs_dir,
        )

        baseline: SideRun | None = None
        cache_file: Path | None = None
        key: dict[str, str] = {}
        if baseline_cache is not None:
            key = _baseline_key(pin, python, unpatched_tree, referee, hf_home, skipped)
            digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
            cache_file = baseline_cache / "baselines" / f"vllm-{pin}-{digest}.json"
            baseline = _cached_baseline(cache_file, key)
            if baseline is not None and not _usable_as_baseline(baseline, expectations, "not using cached"):
                baseline = None
        if baseline is None:
            baseline = _run_side("unpatched", unpatched_tree, setup)
            if cache_file is not None and _usable_as_baseline(baseline, expectations, "not caching"):
                _store_baseline(cache_file, key, baseline, unpatched_tree)
        patched = _run_side("patched", patched_tree, setup)

    comparison = compare(baseline.outcomes, patched.outcomes, expectations)
    return ConformanceReport(pin, baseline, patched, comparison, skipped, changed)
