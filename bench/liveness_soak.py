"""Soak the liveness property: thousands of random scheduler workloads.

The same workloads and invariants as `tests/scheduler/test_liveness_property.py`
(`tests/scheduler/liveness.py`), with a random (or given) seed and many more
examples; hypothesis shrinks the first failure and prints it as a `Workload`
to paste into the test as an `@example` regression.

    VLLM_RBLN_SOURCE_TREE=<patched tree> PYTHONPATH=<tree> \\
        python bench/liveness_soak.py --examples 3000 [--seed N] [--upstream]

Point `VLLM_RBLN_SOURCE_TREE`/`PYTHONPATH` at a variant tree
(`tests/scheduler/variants/`) to watch the property catch a known bug.
Exit status 0 when every example held, 1 on a failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SCHEDULER_TESTS = Path(__file__).resolve().parent.parent / "tests" / "scheduler"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    parser.add_argument("--upstream", action="store_true", help="upstream's Scheduler instead of RBLN's")
    parser.add_argument("--max-requests", type=int, default=8)
    parser.add_argument(
        "--no-progress-guarantee", action="store_true", help="turn the RBLN scheduler's guarantee off"
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HOME", str(SCHEDULER_TESTS.parent / "fixtures" / "hf"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.path.insert(0, str(SCHEDULER_TESTS))
    import logging

    import sched_harness
    from hypothesis import HealthCheck, given, seed, settings
    from liveness import Workload, check, run_workload, workloads

    logging.disable(logging.WARNING)
    source_tree = os.environ.get(sched_harness.SOURCE_TREE_ENV)
    if not source_tree:
        parser.error(f"set {sched_harness.SOURCE_TREE_ENV} to a patched vLLM source tree")
    sched_harness.load_vllm_test_harness(source_tree)
    rbln = not args.upstream
    counts = {"examples": 0, "preempted": 0, "steps": 0}

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(workload=workloads(args.max_requests))
    def soak(workload: Workload) -> None:
        outcome = run_workload(workload, rbln=rbln, progress_guarantee=not args.no_progress_guarantee)
        counts["examples"] += 1
        counts["preempted"] += bool(outcome.preemptions)
        counts["steps"] += outcome.steps
        check(workload, outcome, rbln=rbln)

    if args.seed is not None:
        soak = seed(args.seed)(soak)
    started = time.perf_counter()
    failed = False
    try:
        soak()
    except AssertionError as error:
        failed = True
        print(f"FAILED: {error}", file=sys.stderr)
        for note in getattr(error, "__notes__", []):
            print(note, file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(
        f"{'upstream' if args.upstream else 'rbln'} scheduler, tree {source_tree}: "
        f"{counts['examples']} runs ({counts['preempted']} with preemptions, "
        f"{counts['steps']} steps) in {elapsed:.1f} s: {'FAILED' if failed else 'all held'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
