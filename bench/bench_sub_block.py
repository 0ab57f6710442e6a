"""Benchmark: prefix-cache hit rate of sub-block caching on a shared-prefix workload.

    VLLM_RBLN_SOURCE_TREE=<patched vLLM tree> PYTHONPATH=<same tree> \\
        <vllm venv>/bin/python bench/bench_sub_block.py [--groups 16] [--per-group 6] [--seed 0]

Runs the real patched RBLN scheduler (vLLM's own test harness, a simulated
model runner: tests/scheduler/sched_harness.py) over one workload three
times: whole-block prefix caching (block size 16), and sub-block caching at
sub-block sizes 4 and 8. Prints a table of prompt tokens, prefix-cache hits
and hit rate (tokens a request starts with computed / its prompt tokens).

The workload: `--groups` shared prefixes (a system prompt or a document) of
random length 40-200 tokens, mostly not block-aligned. Each group first sends
the shared prefix alone (a warm-up request), then `--per-group` requests that
append a distinct 10-60-token question to it. A request can hit the prefix up
to its last cached boundary: a whole block (multiple of 16), or with sub-block
caching the prefix's last sub-block boundary (upstream registers the partial
tail of a prompt at its last hash boundary).

The pool is large enough that nothing is preempted or evicted. Counts are
deterministic for a seed; this prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "scheduler"))
os.environ.setdefault("HF_HOME", str(HERE.parent / "tests" / "fixtures" / "hf"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import sched_harness as h  # noqa: E402

CONFIGS: tuple[tuple[str, int | None], ...] = (("whole-block", None), ("sub-block 4", 4), ("sub-block 8", 8))


def workload(groups: int, per_group: int, seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    out: list[list[list[int]]] = []
    for _group in range(groups):
        prefix = [rng.randrange(1, 30000) for _ in range(rng.randint(40, 200))]
        prompts = [list(prefix)]
        for _ in range(per_group):
            prompts.append(prefix + [rng.randrange(1, 30000) for _ in range(rng.randint(10, 60))])
        out.append(prompts)
    return out


def run(sub_block_size: int | None, groups: list[list[list[int]]]) -> tuple[int, int, int]:
    from tests.v1.core.utils import create_scheduler

    settings = None if sub_block_size is None else h.sub_block_settings(sub_block_size)
    scheduler = create_scheduler(
        scheduler_cls=h.rbln_scheduler_factory(settings),  # type: ignore[arg-type]
        block_size=h.BLOCK_SIZE,
        num_blocks=4096,
        # At most the block (vllm-rbln's rule: block >= prefill chunk >= sub-block).
        max_num_batched_tokens=h.BLOCK_SIZE,
        max_model_len=1024,
        enable_prefix_caching=True,
    )
    hash_size = h.BLOCK_SIZE if sub_block_size is None else sub_block_size
    driver = h.Driver(scheduler)
    hits: dict[str, int] = {}
    prompt_tokens = 0

    def run_all() -> None:
        while scheduler.has_requests():
            record = driver.step()
            for req_id, start in record.num_computed_before.items():
                # A request's first scheduled step starts at its hit.
                hits.setdefault(req_id, start)

    n = 0
    for prompts in groups:
        # The warm-up first, to completion; then the group's requests together.
        for i, prompt in enumerate(prompts):
            driver.add(h.make_request(f"r{n}", prompt, max_tokens=4, hash_block_size=hash_size))
            prompt_tokens += len(prompt)
            n += 1
            if i == 0:
                run_all()
        run_all()
    assert not any(driver.preemptions.values())
    return n, prompt_tokens, sum(hits.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--per-group", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    source_tree = os.environ.get(h.SOURCE_TREE_ENV)
    if not source_tree:
        sys.exit(f"{h.SOURCE_TREE_ENV} must name the patched vLLM source tree")
    h.load_vllm_test_harness(source_tree)
    groups = workload(args.groups, args.per_group, args.seed)
    rows = [(name, *run(size, groups)) for name, size in CONFIGS]
    base_hits = rows[0][3]
    print(
        f"shared-prefix workload: {args.groups} prefixes x (1 warm-up + {args.per_group} requests), "
        f"block size {h.BLOCK_SIZE}, seed {args.seed}"
    )
    print(
        f"{'config':<12} {'requests':>8} {'prompt tokens':>13} {'hit tokens':>10}"
        f" {'hit rate':>8} {'vs whole':>8}"
    )
    for name, requests, queries, hits in rows:
        print(
            f"{name:<12} {requests:>8} {queries:>13} {hits:>10} {hits / queries:>8.1%} "
            f"{hits / base_hits:>7.3f}x"
        )


if __name__ == "__main__":
    main()
