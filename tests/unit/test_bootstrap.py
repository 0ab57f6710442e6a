"""build.py's stdlib-only bootstrap on a Python without ensurepip (Debian's python3.X
without python3.X-venv): a sentence naming the package to install, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_python_without_ensurepip_gets_the_package_to_install(tmp_path: Path) -> None:
    # Debian leaves the ensurepip package out of python3.X; PYTHONPATH puts one first that
    # fails to import as the missing one does, for build.py and for the venv's own Python.
    fake = tmp_path / "no-ensurepip" / "ensurepip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'ensurepip\'", name="ensurepip")\n'
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("VLLM_RBLN_FORK_BOOTSTRAPPED", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env |= {"PYTHONPATH": str(fake.parent), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert proc.returncode != 0
    assert f"sudo apt install python{version}-venv" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not list((tmp_path / "cache").glob("vllm-rbln-fork/tool-envs/py*/bin/pip")), "a half-made env"
