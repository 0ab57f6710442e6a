"""Benchmark: cold and warm builds against a plain ``pip wheel`` of the same sdist.

    python bench/bench_build.py [--pin 0.31.0] [--repeat 1]

Cold: an empty cache (download included) through ``build.py --pin``. Baseline,
measured in the same run: download the sdist + unpack + ``pip wheel
--no-build-isolation`` with ``VLLM_TARGET_DEVICE=empty`` (the tool env has the
build requirements). Warm: the same ``build.py --pin`` again (cache hit), as a
user runs it, bootstrap re-exec included. Prints times and ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import build as bootstrap

bootstrap.run_in_tool_env(__file__)

from vllm_rbln_fork.index_client import configured_index_url, download, find_sdist  # noqa: E402
from vllm_rbln_fork.pins import Pin  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pin", default="0.31.0")
    args = parser.parse_args()
    pin = Pin.parse(args.pin)
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp_name:
        tmp = Path(tmp_name)
        # Baseline: download + unpack + plain pip wheel.
        start = time.perf_counter()
        sdist = download(find_sdist(pin, configured_index_url()), tmp / f"vllm-{pin}.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp / "plain", filter="data")
        baseline_fetch = time.perf_counter() - start
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        plain_env = {**env, "VLLM_TARGET_DEVICE": "empty"}
        plain = timed(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-build-isolation",
                "--no-deps",
                "-w",
                str(tmp / "plain-out"),
                str(tmp / "plain" / f"vllm-{pin}"),
            ],
            plain_env,
            cwd=tmp,
        )
        baseline = baseline_fetch + plain
        # Ours, cold: a fresh cache, so download, import, apply and build all run.
        ours_env = {**os.environ, "VLLM_RBLN_FORK_CACHE": str(tmp / "cache")}
        ours_env.pop(bootstrap.MARKER, None)  # measure as a user runs it: through the bootstrap
        cold = timed([sys.executable, str(ROOT / "build.py"), "--pin", str(pin)], ours_env, cwd=ROOT)
        warm = min(
            timed([sys.executable, str(ROOT / "build.py"), "--pin", str(pin)], ours_env, cwd=ROOT)
            for _ in range(3)
        )
    print(f"baseline: download+unpack {baseline_fetch:.1f} s + pip wheel {plain:.1f} s = {baseline:.1f} s")
    print(f"cold build.py --pin {pin}: {cold:.1f} s  ratio {cold / baseline:.2f}x  (target <= 1.25x)")
    print(f"warm build.py --pin {pin}: {warm:.2f} s  (target <= 1 s)")


if __name__ == "__main__":
    main()
