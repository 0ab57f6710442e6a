"""The real RBLN wheel, published to a folder, served, installed as an operator would.

The test runner sets ``VLLM_RBLN_WHEEL`` to the wheel ``python build.py --pin ...`` made
(``dist/vllm-<pin>+rbln.<n>-py3-none-any.whl``); without it this test fails, it never
skips. The install is ``--no-deps`` (vLLM's dependencies, torch first, are not
installed here), and ``vllm/__init__.py`` imports torch, so this tier reads the installed
distribution and its manifest module without importing the package. That
``RBLNScheduler`` imports and runs is the scheduler tier's job (a venv with torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import pytest
from packaging.utils import parse_wheel_filename

from vllm_rbln_fork.manifest import BESIDE_ONLY
from vllm_rbln_fork.publish import publish

# Runs in the fresh venv: the installed version, files and manifest, without importing
# vllm/__init__.py (it needs torch).
PROBE = r"""
import importlib.metadata as md, importlib.util, json, pathlib
dist = md.distribution("vllm")
spec = importlib.util.find_spec("vllm")
pkg = pathlib.Path(spec.submodule_search_locations[0])
build = importlib.util.spec_from_file_location("rbln_build", pkg / "_rbln_build.py")
module = importlib.util.module_from_spec(build)
build.loader.exec_module(module)
print(json.dumps({
    "version": dist.version,
    "manifest": module.MANIFEST,
    "files": sorted(str(f) for f in dist.files),
    "installer": dist.read_text("INSTALLER"),
    # Compiles (no import: that needs torch, the scheduler tier does it).
    "rbln_scheduler_compiles": bool(compile(
        (pkg / "v1/core/sched/rbln_scheduler.py").read_text(), "rbln_scheduler.py", "exec"
    )),
}))
"""


@pytest.fixture(scope="module")
def real_wheel() -> Path:
    value = os.environ.get("VLLM_RBLN_WHEEL")
    if not value:
        pytest.fail(
            "VLLM_RBLN_WHEEL is not set: point it at the wheel the build made, e.g. "
            "VLLM_RBLN_WHEEL=dist/vllm-0.31.0+rbln.1-py3-none-any.whl (python build.py --pin 0.31.0 "
            "makes it)."
        )
    wheel = Path(value).resolve()
    if not wheel.is_file():
        pytest.fail(f"VLLM_RBLN_WHEEL={value} does not exist; build it first (python build.py --pin ...).")
    return wheel


def test_operator_install_from_the_static_index(kit: ModuleType, real_wheel: Path, tmp_path: Path) -> None:
    _, version, _, _ = parse_wheel_filename(real_wheel.name)
    index = tmp_path / "index"
    result = publish(real_wheel, str(index))
    python = kit.fresh_venv(tmp_path / "venv")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"vllm=={version} --hash=sha256:{result.sha256}\n")  # as docs/install.md says

    with kit.static_server(index, tmp_path / "http.log") as server:
        kit.pip(python, "install", "--no-deps", "--require-hashes", "--index-url", f"{server.url}/simple/",
                "-r", requirements)  # fmt: skip
        fetched = server.gets()

    wheel_path = "/files/" + real_wheel.name.replace("+", "%2B")
    assert wheel_path in fetched  # from this server, not from anywhere else
    installed = json.loads(kit.venv_python(python, PROBE))
    assert installed["version"] == str(version)
    assert installed["installer"].strip() == "pip"

    manifest = installed["manifest"]
    assert manifest["wheel_version"] == str(version)
    beside = real_wheel.with_name(real_wheel.name.removesuffix(".whl") + ".manifest.json")
    if beside.is_file():  # the copy in dist/ also holds the wheel's own name, hash and source
        expected = json.loads(beside.read_text())
        assert expected["wheel_sha256"] == result.sha256
        for key in BESIDE_ONLY:  # kept out of the wheel, so its bytes do not depend on them
            expected.pop(key)
        assert manifest == expected

    assert "vllm/_rbln_build.py" in installed["files"]
    assert "vllm/v1/core/sched/rbln_scheduler.py" in installed["files"]
    assert installed["rbln_scheduler_compiles"]
    assert not [f for f in installed["files"] if f.endswith((".so", ".pyd"))]  # pure, as tagged
