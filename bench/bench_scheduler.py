"""Benchmark: the RBLN scheduler's cost per step, and steps to drain under KV pressure.

    VLLM_RBLN_SOURCE_TREE=<patched tree> <vllm venv>/bin/python bench/bench_scheduler.py \\
        --tree patched=<patched tree> [--tree no-backport=<variant tree>] \\
        [--steps 400] [--repeat 5] [--config fcfs ...]

Each `--tree` is imported in its own subprocess (`PYTHONPATH=<tree>`); the
variant trees are built as `tests/scheduler/variants/README.md` says. Without
the `no-backport` tree only the cost table is printed.

1. Cost (patched tree): `schedule()` + `update_from_output()` of the RBLN
   scheduler against upstream's `Scheduler` (the patched tree's, hooks
   included) on the same workload: 32 requests, 32-token prompts, no spec
   decoding, per configuration (`--config`, default all):
   * `fcfs`: 512 output tokens, a pool that holds them all; timed over
     decode-only steps of all 32 (the RBLN scheduler runs its prefills alone
     first; upstream mixes them in). Target: ratio <= 1.05.
   * `priority`: the same under the priority policy (priorities 0-3).
   * `sub-block`: the same with prefix caching on for both, the RBLN
     scheduler's sub-block caching at size 4 (requests hashed every 4
     tokens, as the engine hashes them), and upstream's `Scheduler` hashing
     at 4 too (the series lets it hit inside a block): the RBLN code's cost.
   * `sub-block-vs-whole`: the same, upstream hashing whole blocks: the
     feature's whole cost (8x the hashing in blocks of 32, and an index
     entry each time a decode crosses a boundary, every 4th token): the
     worst case, a sub-block far below any real prefill chunk.
   * `sub-block-at-chunk`: the same price at the sub-block's default, the
     prefill chunk (128 tokens, in blocks of 512; upstream hashing whole
     blocks): one boundary every 128 tokens of a request.
   * `pressure`: 128 output tokens in a pool of 5 blocks a request (a
     sequence needs up to 10): decodes are preempted and prefilled again
     throughout. Both run the workload to the end and the cost is per
     generated token: the two policies take different steps (the RBLN
     scheduler prefills alone), so this ratio measures the policy's steps
     as well as its code.
   `--repeat` pairs of runs, each pair one RBLN and one upstream run back to
   back, the order alternating, so that a change in the machine's load falls
   on both sides; the ratio is taken per pair (median and range printed),
   in CPU time of the process (`time.thread_time`, which other work on a
   shared machine does not inflate) and in wall time, each run the mean
   over its timed steps, with the garbage collector off while timing.
   `--aa` adds a row timing upstream against itself (`fcfs A/A`): the
   method's noise floor on this machine. An earlier version timed all RBLN
   runs, then all upstream runs, in wall time with the collector on: timing
   upstream against itself that way on the shared 2-core machine (load
   about 12) gave ratios from 0.67 to 1.10, so it could not tell 1.05 from
   1.0.
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
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

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


@dataclass(frozen=True)
class CostConfig:
    """One configuration of the cost-per-step workload (both schedulers)."""

    name: str
    policy: str = "fcfs"
    # Prefix caching on for both; for the RBLN scheduler also sub-block
    # caching at this size (requests hashed at it, as the engine hashes them).
    sub_block_size: int | None = None
    # Upstream's `Scheduler` hashes at the sub-block size too (the series
    # lets it hit inside a block): the difference is the RBLN scheduler's
    # own. False: upstream hashes whole blocks, the feature's whole cost.
    same_hashing: bool = True
    # KV blocks per request in the pool: 40 holds every sequence (512 + 32
    # tokens, in blocks of 16 or more); fewer puts the pool under pressure.
    blocks_per_request: int = 40
    max_tokens: int = 512
    # With sub-blocks: the KV block and the prefill chunk (the harness's
    # `max_num_batched_tokens`), both schedulers alike.
    sub_block_kv_block: int = 32
    sub_block_chunk: int = 32

    @property
    def block_and_chunk(self) -> tuple[int, int]:
        """(KV block, prefill chunk): the sub-block fields', or 16 and 512 without sub-blocks."""
        if self.sub_block_size is None:
            return 16, 512
        return self.sub_block_kv_block, self.sub_block_chunk

    @property
    def under_pressure(self) -> bool:
        """The pool cannot hold every sequence at once."""
        return self.blocks_per_request * self.block_and_chunk[0] < 32 + self.max_tokens


