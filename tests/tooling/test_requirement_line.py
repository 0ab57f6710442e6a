"""The requirement line a plugin puts on our wheel (docs/adopting.md, step 1), resolved by a
real pip into a fresh venv from a find-links folder.

vllm-rbln 0.12.0 requires ``vllm==0.30.0+cpu``; moved to our wheel of 0.31.0, the same shape
(``vllm==0.31.0+cpu``) does not accept ``0.31.0+rbln.N``: a specifier with a local label
matches that label only. ``vllm==0.31.0`` (no label) accepts every build of 0.31.0, and
among builds on offer pip takes the highest local label, ours over vLLM's CPU build.
The stand-in plugin ``rbln-plugin`` carries only the requirement line under test.
"""

from __future__ import annotations

from pathlib import Path

import indexkit as kit  # tests/support, put on sys.path by tests/tooling/conftest.py
import pytest

from vllm_rbln_fork.wheel import pack_wheel

OURS = "0.31.0+rbln.3"
VLLM_CPU = "0.31.0+cpu"


def plugin_wheel(out_dir: Path, requirement: str) -> Path:
    """A tiny plugin wheel whose one dependency is ``requirement``."""
    src = out_dir / "src-plugin"
    (src / "rbln_plugin").mkdir(parents=True)
    (src / "rbln_plugin" / "__init__.py").write_text("")
    dist_info = src / "rbln_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: rbln-plugin\nVersion: 1.0\nRequires-Dist: {requirement}\n"
    )
    (dist_info / "WHEEL").write_text(
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    return pack_wheel(src, out_dir / "rbln_plugin-1.0-py3-none-any.whl", 1_700_000_000)


def links(tmp_path: Path, requirement: str, *vllm_versions: str) -> Path:
    """A find-links folder: the plugin and the given builds of vllm."""
    folder = tmp_path / "links"
    folder.mkdir()
    for version in vllm_versions:
        kit.make_wheel(folder, version)
    plugin_wheel(tmp_path, requirement).rename(folder / "rbln_plugin-1.0-py3-none-any.whl")
    return folder


def install(python: Path, folder: Path) -> str:
    return kit.pip(python, "install", "--no-index", "--find-links", folder, "rbln-plugin")


def installed_vllm(python: Path) -> str:
    return kit.venv_python(python, "from importlib.metadata import version; print(version('vllm'))")


def test_the_cpu_pin_refuses_our_wheel(tmp_path: Path) -> None:
    python = kit.fresh_venv(tmp_path / "venv")
    folder = links(tmp_path, "vllm==0.31.0+cpu", OURS)
    with pytest.raises(AssertionError) as failure:
        install(python, folder)
    output = str(failure.value)
    # pip saw our wheel and refused it for the label.
    assert "No matching distribution found for vllm==0.31.0+cpu" in output
    assert f"(from versions: {OURS})" in output
    # Nothing was installed.
    assert kit.venv_python(python, "import importlib.util as u; print(u.find_spec('rbln_plugin'))") == "None"


def test_the_release_pin_takes_our_wheel_over_vllms_cpu_build(tmp_path: Path) -> None:
    """``vllm==0.31.0`` accepts every build of 0.31.0; pip takes the highest local label,
    and ``rbln`` sorts after ``cpu``."""
    python = kit.fresh_venv(tmp_path / "venv")
    install(python, links(tmp_path, "vllm==0.31.0", VLLM_CPU, OURS))
    assert installed_vllm(python) == OURS


def test_an_exact_build_pin_installs_that_build(tmp_path: Path) -> None:
    python = kit.fresh_venv(tmp_path / "venv")
    install(python, links(tmp_path, f"vllm=={OURS}", VLLM_CPU, OURS))
    assert installed_vllm(python) == OURS


def test_an_exact_build_pin_refuses_another_build(tmp_path: Path) -> None:
    python = kit.fresh_venv(tmp_path / "venv")
    with pytest.raises(AssertionError, match=r"No matching distribution found for vllm==0\.31\.0\+rbln\.2"):
        install(python, links(tmp_path, "vllm==0.31.0+rbln.2", OURS))


def test_an_installed_cpu_build_satisfies_the_release_pin_and_stays(tmp_path: Path) -> None:
    """With vLLM's CPU build of 0.31.0 already installed, installing the plugin changes no vllm,
    although our build is on offer: pip says "Requirement already satisfied" (what the install
    guard of docs/adopting.md is for)."""
    python = kit.fresh_venv(tmp_path / "venv")
    folder = links(tmp_path, "vllm==0.31.0", VLLM_CPU, OURS)
    kit.pip(python, "install", "--no-index", "--find-links", folder, f"vllm=={VLLM_CPU}")
    assert installed_vllm(python) == VLLM_CPU
    output = install(python, folder)
    assert "Requirement already satisfied: vllm==0.31.0 in" in output and f"({VLLM_CPU})" in output, output
    assert installed_vllm(python) == VLLM_CPU
