"""The forge's files: every workflow under .github/workflows passes actionlint (installed from
requirements/test.lock), takes its runner labels and index from variables, and passes values
to scripts through env: only; .pre-commit-config.yaml runs exactly `python build.py lint`'s
checks, from `repo: local` hooks that run on the system (pre-commit makes no env); the
series lint finds what the build would refuse.

tests/e2e/test_forge_steps.py runs the workflows' run: steps themselves.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_rbln_fork.cage import PROBE
from vllm_rbln_fork.paths import PROJECT_ROOT
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.testing.lint import CHECKS
from vllm_rbln_fork.testing.series_lint import problems

# The cage step's probe: the cage's own (cage.PROBE), so both refuse the same machines.
PROBE_LINE = "bwrap " + " ".join(PROBE)

WORKFLOWS = sorted((PROJECT_ROOT / ".github" / "workflows").glob("*.yml"))
ACTIONLINT = Path(sys.executable).parent / "actionlint"


def _actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    # -shellcheck= and -pyflakes=: none is on these machines, and none is asked for.
    command = [str(ACTIONLINT), "-no-color", "-shellcheck=", "-pyflakes=", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT)


def test_the_three_workflows_pass_actionlint() -> None:
    assert [p.name for p in WORKFLOWS] == ["ci.yml", "release.yml", "watch.yml"]
    done = _actionlint(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_refuses_a_broken_workflow(tmp_path: Path) -> None:
    """The checker is live: a needs: of no job, and a step id that no step has, fail it."""
    broken = tmp_path / ".github" / "workflows" / "ci.yml"
    broken.parent.mkdir(parents=True)
    text = (PROJECT_ROOT / ".github" / "workflows" / "ci.yml").read_text()
    broken.write_text(text.replace("needs: tooling\n", "needs: tooling-tier\n", 1))
    done = _actionlint(broken)
    assert done.returncode == 1 and 'needs job "tooling-tier" which does not exist' in done.stdout, (
        done.stdout
    )
    broken.write_text(text.replace("steps.matrix.outputs.test", "steps.matrices.outputs.test", 1))
    done = _actionlint(broken)
    assert done.returncode == 1 and 'property "matrices" is not defined' in done.stdout, done.stdout


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


# Each workflow's runner label is a variable of its own (issue 52, R1): the watcher runs an
# unreviewed vLLM release's code and the release job holds the upload secrets, so on self-hosted
# runners the two (and CI, which runs pull requests) must be told apart.
RUNNER_VARIABLE = {"ci.yml": "CI_RUNNER", "release.yml": "RELEASE_RUNNER", "watch.yml": "WATCH_RUNNER"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_runners_and_indexes_are_variables_and_scripts_take_values_through_env(path: Path) -> None:
    for name, job in _load(path)["jobs"].items():
        runs_on = str(job["runs-on"])
        assert f"vars.{RUNNER_VARIABLE[path.name]}" in runs_on, (
            f"{path.name}: job {name}'s runs-on: {runs_on}"
        )
        others = [v for f, v in RUNNER_VARIABLE.items() if f != path.name and v in runs_on]
        assert not others, f"{path.name}: job {name} runs on another workflow's runner {others}"
        for step in job["steps"]:
            script = step.get("run", "")
            assert "${{" not in script, f"{path.name}: {step.get('name')}: an expression in a script"
            assert not re.search(r"https?://", script), f"{path.name}: {step.get('name')}: a URL literal"
    text = path.read_text()
    assert "PIP_INDEX_URL" in text and "vars.PIP_INDEX_URL" in text


def test_release_takes_the_upload_urls_and_credentials_from_secrets_through_env() -> None:
    job = _load(PROJECT_ROOT / ".github" / "workflows" / "release.yml")["jobs"]["wheel"]
    (publish,) = [s for s in job["steps"] if "--publish" in s.get("run", "")]
    assert publish["env"]["PURE_URL"] == "${{ secrets.INDEX_UPLOAD_URL }}"
    assert publish["env"]["CPU_URL"] == "${{ secrets.INDEX_UPLOAD_URL_CPU }}"
    assert publish["env"]["TWINE_USERNAME"] == "${{ secrets.INDEX_USERNAME }}"
    assert publish["env"]["TWINE_PASSWORD"] == "${{ secrets.INDEX_PASSWORD }}"


def test_pre_commit_runs_the_checks_of_build_py_lint_from_local_hooks() -> None:
    from pre_commit.clientlib import load_config

    config = load_config(str(PROJECT_ROOT / ".pre-commit-config.yaml"))  # pre-commit's own schema
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    hooks = config["repos"][0]["hooks"]
    assert [(h["id"], h["name"]) for h in hooks] == [(c.id, c.name) for c in CHECKS]
    for hook in hooks:
        assert hook["entry"] == f"python build.py lint --only {hook['id']}"
        assert hook["language"] == "unsupported" and hook["pass_filenames"] is False


def test_lint_only_runs_the_one_check_a_hook_names(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_rbln_fork.testing.lint import run_lint

    assert run_lint(["--only", "series"]) == 0  # the series lint alone: no ruff, no mypy here
    with pytest.raises(SystemExit):
        run_lint(["--only", "black"])
    assert "invalid choice: 'black'" in capsys.readouterr().err


def test_the_series_lint_finds_a_stray_patch_an_unlisted_series_and_a_bad_patch(tmp_path: Path) -> None:
    project = Project(tmp_path / "project")
    shutil.copytree(PROJECT_ROOT / "series", project.series_dir)
    shutil.copytree(PROJECT_ROOT / "patches", project.patches_dir)
    shutil.copytree(PROJECT_ROOT / "requirements", project.root / "requirements")
    shutil.copy(PROJECT_ROOT / "pins.toml", project.pins_file)
    assert problems(project) == []

    (project.patches_dir / "left-over.patch").write_text("x\n")
    assert problems(project) == [
        "patches/left-over.patch: no series names it. Export removes such files; delete it, or add "
        "it to a series through the edit loop (docs/patch-workflow.md)."
    ]
    (project.series_dir / "9.9.9").write_text((project.series_dir / "0.31.0").read_text())
    assert "series/9.9.9: pins.toml does not list vllm 9.9.9" in "\n".join(problems(project))

    (project.series_dir / "9.9.9").unlink()
    first = next(p for p in sorted(project.patches_dir.glob("*.patch")) if p.name != "left-over.patch")
    first.write_text(first.read_text().replace("Origin: ", "Origine: ", 1))
    found = "\n".join(problems(project))
    assert f"patches/{first.name} fails lint: it has no 'Origin:' trailer" in found


def test_the_watch_job_runs_the_release_without_write_access_or_a_cache_to_save() -> None:
    """The watch job runs an unreviewed vLLM release's code: it may only read the repository,
    keeps no token in .git/config, and saves no cache (release.yml restores the tool env's);
    only the propose job writes, and it runs none of the project's or the release's code."""
    data = _load(PROJECT_ROOT / ".github" / "workflows" / "watch.yml")
    assert data["permissions"] == {"contents": "read"}
    watch, propose = data["jobs"]["watch"], data["jobs"]["propose"]
    assert set(watch["permissions"].values()) == {"read"}
    (checkout,) = [s for s in watch["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert checkout["with"]["persist-credentials"] is False
    caches = [s["uses"] for s in watch["steps"] if str(s.get("uses", "")).startswith("actions/cache")]
    assert caches and all(c.startswith("actions/cache/restore@") for c in caches)
    assert propose["needs"] == "watch" and propose["permissions"]["contents"] == "write"
    for step in propose["steps"]:
        assert not re.search(r"\b(python|build\.py|pip|uv)\b", step.get("run", "")), step.get("name")
        assert not str(step.get("uses", "")).startswith(("actions/setup-python", "actions/cache"))


def test_the_watch_job_installs_the_cage_before_it_watches() -> None:
    """build.py watch refuses to run the scheduler tier without bwrap (the cage, W3/W4): the
    watch job installs bubblewrap and checks it starts, before the Watch step."""
    steps = _load(PROJECT_ROOT / ".github" / "workflows" / "watch.yml")["jobs"]["watch"]["steps"]
    runs = [str(s.get("run", "")) for s in steps]
    (cage,) = [i for i, r in enumerate(runs) if "apt-get install -y -q bubblewrap" in r]
    (watching,) = [i for i, r in enumerate(runs) if "python build.py watch" in r]
    assert cage < watching and PROBE_LINE in runs[cage]


def test_ci_installs_the_cage_before_the_tiers_that_drive_the_watcher() -> None:
    """Review finding 6: CI's tooling tier and its matrix's e2e cells drive the watcher's cage
    (bwrap), and ci.yml had no cage step: on a runner without bubblewrap, or with Ubuntu
    24.04's AppArmor keeping unprivileged user namespaces from it, they fail. Each job that
    runs `build.py test` installs bubblewrap, lifts the restriction and probes bwrap first,
    as watch.yml's job does."""
    jobs = _load(PROJECT_ROOT / ".github" / "workflows" / "ci.yml")["jobs"]
    testing = {name: job for name, job in jobs.items() if "build.py test" in str(job["steps"])}
    assert {"tooling", "tier"} <= set(testing)
    for name in ("tooling", "tier"):
        runs = [str(s.get("run", "")) for s in jobs[name]["steps"]]
        (cage,) = [i for i, r in enumerate(runs) if "apt-get install -y -q bubblewrap" in r]
        (first,) = [i for i, r in enumerate(runs) if "python build.py test " in r]
        assert cage < first, name
        assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in runs[cage], name
        assert PROBE_LINE in runs[cage], name


def test_no_cell_of_the_test_matrix_may_run_over_its_minutes() -> None:
    """Each cell of ``build.py matrix test`` is a run of ci.yml's tier job, which the forge stops
    at its timeout: that timeout is the matrix's budget (issue 31: no cell over 10 minutes)."""
    from vllm_rbln_fork.testing.matrix import CELL_MINUTES

    jobs = yaml.safe_load((PROJECT_ROOT / ".github" / "workflows" / "ci.yml").read_text())["jobs"]
    cells = [job for job in jobs.values() if "needs.tooling.outputs.test" in str(job.get("strategy", ""))]
    assert len(cells) == 1, "one job runs the test matrix"
    assert cells[0].get("timeout-minutes") == CELL_MINUTES <= 10


# Each action the workflows use, by the commit its release tag named when it was pinned (issue
# 52, WF1): a tag moves, and the release wheel job (the upload secret) and the propose job (the
# write token) run whatever it names when they start. Resolved from stored public workflows and
# action lock files that record the same sha for the tag; bump one with its tag's commit
# (git ls-remote https://github.com/<action> refs/tags/<tag>) and the comment beside it.
PINNED_ACTIONS = {
    "actions/checkout": ("08c6903cd8c0fde910a37f88322edcfb5dd907a8", "v5.0.0"),
    "actions/setup-python": ("e797f83bcb11b83ae66e0230d6156d7c80228e7c", "v6.0.0"),
    "actions/cache": ("a7833574556fa59680c1b7cb190c1735db73ebf0", "v5.0.0"),
    "actions/cache/restore": ("a7833574556fa59680c1b7cb190c1735db73ebf0", "v5.0.0"),
    "actions/upload-artifact": ("b7c566a772e6b6bfb58ed0dc250532a479d7789f", "v6.0.0"),
    "actions/download-artifact": ("37930b1c2abaa49bbe596cd826c3c89aef350131", "v7.0.0"),
}


def test_every_action_is_used_by_its_full_commit_sha_with_its_tag_beside_it() -> None:
    unpinned = []
    for workflow in WORKFLOWS:
        for number, line in enumerate(workflow.read_text().splitlines(), start=1):
            found = re.match(r"^\s*(?:-\s*)?uses:\s*(\S+?)@(\S+)\s*(?:#\s*(\S+))?\s*$", line)
            if found is None:
                continue
            action, ref, tag = found.groups()
            if PINNED_ACTIONS.get(action) != (ref, tag):
                unpinned.append(f"{workflow.name}:{number}: {action}@{ref} # {tag}")
    assert not unpinned, "actions not used by their pinned commit:\n" + "\n".join(unpinned)