COST_CONFIGS = {
    c.name: c
    for c in (
        CostConfig("fcfs"),
        CostConfig("priority", policy="priority"),
        CostConfig("sub-block", sub_block_size=4),
        CostConfig("sub-block-vs-whole", sub_block_size=4, same_hashing=False),
        # The sub-block at what its default takes here (the prefill chunk; an
        # unset size resolves to 128 on the plain platform), under a block four
        # chunks long: one boundary every 128 tokens of a request, not every 4.
        CostConfig(
            "sub-block-at-chunk",
            sub_block_size=128,
            same_hashing=False,
            sub_block_kv_block=512,
            sub_block_chunk=128,
            blocks_per_request=2,
        ),
        # 32 sequences of up to 160 tokens (10 blocks each) in 5 blocks each:
        # decodes are preempted and prefilled again throughout.
        CostConfig("pressure", blocks_per_request=5, max_tokens=128),
    )
}


def _cost_scheduler(rbln: bool, config: CostConfig) -> Scheduler:
    import sched_harness as h
    from tests.v1.core.utils import create_scheduler
    from vllm.v1.core.sched.scheduler import Scheduler as UpstreamScheduler

    scheduler_cls: Any = None
    if rbln:
        settings = None if config.sub_block_size is None else h.sub_block_settings(config.sub_block_size)
        scheduler_cls = h.rbln_scheduler_factory(settings)
    elif config.sub_block_size is not None and config.same_hashing:
        scheduler_cls = functools.partial(UpstreamScheduler, hash_block_size=config.sub_block_size)
    # Sub-block caching needs block >= prefill chunk >= sub-block (vllm-rbln's
    # rule), and a decode step of 32 requests 32 tokens: chunks of at least 32
    # (the config's), the sub-block below the chunk on a platform that
    # declares it can (sched_harness.chunks_may_cross_kv_blocks).
    block_size, chunk = config.block_and_chunk
    scheduler = create_scheduler(
        scheduler_cls=scheduler_cls,
        block_size=block_size,
        num_blocks=32 * config.blocks_per_request + 1,
        max_num_seqs=32,
        max_num_batched_tokens=chunk,
        max_model_len=1024,
        enable_prefix_caching=config.sub_block_size is not None,
        scheduling_policy=config.policy,
    )
    for i in range(32):
        scheduler.add_request(
            h.make_request(
                f"r{i}",
                h.distinct_prompt(i, 32),
                max_tokens=config.max_tokens,
                # Mixed priorities, so the priority policy has to rank.
                priority=i % 4,
                hash_block_size=scheduler.hash_block_size,
            )
        )
    return scheduler


def _step(scheduler: Scheduler) -> tuple[float, float, list[str]]:
    """One engine step: (CPU seconds, wall seconds, scheduled request ids)."""
    import sched_harness as h
    from vllm.v1.outputs import ModelRunnerOutput

    cpu, wall = time.thread_time(), time.perf_counter()
    output = scheduler.schedule()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    req_ids = list(output.num_scheduled_tokens)
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
    started_cpu, started_wall = time.thread_time(), time.perf_counter()
    scheduler.update_from_output(output, model_output)
    cpu += time.thread_time() - started_cpu
    wall += time.perf_counter() - started_wall
    return cpu, wall, req_ids


def _cost(rbln: bool, config: CostConfig, num_steps: int) -> tuple[float, float]:
    """(CPU, wall) seconds per unit of work: per decode-only step of 32
    decodes, or, under pressure, per generated token over the whole drain
    (the two schedulers then take different steps for the same tokens).

    The garbage collector is off while timing (as `timeit` does): a
    collection lands on whichever step crosses its threshold, and one
    full collection of the imported vLLM costs as much as a step."""
    scheduler = _cost_scheduler(rbln, config)
    gc.collect()
    gc.disable()
    try:
        cpu: list[float] = []
        wall: list[float] = []
        pressure = config.under_pressure
        while scheduler.has_requests() and (pressure or len(cpu) < num_steps):
            started = {r: scheduler.requests[r].num_output_tokens for r in scheduler.requests}
            step_cpu, step_wall, req_ids = _step(scheduler)
            if pressure or (len(req_ids) == 32 and all(started[r] > 0 for r in req_ids)):
                cpu.append(step_cpu)
                wall.append(step_wall)
    finally:
        gc.enable()
    if config.under_pressure:
        tokens = 32 * config.max_tokens
        return sum(cpu) / tokens, sum(wall) / tokens
    return statistics.fmean(cpu), statistics.fmean(wall)


