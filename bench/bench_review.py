"""Benchmark: ``build.py --pin 0.33.0 --review`` with everything cached (target < 30 s).

    python bench/bench_review.py [--pin 0.33.0] [--repeat 3]

A first run warms the caches (sdist download and import, if needed); then the review
is timed as a user runs it, bootstrap re-exec included. Reports go to a temp dir.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import build as bootstrap

bootstrap.run_in_tool_env(__file__)

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pin", default="0.33.0")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != bootstrap.MARKER}
    with tempfile.TemporaryDirectory(prefix="bench-review-") as tmp:
        cmd = [sys.executable, str(ROOT / "build.py"), "--pin", args.pin, "--review", "--report-dir", tmp]

        def once() -> tuple[float, int]:
            start = time.perf_counter()
            status = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            return time.perf_counter() - start, status.returncode

        warmup, code = once()
        if code not in (0, 1):
            sys.exit(f"the review failed (exit {code}); run {' '.join(cmd)} to see why")
        times = [once()[0] for _ in range(args.repeat)]
    verdict = "ready" if code == 0 else "needs work"
    print(f"warm-up build.py --pin {args.pin} --review: {warmup:.1f} s ({verdict})")
    print(
        f"cached  build.py --pin {args.pin} --review: {min(times):.1f} s best of {args.repeat} "
        f"(target < 30 s)"
    )


if __name__ == "__main__":
    main()
