"""Run by test_async_and_dp.py in its own process (vLLM spawns DP engine cores; the spawned
children re-import the main module, hence the ``__main__`` guard).

AsyncLLM with DP=2: the front end's load balancer receives each rank's published
``SchedulerStats`` through the DP coordinator as ``lb_engines`` ([waiting, running, kv
usage] per rank, replaced by every snapshot). The probe records every snapshot it sees
while the requests run and prints the largest waiting and running count of each rank.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from engine_kit import RBLN, engine_args, prompts_with_shared_prefixes


async def probe(model: str) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    args = engine_args(scheduler_cls=RBLN, data_parallel_size=2, max_num_seqs=1)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **args))
    prompts = prompts_with_shared_prefixes(seed=11, count=12)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    snapshots: list[list[list[float]]] = []
    done = asyncio.Event()

    async def one(i: int, prompt: list[int]) -> int:
        last = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=f"r{i}"):
            last = out
        assert last is not None
        return len(last.outputs[0].token_ids)

    async def watch() -> None:
        seen = None
        while not done.is_set():
            current = engine.engine_core.lb_engines  # type: ignore[attr-defined]
            if current is not seen:
                seen = current
                snapshots.append([list(map(float, c)) for c in current])
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        lengths = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    finally:
        done.set()
        await watcher
        engine.shutdown()
    ranks = len(snapshots[0]) if snapshots else 0
    return {
        "finished": sum(n == 48 for n in lengths),
        "snapshots": len(snapshots),
        "max_waiting": [max(s[r][0] for s in snapshots) for r in range(ranks)],
        "max_running": [max(s[r][1] for s in snapshots) for r in range(ranks)],
    }


if __name__ == "__main__":
    print("DP-PROBE " + json.dumps(asyncio.run(probe(sys.argv[1]))), flush=True)
