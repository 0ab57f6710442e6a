"""docs/adopting.md, section 1: its commands for the unpacked wheel, run as written.

The three ``sh`` blocks (at vLLM 0.30.0, from 0.31.0 up to 0.33.0, and from 0.34.0 on) are taken
from the page and run in bash on a stand-in of vllm-rbln 0.12.0's wheel (a zip of a small plugin
named as the real one), with an ``adopting/vllm-rbln-0.12.0`` folder shaped like the real one: the
0.31.0 port gated on ``vllm>=0.31.0``, the 0.34.0 port stacked on it and gated on
``vllm>=0.34.0``, the replaced scheduler in ``deletes``. Each must give the files the tool's own
applier gives at that pin (issue 52: the page's one loop applied the 0.31.0 port at 0.30.0, and
said "no repository needed", then ``git rm``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from vllm_rbln_fork.adopting import adoption_patches, apply_adoption_patches
from vllm_rbln_fork.paths import PROJECT_ROOT
from vllm_rbln_fork.pins import Pin

DOC = PROJECT_ROOT / "docs" / "adopting.md"
RELEASE = "vllm-rbln-0.12.0"
WHEEL = "vllm_rbln-0.12.0-py3-none-any.whl"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


def _block(intro: str) -> str:
    """The ``sh`` block that follows the paragraph starting with ``intro``."""
    text = DOC.read_text()
    found = re.search(re.escape(intro) + r".*?```sh\n(.*?)```", text, re.S)
    assert found, f"docs/adopting.md has no sh block after {intro!r}"
    return found.group(1)


def _stand_in(tmp_path: Path) -> tuple[Path, Path]:
    """A wheel named as vllm-rbln 0.12.0's, and a fork folder with its adoption patches."""
    src = tmp_path / "src"
    core = src / "vllm_rbln" / "v1" / "core"
    core.mkdir(parents=True)
    (src / "vllm_rbln-0.12.0.dist-info").mkdir()
    (src / "vllm_rbln-0.12.0.dist-info" / "METADATA").write_text("Requires-Dist: vllm==0.30.0+cpu\n")
    (core / "rbln_scheduler.py").write_text("class RBLNScheduler: ...\n")
    (src / "vllm_rbln" / "platform.py").write_text("scheduler_cls = 'vllm_rbln.v1.core.rbln_scheduler'\n")
    (src / "vllm_rbln" / "harmony.py").write_text("assert vllm_version < (0, 31, 0)\n")
    wheel = tmp_path / WHEEL
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            zf.write(path, path.relative_to(src).as_posix())
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "0.12.0")
    (src / "vllm_rbln" / "platform.py").write_text("scheduler_cls = 'vllm.v1.core.sched.rbln_scheduler'\n")
    (src / "vllm_rbln-0.12.0.dist-info" / "METADATA").write_text("Requires-Dist: vllm==0.30.0\n")
    _git(src, "commit", "-qam", "Run on the RBLN build of vllm and its scheduler")
    (src / "vllm_rbln" / "harmony.py").write_text("pass  # the fix is in\n")
    (src / "vllm_rbln-0.12.0.dist-info" / "METADATA").write_text("Requires-Dist: vllm==0.31.0\n")
    _git(src, "commit", "-qam", "Port to vllm 0.31.0")
    (src / "vllm_rbln" / "attention.py").write_text("from vllm.v1.kv_cache_interface import q\n")
    (src / "vllm_rbln-0.12.0.dist-info" / "METADATA").write_text("Requires-Dist: vllm==0.34.0\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "Port to vllm 0.34.0")
    folder = tmp_path / "fork" / "adopting" / RELEASE
    folder.mkdir(parents=True)
    first, second = "run-on-the-rbln-build.patch", "port-to-vllm-0.31.0.patch"
    third = "port-to-vllm-0.34.0.patch"
    for name, rev in ((first, "HEAD~2"), (second, "HEAD~1"), (third, "HEAD")):
        patch = subprocess.run(
            ["git", "format-patch", "--stdout", "--zero-commit", "-1", rev],
            cwd=src,
            check=True,
            capture_output=True,
        ).stdout
        (folder / name).write_bytes(patch)
    (folder / "series").write_text(f"# the order\n{first}\n{second} vllm>=0.31.0\n{third} vllm>=0.34.0\n")
    (folder / "deletes").write_text("# files that go\nvllm_rbln/v1/core/rbln_scheduler.py\n")
    return wheel, tmp_path / "fork"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("pin", "intro"),
    [
        ("0.30.0", "At vLLM 0.30.0 (the pin vllm-rbln 0.12.0 is built for)"),
        ("0.31.0", "From vLLM 0.31.0 up to 0.33.0"),
        ("0.34.0", "From vLLM 0.34.0 on"),
    ],
)
def test_the_pages_commands_give_what_the_applier_gives_at_the_pin(
    tmp_path: Path, pin: str, intro: str
) -> None:
    wheel, fork = _stand_in(tmp_path)
    work = tmp_path / "by-the-docs"
    work.mkdir()
    shutil.copy(wheel, work / WHEEL)
    script = _block(intro).replace("<fork>", str(fork))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=work, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    by_docs = _files(work / "vllm-rbln")

    by_tool = tmp_path / "by-the-tool"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(by_tool)
    apply_adoption_patches(by_tool, adoption_patches(RELEASE, root=fork / "adopting", pin=Pin.parse(pin)))
    assert by_docs == _files(by_tool)
    metadata = by_docs["vllm_rbln-0.12.0.dist-info/METADATA"].decode()
    assert metadata == f"Requires-Dist: vllm=={pin}\n"  # each port only from its release on
    assert ("vllm_rbln/attention.py" in by_docs) == (pin == "0.34.0")
    assert "vllm_rbln/v1/core/rbln_scheduler.py" not in by_docs


def test_the_page_names_check_and_update_s_last_step() -> None:
    """vllm-rbln 0.12.0's check_and_update runs _validate, _override, _wire, _setup_runtime_env:
    the page said it ended in _wire (checked against the released file in the consumer tier's
    venv by tests/consumer; here, that the page says so)."""
    text = " ".join(DOC.read_text().split())
    assert "runs `_validate`, `_override`, `_wire` and `_setup_runtime_env`, in that order" in text
    assert "ends in `_wire`" not in text
