"""Benchmark: where the test loop's time goes, old way against new way, in the same run.

    python bench/bench_tests.py [--pin 0.31.0] [--repeat 2] [--old REV] [--new REV]
                                [--only tooling,engine,upstream,venv,loop,conformance,variant]

Needs a build cache where ``python build.py test --pin PIN --tier scheduler`` has run (its
vLLM test venv, patched and unpatched trees); ``VLLM_RBLN_FORK_CACHE`` picks it. Measures,
alternating old and new ``--repeat`` times, and prints medians and new/old ratios:

* conformance: vLLM's own ``test_prefix_caching.py`` and ``test_single_type_kv_cache_manager.py``
  (202 tests at 0.31.0) on the unpatched tree, serially, with vLLM's per-test global clean-up
  (old) and with the conformance plugin that skips it (new): wall time and the CPU time of
  the processes (user + system), the figure that load on a shared machine disturbs least;
* variant tree: a full ``git checkout-index`` of the patched commit (old) against a hard-linked
  copy of the patched tree (new), as ``runner.variant_trees`` makes it;
* tooling tier (issue 12, goal 3a: under 45 s): ``build.py test --tier tooling`` in a scratch
  clone of each of the two commits below, alternating, wall and CPU time;
* engine tier (issue 31: at most 240 s a pin): ``build.py test --tier engine --pin PIN`` in a
  scratch clone of each of the two commits below, alternating, wall and CPU time (the runs
  share the engine venv, which is keyed by the wheel: make it first with one run);
* upstream tier (issue 31: at most 120 s a pin) and test venv (issue 31: at most 30 s from a
  warm package cache: ``runner.make_locked_venv`` of ``requirements/vllm-test.lock``), each
  of the two commits below against the other, alternating, wall and CPU time;
* patch-edit loop (issue 12, goal 3c: under 2 minutes on a warm machine): in a scratch clone of
  this repository at each of two commits (``--old``, default ``main``; ``--new``, default
  ``HEAD``: uncommitted changes are not measured), the way a maintainer edits one RBLN patch:
  ``build.py checkout`` once (not timed), then each time a one-line change to the RBLN
  scheduler committed as a fixup of the last patch that changes it, ``git rebase
  --autosquash``, ``build.py export`` (timed as "edit"), and ``build.py test --tier scheduler
  --pin PIN`` (timed as "test", wall and CPU: the wheel build, its trees, the wheel's install
  into the warm test venv, the tests). Each checkout's test venv is warmed first by an
  untimed collect-only run. The trees and wheels each edit makes are removed from the cache
  after it.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import build as bootstrap

bootstrap.run_in_tool_env(__file__)

from vllm_rbln_fork.apply import checkout_into  # noqa: E402
from vllm_rbln_fork.files import remove_unless_held  # noqa: E402
from vllm_rbln_fork.gitrepo import Repo  # noqa: E402
from vllm_rbln_fork.paths import PROJECT_ROOT, cache_root, upstream_repo_dir, wheel_cache_dir  # noqa: E402
from vllm_rbln_fork.pipeline import build_lock  # noqa: E402
from vllm_rbln_fork.project import Project  # noqa: E402
from vllm_rbln_fork.supported import supported_pins  # noqa: E402
from vllm_rbln_fork.testing.conformance import PLUGIN, _env, tree_version  # noqa: E402
from vllm_rbln_fork.testing.runner import vllm_venv_dir  # noqa: E402

FILES = ("tests/v1/core/test_prefix_caching.py", "tests/v1/core/test_single_type_kv_cache_manager.py")


def _children_cpu() -> float:
    """CPU time (user + system) of this process and its finished children."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def _timed(run: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), _children_cpu()
    run()
    return time.perf_counter() - wall, _children_cpu() - cpu


