"""Benchmark: the RBLN scheduler's cost per step, and steps to drain under KV pressure.

    VLLM_RBLN_SOURCE_TREE=<patched tree> <vllm venv>/bin/python bench/bench_scheduler.py \\
        --tree patched=<patched tree> --tree no-backport=<variant tree> [--steps 400] [--repeat 5]

Each `--tree` is imported in its own subprocess (`PYTHONPATH=<tree>`); the
variant trees are built as `tests/scheduler/variants/README.md` says.

1. Cost per step (patched tree): `schedule()` + `update_from_output()` of the
   RBLN scheduler against upstream's `Scheduler` on the same decode-heavy
   workload (32 requests, 32-token prompts, 512 output tokens, a pool that
   holds them all, no spec decoding), timed over decode-only steps (the RBLN
   scheduler runs its prefills alone first; upstream mixes them in), median
   of `--repeat` runs. Target: ratio <= 1.05.
2. Steps to drain the design's KV-pressure workload (the livelock matrix's
   scenario, sub-block caching off, no connector: two drafting decodes hold
   all but two blocks when a 32- or 26-token prompt arrives), counted from the
   prompt's arrival, for: the unpatched gate (`no-backport` tree, progress
   guarantee off), the backport (patched tree, guarantee off), the backport
   with the progress guarantee, and the unpatched gate with the guarantee.
   The lower bound: the prompt's prefill chunks (a prefill runs alone) plus
   the decode steps of the longest remaining output at one token per step
   (every draft rejected), `cdiv(prompt, 16) + max(max_tokens - 1 remaining)`.
   The RBLN scheduler hands a failed prefill step to the decodes, so the
   unpatched gate does not stall for good here: it shows as the prompt's
   repeated self-preemptions and the extra steps.

Prints two tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCHEDULER_TESTS = Path(__file__).resolve().parent.parent / "tests" / "scheduler"


def _setup(tree: str) -> None:
    os.environ.setdefault("HF_HOME", str(SCHEDULER_TESTS.parent / "fixtures" / "hf"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.path.insert(0, str(SCHEDULER_TESTS))
    import logging

    logging.disable(logging.WARNING)
    import sched_harness

    sched_harness.load_vllm_test_harness(tree)


def _decode_cost(rbln: bool, num_steps: int) -> float:
    """Mean seconds of schedule() + update_from_output() per decode-only step."""
    import sched_harness as h
    from tests.v1.core.utils import create_scheduler
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler = create_scheduler(
        scheduler_cls=h._rbln_scheduler_cls() if rbln else None,
        block_size=16,
        num_blocks=32 * 40 + 1,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        max_model_len=1024,
    )
    for i in range(32):
        scheduler.add_request(h.make_request(f"r{i}", h.distinct_prompt(i, 32), max_tokens=512))
    timed: list[float] = []
    while len(timed) < num_steps and scheduler.has_requests():
        started = time.perf_counter()
        output = scheduler.schedule()
        elapsed = time.perf_counter() - started
        req_ids = list(output.num_scheduled_tokens)
        decode_only = all(scheduler.requests[r].num_output_tokens > 0 for r in req_ids)
        model_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[
                [h.SAMPLED_TOKEN]
                if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens
                else []
                for r in req_ids
            ],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        started = time.perf_counter()
        scheduler.update_from_output(output, model_output)
        elapsed += time.perf_counter() - started
        if decode_only and len(req_ids) == 32:
            timed.append(elapsed)
    return statistics.fmean(timed)


def _drain(prompt_len: int, progress_guarantee: bool) -> dict[str, Any]:
    import sched_harness as h

    case = h.LivelockCase(prompt_len, None, False)
    scheduler = h.make_livelock_scheduler(case)
    if hasattr(scheduler, "preempt_decode_for_prefill"):
        h.set_progress_guarantee(scheduler, progress_guarantee)
    elif progress_guarantee:
        raise SystemExit("this tree has no progress guarantee")
    driver = h.Driver(scheduler)
    h.start_livelock_decodes(driver)
    remaining = max(r.max_tokens - r.num_output_tokens for r in scheduler.running)
    driver.add(h.make_request("prompt", h.distinct_prompt(100 + prompt_len, prompt_len), h.PROMPT_MAX_TOKENS))
    steps = driver.run(h.LIVELOCK_MAX_STEPS)
    lower = -(-prompt_len // h.PREFILL_CHUNK) + max(remaining, h.PROMPT_MAX_TOKENS - 1)
    return {
        "steps": steps,
        "finished": not scheduler.has_requests(),
        "prompt_preemptions": driver.preemptions.get("prompt", 0),
        "decode_preemptions": sum(n for r, n in driver.preemptions.items() if r.startswith("decode-")),
        "reported_preemptions": driver.reported_preemptions,
        "lower_bound": lower,
    }


def _worker(args: argparse.Namespace) -> None:
    _setup(args.worker_tree)
    result: dict[str, Any] = {}
    if args.cost:
        rbln = [_decode_cost(True, args.steps) for _ in range(args.repeat)]
        upstream = [_decode_cost(False, args.steps) for _ in range(args.repeat)]
        result["cost"] = {"rbln": statistics.median(rbln), "upstream": statistics.median(upstream)}
    result["drain"] = {f"{p}-{g}": _drain(p, g == "guarantee") for p in (32, 26) for g in args.guarantee}
    print(json.dumps(result))


def _run_tree(tree: str, cost: bool, guarantee: list[str], args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree, VLLM_RBLN_SOURCE_TREE=tree)
    command = [sys.executable, __file__, "--worker-tree", tree, "--steps", str(args.steps)]
    command += ["--repeat", str(args.repeat), *(["--cost"] if cost else [])]
    command += [arg for g in guarantee for arg in ("--guarantee", g)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"worker for {tree} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", default=[], help="name=path (patched, no-backport)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worker-tree", help=argparse.SUPPRESS)
    parser.add_argument("--cost", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--guarantee", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_tree:
        _worker(args)
        return 0
    trees = dict(entry.split("=", 1) for entry in args.tree)
    if set(trees) != {"patched", "no-backport"}:
        parser.error("give --tree patched=<path> and --tree no-backport=<path>")
    patched = _run_tree(trees["patched"], True, ["off", "guarantee"], args)
    unpatched = _run_tree(trees["no-backport"], False, ["off", "guarantee"], args)

    cost = patched["cost"]
    print("cost per decode step (schedule + update_from_output, 32 decodes, median of runs)")
    print(f"  upstream Scheduler  {cost['upstream'] * 1e6:8.1f} us")
    print(f"  RBLNScheduler       {cost['rbln'] * 1e6:8.1f} us")
    print(f"  ratio               {cost['rbln'] / cost['upstream']:8.3f}  (target <= 1.05)")
    print()
    rows = [
        ("unpatched gate", unpatched["drain"], "off"),
        ("backport", patched["drain"], "off"),
        ("backport + progress guarantee", patched["drain"], "guarantee"),
        ("unpatched gate + progress guarantee", unpatched["drain"], "guarantee"),
    ]
    print("steps to drain the KV-pressure workload (from the prompt's arrival)")
    header = (
        f"  {'variant':<36} {'prompt':>6} {'steps':>5} {'bound':>5} {'prompt pre.':>11} {'decode pre.':>11}"
    )
    print(header)
    for name, drains, guarantee in rows:
        for prompt_len in (32, 26):
            d = drains[f"{prompt_len}-{guarantee}"]
            steps = d["steps"] if d["finished"] else f">{d['steps']}"
            print(
                f"  {name:<36} {prompt_len:>6} {steps:>5} {d['lower_bound']:>5} "
                f"{d['prompt_preemptions']:>11} {d['decode_preemptions']:>11}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
