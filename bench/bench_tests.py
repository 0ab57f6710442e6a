"""Benchmark: where the test loop's time goes, old way against new way, in the same run.

    python bench/bench_tests.py [--pin 0.31.0] [--repeat 2]

Needs a build cache where ``python build.py test --pin PIN --tier scheduler`` has run (its
vLLM test venv, patched and unpatched trees); ``VLLM_RBLN_FORK_CACHE`` picks it. Measures,
alternating old and new ``--repeat`` times, and prints medians and new/old ratios:

* conformance: vLLM's own ``test_prefix_caching.py`` and ``test_single_type_kv_cache_manager.py``
  (202 tests at 0.31.0) on the unpatched tree, serially, with vLLM's per-test global clean-up
  (old) and with the conformance plugin that skips it (new): wall time and the CPU time of
  the processes (user + system), the figure that load on a shared machine disturbs least;
* variant tree: a full ``git checkout-index`` of the patched commit (old) against a hard-linked
  copy of the patched tree (new), as ``runner.variant_trees`` makes it.
"""

from __future__ import annotations

import argparse
import os
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
from vllm_rbln_fork.gitrepo import Repo  # noqa: E402
from vllm_rbln_fork.paths import PROJECT_ROOT, cache_root, upstream_repo_dir  # noqa: E402
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
    args = parser.parse_args()
    variant_tree(args.pin, args.repeat)
    conformance(args.pin, args.repeat)


if __name__ == "__main__":
    main()