def _tree(kind: str, pin: str) -> Path:
    for tree in sorted((cache_root() / "test-trees").glob(f"{kind}-*")):
        if (tree / ".complete").exists() and (tree_version(tree) or "").split("+")[0] == pin:
            return tree
    sys.exit(
        f"no {kind} tree of vllm {pin} in {cache_root()}: run build.py test --pin {pin} --tier scheduler"
    )


def conformance(pin: str, repeat: int) -> None:
    lock = next(s.test_lock for s in supported_pins(Project.default()) if str(s.pin) == pin)
    python = vllm_venv_dir(lock) / "bin" / "python"
    unpatched = _tree("upstream", pin)
    with tempfile.TemporaryDirectory(prefix="bench-tests-") as tmp:
        referee = Path(tmp) / "referee"
        shutil.copytree(unpatched / "tests", referee / "tests")
        shutil.copy2(unpatched / "pyproject.toml", referee / "pyproject.toml")
        shutil.copy2(PLUGIN, referee / "rbln_conformance_plugin.py")
        hf = Path(tmp) / "hf"
        shutil.copytree(PROJECT_ROOT / "tests" / "fixtures" / "hf", hf)
        env = _env(unpatched, hf, Path(tmp) / "pycache")
        base = [str(python), "-m", "pytest", *FILES, "-q", "-p", "no:cacheprovider"]

        def run(plugin: bool) -> None:
            cmd = base + (["-p", "rbln_conformance_plugin"] if plugin else [])
            subprocess.run(cmd, cwd=referee, env=env, check=True, stdout=subprocess.DEVNULL)

        _report("conformance, 202 tests", repeat, lambda: run(False), lambda: run(True))


def variant_tree(pin: str, repeat: int) -> None:
    patched = _tree("patched", pin)
    commit_prefix = patched.name.split("-")[-1]
    repo = Repo(upstream_repo_dir())
    commit = repo.resolve(commit_prefix)
    assert commit is not None, f"{commit_prefix} is not in {repo}"
    with tempfile.TemporaryDirectory(prefix="bench-tests-", dir=cache_root()) as tmp:
        counter = iter(range(1_000_000))

        def checkout() -> None:
            checkout_into(repo, commit, Path(tmp) / f"c{next(counter)}", Path(tmp) / f"index{next(counter)}")

        def linked() -> None:
            shutil.copytree(patched, Path(tmp) / f"l{next(counter)}", copy_function=os.link)

        _report("variant tree", repeat, checkout, linked)


def _git(*args: str | Path, cwd: Path) -> str:
    return subprocess.run(
        ["git", *map(str, args)], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def _build_py(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (bootstrap.MARKER, "PYTHONPATH")}
    command = [sys.executable, str(clone / "build.py"), *args]
    return subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, check=False)


