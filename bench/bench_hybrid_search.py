"""The long hybrid search (issue 51): seeds of tests/scheduler/hybrid_search.py on three sides.

    VLLM_RBLN_SOURCE_TREE=<patched vLLM tree> PYTHONPATH=<same tree> \\
        <vllm venv>/bin/python bench/bench_hybrid_search.py --layouts full+window,full+2windows \\
        --connector no --seeds 100:300

Layouts: full, mla, full+window, full+2windows, window, full+chunked (whole blocks only; no
connector next to two groups: hybrid_search.py).

Each seed draws one workload (`random_workload`) and runs it on the RBLN scheduler
(``rbln``), upstream's scheduler with whole blocks (``upstream``) and upstream's policy over
the RBLN KV cache classes at the same sub-block size (``upstream-sub``). Prints one line per
seed that fails on any side (the workload, each side's first failure), then the counts per
side and how many fail on ``rbln`` only. Asserts nothing; the tier runs a few examples of the
same search (tests/scheduler/test_hybrid_search.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "scheduler"))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
os.environ.setdefault("HF_HOME", str(HERE.parent / "tests" / "fixtures" / "hf"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import sched_harness as h  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layouts", default="full+window,full+2windows")
    parser.add_argument("--connector", choices=["yes", "no", "any"], default="any")
    parser.add_argument("--seeds", default="0:150", help="first:last (last excluded)")
    parser.add_argument("--sides", default="rbln,upstream,upstream-sub")
    args = parser.parse_args(argv)
    error = h.load_harness_from_env()
    if error is not None:
        print(error, file=sys.stderr)
        return 2
    import hybrid_search as s

    first, last = (int(x) for x in args.seeds.split(":"))
    layouts = tuple(args.layouts.split(","))
    connector = {"yes": True, "no": False, "any": None}[args.connector]
    sides = args.sides.split(",")
    failed = dict.fromkeys(sides, 0)
    ours_only = 0
    start = time.perf_counter()
    for seed in range(first, last):
        w = s.random_workload(random.Random(seed), layouts=layouts, connector=connector)  # type: ignore[arg-type]
        outcomes = {side: s.run(w, side)[0] for side in sides}  # type: ignore[arg-type]
        for side, outcome in outcomes.items():
            failed[side] += outcome is not None
        if outcomes.get("rbln") and not any(o for side, o in outcomes.items() if side != "rbln"):
            ours_only += 1
        if any(outcomes.values()):
            line = {side: None if o is None else str(o)[:300] for side, o in outcomes.items()}
            print(seed, w.layout, w.windows, w.sub_block, w.mode, w.connector, json.dumps(line), flush=True)
    print(
        f"{last - first} seeds in {time.perf_counter() - start:.0f} s; failed: "
        + ", ".join(f"{side} {n}" for side, n in failed.items())
        + f"; rbln only: {ours_only}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
