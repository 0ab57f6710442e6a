"""build.py's stdlib-only bootstrap on a Python without ensurepip (Debian's python3.X
without python3.X-venv): a sentence naming the package to install, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from vllm_rbln_fork import pipconfig
from vllm_rbln_fork.pipconfig import pip_settings

ROOT = Path(__file__).resolve().parents[2]


def _bootstrap_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bootstrap", ROOT / "build.py")
    assert spec is not None and spec.loader is not None
    bootstrap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bootstrap)
    return bootstrap


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


def test_uv_gets_the_indexes_pip_is_configured_with_the_environment_first() -> None:
    config = "\n".join(
        [
            ":env:.find-links='/opt/wheels'",
            "global.cert='/etc/ssl/certs/ca.crt'",
            "global.extra-index-url='file:///a/simple file:///b/simple'",
            "global.find-links='/elsewhere'",
            "global.index-url='https://files.example.invalid/simple'",
            "install.index-url='https://install.example.invalid/simple'",
        ]
    )
    settings = pip_settings(config)
    assert settings["cert"] == "/etc/ssl/certs/ca.crt"
    assert pipconfig.uv_options(settings) == (
        ["--no-config", "--index-strategy", "unsafe-best-match"],
        {
            "UV_INDEX_URL": "https://install.example.invalid/simple",
            "UV_EXTRA_INDEX_URL": "file:///a/simple file:///b/simple",
            "UV_FIND_LINKS": "/opt/wheels",
        },
    )
    assert pipconfig.uv_options({}) == (["--no-config", "--index-strategy", "unsafe-best-match"], {})


def test_asking_for_help_installs_no_bigger_lock() -> None:
    lock_for = _bootstrap_module().lock_for
    assert lock_for(["lint", "--help"]).name == lock_for(["test", "-h"]).name == "build.lock"
    assert (
        lock_for(["lint"]).name == "dev.lock" and lock_for(["test", "--tier", "tooling"]).name == "test.lock"
    )


def test_index_urls_reach_uv_by_its_environment_never_its_command_line() -> None:
    """``ps`` shows every user a command line: a token in pip's index URL must not be on it."""
    settings = {"index-url": "https://user:s3cret@i.example.invalid/simple", "find-links": "https://t0k@w/"}
    options, env = pipconfig.uv_options(settings)
    assert not [o for o in options if "s3cret" in o or "t0k" in o]
    assert env == {"UV_INDEX_URL": settings["index-url"], "UV_FIND_LINKS": settings["find-links"]}


def test_the_sdist_fetch_and_the_bootstrap_read_one_pip_config_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With both global.index-url and install.index-url, pip installs from install's: so
    do the bootstrap (uv) and the sdist fetch, through one reader (pipconfig)."""
    from vllm_rbln_fork.index_client import configured_index_url

    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = file:///global/simple\n[install]\nindex-url = file:///install/simple\n"
    )
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    _options, uv_env = pipconfig.uv_options(pip_settings(listed.stdout))
    assert uv_env["UV_INDEX_URL"] == configured_index_url() == "file:///install/simple"


def test_uv_gets_every_index_of_a_pip_conf_written_over_several_lines(tmp_path: Path) -> None:
    """pip.conf's usual form for several extra indexes, read back through real ``pip config
    list``, which prints the value as a literal with ``\\n`` in it."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url =\n    file:///opt/a/simple\n    file:///opt/b/simple\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "\\n" in listed  # the form that once reached uv as a single bogus URL
    _options, env = pipconfig.uv_options(pip_settings(listed))
    assert env["UV_EXTRA_INDEX_URL"].split()[-2:] == ["file:///opt/a/simple", "file:///opt/b/simple"]


def test_pips_no_index_leaves_uv_only_the_local_wheels() -> None:
    settings = {"no-index": "true", "index-url": "https://i.example.invalid/simple", "find-links": "/w"}
    assert pipconfig.uv_options(settings) == (
        ["--no-config", "--index-strategy", "unsafe-best-match", "--no-index"],
        {"UV_FIND_LINKS": "/w"},
    )


def test_a_bootstrap_that_waits_for_another_one_says_so(tmp_path: Path) -> None:
    """Two first runs of build.py at once: one makes the tool env, the other waits on its
    lock (files.held, the one flock), and says that it waits instead of hanging silently."""
    import fcntl
    import time

    bootstrap = _bootstrap_module()
    env_dir = tmp_path / "tool-envs" / "py-test"
    lock = ROOT / "requirements" / "build.lock"
    script = (
        "import importlib.util, sys\n"
        "from pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('bootstrap', {str(ROOT / 'build.py')!r})\n"
        "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)\n"
        f"print(b.ensure_tool_env(Path({str(env_dir)!r}), Path({str(lock)!r})))\n"
    )
    env_dir.parent.mkdir(parents=True)
    stderr = tmp_path / "stderr"
    with (env_dir.parent / f"{env_dir.name}.lock").open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another build.py is making the env
        with stderr.open("w") as err:
            waiting = subprocess.Popen(
                [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=err, text=True
            )
        deadline = time.monotonic() + 60
        while "waiting" not in stderr.read_text() and time.monotonic() < deadline and waiting.poll() is None:
            time.sleep(0.1)
        said = stderr.read_text()
        # The other one finishes: the env is complete, and the lock is released.
        env_dir.mkdir()
        bootstrap.installed_marker(env_dir, lock).write_text(lock.read_text())
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, stderr.read_text()
    assert out.strip() == str(env_dir / "bin" / "python")
    assert f"another build.py is making {env_dir}; waiting for it" in said, said


def test_uv_inherits_no_index_of_its_own_from_the_environment() -> None:
    """pip's settings are uv's only indexes: uv 0.13 also reads UV_DEFAULT_INDEX, UV_INDEX and
    UV_NO_INDEX, and with one naming an index out of reach the install failed."""
    _, index_env = pipconfig.uv_options({"index-url": "https://pip.example.invalid/simple"})
    inherited = {
        "UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple",
        "UV_INDEX": "other=http://127.0.0.1:9/simple",
        "UV_NO_INDEX": "1",
        "UV_INDEX_URL": "http://127.0.0.1:9/simple",
        "UV_EXTRA_INDEX_URL": "http://127.0.0.1:9/simple",
        "UV_FIND_LINKS": "/nowhere",
        "HOME": "/home/me",
    }
    env = pipconfig.uv_environment(inherited, index_env)
    assert env == {"HOME": "/home/me", "UV_INDEX_URL": "https://pip.example.invalid/simple"}
