"""Run the parity workloads on one side and print their traces as JSON (docs/parity.md).

    python drive.py ours <patched vLLM source tree> <out.json> [workload ...]
    python drive.py vllm-rbln <vLLM 0.30.0 source tree> <out.json> [workload ...]
    python drive.py <side> <tree> <out.json> --time-decodes N     (bench/bench_parity.py)

The JSON goes to ``out.json`` (vLLM 0.30.0 logs to stdout).

Run by the parity tier in each side's venv: ``ours`` where the pin's RBLN wheel is installed,
``vllm-rbln`` in the reference venv (an unpatched empty-device vLLM 0.30.0 and vllm-rbln 0.12.0,
``VLLM_PLUGINS=none``). Both sides are built by vLLM's own ``create_scheduler`` of their own
source tree and stepped by one simulated runner, ``tests/scheduler/sched_harness.py``'s
``Driver``. Only the scheduler class and its settings differ:

* ours: ``vllm.v1.core.sched.rbln_scheduler.RBLNScheduler``, the sub-block settings in
  ``additional_config`` as a dict (our scheduler reads them so);
* vllm-rbln: ``RBLNScheduler``, or ``RBLNAsyncScheduler`` with async scheduling (as its
  platform's ``_wire`` picks), given the ``RBLNConfig`` its own ``build_rbln_config`` makes (as
  its platform hook does). vLLM 0.30.0's ``create_scheduler`` has no ``scheduler_cls``: the
  class is built on the ``VllmConfig``, KV cache config and structured-output manager that
  ``create_scheduler`` made, exactly the arguments it passes its own class.

vllm-rbln checks a sub-block size below the prefill chunk against ``current_platform.is_cr13()``
(the REBEL CR13 device); vLLM's CPU platform has no such method. The sub-block workloads stand
for a CR13 device, and say so: ``CR13CpuPlatform`` below is vLLM's CPU platform declaring that
one capability, installed as the current platform before vllm_rbln is imported. Ours asks the
platform the same question as ``supports_prefill_chunk_across_kv_blocks()``, which
``sched_harness.rbln_scheduler_factory`` answers yes while it builds the scheduler
(``chunks_may_cross_kv_blocks``). Neither decides anything about scheduling.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "scheduler"))

import sched_harness as h  # noqa: E402
from workloads import BY_NAME, WORKLOADS, Arrival, Workload  # noqa: E402

OURS = "ours"
VLLM_RBLN = "vllm-rbln"
SIDES = (OURS, VLLM_RBLN)


def declare_cr13_platform() -> None:
    """Make the current platform vLLM's CPU platform with ``is_cr13() -> True``."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    class CR13CpuPlatform(CpuPlatform):
        """The CPU platform, standing for an RBLN CR13 device in vllm-rbln's sub-block check."""

        @classmethod
        def is_cr13(cls) -> bool:
            return True

    platforms._current_platform = CR13CpuPlatform()


# Group spec class names by layout, as both sides' KV cache configs must hold them.
LAYOUT_GROUPS = {
    "full": ["FullAttentionSpec"],
    "mla": ["MLAAttentionSpec"],
    "full+window": ["FullAttentionSpec", "SlidingWindowSpec"],
}


def _kv_cache_config(w: Workload, made: Any) -> Any:
    """The KV cache config both sides run on: the harness's (`made`, one group of
    `_kv_cache_spec`), or for `full+window` its full-attention group next to a sliding
    window of a block and a half (Gemma-2's layout: two groups, one pool)."""
    if w.kv_layout != "full+window":
        return made
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    full = made.kv_cache_groups[0].kv_cache_spec
    window = SlidingWindowSpec(
        block_size=full.block_size,
        num_kv_heads=full.num_kv_heads,
        head_size=full.head_size,
        dtype=full.dtype,
        sliding_window=full.block_size * 3 // 2,
    )
    return KVCacheConfig(
        num_blocks=made.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], full),
            KVCacheGroupSpec(["window"], window),
        ],
    )


def _kv_cache_spec(w: Workload) -> Any:
    """The first KV cache group's spec, the same on both sides: None (the harness's full
    attention), or MLA's latent (one KV head of DeepSeek-V2's 512 + 64)."""
    if w.kv_layout in ("full", "full+window"):
        return None
    assert w.kv_layout == "mla", w.kv_layout
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return MLAAttentionSpec(block_size=w.block_size, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)


