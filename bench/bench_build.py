"""Benchmark: the first run, the warm run and the cold build, each beside its baseline.

    python bench/bench_build.py [--pin 0.31.0] [--pairs 4] [--warm 5] [--only first,warm,cold]
                                [--root CHECKOUT] [--against CHECKOUT] [--scratch DIR] [--sdist FILE]

Standard library only, and it runs ``build.py`` of ``--root`` (default: this checkout) as a
user does, through the bootstrap, so the same script measures another checkout (``main``
before a change) without importing its code. Everything it makes goes under ``--scratch``
(default: a temporary directory) and is deleted at the end. The sdist comes from
``--sdist`` or the build cache's downloads (a ``build.py --pin`` run puts it there):
downloads are excluded from every figure.

1. **First run** (issue 12, goal 1: at most 1.2x). Ours: ``build.py --pin <pin>`` with an
   empty ``XDG_CACHE_HOME`` (no tool env, no pip or uv cache) and an empty build cache
   holding only the sdist in its downloads. By hand, with its own empty
   ``XDG_CACHE_HOME``: a fresh venv, ``pip install`` of the sdist's
   ``build-system.requires``, unpack, ``pip wheel --no-build-isolation`` with
   ``VLLM_TARGET_DEVICE=empty``. One of each (a first run is only first once).
2. **Warm run** (goal 2: at most 0.5 s, an absolute target). ``build.py --pin <pin>``
   again on a warm cache (a hit on a locked pin), bootstrap re-exec included: median of
   ``--warm`` runs, beside the baseline of starting the interpreter alone, each as wall time
   and as CPU time (user + system of both processes: the figure load on a shared machine
   disturbs least), with the load average. With ``--against`` another checkout (``main``
   before a change), its runs alternate with ``--root``'s, and the ratios are printed.
3. **Cold build** (goal 4: at most 1.1x). Ours: ``build.py --pin <pin> --source <sdist>``
   with an empty build cache (the tool env warm). Baseline: unpack the same sdist and
   ``pip wheel --no-build-isolation`` in the by-hand venv. Alternating pairs; the
   median of the per-pair ratios, and their range.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
MARKER = "VLLM_RBLN_FORK_BOOTSTRAPPED"


def children_cpu() -> float:
    """CPU time (user + system) of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    """Run ``cmd`` (output kept, shown only on failure); return its wall time."""
    return run_cpu(cmd, env, cwd)[0]


