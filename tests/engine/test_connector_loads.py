"""Case 3: requests that arrive with their KV loaded by a connector (the P/D decode side).

A waiting request with only its last token to compute runs as a decode (issue 21, gap 2):
on a P/D decode instance every request arrives with its prompt's KV loaded by a connector.
The RBLN scheduler admits such requests into the decode batch. Here vLLM's real engine runs
them, and every greedy token must be the same as in a plain run (no connector), with
upstream's ``Scheduler`` and with the RBLN scheduler.

The connector is ``whole_prompt_connector.WholePromptConnector``: upstream's disk connector
(``ExampleConnector``) made to move a prompt's every block (upstream's moves whole blocks of
the prompt less one token, so it never leaves fewer than two tokens to compute; see the
module). Run 1 (``kv_both``) stores every prompt's KV; run 2, a fresh engine on the same
store, loads it: synchronously (``n - 1`` tokens, in the admitting step) or as a P/D decode
instance receives it (the whole prompt, asynchronously, the scheduler then leaving the last
token to compute). The loads are seen three ways: the store's files, the engine's
``vllm:external_prefix_cache_hits`` and ``RequestOutput.num_cached_tokens`` (``n - 1``
tokens a request, or ``n`` for an asynchronous load), and the scheduler's output (each new
request scheduled with ``n - 1`` tokens computed and one to compute; under the RBLN
scheduler all in one step, one decode batch).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from engine_kit import (
    COUNTING,
    COUNTING_UPSTREAM,
    NGRAM,
    VOCAB,
    Outcome,
    assert_decode_ready,
    assert_same_tokens,
    run,
)

MAX_TOKENS = 8
rng = random.Random(21)
# n - 1 ending inside a block (39, 76, 95, 99, 119, 56 tokens) and on a boundary (64, 32).
PROMPTS = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (40, 65, 77, 96, 100, 33, 120, 57)]
LAYER_FILES = [f"model.layers.{i}.self_attn.attn.safetensors" for i in range(2)]  # the model's 2

# Run 2's engines: scheduler, ngram drafts, the load's form.
LOADS = {
    "rbln-sync": (COUNTING, False, False),
    "upstream-sync": (COUNTING_UPSTREAM, False, False),
    "rbln-async": (COUNTING, False, True),
    "rbln-ngram-async": (COUNTING, True, True),
    "upstream-async": (COUNTING_UPSTREAM, False, True),
}


def connector(store: Path, *, async_load: bool = False) -> dict[str, Any]:
    return dict(
        kv_transfer_config=dict(
            kv_connector="WholePromptConnector",
            kv_connector_module_path="whole_prompt_connector",
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": str(store), "async_load": async_load},
        )
    )


@dataclass(frozen=True)
class Stored:
    reference: Outcome  # upstream's Scheduler, no connector, no prefix caching
    store: Path
    files: dict[Path, int]  # every stored file and its st_mtime_ns after run 1


@pytest.fixture(scope="module")
def stored(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    store = tmp_path_factory.mktemp("kv-store")
    reference = run(model, PROMPTS, MAX_TOKENS, scheduler_cls=COUNTING_UPSTREAM, enable_prefix_caching=False)
    plain = run(model, PROMPTS, MAX_TOKENS, scheduler_cls=COUNTING, enable_prefix_caching=False)
    assert_same_tokens(plain, reference, "rbln, no connector")
    # Run 1: the store is empty; every prompt is computed, and stored.
    first = run(model, PROMPTS, MAX_TOKENS, scheduler_cls=COUNTING, **connector(store))
    assert_same_tokens(first, reference, "run 1 (stores)")
    assert first.metrics["vllm:external_prefix_cache_hits"] == 0, first.metrics
    assert all(a.computed == 0 for a in first.admissions), first.admissions
    folders = sorted(store.iterdir())
    assert len(folders) == len(PROMPTS), folders  # one a prompt, named by its tokens' hash
    assert all(sorted(f.name for f in folder.iterdir()) == LAYER_FILES for folder in folders), folders
    return Stored(reference, store, _stored_files(store))


def _stored_files(store: Path) -> dict[Path, int]:
    return {f: f.stat().st_mtime_ns for f in sorted(store.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("load", LOADS)
def test_connector_loads_are_decode_ready_and_keep_the_tokens(model: Path, stored: Stored, load: str) -> None:
    scheduler, ngram, async_load = LOADS[load]
    drafts = {"speculative_config": NGRAM} if ngram else {}
    loaded = run(
        model,
        PROMPTS,
        MAX_TOKENS,
        scheduler_cls=scheduler,
        **drafts,
        **connector(stored.store, async_load=async_load),
    )
    assert_same_tokens(loaded, stored.reference, f"run 2 ({load})")
    # An async load announces the whole prompt; the scheduler recomputes its last token.
    announced = [len(p) if async_load else len(p) - 1 for p in PROMPTS]
    assert loaded.metrics["vllm:external_prefix_cache_hits"] == sum(announced), loaded.metrics
    assert loaded.num_cached_tokens == announced
    width = 1 + NGRAM["num_speculative_tokens"] if ngram else 1
    assert_decode_ready(loaded, PROMPTS, one_batch=scheduler == COUNTING, width=width)
    if ngram:  # drafts really made and used after the loads
        assert loaded.metrics.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, loaded.metrics
    # Folders are named by the tokens' hash: a prompt stored again would rewrite its files.
    assert _stored_files(stored.store) == stored.files, "run 2 stored a prompt again"
