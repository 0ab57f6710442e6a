"""The real build of a supported vLLM pin (the test runner built it; VLLM_RBLN_WHEEL names it,
VLLM_RBLN_PIN its pin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


PIN = os.environ.get("VLLM_RBLN_PIN", "0.31.0")  # the test runner sets it to the pin it built


@pytest.fixture(scope="module")
def wheel() -> Path:
    path = os.environ.get("VLLM_RBLN_WHEEL")
    if not path or not Path(path).is_file():
        pytest.fail("VLLM_RBLN_WHEEL must name the built wheel; run this tier through 'python build.py test'")
    return Path(path)


def test_wheel_name_version_and_tag(wheel: Path) -> None:
    assert wheel.name.startswith(f"vllm-{PIN}+rbln.") and wheel.name.endswith("-py3-none-any.whl")
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"vllm-{version}.dist-info/METADATA").decode()
        wheel_meta = zf.read(f"vllm-{version}.dist-info/WHEEL").decode()
        names = zf.namelist()
    assert f"\nVersion: {version}\n" in meta
    assert "Tag: py3-none-any" in wheel_meta and "Root-Is-Purelib: true" in wheel_meta
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]


def test_patched_source_and_manifest_are_inside(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        kv_manager = zf.read("vllm/v1/core/kv_cache_manager.py").decode()
        scheduler = zf.read("vllm/v1/core/sched/rbln_scheduler.py").decode()
        module = zf.read("vllm/_rbln_build.py").decode()
    assert "num_decode_step_tokens" in kv_manager  # the backport of vllm#63288
    assert "class RBLNScheduler(Scheduler)" in scheduler
    namespace: dict[str, object] = {}
    exec(compile(module, "_rbln_build.py", "exec"), namespace)
    manifest = namespace["MANIFEST"]
    assert isinstance(manifest, dict)
    assert manifest["pin"] == PIN
    backport = manifest["applied"][0]
    assert backport["origin"] == "backport, vllm-project/vllm#63288"
    beside = json.loads(wheel.with_name(wheel.name.removesuffix(".whl") + ".manifest.json").read_text())
    assert beside["patched_commit"] == manifest["patched_commit"]
    assert beside["source_sha256"] == manifest["source_sha256"]


def test_second_build_is_a_cache_hit_with_the_same_bytes(wheel: Path) -> None:
    before = wheel.read_bytes()
    out = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--pin", PIN],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "cache hit" in out.stderr
    assert Path(out.stdout.strip()) == wheel
    assert wheel.read_bytes() == before
