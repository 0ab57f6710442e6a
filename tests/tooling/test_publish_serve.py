"""A published folder, served by a plain static server, installed by pip into fresh venvs.

pip runs isolated from this machine's configuration; each test checks the server's log,
so an install that came from anywhere else fails.
"""

from __future__ import annotations

from pathlib import Path

import indexkit as kit  # tests/support, put on sys.path by tests/tooling/conftest.py
import pytest

from vllm_rbln_fork.publish import publish, yank

WHEEL = "vllm-0.31.0+rbln.1-py3-none-any.whl"
WHEEL_PATH = "/files/vllm-0.31.0%2Brbln.1-py3-none-any.whl"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """rbln.1 and rbln.2 published, rbln.2 yanked; served by ``python -m http.server``."""
    tmp = tmp_path_factory.mktemp("served")
    index = tmp / "index"
    publish(kit.make_wheel(tmp / "d1", "0.31.0+rbln.1"), str(index))
    publish(kit.make_wheel(tmp / "d2", "0.31.0+rbln.2"), str(index))
    yank(str(index), "vllm-0.31.0+rbln.2-py3-none-any.whl", "broken admission gate")
    with kit.static_server(index, tmp / "http.log") as server:
        yield server


def test_pip_installs_the_wheel_from_the_static_folder(served, tmp_path: Path) -> None:
    python = kit.fresh_venv(tmp_path / "venv")
    requirement = "vllm==0.31.0+rbln.1"

    kit.pip(python, "install", "--no-deps", "--index-url", f"{served.url}/simple/", requirement)

    assert (
        kit.venv_python(python, "import importlib.metadata as m; print(m.version('vllm'))") == "0.31.0+rbln.1"
    )
    assert kit.venv_python(
        python, "from vllm._rbln_build import MANIFEST; print(MANIFEST['wheel_version'])"
    ) == ("0.31.0+rbln.1")
    assert "/simple/vllm/" in served.gets()
    assert WHEEL_PATH in served.gets()  # the wheel came from this server, not from elsewhere


def test_dry_run_report_fetches_only_the_metadata_file(served, tmp_path: Path) -> None:
    python = kit.fresh_venv(tmp_path / "venv")
    seen = len(served.gets())

    report = kit.dry_run_report(python, f"{served.url}/simple/", "vllm==0.31.0+rbln.1", tmp_path / "r.json")

    assert kit.installed_versions(report) == ["0.31.0+rbln.1"]
    new = served.gets()[seen:]
    assert WHEEL_PATH + ".metadata" in new  # PEP 658: the metadata alone
    assert WHEEL_PATH not in new


def test_a_yanked_build_is_skipped_unless_pinned(served, tmp_path: Path) -> None:
    python = kit.fresh_venv(tmp_path / "venv")
    index = f"{served.url}/simple/"

    unpinned = kit.dry_run_report(python, index, "vllm", tmp_path / "unpinned.json")
    assert kit.installed_versions(unpinned) == ["0.31.0+rbln.1"]  # rbln.2 is newer but yanked

    pinned = kit.dry_run_report(python, index, "vllm==0.31.0+rbln.2", tmp_path / "pinned.json")
    assert kit.installed_versions(pinned) == ["0.31.0+rbln.2"]  # PEP 592: an exact pin still gets it


def test_pip_reads_the_json_pages_where_the_server_negotiates(tmp_path: Path) -> None:
    index = tmp_path / "index"
    publish(kit.make_wheel(tmp_path / "d1", "0.31.0+rbln.1"), str(index))
    python = kit.fresh_venv(tmp_path / "venv")

    with kit.negotiating_server(index) as server:
        kit.pip(python, "install", "--no-deps", "--index-url", f"{server.url}/simple/", "vllm==0.31.0+rbln.1")

    assert ("/simple/vllm/", "index.json") in [(path, served) for path, _, served in server.served]
    assert WHEEL_PATH in [path for path, _, _ in server.served]
    assert (
        kit.venv_python(python, "import importlib.metadata as m; print(m.version('vllm'))") == "0.31.0+rbln.1"
    )