class Loop:
    """One checkout's patch-edit loop, in a scratch clone of its HEAD."""

    FILE = "vllm/v1/core/sched/rbln_scheduler.py"  # edited in the last patch that touches it

    def __init__(self, label: str, rev: str, scratch: Path, pin: str) -> None:
        self.label, self.pin = label, pin
        self.clone = scratch / label
        self.head = _clone(rev, self.clone)
        self.tree = self.clone / "work" / "loop"
        done = _build_py(self.clone, "checkout", "--pin", pin, "--dir", str(self.tree))
        if done.returncode != 0:
            sys.exit(f"bench: build.py checkout failed in {self.clone}:\n{done.stdout}{done.stderr}")
        self._find_patch()
        # The checkout's test venv made and warm (and its wheel installed): not timed.
        _build_py(self.clone, "test", "--tier", "scheduler", "--pin", pin, "--", "--collect-only", "-q")
        self.edits = 0

    def _find_patch(self) -> None:
        """The last commit of the series that changes FILE: a line appended there conflicts
        with no later patch."""
        found = _git(
            "log", "-1", "--format=%H %s", f"upstream/v{self.pin}..HEAD", "--", self.FILE, cwd=self.tree
        )
        if not found:
            sys.exit(f"bench: no patch of {self.tree} changes {self.FILE}")
        self.patch_commit, _, self.subject = found.strip().partition(" ")

    def edit(self) -> None:
        """A one-line change to the RBLN scheduler, folded into its patch, and exported."""
        self.edits += 1
        path = self.tree / self.FILE
        path.write_text(path.read_text() + f"# bench edit {self.label} {self.edits} {time.time_ns()}\n")
        _git("commit", "--quiet", "-a", f"--fixup={self.patch_commit}", cwd=self.tree)
        env = {**os.environ, "GIT_SEQUENCE_EDITOR": "true"}
        subprocess.run(
            ["git", "rebase", "--quiet", "-i", "--autosquash", f"upstream/v{self.pin}"],
            cwd=self.tree,
            env=env,
            check=True,
            capture_output=True,
        )
        self._find_patch()
        done = _build_py(self.clone, "export", "--dir", str(self.tree))
        if done.returncode != 0:
            sys.exit(f"bench: build.py export failed in {self.clone}:\n{done.stdout}{done.stderr}")

    def test(self) -> dict[str, float]:
        """The scheduler tier at the pin; its setup and test seconds, and the wheel's install."""
        made = {d: set(d.iterdir()) for d in _made_per_edit()}
        start, cpu = time.perf_counter(), _children_cpu()
        done = _build_py(self.clone, "test", "--tier", "scheduler", "--pin", self.pin)
        run, cpu = time.perf_counter() - start, _children_cpu() - cpu
        _remove_new(made)
        if done.returncode != 0:
            output = done.stdout[-5000:] + done.stderr[-5000:]
            sys.exit(f"bench: the scheduler tier failed in {self.clone}:\n{output}")
        figures = {"run": run, "cpu": cpu}
        found = re.search(r"^whole run: (\d+) s wall", done.stdout, re.MULTILINE)
        figures["whole"] = float(found.group(1)) if found else float("nan")
        for row in ("setup", "scheduler"):
            found = re.search(rf"^{row}\s+(\d+) s", done.stdout, re.MULTILINE)
            figures[row] = float(found.group(1)) if found else float("nan")
        found = re.search(
            r"^\s+install \S+ into the test venv: ([\d.]+) s", done.stdout + done.stderr, re.MULTILINE
        )
        figures["install"] = float(found.group(1)) if found else float("nan")
        return figures


def _clone(rev: str, dest: Path) -> str:
    """A scratch clone of this repository at ``rev``; its short commit id."""
    head = _git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=PROJECT_ROOT).strip()
    _git("clone", "--quiet", "--no-checkout", PROJECT_ROOT, dest, cwd=dest.parent)
    _git("checkout", "--quiet", "--detach", head, cwd=dest)
    return head[:10]


def tooling_tier(repeat: int, old: str, new: str) -> None:
    tier_against_old("tooling", [], "target < 45 s", repeat, old, new)


def engine_tier(pin: str, repeat: int, old: str, new: str) -> None:
    """The engine tier at ``pin`` (issue 31: <= 240 s a pin). Both checkouts build the same wheel
    and so share one engine venv (keyed by the wheel): made by the first run if missing, so run
    ``build.py test --tier engine --pin PIN`` once before, or read the first pair as setup."""
    tier_against_old("engine", ["--pin", pin], f"at {pin}, target <= 240 s", repeat, old, new)


def upstream_tier(pin: str, repeat: int, old: str, new: str) -> None:
    """The upstream (conformance) tier at ``pin`` (issue 31: <= 120 s a pin)."""
    tier_against_old("upstream", ["--pin", pin], f"at {pin}, target <= 120 s", repeat, old, new)


