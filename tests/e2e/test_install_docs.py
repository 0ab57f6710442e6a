"""What docs/install.md tells an operator, checked against pip and uv.

Two static servers on 127.0.0.1: the internal index (``vllm 0.31.0+rbln.1``) and a
stand-in for the public index (a plain ``vllm 0.31.0`` and a newer ``0.31.1``, as the
public index has). Resolution only (``--dry-run``): which file each recipe would take.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from vllm_rbln_fork.publish import publish

RBLN = "0.31.0+rbln.1"


@pytest.fixture(scope="module")
def indexes(kit: ModuleType, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("indexes")
    result = publish(kit.make_wheel(tmp / "d-rbln", RBLN), str(tmp / "internal"))
    for version in ("0.31.0", "0.31.1"):
        publish(kit.make_wheel(tmp / f"d-{version}", version), str(tmp / "public"))
    with (
        kit.static_server(tmp / "internal", tmp / "internal.log") as internal,
        kit.static_server(tmp / "public", tmp / "public.log") as public,
    ):
        yield {
            "internal": f"{internal.url}/simple/",
            "public": f"{public.url}/simple/",
            "down": f"http://127.0.0.1:{kit.free_port()}/simple/",  # nothing listens there
            "sha256": result.sha256,
        }


def _pip_would_install(kit: ModuleType, tmp: Path, index: str, extra: str, *requirement: str) -> str:
    python = kit.fresh_venv(tmp / "venv")
    report = tmp / "report.json"
    kit.pip(python, "install", "--dry-run", "--no-deps", "--retries", "0", "--index-url", index,
            "--extra-index-url", extra, "--report", report, *requirement)  # fmt: skip

    [version] = kit.installed_versions(json.loads(report.read_text()))
    return str(version)


def test_pip_with_the_full_label_and_hash_takes_the_rbln_build(
    kit: ModuleType, indexes, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"vllm=={RBLN} --hash=sha256:{indexes['sha256']}\n")
    version = _pip_would_install(
        kit, tmp_path, indexes["internal"], indexes["public"], "-r", str(requirements)
    )
    assert version == RBLN


def test_pip_with_the_full_label_fails_safely_when_the_internal_index_is_down(
    kit: ModuleType, indexes, tmp_path: Path
) -> None:
    with pytest.raises(AssertionError, match=r"(?i)no matching distribution"):
        _pip_would_install(kit, tmp_path, indexes["down"], indexes["public"], f"vllm=={RBLN}")


def test_pip_without_the_label_takes_the_public_vllm_when_the_internal_index_is_down(
    kit: ModuleType, indexes, tmp_path: Path
) -> None:
    # With the internal index up, ==0.31.0 happens to pick 0.31.0+rbln.1 (PEP 440: == without
    # a label matches any label, and a labelled version sorts above the plain one)...
    assert (
        _pip_would_install(kit, tmp_path / "up", indexes["internal"], indexes["public"], "vllm==0.31.0")
        == RBLN
    )
    # ...and with it down, pip warns and quietly installs upstream vLLM, without the scheduler.
    assert (
        _pip_would_install(kit, tmp_path / "down", indexes["down"], indexes["public"], "vllm==0.31.0")
        == "0.31.0"
    )
    # A range is worse still: the public index's newer release wins even with the internal one up.
    assert _pip_would_install(
        kit, tmp_path / "range", indexes["internal"], indexes["public"], "vllm>=0.31"
    ) == ("0.31.1")


def _uv(kit: ModuleType, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kit.uv_binary(), *map(str, args)], env=kit.isolated_env(UV_HTTP_RETRIES="0"), capture_output=True,
        text=True, check=False,
    )  # fmt: skip


def test_uv_with_extra_index_url_finds_the_public_vllm_first(
    kit: ModuleType, indexes, tmp_path: Path
) -> None:
    """uv searches --extra-index-url before --index-url, and stops at the first index with vllm."""
    python = kit.fresh_venv(tmp_path / "venv")
    pip_style = ["pip", "install", "--dry-run", "--no-deps", "--python", python,
                 "--index-url", indexes["internal"], "--extra-index-url", indexes["public"]]  # fmt: skip

    labelled = _uv(kit, *pip_style, f"vllm=={RBLN}")
    assert labelled.returncode != 0 and "first index" in labelled.stderr

    plain = _uv(kit, *pip_style, "vllm==0.31.0")
    assert plain.returncode == 0 and "+ vllm==0.31.0\n" in plain.stderr  # upstream vLLM, silently


def test_uv_project_with_an_explicit_internal_index_takes_the_rbln_build(
    kit: ModuleType, indexes, tmp_path: Path
) -> None:
    project = tmp_path / "server"
    project.mkdir()
    # docs/install.md's pyproject.toml, with the public index made explicit for the test.
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        f"""\
[project]
name = "inference-server"
version = "1.0.0"
requires-python = ">=3.11"
dependencies = ["vllm=={RBLN}"]

[tool.uv]
package = false

[[tool.uv.index]]
name = "rbln"
url = "{indexes["internal"]}"
explicit = true

[[tool.uv.index]]
name = "public-stand-in"
url = "{indexes["public"]}"
default = true

[tool.uv.sources]
vllm = {{ index = "rbln" }}
"""
    )
    locked = _uv(kit, "lock", "--directory", project)
    assert locked.returncode == 0, locked.stderr
    lock = (project / "uv.lock").read_text()
    assert f'version = "{RBLN}"' in lock and f"sha256:{indexes['sha256']}" in lock
    assert indexes["public"] not in lock

    python = kit.fresh_venv(tmp_path / "venv")
    from_pyproject = _uv(kit, "pip", "install", "--dry-run", "--python", python, "-r", pyproject)
    assert from_pyproject.returncode == 0 and f"+ vllm=={RBLN}\n" in from_pyproject.stderr

    # With the internal index down, locking fails: vllm never comes from the public index.
    pyproject.write_text(pyproject.read_text().replace(indexes["internal"], indexes["down"]))
    (project / "uv.lock").unlink()
    down = _uv(kit, "lock", "--directory", project)
    assert down.returncode != 0 and "vllm" in down.stderr and not (project / "uv.lock").exists()
