"""The test runner's venvs, trees and tier paths: keys, holds and evictions between concurrent runs.

Real directories and real flock(2) locks; no venv is built (a venv already made, with the
wheel already installed, is what these behaviours are about)."""

from __future__ import annotations

import contextvars
import multiprocessing
import sys
import time
from pathlib import Path

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.files import made_and_held, made_once, sha256_of
from vllm_rbln_fork.testing import engine, runner


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel(tmp_path: Path, name: str = "vllm-0.31.0+rbln.1-cp38-abi3-manylinux_2_28_x86_64.whl") -> Path:
    wheel = tmp_path / name
    wheel.write_bytes(name.encode())
    return wheel


# (c) the venv key holds the Python version.


def test_the_vllm_test_venv_is_one_a_python(tmp_path: Path, cache: Path) -> None:
    lock = tmp_path / "vllm-test.lock"
    lock.write_text("torch==2.13.0\n")
    here = runner.vllm_venv_dir(lock)
    assert here == runner.vllm_venv_dir(lock, sys.version)
    assert runner.vllm_venv_dir(lock, "3.12.1 (main)") != here
    assert here.parent == cache / "venvs"


def test_the_engine_venv_is_one_a_python(tmp_path: Path, cache: Path) -> None:
    wheel, lock = _wheel(tmp_path), tmp_path / "engine.lock"
    lock.write_text("torch==2.13.0\n")
    a = engine.engine_venv_dir(wheel, lock, python_version="3.11.7 (main)")
    b = engine.engine_venv_dir(wheel, lock, python_version="3.11.9 (main)")
    assert a != b
    assert a.name.startswith("engine-0.31.0-") and b.name.startswith("engine-0.31.0-")


def test_the_engine_venv_key_asks_the_doc_blocks_interpreter(tmp_path: Path, cache: Path) -> None:
    version = engine.interpreter_version("python3.11")
    assert version.startswith("3.11.")
    wheel, lock = _wheel(tmp_path), tmp_path / "engine.lock"
    lock.write_text("")
    assert engine.engine_venv_dir(wheel, lock) == engine.engine_venv_dir(wheel, lock, python_version=version)


# (a) making an engine venv evicts only the pin's venvs that no run holds.


def test_eviction_spares_a_venv_another_run_holds(tmp_path: Path, cache: Path) -> None:
    venvs = cache / "venvs"
    held, idle, other_pin = (
        made_once(venvs / name, lambda d: d.mkdir(parents=True))
        for name in ("engine-0.31.0-aaaa", "engine-0.31.0-bbbb", "engine-0.32.0-cccc")
    )
    new = venvs / "engine-0.31.0-dddd"
    with made_and_held(held, lambda d: d.mkdir(parents=True)):  # another tree's run, mid-test
        assert engine.evict_older_engine_venvs(new) == [idle]
        assert (held / ".complete").exists()
    assert not idle.exists()
    assert other_pin.exists()
    assert engine.evict_older_engine_venvs(new) == [held]  # no longer held


# (b) a run holds the shared vLLM test venv, with its wheel, until it is done with it.


def _fake_venv(cache: Path, lock: Path, wheel: Path) -> Path:
    """A test venv as vllm_venv leaves it: made, with ``wheel`` installed (nothing to do)."""
    env_dir = runner.vllm_venv_dir(lock)
    made_once(env_dir, lambda d: d.mkdir(parents=True))
    (env_dir / ".wheel-sha256").write_text(sha256_of(wheel))
    return env_dir


def _second_run(cache: str, lock: str, wheel: str, entered: str) -> None:
    import os

    os.environ["VLLM_RBLN_FORK_CACHE"] = cache
    with runner.vllm_venv(Path(wheel), Path(lock)):
        Path(entered).write_text(str(time.monotonic()))


def test_a_second_run_waits_for_the_test_venv(tmp_path: Path, cache: Path) -> None:
    lock, wheel = tmp_path / "vllm-test.lock", _wheel(tmp_path)
    lock.write_text("torch==2.13.0\n")
    _fake_venv(cache, lock, wheel)
    entered = tmp_path / "entered"
    ctx = multiprocessing.get_context("spawn")
    with runner.vllm_venv(wheel, lock) as python:
        assert python == runner.vllm_venv_dir(lock) / "bin" / "python"
        second = ctx.Process(target=_second_run, args=(str(cache), str(lock), str(wheel), str(entered)))
        second.start()
        time.sleep(2.0)  # ample, on an idle machine, for a spawned process to import and reach the venv
        assert not entered.exists(), "a second run used the test venv while the first was testing"
        left = time.monotonic()
    second.join(timeout=60)
    assert second.exitcode == 0
    assert float(entered.read_text()) >= left


# (d) a renamed test file fails the run before any work.