def _create_kwargs(w: Workload) -> dict[str, Any]:
    from tests.v1.core.utils import mock_kv

    return dict(
        kv_cache_spec=_kv_cache_spec(w),
        block_size=w.block_size,
        num_blocks=w.num_blocks,
        max_num_batched_tokens=w.max_num_batched_tokens,
        max_num_seqs=w.max_num_seqs,
        max_model_len=w.max_model_len,
        num_speculative_tokens=w.num_spec_tokens,
        speculative_method="ngram" if w.num_spec_tokens else None,
        enable_prefix_caching=w.prefix_caching,
        use_kv_connector=mock_kv(0, False) if w.empty_connector else None,
        scheduling_policy=w.policy,
        pipeline_parallel_size=w.pipeline_parallel_size,
        async_scheduling=w.async_scheduling,
    )


def _with_connector(w: Workload, vllm_config: Any) -> None:
    """The prefix-hit connector (sched_harness's), configured for the workload."""
    from vllm.config import KVTransferConfig

    assert w.connector is not None
    h._register_prefix_hit_connector()
    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector=h.PREFIX_HIT_CONNECTOR,
        kv_role="kv_both",
        kv_connector_extra_config={
            "matched_tokens": w.connector.matched_tokens,
            "is_async": w.connector.is_async,
        },
    )
    # As vLLM's config does for a connector without HMA support.
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True


def _sub_block(w: Workload) -> tuple[bool, int | None]:
    """(enable_sub_block_cache, sub_block_size), the same on both sides."""
    return w.sub_block_size is not None, w.sub_block_size


def make_ours(w: Workload) -> Any:
    from sched_harness import create_scheduler

    enabled, size = _sub_block(w)
    rbln = h.rbln_scheduler_factory(h.sub_block_settings(size, enabled), async_scheduling=w.async_scheduling)

    def scheduler_cls(*, vllm_config: Any, kv_cache_config: Any, **kwargs: Any) -> Any:
        if w.connector is not None:
            _with_connector(w, vllm_config)
        return rbln(vllm_config=vllm_config, kv_cache_config=_kv_cache_config(w, kv_cache_config), **kwargs)

    return create_scheduler(scheduler_cls=scheduler_cls, **_create_kwargs(w))


def make_vllm_rbln(w: Workload) -> Any:
    from sched_harness import create_scheduler
    from vllm_rbln.config import build_rbln_config
    from vllm_rbln.v1.core.rbln_scheduler import RBLNAsyncScheduler, RBLNScheduler

    base = create_scheduler(**_create_kwargs(w))
    vllm_config = base.vllm_config
    enabled, size = _sub_block(w)
    vllm_config.additional_config = build_rbln_config(
        {"enable_sub_block_cache": enabled, "sub_block_size": size}
    )
    if w.connector is not None:
        _with_connector(w, vllm_config)
    cls = RBLNAsyncScheduler if w.async_scheduling else RBLNScheduler
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=_kv_cache_config(w, base.kv_cache_config),
        block_size=w.block_size,
        log_stats=True,
        structured_output_manager=base.structured_output_manager,
    )
    scheduler.use_v2_model_runner = base.use_v2_model_runner
    return scheduler


def hash_block_size(scheduler: Any, w: Workload) -> int:
    """The prefix-hash granularity the engine core hashes requests with: the scheduler's
    (ours: the sub-block size in sub-block mode; vllm-rbln's sub-block manager hashes whole
    blocks and keeps its own sub-block hashes)."""
    return int(getattr(scheduler, "hash_block_size", None) or w.block_size)


