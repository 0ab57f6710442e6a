"""Publishing with the URL form: a real pypiserver on 127.0.0.1, twine, pip and uv.

pypiserver runs without authentication (``-a . -P .``); twine still wants a user name
and password, which come from the environment as they would in production.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from vllm_rbln_fork import log
from vllm_rbln_fork.errors import FailedProcess, IndexConflict, IndexUnreachable
from vllm_rbln_fork.publish import publish
from vllm_rbln_fork.publish import upload as publish_module

SECRET = "pw-8d1c7e0b-never-in-logs"
WHEEL_PATH_RE = "vllm-0.31.0+rbln.{n}-py3-none-any.whl"


@pytest.fixture(scope="module")
def server(kit: ModuleType, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("pypiserver")
    with kit.pypiserver(tmp / "packages", tmp / "pypiserver.log") as s:
        s.packages = tmp / "packages"  # type: ignore[attr-defined]
        yield s


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINE_USERNAME", "release-bot")
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)


def test_upload_then_install_with_pip_and_uv(kit: ModuleType, server, tmp_path: Path) -> None:
    wheel = kit.make_wheel(tmp_path / "dist", "0.31.0+rbln.1")

    result = publish(wheel, server.url)

    assert not result.already_published
    assert (server.packages / wheel.name).read_bytes() == wheel.read_bytes()
    assert result.file_url.endswith("vllm-0.31.0%2Brbln.1-py3-none-any.whl") or result.file_url.endswith(
        wheel.name
    )
    index = f"{server.url}simple/"
    show_version = "import importlib.metadata as m; print(m.version('vllm'))"

    with_pip = kit.fresh_venv(tmp_path / "pip-venv")
    kit.pip(with_pip, "install", "--no-deps", "--index-url", index, "vllm==0.31.0+rbln.1")
    assert kit.venv_python(with_pip, show_version) == "0.31.0+rbln.1"

    with_uv = kit.fresh_venv(tmp_path / "uv-venv")
    kit.run([kit.uv_binary(), "pip", "install", "--python", with_uv, "--no-deps", "--index-url", index,
             "vllm==0.31.0+rbln.1"])  # fmt: skip
    assert kit.venv_python(with_uv, show_version) == "0.31.0+rbln.1"
    assert (
        kit.venv_python(with_uv, "from vllm._rbln_build import MANIFEST; print(MANIFEST['pin'])") == "0.31.0"
    )

    downloads = [line for line in server.log().splitlines() if "GET" in line and ".whl" in line]
    assert len(downloads) >= 2, server.log()  # both installers fetched the wheel from this server


def test_same_bytes_is_a_no_op_and_other_bytes_conflict(
    kit: ModuleType, server, tmp_path: Path, recorder: log.RecordingReporter
) -> None:
    wheel = kit.make_wheel(tmp_path / "dist", "0.31.0+rbln.2")
    publish(wheel, server.url)

    again = publish(kit.make_wheel(tmp_path / "rebuilt", "0.31.0+rbln.2"), server.url)
    assert again.already_published
    assert any("already on" in m and "same bytes" in m for m in recorder.messages("info"))

    impostor = kit.make_wheel(tmp_path / "impostor", "0.31.0+rbln.2", body="# other patches")
    with pytest.raises(IndexConflict, match="never replaced"):
        publish(impostor, server.url)
    assert (server.packages / wheel.name).read_bytes() == wheel.read_bytes()


def test_the_binary_wheel_of_a_published_pure_version_is_not_uploaded(
    kit: ModuleType, server, tmp_path: Path
) -> None:
    """One index, one kind of wheel per version: pip would take the binary one."""
    pure = kit.make_wheel(tmp_path / "dist", "0.31.0+rbln.6")
    publish(pure, server.url)
    binary = kit.make_wheel(tmp_path / "binary", "0.31.0+rbln.6", tag="cp38-abi3-manylinux_2_28_x86_64")

    with pytest.raises(IndexConflict) as err:
        publish(binary, server.url)

    assert f"already has {pure.name}, the pure wheel" in str(err.value)
    assert "separate indexes" in str(err.value)
    assert not (server.packages / binary.name).exists()


def test_an_index_that_cannot_be_read_stops_the_upload(kit: ModuleType, server, tmp_path: Path) -> None:
    """No blind upload: the pure/binary check needs the pages."""
    wheel = kit.make_wheel(tmp_path / "dist", "0.31.0+rbln.7")
    unreadable = f"http://127.0.0.1:{kit.free_port()}/simple/"

    with pytest.raises(IndexUnreachable, match="--check-index"):
        publish(wheel, server.url, index_url=unreadable)

    assert not (server.packages / wheel.name).exists()


def test_a_refusal_by_the_server_is_a_conflict_too(kit: ModuleType, server, tmp_path: Path) -> None:
    """When the pages read do not list the file (another upload came in between, or they
    lag), the server's own 409 still stops an overwrite."""
    wheel = kit.make_wheel(tmp_path / "dist", "0.31.0+rbln.3")
    publish(wheel, server.url)
    impostor = kit.make_wheel(tmp_path / "impostor", "0.31.0+rbln.3", body="# other patches")
    lagging = tmp_path / "lagging"  # pages from before rbln.3 was uploaded
    publish(kit.make_wheel(tmp_path / "older", "0.31.0+rbln.0"), str(lagging))

    with kit.static_server(lagging, tmp_path / "http.log") as pages:
        with pytest.raises(IndexConflict, match="already there"):
            publish(impostor, server.url, index_url=f"{pages.url}/simple/")

    assert (server.packages / wheel.name).read_bytes() == wheel.read_bytes()


def test_credentials_never_reach_a_command_line_or_a_log(
    kit: ModuleType, server, tmp_path: Path, recorder: log.RecordingReporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    command_lines: list[list[str]] = []
    real_run = publish_module.proc.run

    def recording_run(cmd, **kwargs):  # type: ignore[no-untyped-def]
        command_lines.append([str(c) for c in cmd])
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(publish_module.proc, "run", recording_run)
    publish(kit.make_wheel(tmp_path / "ok", "0.31.0+rbln.4"), server.url)
    nowhere = f"http://127.0.0.1:{kit.free_port()}/"
    with pytest.raises(FailedProcess) as failed:  # the pages read, the upload fails in twine
        publish(
            kit.make_wheel(tmp_path / "fails", "0.31.0+rbln.5"), nowhere, index_url=f"{server.url}simple/"
        )

    assert len(command_lines) == 2
    assert not [c for c in command_lines if any(SECRET in part for part in c)]
    assert SECRET not in str(failed.value) and SECRET not in " ".join(failed.value.cmd)
    assert "TWINE_PASSWORD" in str(failed.value)  # the way out is named
    assert not [text for _, text in recorder.events if SECRET in text]
    assert SECRET not in server.log()
