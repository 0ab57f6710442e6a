"""Case 5: the OpenAI-compatible server, as users run it: ``vllm serve`` (engine core in its
own process), the RBLN scheduler and ngram drafts, the ``openai`` client sending concurrent
completions and chat requests on 127.0.0.1, and the counters on ``/metrics``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
from engine_kit import NGRAM, RBLN, Server, metric_samples, prompts_with_shared_prefixes, serve_args, words

PROMPTS = prompts_with_shared_prefixes(seed=3, count=12)


async def _clients(url: str) -> list[tuple[str, int]]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = (await client.models.list()).data[0].id
    extra = {"ignore_eos": True}

    async def complete(prompt: list[int]) -> tuple[str, int]:
        r = await client.completions.create(model=model, prompt=words(prompt), max_tokens=24,
                                            temperature=0, extra_body=extra)  # fmt: skip
        return r.choices[0].finish_reason or "", r.usage.completion_tokens if r.usage else 0

    async def chat(prompt: list[int]) -> tuple[str, int]:
        r = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": words(prompt[:40])}], max_tokens=24,
            temperature=0, extra_body=extra,
        )  # fmt: skip
        return r.choices[0].finish_reason or "", r.usage.completion_tokens if r.usage else 0

    jobs = [complete(p) for p in PROMPTS] + [chat(p) for p in PROMPTS[:6]]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        await client.close()


def test_vllm_serve_with_the_rbln_scheduler(model: Path, tmp_path: Path) -> None:
    server = Server(
        serve_args(model, "--scheduler-cls", RBLN, "--speculative-config", json.dumps(NGRAM),
                   "--num-gpu-blocks-override", "10", "--max-num-seqs", "8"),
        tmp_path / "serve.log",
    )  # fmt: skip
    try:
        server.wait_ready()
        results = asyncio.run(_clients(server.url))
        metrics = server.metrics()
    finally:
        server.stop()
    assert results == [("length", 24)] * len(results), results
    log = server.log_path.read_text(errors="replace")
    assert "RBLNScheduler" in log  # the scheduler the server really ran with
    preemptions = metric_samples(metrics, "vllm:num_preemptions_total")
    hits = metric_samples(metrics, "vllm:prefix_cache_hits_total")
    queries = metric_samples(metrics, "vllm:prefix_cache_queries_total")
    assert preemptions and hits and queries, "the counters are missing from /metrics"
    assert sum(hits.values()) > 0  # the prompts share prefixes
    assert sum(preemptions.values()) > 0  # 10 blocks of 32 for 18 concurrent requests
