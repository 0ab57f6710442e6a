"""Benchmark: the RBLN scheduler against upstream's in vLLM's real engine, on this CPU.

    <engine venv>/bin/python bench/bench_engine.py [--requests 32] [--max-tokens 48] [--repeat 1]

The engine venv is the one ``python build.py test --tier engine`` makes (the binary RBLN
wheel pip-installed; its path is printed by the runner, under
``$VLLM_RBLN_FORK_CACHE/venvs/engine-*/rbln-vllm``).

Same workload, same run: token-id prompts of 40-140 tokens sharing prefixes, greedy, a
fixed number of output tokens, ngram drafts (3 tokens) for both schedulers, prefix
caching off. Each configuration runs in its own process (tests/engine/engine_kit.py), with
a roomy KV pool and under pressure (10 blocks of 32: requests are preempted). Measured
around ``LLM.generate`` only (not the engine's start):

* tokens/s: output tokens / wall time;
* mean step time: wall time / engine steps that scheduled tokens (counted by the
  scheduler subclasses of tests/engine/counting_scheduler.py).

Prints a table and the RBLN/upstream ratios; asserts nothing. The RBLN scheduler is
expected to take more, shorter steps (one prefill a step, no mixed batches).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))

import engine_kit

SCHEDULERS = {"upstream": engine_kit.COUNTING_UPSTREAM, "rbln": engine_kit.COUNTING}
POOLS = {"roomy": None, "pressure": 10}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (median reported)")
    args = parser.parse_args()
    prompts = engine_kit.prompts_with_shared_prefixes(seed=21, count=args.requests)
    rows: dict[tuple[str, str], tuple[float, float, int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = engine_kit.make_model(Path(tmp) / "tiny-llama")
        for pool, blocks in POOLS.items():
            for name, cls in SCHEDULERS.items():
                tps, step_ms, steps, preempted = [], [], 0, 0
                for _ in range(args.repeat):
                    extra = {"num_gpu_blocks_override": blocks} if blocks else {}
                    o = engine_kit.run(model, prompts, args.max_tokens, scheduler_cls=cls,
                                       speculative_config=engine_kit.NGRAM, enable_prefix_caching=False,
                                       **extra)  # fmt: skip
                    tokens = sum(len(t) for t in o.tokens)
                    tps.append(tokens / o.seconds)
                    step_ms.append(1000 * o.seconds / max(o.steps, 1))
                    steps, preempted = o.steps, len(o.preemptions)
                rows[(pool, name)] = (statistics.median(tps), statistics.median(step_ms), steps, preempted)
                print(f"  {pool:9} {name:9} done", file=sys.stderr, flush=True)
    print(f"{'pool':9} {'scheduler':9} {'tokens/s':>9} {'step ms':>8} {'steps':>6} {'preempt':>7}")
    for (pool, name), (tps_, ms, steps, preempted) in rows.items():
        print(f"{pool:9} {name:9} {tps_:9.1f} {ms:8.2f} {steps:6d} {preempted:7d}")
    print("\nRBLN / upstream:")
    for pool in POOLS:
        up, rb = rows[(pool, "upstream")], rows[(pool, "rbln")]
        ratios = (
            f"tokens/s {rb[0] / up[0]:.3f}   mean step time {rb[1] / up[1]:.3f}   steps {rb[2] / up[2]:.3f}"
        )
        print(f"  {pool:9} {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
