"""Consumer tier: vllm-rbln 0.12.0's model runner (the adoption patches applied) on our wheel.

Runs in the tier's venv (``vllm_rbln_fork/testing/consumer.py``): a pin's vLLM test venv with
our wheel, numba, and vllm-rbln 0.12.0 installed ``--no-deps`` and patched. Needs, from the test
runner, ``VLLM_RBLN_SOURCE_TREE`` (the patched vLLM source tree: its ``tests/v1/core/utils.py``
is the scheduler harness) and ``VLLM_RBLN_UPSTREAM_TREE`` (the unpatched tree: a vLLM that is
not the RBLN build, for the install guard's test).

Before anything imports vLLM: Rebellions' SDK is stubbed (``rbln_sdk_stubs``, the only
stand-ins), and vLLM is left to pick its platform from the installed plugins, so that it runs on
vllm-rbln's ``RblnPlatform`` as on an RBLN host (the runner's ``VLLM_TARGET_DEVICE=cpu`` would
pick the CPU platform instead); the vllm model path, host tensors, and an NPU name as a device
host reports it (a CA25: not a CR13, so sub-blocks below the chunk are refused unless a test
names a CR13). vllm-rbln's own start-up would refuse the vllm model path on a CA; the harness
builds its configs without that check (docs/adopting.md, section 6, "Not yet driven")."""

from __future__ import annotations

import fnmatch
import os
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
os.environ.setdefault("HF_HOME", str(HERE.parent / "fixtures" / "hf"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("VLLM_TARGET_DEVICE", None)
os.environ["VLLM_RBLN_USE_VLLM_MODEL"] = "1"
os.environ["VLLM_RBLN_USE_DEVICE_TENSOR"] = "0"
os.environ["RBLN_FORCE_NPU_NAME"] = "RBLN-CA25"

for path in (HERE, HERE.parent / "scheduler", HERE.parent / "support"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# This process and every Python process it starts (vLLM inspects model architectures in one).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(HERE / "stub_site"), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
)
import rbln_sdk_stubs  # noqa: E402

rbln_sdk_stubs.install()

# vLLM first, and its platform resolved, as an engine does: vllm-rbln's platform module imports
# vLLM, and imported first it would be re-entered by vLLM's plugin loader half-made.
import vllm.platforms  # noqa: E402

assert vllm.platforms.current_platform is not None

import sched_harness  # noqa: E402

_SOURCE_TREE = os.environ.get(sched_harness.SOURCE_TREE_ENV)
_SETUP_ERROR = sched_harness.load_harness_from_env()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs the real patched vLLM")


# A listed test's failure must be one of its pin's `errors`: the xfail covers the measured
# reason, never another failure behind it.
_EXPECTED_ERRORS = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The pin's entry of cannot-run.toml: its tests are expected to fail (strictly), with one
    of the entry's errors."""
    entry = tomllib.loads((HERE / "cannot-run.toml").read_text())["pin"].get(
        os.environ.get("VLLM_RBLN_PIN", "")
    )
    if entry is None:
        return
    for item in items:
        name = f"{Path(str(item.path)).name}::{item.name}"
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in entry["tests"]):
            item.add_marker(pytest.mark.xfail(strict=True, reason=" ".join(entry["why"].split())))
            item.stash[_EXPECTED_ERRORS] = entry["errors"]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Outermost, so it sees pytest's xfail verdict: a listed test that failed otherwise than
    its pin's entry says is a failure, with its own traceback."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    expected = item.stash.get(_EXPECTED_ERRORS, None)
    if expected is None or call.excinfo is None or not hasattr(report, "wasxfail"):
        return
    error = f"{call.excinfo.typename}: {call.excinfo.value}"
    if not any(text in error for text in expected):
        report.outcome = "failed"
        del report.wasxfail
        why = f"listed as expected to fail, but failed with {error!r}, not one of {expected}"
        report.sections.append(("cannot-run.toml", why))


@pytest.fixture(autouse=True)
def _require_source_tree() -> None:
    if _SETUP_ERROR is not None:
        pytest.fail(_SETUP_ERROR, pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _pipeline_peer() -> Iterator[None]:
    """The pipelines' last stage (`runner_harness.PipelinePeer`) lives for the run: it exits
    cleanly at the end."""
    yield
    import runner_harness

    runner_harness.stop_pipeline_peer()
