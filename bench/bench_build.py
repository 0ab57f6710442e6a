"""Benchmark: the first run, the warm run and the cold build, each beside its baseline.

    python bench/bench_build.py [--pin 0.31.0] [--pairs 4] [--warm 5] [--only first,warm,cold]
                                [--root CHECKOUT] [--against CHECKOUT] [--scratch DIR] [--sdist FILE]

Standard library only, and it runs ``build.py`` of ``--root`` (default: this checkout) as a
user does, through the bootstrap, so the same script measures another checkout (``main``
before a change) without importing its code. Everything it makes goes under ``--scratch``
(default: a temporary directory) and is deleted at the end. The sdist comes from
``--sdist`` or the build cache's downloads (a ``build.py --pin`` run puts it there):
downloads are excluded from every figure.

1. **First run** (issue 12: at most 1.2x; issue 31: at most 15 s, and the build's own time
   without the tool env's making, from the CLI's ``built ... (N s)`` line, with its phases).
   Ours: ``build.py --pin <pin>`` with an empty ``XDG_CACHE_HOME`` (no tool env, no pip or
   uv cache) and an empty build cache holding only the sdist in its downloads. By hand, with its own empty
   ``XDG_CACHE_HOME``: a fresh venv, ``pip install`` of the sdist's
   ``build-system.requires``, unpack, ``pip wheel --no-build-isolation`` with
   ``VLLM_TARGET_DEVICE=empty``. One of each (a first run is only first once).
2. **Warm run** (issue 31: at most 0.2 s, an absolute target). ``build.py --pin <pin>``
   again on a warm cache (a hit on a locked pin), bootstrap re-exec included: median of
   ``--warm`` runs, beside the baseline of starting the interpreter alone, each as wall time
   and as CPU time (user + system of both processes: the figure load on a shared machine
   disturbs least), with the load average. With ``--against`` another checkout (``main``
   before a change), its runs alternate with ``--root``'s, and the ratios are printed.
3. **Cold build** (issue 31: at most 1.0x). Ours: ``build.py --pin <pin> --source <sdist>``
   with an empty build cache (the tool env warm). Baseline: unpack the same sdist and
   ``pip wheel --no-build-isolation`` in the by-hand venv. Alternating pairs; the
   median of the per-pair ratios, and their range.

With ``--against CHECKOUT`` (``main`` before a change) every figure is measured for both
checkouts in the same run (the cold rounds rotate the order of the two and the plain build),
and each is printed with its ratio to the other's.
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


def first_run(
    roots: list[Path], scratch: Path, sdist: Path, pin: str
) -> tuple[list[float], float, Path, str, list[dict[str, float]]]:
    """One first run of each root (each with its own empty XDG_CACHE_HOME and build cache),
    and the by-hand baseline; with each root's phase times (the tool env excluded)."""
    python, made, build = by_hand_env(scratch, sdist, pin)
    by_hand = made + build
    times, phases = [], []
    for n, root in enumerate(roots):
        cache = scratch / f"first-cache-{n}"
        seed_cache(cache, sdist)
        env = base_env(XDG_CACHE_HOME=str(scratch / f"first-xdg-{n}"), VLLM_RBLN_FORK_CACHE=str(cache))
        cmd = [sys.executable, str(root / "build.py"), "--pin", pin]
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            sys.exit(f"bench: {' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        phases.append(phase_times(done.stdout + done.stderr))
        shutil.rmtree(scratch / f"first-xdg-{n}", ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    detail = f"by hand: venv + build requirements {made:.1f} s, unpack + pip wheel {build:.1f} s"
    return times, by_hand, python, detail, phases


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
            f"(target <= 0.2 s), CPU median {cpu:.3f} s"
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
    roots: list[Path], scratch: Path, sdist: Path, pin: str, python: Path, pairs: int
) -> list[list[float]]:
    """``pairs`` rounds of one cold build of each root and one plain build, in an order that
    rotates each round; per round: [each root's time..., the plain time]."""
    results = []
    env = base_env()
    for i in range(pairs):

        def ours(root: Path, n: int, i: int = i) -> Callable[[], float]:
            def timed() -> float:
                cache = scratch / f"cold-cache-{i}-{n}"
                t = run(
                    [sys.executable, str(root / "build.py"), "--pin", pin, "--source", str(sdist)],
                    {**env, "VLLM_RBLN_FORK_CACHE": str(cache)},
                    cwd=root,
                )
                shutil.rmtree(cache, ignore_errors=True)
                return t

            return timed

        def plain(i: int = i) -> float:
            work = scratch / f"plain-{i}"
            t = plain_wheel(python, sdist, work, env)
            shutil.rmtree(work, ignore_errors=True)
            return t

        runs = [ours(root, n) for n, root in enumerate(roots)] + [plain]
        shift = i % len(runs)
        times = {f: f() for f in runs[shift:] + runs[:shift]}
        results.append([times[f] for f in runs])
        shown = ", ".join(f"{root.name} {t:.1f} s" for root, t in zip(roots, results[-1], strict=False))
        print(f"  cold round {i + 1}: {shown}, plain {results[-1][-1]:.1f} s", file=sys.stderr)
    return results


def cold_lines(roots: list[Path], pairs: list[list[float]]) -> list[str]:
    plain = [p[-1] for p in pairs]
    lines = []
    for n, root in enumerate(roots):
        ours = [p[n] for p in pairs]
        ratios = [o / q for o, q in zip(ours, plain, strict=True)]
        lines.append(
            f"3. cold build  {root.name} (git {_head(root)}): {spread(ours, '{:.1f}')} s, plain "
            f"{spread(plain, '{:.1f}')} s: ratio {spread(ratios)}x over {len(pairs)} rounds (target <= 1.0x)"
        )
    if len(roots) == 2:
        ratios = [p[0] / p[1] for p in pairs]
        lines.append(f"                {roots[0].name} / {roots[1].name}: {spread(ratios)}x (per round)")
    return lines


def phase_times(log: str) -> dict[str, float]:
    """The phase lines a build prints (``    import vllm 0.31.0 into git: 7.0 s``), by phase, and
    as ``built`` the CLI's own total (from its start in the tool env: the env's making left out)."""
    found = {}
    for line in log.splitlines():
        if line.startswith("built ") and line.endswith(" s)"):  # "built <wheel>  (12.3 s)": the CLI's total
            found["built"] = float(line.rpartition("(")[2].removesuffix(" s)").removeprefix("cache hit, "))
            continue
        name, sep, rest = line.strip().rpartition(": ")
        if sep and rest.endswith(" s") and rest[:-2].replace(".", "", 1).isdigit():
            found[name] = float(rest[:-2])
    return found


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
    parser.add_argument(
        "--against",
        type=Path,
        help="a checkout (main before a change) run beside --root in every figure, with ratios",
    )
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
        roots = [root] + ([args.against.resolve()] if args.against else [])
        if "first" in wanted:
            times, by_hand, python, detail, phases = first_run(roots, scratch, sdist, args.pin)
            for r, ours, phase in zip(roots, times, phases, strict=True):
                built = phase.get("built", 0.0)
                rest = ", ".join(f"{k} {v:.1f} s" for k, v in phase.items() if k != "built")
                lines.append(
                    f"1. first run   {r.name} (git {_head(r)}): {ours:.1f} s, by hand {by_hand:.1f} s: "
                    f"{ours / by_hand:.2f}x; the build without the tool env {built:.1f} s ({rest})"
                )
            if len(roots) == 2:
                lines.append(f"                {roots[0].name} / {roots[1].name}: {times[0] / times[1]:.2f}x")
            lines.append(f"                {detail}")
        if "warm" in wanted:
            lines += warm_lines(roots, warm_runs(roots, scratch, sdist, args.pin, args.warm))
        if "cold" in wanted:
            if python is None:
                python, _, _ = by_hand_env(scratch, sdist, args.pin)
            lines += cold_lines(roots, cold_pairs(roots, scratch, sdist, args.pin, python, args.pairs))
    print("\n".join(lines))


def _head(root: Path) -> str:
    args = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


if __name__ == "__main__":
    main()