def _costs(
    config: CostConfig, num_steps: int, pairs: int, same: bool = False
) -> dict[str, list[list[float]]]:
    """`pairs` runs of each scheduler, interleaved (RBLN first in even
    pairs, upstream first in odd ones) so that a change in the machine's
    load during the run falls on both sides. `same`: upstream's on both
    sides (an A/A run: the method's noise floor, ratio 1 but for noise)."""
    _cost(not same, config, 50)  # warm up: first-call imports and caches
    _cost(False, config, 50)
    rbln: list[list[float]] = []
    upstream: list[list[float]] = []
    for pair in range(pairs):
        for first in (True, False) if pair % 2 == 0 else (False, True):
            runs = rbln if first else upstream
            runs.append(list(_cost(first and not same, config, num_steps)))
    return {"rbln": rbln, "upstream": upstream}


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
        result["cost"] = {name: _costs(COST_CONFIGS[name], args.steps, args.repeat) for name in args.config}
        if args.aa:
            result["cost"]["fcfs A/A"] = _costs(COST_CONFIGS["fcfs"], args.steps, args.repeat, same=True)
    result["drain"] = {f"{p}-{g}": _drain(p, g == "guarantee") for p in (32, 26) for g in args.guarantee}
    print(json.dumps(result))


def _run_tree(tree: str, cost: bool, guarantee: list[str], args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree, VLLM_RBLN_SOURCE_TREE=tree)
    command = [sys.executable, __file__, "--worker-tree", tree, "--steps", str(args.steps)]
    command += ["--repeat", str(args.repeat), *(["--cost"] if cost else [])]
    command += [arg for name in args.config for arg in ("--config", name)]
    command += ["--aa"] if args.aa else []
    command += [arg for g in guarantee for arg in ("--guarantee", g)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"worker for {tree} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _cost_table(costs: dict[str, dict[str, list[list[float]]]]) -> str:
    """Medians of the runs and the RBLN/upstream ratio of each pair (median
    and range), in CPU time (the process's own, which other work on the
    machine does not inflate) and in wall time."""
    lines = [
        "cost per unit of work (schedule + update_from_output): per decode-only step of",
        "32 decodes, or (pressure) per generated token over the whole drain; us,",
        "median of the runs; ratio = RBLN / upstream per interleaved pair, median [range]",
        f"  {'config':<18} {'clock':<5} {'upstream':>9} {'RBLN':>9} {'ratio':>7}  range",
    ]
    for name, runs in costs.items():
        for index, clock in enumerate(("cpu", "wall")):
            rbln = [run[index] for run in runs["rbln"]]
            upstream = [run[index] for run in runs["upstream"]]
            ratios = [r / u for r, u in zip(rbln, upstream, strict=True)]
            lines.append(
                f"  {name:<18} {clock:<5} {statistics.median(upstream) * 1e6:9.1f} "
                f"{statistics.median(rbln) * 1e6:9.1f} {statistics.median(ratios):7.3f}  "
                f"{min(ratios):.3f}-{max(ratios):.3f}"
            )
    lines.append("  target: ratio <= 1.05 for the decode step (fcfs, cpu and wall)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="name=path: patched (required), no-backport (the drain table; without it, cost only)",
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5, help="pairs of cost runs (RBLN, upstream)")
    parser.add_argument(
        "--config",
        action="append",
        choices=sorted(COST_CONFIGS),
        help="cost configurations to run (default: all)",
    )
    parser.add_argument(
        "--aa",
        action="store_true",
        help="also time upstream against itself on fcfs (the method's noise floor)",
    )
    parser.add_argument("--worker-tree", help=argparse.SUPPRESS)
    parser.add_argument("--cost", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--guarantee", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.config = args.config or list(COST_CONFIGS)
    if args.worker_tree:
        _worker(args)
        return 0
    trees = dict(entry.split("=", 1) for entry in args.tree)
    if "patched" not in trees or not set(trees) <= {"patched", "no-backport"}:
        parser.error("give --tree patched=<path> [--tree no-backport=<path>]")
    drains = ["off", "guarantee"] if "no-backport" in trees else []
    patched = _run_tree(trees["patched"], True, drains, args)
    print(_cost_table(patched["cost"]))
    if not drains:
        return 0
    unpatched = _run_tree(trees["no-backport"], False, drains, args)
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