def venv_setup(repeat: int, old: str, new: str) -> None:
    """A vLLM test venv made afresh (issue 31: <= 30 s from a warm package cache) by each
    commit's ``runner.make_locked_venv``, from that commit's ``requirements/vllm-test.lock``,
    alternating; the first pair warms uv's cache and is not counted."""
    with tempfile.TemporaryDirectory(prefix="bench-venv-", dir=cache_root()) as tmp:
        clones = {label: Path(tmp) / label for label in ("old", "new")}
        heads = {label: _clone(rev, clones[label]) for label, rev in (("old", old), ("new", new))}
        seen: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        code = (
            "import sys; from pathlib import Path; "
            "from vllm_rbln_fork.testing.runner import make_locked_venv; "
            "make_locked_venv(Path(sys.argv[1]), Path(sys.argv[2]))"
        )
        for n in range(repeat + 1):
            for label, clone in clones.items():
                env = {**os.environ, "PYTHONPATH": str(clone)}
                target = Path(tmp) / f"venv-{label}"
                args = [sys.executable, "-c", code, target, clone / "requirements" / "vllm-test.lock"]
                start, cpu = time.perf_counter(), _children_cpu()
                done = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True)
                wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
                if done.returncode != 0:
                    sys.exit(f"bench: making a venv with {clone} ({heads[label]}) failed:\n{done.stderr}")
                shutil.rmtree(target)
                if n:
                    seen[label].append((wall, cpu))
                    print(f"  {label} ({heads[label]}): {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
        _print_old_new("test venv (target <= 30 s)", seen, repeat)


def _print_old_new(what: str, seen: dict[str, list[tuple[float, float]]], repeat: int) -> None:
    """The medians of the old and the new commit's (wall, CPU) runs, and new/old."""
    (o_wall, o_cpu), (n_wall, n_cpu) = (
        (statistics.median(w for w, _ in seen[k]), statistics.median(c for _, c in seen[k]))
        for k in ("old", "new")
    )
    print(
        f"{what}: old {o_wall:.1f} s wall / {o_cpu:.1f} s CPU, new {n_wall:.1f} s "
        f"wall / {n_cpu:.1f} s CPU; new/old wall {n_wall / o_wall:.3f}, CPU {n_cpu / o_cpu:.3f} "
        f"(median of {repeat}, load average {os.getloadavg()[0]:.1f})",
        flush=True,
    )


def tier_against_old(tier: str, extra: list[str], target: str, repeat: int, old: str, new: str) -> None:
    """``build.py test --tier TIER`` in a scratch clone of each of two commits, alternating."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{tier}-", dir=cache_root()) as tmp:
        clones = {label: Path(tmp) / label for label in ("old", "new")}
        heads = {label: _clone(rev, clones[label]) for label, rev in (("old", old), ("new", new))}
        seen: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        for _ in range(repeat):
            for label, clone in clones.items():
                start, cpu = time.perf_counter(), _children_cpu()
                done = _build_py(clone, "test", "--tier", tier, *extra)
                wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
                found = re.search(r"^(\d+) passed, (\d+) failed", done.stdout, re.MULTILINE)
                if not found:
                    # A run that crashed or failed to collect is no figure of speed (it would read
                    # as a great speed-up); one with failing tests is, and says which failed.
                    output = done.stdout[-5000:] + done.stderr[-5000:]
                    sys.exit(f"bench: the {tier} tier failed in {clone} ({heads[label]}):\n{output}")
                seen[label].append((wall, cpu))
                failed = "; ".join(line for line in done.stdout.splitlines() if line.startswith("FAILED "))
                print(
                    f"  {label} ({heads[label]}): {wall:.1f} s wall, {cpu:.1f} s CPU, "
                    f"{found.group(1)} passed, {found.group(2)} failed"
                    f"{f' ({failed})' if failed else ''}, load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        _print_old_new(f"{tier} tier ({target})", seen, repeat)


def _made_per_edit() -> list[Path]:
    return [d for d in (cache_root() / "test-trees", wheel_cache_dir()) if d.is_dir()]


def _remove_new(before: dict[Path, set[Path]]) -> None:
    """Remove the trees and wheels that appeared during an edit's test run (not kept), through
    the cache's own locks: a tree another run holds or is making stays (files.remove_unless_held),
    and wheels go under the build lock that every build writes them under."""
    with build_lock():
        for directory, seen in before.items():
            for path in set(directory.iterdir()) - seen:
                if directory == wheel_cache_dir():
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
                elif path.is_dir():
                    remove_unless_held(path)


def patch_loop(pin: str, repeat: int, old: str, new: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-loop-", dir=cache_root()) as tmp:
        loops = [Loop("old", old, Path(tmp), pin), Loop("new", new, Path(tmp), pin)]
        seen: dict[str, list[dict[str, float]]] = {loop.label: [] for loop in loops}
        for _ in range(repeat):
            for loop in loops:
                edit, _ = _timed(loop.edit)
                figures = loop.test()
                test = figures.pop("run")
                seen[loop.label].append({"edit": edit, "test": test, "total": edit + test, **figures})
                print(
                    f"  {loop.label} ({loop.head}): edit+export {edit:.1f} s, build.py test {test:.1f} s "
                    f"(its whole run {figures['whole']:.0f} s: setup {figures['setup']:.0f} s, of it the "
                    f"wheel's install "
                    f"{figures['install']:.1f} s; tests {figures['scheduler']:.0f} s; "
                    f"CPU {figures['cpu']:.0f} s), "
                    f"load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        med = {
            label: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for label, runs in seen.items()
        }
        o, n = med["old"], med["new"]
        print(
            f"patch-edit loop at {pin} (target < 120 s): old {o['total']:.1f} s, new {n['total']:.1f} s, "
            f"new/old {n['total'] / o['total']:.3f}, CPU new/old {n['cpu'] / o['cpu']:.3f}; "
            f"wheel install old {o['install']:.1f} s, new "
            f"{n['install']:.1f} s; setup new/old {n['setup'] / o['setup']:.3f}; tests new/old "
            f"{n['scheduler'] / o['scheduler']:.3f} (median of {repeat}, "
            f"load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )


def _report(what: str, repeat: int, old: Callable[[], None], new: Callable[[], None]) -> None:
    olds, news = [], []
    for _ in range(repeat):
        olds.append(_timed(old))
        news.append(_timed(new))
    o_wall, o_cpu = (statistics.median(x[i] for x in olds) for i in (0, 1))
    n_wall, n_cpu = (statistics.median(x[i] for x in news) for i in (0, 1))
    print(
        f"{what}: old {o_wall:.1f} s wall / {o_cpu:.1f} s CPU, new {n_wall:.1f} s wall / {n_cpu:.1f} s CPU; "
        f"new/old wall {n_wall / o_wall:.3f}, CPU {n_cpu / o_cpu if o_cpu else float('nan'):.3f} "
        f"(median of {repeat}, load average {os.getloadavg()[0]:.1f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pin", default="0.31.0")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--only",
        default="variant,conformance,loop",
        help="a comma list of tooling, engine, upstream, venv, variant, conformance, loop",
    )
    parser.add_argument(
        "--old", default="main", help="the baseline commit of tooling and loop (default: main)"
    )
    parser.add_argument(
        "--new", default="HEAD", help="the commit under test of tooling and loop (default: HEAD)"
    )
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    if "tooling" in wanted:
        tooling_tier(args.repeat, args.old, args.new)
    if "engine" in wanted:
        engine_tier(args.pin, args.repeat, args.old, args.new)
    if "upstream" in wanted:
        upstream_tier(args.pin, args.repeat, args.old, args.new)
    if "venv" in wanted:
        venv_setup(args.repeat, args.old, args.new)
    if "variant" in wanted:
        variant_tree(args.pin, args.repeat)
    if "conformance" in wanted:
        conformance(args.pin, args.repeat)
    if "loop" in wanted:
        patch_loop(args.pin, args.repeat, args.old, args.new)


if __name__ == "__main__":
    main()