def run(side: str, w: Workload) -> dict[str, Any]:
    """The workload's trace on ``side``: every step as the runner saw it, and the end state."""
    start = time.process_time()
    try:
        scheduler = make_ours(w) if side == OURS else make_vllm_rbln(w)
    except Exception as error:  # a side refusing the configuration is a figure of its own
        return {"workload": w.name, "side": side, "error": f"{type(error).__name__}: {error}"}
    groups = [type(g.kv_cache_spec).__name__ for g in scheduler.kv_cache_config.kv_cache_groups]
    assert groups == LAYOUT_GROUPS[w.kv_layout], groups
    driver = h.Driver(
        scheduler,
        accept=lambda req_id, num_drafts: w.accepted,
        async_load_steps=w.connector.load_steps if w.connector else 1,
        load_steps={a.req_id: a.load_steps for a in w.arrivals if a.load_steps is not None},
        max_in_flight=w.max_in_flight,
    )
    block_hash = hash_block_size(scheduler, w)
    arrived: dict[str, int] = {}
    pending = sorted(w.arrivals, key=lambda a: a.at_step)
    for call in range(w.max_steps):
        while pending and pending[0].at_step <= call:
            a = pending.pop(0)
            driver.add(
                h.make_request(
                    a.req_id, a.prompt(), a.max_tokens, priority=a.priority, hash_block_size=block_hash
                )
            )
            arrived[a.req_id] = len(driver.steps)
        if not pending and not scheduler.has_requests() and not driver.batches_in_flight:
            break
        if w.max_in_flight > 1:
            driver.step_with_batch_queue()
        else:
            driver.step()
    manager = scheduler.kv_cache_manager
    # Distinct blocks the requests still hold (a prefix hit shares a block between requests).
    held = {
        block.block_id
        for m in manager.coordinator.single_type_managers
        for blocks in m.req_to_blocks.values()
        for block in blocks
        if not block.is_null
    }
    return {
        "workload": w.name,
        "side": side,
        "steps": [
            {
                "tokens": s.num_scheduled_tokens,
                "prefill": s.prefill_req_ids,
                "decode": s.decode_req_ids,
                "preempted": sorted(s.preempted_req_ids),
                "sampled": s.sampled_req_ids,
                "computed_before": s.num_computed_before,
                "free_blocks": s.num_free_blocks_after,
                "copies": len(s.block_copies),
            }
            for s in driver.steps
        ],
        "arrived": arrived,
        "max_tokens": {a.req_id: a.max_tokens for a in w.arrivals},
        "finished": sorted(driver.finished),
        "unfinished": sorted(scheduler.requests),
        "reported_preemptions": driver.reported_preemptions,
        "blocks_not_free": h.num_usable_blocks(scheduler) - manager.block_pool.get_num_free_blocks(),
        "blocks_held_by_requests": len(held),
        "cpu_seconds": time.process_time() - start,
    }


# The bench's CPU-time figure (bench/bench_parity.py): 32 requests decoding together.
DECODES_32 = Workload(
    name="cpu-32-decodes",
    what="32 requests decoding together, blocks to spare (the bench's CPU time per step)",
    arrivals=tuple(Arrival(f"req-{i}", 16, 1000, seed=200 + i) for i in range(32)),
    judged=(),
    num_blocks=2000,
    max_num_batched_tokens=64,
    max_num_seqs=32,
    max_model_len=2048,
)


def time_decodes(side: str, steps: int) -> dict[str, Any]:
    """CPU seconds of one ``schedule()`` + ``update_from_output()`` with 32 requests decoding,
    the mean over ``steps`` steps after every request has started decoding."""
    w = DECODES_32
    scheduler = make_ours(w) if side == OURS else make_vllm_rbln(w)
    driver = h.Driver(scheduler)
    for a in w.arrivals:
        driver.add(
            h.make_request(a.req_id, a.prompt(), a.max_tokens, hash_block_size=hash_block_size(scheduler, w))
        )
    while len(driver.steps) < 200 and (not driver.steps or len(driver.steps[-1].decode_req_ids) < 32):
        driver.step()
    assert len(driver.steps[-1].decode_req_ids) == 32, "the 32 requests never decoded together"
    spent = 0.0
    for _ in range(steps):
        start = time.process_time()
        output = scheduler.schedule()
        spent += time.process_time() - start
        req_ids = list(output.num_scheduled_tokens)
        model_output = h.runner_output(req_ids, [[h.SAMPLED_TOKEN] for _ in req_ids])
        start = time.process_time()
        scheduler.update_from_output(output, model_output)
        spent += time.process_time() - start
        assert len(req_ids) == 32
    return {"cpu_seconds_per_step": spent / steps, "steps": steps}


def _progress(trace: dict[str, Any]) -> dict[str, Any]:
    print(f"{trace['side']}: {trace['workload']} {trace.get('error', 'done')}", file=sys.stderr, flush=True)
    return trace


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[1] not in SIDES:
        print(
            f"usage: {argv[0]} {{{','.join(SIDES)}}} <vllm-source-tree> <out.json> "
            "[workload ... | --time-decodes N]",
            file=sys.stderr,
        )
        return 2
    side, tree, out, names = argv[1], argv[2], Path(argv[3]), argv[4:]
    timing = names[:1] == ["--time-decodes"]
    unknown = [n for n in names if n not in BY_NAME] if not timing else []
    if unknown:
        print(f"unknown workloads: {', '.join(unknown)} (tests/parity/workloads.py)", file=sys.stderr)
        return 2
    if side == VLLM_RBLN:
        declare_cr13_platform()  # first: every module that asks gets this one platform
    h.load_vllm_test_harness(tree)
    import vllm

    if timing:
        result = time_decodes(side, int(names[1]))
    else:
        traces = [_progress(run(side, w)) for w in (WORKLOADS if not names else [BY_NAME[n] for n in names])]
        result = {"side": side, "vllm": vllm.__version__, "vllm_file": vllm.__file__, "traces": traces}
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