def test_a_renamed_per_pin_e2e_file_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        runner, "TIER_PATHS", {**runner.TIER_PATHS, "e2e": ("tests/e2e", "tests/e2e/test_renamed_away.py")}
    )

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the runner built a wheel before checking its test paths")

    monkeypatch.setattr(runner, "build", no_build)
    with pytest.raises(ForkError, match="tests/e2e/test_renamed_away.py"):
        runner.run_tests(["--tier", "e2e", "--pin", "0.31.0"])


def test_every_path_the_runner_names_exists() -> None:
    runner.check_tier_paths(list(runner.TIERS))
    assert set(runner.E2E_PER_PIN) <= set(runner.TIER_PATHS["e2e"])


# The scheduler tier's variant trees: hard-linked copies of the patched tree, one patch applied.

VARIANT = """\
--- a/vllm/gate.py
+++ b/vllm/gate.py
@@ -1,2 +1,2 @@
 def decode_step_tokens():
-    return 1 + NUM_SPEC_TOKENS
+    return 0
"""


def test_a_variant_tree_changes_its_own_files_only(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patched = made_once(tmp_path / "patched-0123456789ab", lambda d: (d / "vllm").mkdir(parents=True))
    gate = "def decode_step_tokens():\n    return 1 + NUM_SPEC_TOKENS\n"
    (patched / "vllm" / "gate.py").write_text(gate)
    (patched / "vllm" / "other.py").write_text("x = 1\n")
    variants = tmp_path / "variants"
    variants.mkdir()
    (variants / "no-backport.patch").write_text(VARIANT)
    monkeypatch.setattr(runner, "VARIANTS", variants)

    trees = runner.variant_trees(patched, "0123456789abcdef")

    variant = Path(trees["no-backport"])
    assert (variant / "vllm" / "gate.py").read_text() == "def decode_step_tokens():\n    return 0\n"
    assert (patched / "vllm" / "gate.py").read_text() == gate  # the patched tree untouched
    assert (variant / "vllm" / "other.py").read_text() == "x = 1\n"
    assert (variant / "vllm" / "other.py").stat().st_ino == (patched / "vllm" / "other.py").stat().st_ino
    assert (variant / ".complete").exists()


# The engine tier's wheel and venv, made on a thread while the pin's other tiers run.


def test_the_engine_setup_makes_the_venv_with_the_build_and_reports_through_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextlib import contextmanager

    from vllm_rbln_fork import log
    from vllm_rbln_fork.pins import Pin
    from vllm_rbln_fork.project import Project

    wheel, lock = _wheel(tmp_path), tmp_path / "engine.lock"
    made: list[tuple[Path, Path]] = []

    @contextmanager
    def venv(w: Path, lk: Path):  # type: ignore[no-untyped-def]
        log.info(f"made {w.name}")
        made.append((w, lk))
        yield w

    class Built:
        def __init__(self) -> None:
            self.wheel = wheel

    monkeypatch.setattr(engine, "plan_for", lambda pin, project, cannot: engine.PinPlan(lock, None))
    monkeypatch.setattr(engine, "build_engine_wheel", lambda pin: Built())
    monkeypatch.setattr(engine, "engine_venv", venv)
    reporter = log.RecordingReporter()

    def run() -> None:  # in a context of its own: the reporter is set for this test alone
        log.set_reporter(reporter)
        runner.EngineSetup(Pin.parse("0.31.0"), Project.default()).wait()

    contextvars.copy_context().run(run)
    assert made == [(wheel, lock)]
    assert f"made {wheel.name}" in reporter.messages("info")  # the run's reporter, not a silent one


def test_the_engine_setup_gives_its_error_to_the_engine_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_rbln_fork.pins import Pin
    from vllm_rbln_fork.project import Project

    def failing_build(pin: object) -> None:
        raise ForkError("docs/install.md's install commands failed")

    monkeypatch.setattr(engine, "plan_for", lambda pin, project, cannot: engine.PinPlan(Path("x.lock"), None))
    monkeypatch.setattr(engine, "build_engine_wheel", failing_build)
    setup = runner.EngineSetup(Pin.parse("0.31.0"), Project.default())
    with pytest.raises(ForkError, match="install commands failed"):
        setup.wait()


def test_a_pin_that_is_not_a_version_is_refused_before_any_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """C2: ``build.py test --pin not-a-version`` ran the whole tooling tier, then refused."""

    def no_pytest(*args: object, **kwargs: object) -> None:
        raise AssertionError("the runner ran a tier before reading --pin")

    monkeypatch.setattr(runner, "_pytest", no_pytest)
    with pytest.raises(ForkError, match="'not-a-version' is not a PEP 440 version"):
        runner.run_tests(["--pin", "not-a-version"])