def run_cpu(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float]:
    """Run ``cmd`` (output kept, shown only on failure); return its wall and CPU time."""
    start, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode != 0:
        command = " ".join(map(str, cmd))
        sys.exit(f"bench: {command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed, cpu


DROPPED = (MARKER, "PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")


def base_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that would point into another tool env,
    and without PYTHONDONTWRITEBYTECODE (a user's machine writes bytecode; without it every
    run compiles the tool's modules again)."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update(extra)
    return env


def find_sdist(root: Path, pin: str, given: Path | None) -> Path:
    if given is not None:
        return given.resolve()
    name = f"vllm-{pin}.tar.gz"
    cache = os.environ.get("VLLM_RBLN_FORK_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-rbln-fork"
    )
    path = Path(cache) / "downloads" / name
    if not path.exists():
        print(f"bench: fetching {name} once with build.py --pin {pin} (not timed)", file=sys.stderr)
        run([sys.executable, str(root / "build.py"), "--pin", pin], base_env(), cwd=root)
    return path


def build_requires(sdist: Path, pin: str) -> list[str]:
    """The sdist's own ``build-system.requires``: what a user installs by hand."""
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(f"vllm-{pin}/pyproject.toml")
        assert member is not None
        return list(tomllib.loads(member.read().decode())["build-system"]["requires"])


def unpack(sdist: Path, dest: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    return next(dest.iterdir())


def plain_wheel(python: Path, sdist: Path, work: Path, env: dict[str, str]) -> float:
    """The baseline build: unpack + ``pip wheel --no-build-isolation`` (timed together)."""
    start = time.perf_counter()
    tree = unpack(sdist, work / "src")
    run(
        [
            *(str(python), "-m", "pip", "wheel", "--no-build-isolation", "--no-deps"),
            "-w",
            str(work / "out"),
            str(tree),
        ],
        {**env, "VLLM_TARGET_DEVICE": "empty"},
        cwd=work,
    )
    return time.perf_counter() - start


def seed_cache(cache: Path, sdist: Path) -> None:
    """An empty build cache holding only the sdist, as a download left it."""
    (cache / "downloads").mkdir(parents=True)
    shutil.copy2(sdist, cache / "downloads" / sdist.name)


def by_hand_env(scratch: Path, sdist: Path, pin: str) -> tuple[Path, float, float]:
    """A fresh venv with the sdist's build requirements, from an empty pip cache; return
    (its python, seconds to make it, seconds for the build)."""
    env = base_env(XDG_CACHE_HOME=str(scratch / "hand-xdg"))
    venv = scratch / "hand-venv"
    start = time.perf_counter()
    run([sys.executable, "-m", "venv", str(venv)], env)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", *build_requires(sdist, pin)], env)
    made = time.perf_counter() - start
    build = plain_wheel(python, sdist, scratch / "hand-build", env)
    return python, made, build


def first_run(root: Path, scratch: Path, sdist: Path, pin: str) -> tuple[float, float, Path, str]:
    python, made, build = by_hand_env(scratch, sdist, pin)
    by_hand = made + build
    cache = scratch / "first-cache"
    seed_cache(cache, sdist)
    env = base_env(XDG_CACHE_HOME=str(scratch / "first-xdg"), VLLM_RBLN_FORK_CACHE=str(cache))
    ours = run([sys.executable, str(root / "build.py"), "--pin", pin], env, cwd=root)
    detail = f"by hand: venv + build requirements {made:.1f} s, unpack + pip wheel {build:.1f} s"
    shutil.rmtree(scratch / "first-xdg", ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return ours, by_hand, python, detail


Timed = tuple[float, float]  # wall, CPU


def warm_runs(roots: list[Path], scratch: Path, sdist: Path, pin: str, n: int) -> list[list[Timed]]:
    """``n`` warm hits of each root's build.py, interleaved, then ``n`` bare interpreter starts."""
    cmds, envs = [], []
    for i, root in enumerate(roots):
        cache = scratch / f"warm-cache-{i}"
        seed_cache(cache, sdist)
        envs.append(base_env(VLLM_RBLN_FORK_CACHE=str(cache)))
        cmds.append([sys.executable, str(root / "build.py"), "--pin", pin])
        run(cmds[-1], envs[-1], cwd=root)  # fills the cache (not timed)
        run(cmds[-1], envs[-1], cwd=root)  # and writes the bytecode a first hit imports
    timed: list[list[Timed]] = [[] for _ in roots]
    for _ in range(n):
        for i, root in enumerate(roots):
            timed[i].append(run_cpu(cmds[i], envs[i], cwd=root))
    timed.append([run_cpu([sys.executable, "-c", "pass"], envs[0]) for _ in range(n)])
    for i in range(len(roots)):
        shutil.rmtree(scratch / f"warm-cache-{i}", ignore_errors=True)
    return timed


def warm_lines(roots: list[Path], timed: list[list[Timed]]) -> list[str]:
    runs = timed[:-1]
    med = [(statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for t in timed]
    lines = []
    for root, t, (_, cpu) in zip(roots, runs, med, strict=False):
        lines.append(
            f"2. warm run    {root.name} (git {_head(root)}): {spread([w for w, _ in t])} s over {len(t)} "
            f"(target <= 0.5 s), CPU median {cpu:.3f} s"
        )
    lines.append(
        f"                python -c pass: median {med[-1][0]:.3f} s, CPU {med[-1][1]:.3f} s; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if len(runs) == 2:
        (new_w, new_c), (old_w, old_c) = med[0], med[1]
        lines.append(
            f"                {roots[0].name} / {roots[1].name}: wall {new_w / old_w:.3f}, "
            f"CPU {new_c / old_c:.3f}"
        )
    return lines


def cold_pairs(
    root: Path, scratch: Path, sdist: Path, pin: str, python: Path, pairs: int
) -> list[tuple[float, float]]:
    results = []
    env = base_env()
    for i in range(pairs):

        def ours(i: int = i) -> float:
            cache = scratch / f"cold-cache-{i}"
            t = run(
                [sys.executable, str(root / "build.py"), "--pin", pin, "--source", str(sdist)],
                {**env, "VLLM_RBLN_FORK_CACHE": str(cache)},
                cwd=root,
            )
            shutil.rmtree(cache, ignore_errors=True)
            return t

        def plain(i: int = i) -> float:
            work = scratch / f"plain-{i}"
            t = plain_wheel(python, sdist, work, env)
            shutil.rmtree(work, ignore_errors=True)
            return t

        order: list[Callable[[], float]] = [ours, plain] if i % 2 == 0 else [plain, ours]
        times = {f: f() for f in order}
        results.append((times[ours], times[plain]))
        print(f"  cold pair {i + 1}: ours {times[ours]:.1f} s, plain {times[plain]:.1f} s", file=sys.stderr)
    return results


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    median, low, high = (fmt.format(v) for v in (statistics.median(values), min(values), max(values)))
    return f"median {median}, range {low}-{high}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pin", default="0.31.0")
    parser.add_argument("--pairs", type=int, default=4, help="alternating pairs for the cold build")
    parser.add_argument("--warm", type=int, default=5, help="warm runs")
    parser.add_argument("--only", default="first,warm,cold", help="a comma list of first, warm, cold")
    parser.add_argument("--root", type=Path, default=HERE, help="the checkout whose build.py is measured")
    parser.add_argument("--against", type=Path, help="a checkout to alternate with --root in the warm run")
    parser.add_argument("--scratch", type=Path, help="where the temporary caches go (default: a temp dir)")
    parser.add_argument("--sdist", type=Path, help="the pin's sdist (default: the build cache's download)")
    args = parser.parse_args()
    root = args.root.resolve()
    wanted = set(args.only.split(","))
    sdist = find_sdist(root, args.pin, args.sdist)
    if args.scratch:
        args.scratch.mkdir(parents=True, exist_ok=True)
    lines = [f"bench_build: {root} (git {_head(root)}), vllm {args.pin}, {os.cpu_count()} CPUs"]
    with tempfile.TemporaryDirectory(prefix="bench-build-", dir=args.scratch) as tmp:
        scratch = Path(tmp)
        python = None
        if "first" in wanted:
            ours, by_hand, python, detail = first_run(root, scratch, sdist, args.pin)
            lines.append(
                f"1. first run   ours {ours:.1f} s, by hand {by_hand:.1f} s: "
                f"{ours / by_hand:.2f}x (target <= 1.2x)"
            )
            lines.append(f"                {detail}")
        if "warm" in wanted:
            roots = [root] + ([args.against.resolve()] if args.against else [])
            lines += warm_lines(roots, warm_runs(roots, scratch, sdist, args.pin, args.warm))
        if "cold" in wanted:
            if python is None:
                python, _, _ = by_hand_env(scratch, sdist, args.pin)
            pairs = cold_pairs(root, scratch, sdist, args.pin, python, args.pairs)
            ratios = [o / p for o, p in pairs]
            lines.append(
                f"3. cold build  ours {spread([o for o, _ in pairs], '{:.1f}')} s, plain "
                f"{spread([p for _, p in pairs], '{:.1f}')} s: ratio {spread(ratios)}x over {len(pairs)} "
                f"alternating pairs (target <= 1.1x)"
            )
    print("\n".join(lines))


def _head(root: Path) -> str:
    args = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


if __name__ == "__main__":
    main()
