"""vllm-rbln's real model runner, driven step by step by our RBLN scheduler.

The scheduler side is the scheduler tier's: vLLM's own harness (`tests/v1/core/utils.py`'s
`create_scheduler`) and `sched_harness.Driver`, which plays the engine core around the real
`RBLNScheduler`. This module hands each step's `SchedulerOutput` to vllm-rbln 0.12.0's
`RBLNModelRunner` (its released wheel with the adoption patches applied, docs/adopting.md), as
its worker does: `execute_model` runs for real up to the model's forward (state update, the
sub-block copies, input preparation, padding, attention metadata, staging); the forward is the
one stand-in (`Forward`: the compiled model needs an RBLN NPU), which records what it is given
and stops the step; then `_bookkeeping_sync` takes the tokens the simulated model sampled, as
`sample_tokens` hands them to it. vLLM is built on vllm-rbln's own platform (its plugin,
`RblnPlatform`, with its `check_and_update_config` and `_wire`), on the vllm model path, with
host tensors (`VLLM_RBLN_USE_DEVICE_TENSOR=0`) and eager KV copies (`enforce_eager`).

Every step is checked against the scheduler (`check_step`): the phase, each row's input ids
and positions against the request's real tokens and drafts, the block table (the runner's
request state and its persistent row) against the scheduler's, the discard mask, each copy's
effect on the KV tensor (every slot of every block stamped with its own value first), and the
tokens bookkeeping keeps.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import sched_harness as h
import torch

# One attention layer, named as a model's are (vllm-rbln reads the layer index from it), and a
# second one with a sliding window where a build asks for one (`build(window=...)`).
LAYER = "model.layers.0.self_attn.attn"
WINDOW_LAYER = "model.layers.1.self_attn.attn"
HEADS = 1
HEAD_SIZE = 4
# vllm-rbln's default geometry: 32-token blocks, 16-token prefill chunks, so the default
# sub-block (the chunk) is half a block.
BLOCK_SIZE = 32
CHUNK = 16


class ForwardReached(Exception):
    """Raised by the stand-in forward: `execute_model` got as far as the model."""


@dataclass
class Forward:
    """The compiled model's place (`RBLNModelRunner.model_executable`): records the staged
    inputs and stops the step."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, **inputs: Any) -> Any:
        self.calls.append(inputs)
        raise ForwardReached


def attention_layer(spec: Any) -> Any:
    """The model's attention layer as vLLM's static forward context holds it: it names vllm-rbln's
    attention backend and the KV spec, and receives the KV tensor the runner allocates. It
    stands for the layer a loaded model registers (loading one needs the device)."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm_rbln.v1.attention.backends.flash_attention import RBLNFlashAttentionBackend

    class Layer(torch.nn.Module, AttentionLayerBase):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.kv_cache: Any = None

        def get_attn_backend(self) -> Any:
            return RBLNFlashAttentionBackend

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return spec

    return Layer()


# The pipeline this process is a stage of: (size, rank), or None before the first build.
_STAGE: tuple[int, int] | None = None
# The stage the next build joins as: (port, size, rank).
_NEXT_STAGE: tuple[int, int, int] | None = None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def join_process_groups(port: int, size: int, rank: int, vllm_config: Any) -> None:
    """vLLM's process groups for a pipeline of ``size`` processes on 127.0.0.1 (gloo), this one
    its stage ``rank``, as a worker makes them (tensor parallelism 1, the data parallelism of
    ``vllm_config``, which every stage must agree on)."""
    global _STAGE
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    try:
        init_distributed_environment(
            world_size=size,
            rank=rank,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=rank,
            backend="gloo",
            timeout=timedelta(seconds=120),  # a stage that never comes fails the join, not hangs
        )
        # The groups read data parallelism from the config: none, in every stage.
        with set_current_vllm_config(vllm_config):
            ensure_model_parallel_initialized(1, size)
    except BaseException:
        leave_process_groups()  # nothing half-made for the next build to trip on
        raise
    _STAGE = (size, rank)


def leave_process_groups() -> None:
    global _STAGE
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    _STAGE = None


def _join_for_build(vllm_config: Any) -> None:
    global _NEXT_STAGE
    if _NEXT_STAGE is not None:
        if _STAGE is not None:
            leave_process_groups()
        port, size, rank = _NEXT_STAGE
        _NEXT_STAGE = None
        join_process_groups(port, size, rank, vllm_config)
    elif _STAGE is None:
        join_process_groups(free_port(), 1, 0, vllm_config)


class PipelinePeer:
    """The last stage of the pipelines (`pipeline_peer.py`): one process for the whole test run,
    told on its standard input to join and leave, answering on a pipe of its own."""

    TIMEOUT = 120.0  # as the join's: a stage that never comes fails, not hangs

    def __init__(self) -> None:
        answers, answer_fd = os.pipe()
        # On vLLM's CPU platform (no plugin): it needs a default config to make the groups,
        # which vllm-rbln's platform refuses without a model; process groups over gloo do not
        # depend on the platform.
        env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_TARGET_DEVICE": "cpu"}
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("pipeline_peer.py")), str(answer_fd)],
            stdin=subprocess.PIPE,
            env=env,
            pass_fds=(answer_fd,),
            text=True,
        )
        os.close(answer_fd)
        self.answers = os.fdopen(answers)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def expect(self, answer: str) -> None:
        ready, _, _ = select.select([self.answers], [], [], self.TIMEOUT)
        line = self.answers.readline().strip() if ready else "(nothing in 120 s)"
        if line != answer:
            raise AssertionError(
                f"the pipeline's last stage answered {line!r} where {answer!r} was due"
                f" (exit code {self.process.poll()})"
            )

    def stop(self) -> int:
        """Closes its standard input (it exits) and reaps it, killed if it does not exit."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=self.TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.answers.close()
        return self.process.returncode


_PEER: PipelinePeer | None = None


def stop_pipeline_peer() -> None:
    """The end of the test run (conftest): the peer, if one was started, exits cleanly."""
    global _PEER
    if _PEER is not None:
        peer, _PEER = _PEER, None
        code = peer.stop()
        assert code == 0, f"the pipeline's last stage exited {code}"


@contextmanager
def first_of_two_pipeline_stages() -> Iterator[None]:
    """The runner built inside this block is the first stage of a two-stage pipeline (a non-last
    stage: vLLM's `get_pp_group().is_last_rank` is false there); the last stage is a peer
    process that only joins the process groups (`PipelinePeer`). The runner reads which stage
    it is from the groups, and nothing sends it a tensor (the forward is the stand-in).
    Afterwards this process is a pipeline of one again."""
    global _NEXT_STAGE, _PEER
    if _PEER is None:
        _PEER = PipelinePeer()
    peer = _PEER
    port = free_port()
    peer.send(f"join {port}")
    _NEXT_STAGE = (port, 2, 0)
    try:
        yield
    finally:
        joined = _STAGE == (2, 0)
        _NEXT_STAGE = None
        if joined:
            peer.expect("joined")
            peer.send("leave")
            leave_process_groups()
            peer.expect("left")
        else:  # it waits for a stage 0 that never came (the build failed first): not reused
            _PEER = None
            peer.process.kill()
            peer.stop()


@dataclass
class Built:
    scheduler: Any
    vllm_config: Any
    runner: Any
    forward: Forward


def build(
    *,
    num_blocks: int = 40,
    block_size: int = BLOCK_SIZE,
    chunk: int = CHUNK,
    max_num_seqs: int = 4,
    prefix_caching: bool = True,
    rbln_settings: dict[str, Any] | None = None,
    kv_cache_spec: Any = None,
    window: int | None = None,
    chunks_cross_kv_blocks: bool = False,
    **harness: Any,
) -> Built:
    """Our RBLN scheduler in vLLM's harness and vllm-rbln's runner on the same `VllmConfig`.

    The config passes through vllm-rbln's platform hook as an engine's does (its
    `additional_config` becomes vllm-rbln's `RBLNConfig`, `_wire` names the scheduler class);
    `window`: a second layer, `WINDOW_LAYER`, with a sliding window of that many tokens, in a
    KV cache group of its own (full attention next to a sliding window, as Gemma-2's; the
    groups share the one block pool, and each layer has its own KV tensor, as vllm-rbln
    allocates them); `chunks_cross_kv_blocks`: the scheduler is built on a platform declaring
    a device that may prefill a chunk across KV blocks (`sched_harness.chunks_may_cross_kv_blocks`)."""
    from sched_harness import create_scheduler
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        SlidingWindowSpec,
    )
    from vllm_rbln.config import build_rbln_config
    from vllm_rbln.v1.worker.rbln_model_runner import RBLNModelRunner

    spec = kv_cache_spec or FullAttentionSpec(
        block_size=block_size, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    layers = {LAYER: spec}
    if window is not None:
        layers[WINDOW_LAYER] = SlidingWindowSpec(
            block_size=block_size,
            num_kv_heads=HEADS,
            head_size=HEAD_SIZE,
            dtype=torch.float32,
            sliding_window=window,
        )
    groups = [KVCacheGroupSpec([name], layer_spec) for name, layer_spec in layers.items()]
    made: dict[str, Any] = {}
    rbln = h.rbln_scheduler_factory(
        build_rbln_config(dict(rbln_settings or {})), chunks_cross_kv_blocks=chunks_cross_kv_blocks
    )

    def scheduler_cls(*, vllm_config: Any, kv_cache_config: Any, **kwargs: Any) -> Any:
        made["vllm_config"] = vllm_config
        made["scheduler_cls"] = vllm_config.scheduler_config.scheduler_cls  # as _wire named it
        # vLLM's harness makes one group, of the spec it is given.
        kv_cache_config = KVCacheConfig(
            num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )
        made["kv_cache_config"] = kv_cache_config
        return rbln(vllm_config=vllm_config, kv_cache_config=kv_cache_config, **kwargs)

    scheduler = create_scheduler(
        scheduler_cls=scheduler_cls,  # type: ignore[arg-type]
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=chunk,
        max_num_seqs=max_num_seqs,
        max_model_len=harness.pop("max_model_len", 512),
        enable_prefix_caching=prefix_caching,
        kv_cache_spec=spec,
        **harness,
    )
    vllm_config = made["vllm_config"]
    assert made["scheduler_cls"] == h.RBLN_SCHEDULER, (
        f"vllm-rbln's platform named {made['scheduler_cls']} as the scheduler class"
    )
    vllm_config.model_config.enforce_eager = True  # KV copies as torch copies (no compiled runtime)
    for name, layer_spec in layers.items():
        vllm_config.compilation_config.static_forward_context[name] = attention_layer(layer_spec)
    num_blocks = made["kv_cache_config"].num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(
                size=layer_spec.page_size_bytes * num_blocks,
                layers=[name],
                layer_stride=layer_spec.page_size_bytes * num_blocks,
                block_stride=layer_spec.page_size_bytes,
            )
            for name, layer_spec in layers.items()
        ],
        kv_cache_groups=groups,
    )
    forward = Forward()
    with set_current_vllm_config(vllm_config):
        _join_for_build(vllm_config)
        runner = RBLNModelRunner(vllm_config, torch.device("cpu"))
        runner.initialize_kv_cache(kv_cache_config)
    # With host tensors the KV cache is the compiled runtime's device memory, which the runner
    # holds as meta tensors of its layout: host tensors of the same layout take its place, so
    # that the copies (`_process_kv_cache_copy_ops`'s tensor path) have an effect to check.
    runner.kv_caches = [torch.zeros(t.shape, dtype=t.dtype) for t in runner.kv_caches]
    runner.model_executable = forward
    return Built(scheduler, vllm_config, runner, forward)


@dataclass
class Coverage:
    """What the workload's steps held (each test asserts on what it is about)."""

    prefill_steps: int = 0
    decode_steps: int = 0
    copies: int = 0
    copies_in_multi_request_steps: int = 0
    resumed: int = 0
    draft_rows: int = 0
    discarded_rows: int = 0
    max_decode_batch: int = 0
    non_last_stage_steps: int = 0  # steps the runner ran as a non-last pipeline stage


def stamp_kv(runner: Any) -> list[torch.Tensor]:
    """Give every slot of every KV block of every layer a value of its own; returns the stamps,
    in the order of `runner.kv_caches`."""
    stamps = []
    offset = 0
    for kv in runner.kv_caches:
        stamp = torch.arange(offset, offset + kv.numel(), dtype=kv.dtype).reshape(kv.shape)
        kv.copy_(stamp)
        stamps.append(stamp)
        offset += kv.numel()
    return stamps


def check_copies(runner: Any, stamps: list[torch.Tensor], copies: dict[str, list[tuple[int, int]]]) -> None:
    """After the step's copies: in each layer's KV tensor, each destination block of the layer's
    copies (`copies[layer]`) holds its source's KV, every other block its own."""
    for name, kv, stamp in zip(runner.kv_cache_names, runner.kv_caches, stamps, strict=True):
        axis = runner.kv_cache_block_axes[name]
        layer_copies = copies.get(name, [])
        expected = stamp.clone()
        for src, dst in layer_copies:
            expected.select(axis, dst).copy_(stamp.select(axis, src))
        for block in range(kv.shape[axis]):
            got, want = kv.select(axis, block), expected.select(axis, block)
            if not torch.equal(got, want):
                sources = [s for s, d in layer_copies if d == block]
                raise AssertionError(
                    f"{name}'s KV block {block} after the step's copies {layer_copies}: "
                    + (f"not a copy of block {sources[0]}" if sources else "changed, and no copy names it")
                )


@dataclass
class RunnerDriver(h.Driver):
    """`sched_harness.Driver` with vllm-rbln's runner on the other side of each `schedule()`."""

    built: Built | None = None
    coverage: Coverage = field(default_factory=Coverage)
    # Applied to each output before the runner sees it (a fault the checks must catch).
    tamper: Callable[[Any], None] | None = None

    def _schedule(self) -> Any:
        batch = super()._schedule()
        assert self.built is not None
        if self.tamper is not None:
            self.tamper(batch.output)
        run_step(self.built, batch, self.coverage)
        return batch


def _row_tokens(scheduler: Any, output: Any, req_id: str, computed: int) -> tuple[list[int], list[int]]:
    """The input ids and positions the step must feed for the request."""
    request = scheduler.requests[req_id]
    drafts = list(output.scheduled_spec_decode_tokens.get(req_id, ()))
    n = output.num_scheduled_tokens[req_id]
    base = n - len(drafts)
    return list(request.all_token_ids[computed : computed + base]) + drafts, list(
        range(computed, computed + n)
    )


def run_step(built: Built, batch: Any, coverage: Coverage) -> None:
    """Hand one step's output to the runner and check what it made of it."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.outputs import SamplerOutput

    scheduler, runner, output = built.scheduler, built.runner, batch.output
    scheduled = output.num_scheduled_tokens
    drafts = output.scheduled_spec_decode_tokens
    computed = {d.req_id: d.num_computed_tokens for d in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    coverage.resumed += len(cached.resumed_req_ids)
    copies = [(c.src_block_id, c.dst_block_id) for c in output.kv_cache_block_copies or ()]
    # The copies: one for each admission whose hit ends inside a block, in each KV cache group,
    # into the block of the request's table that holds the hit's end.
    block_size = built.vllm_config.cache_config.block_size
    groups = scheduler.kv_cache_config.kv_cache_groups
    wanted: dict[str, dict[str, int]] = {}  # layer -> request -> the block its copy fills
    for data in output.scheduled_new_reqs:
        hit = data.num_computed_tokens
        if hit % block_size:
            tables = scheduler.kv_cache_manager.get_block_ids(data.req_id)
            for group, table in zip(groups, tables, strict=True):
                (layer,) = group.layer_names
                wanted.setdefault(layer, {})[data.req_id] = list(table)[hit // block_size]
    layer_copies = {
        layer: [(src, dst) for src, dst in copies if dst in blocks.values()]
        for layer, blocks in wanted.items()
    }
    stamps = stamp_kv(runner)
    calls = len(built.forward.calls)
    with set_current_vllm_config(built.vllm_config):
        try:
            result = runner.execute_model(output)
        except ForwardReached:
            result = None
    if not scheduled:
        assert result is not None and len(built.forward.calls) == calls, "an empty step reached the forward"
        check_copies(runner, stamps, layer_copies)
        return
    assert len(built.forward.calls) == calls + 1, "execute_model returned before the forward"
    inputs = built.forward.calls[-1]

    # The phase: a prefill when some request has two or more tokens beyond its drafts.
    base = {r: n - len(drafts.get(r, ())) for r, n in scheduled.items()}
    prefill = any(n > 1 for n in base.values())
    assert runner.is_prefill == prefill, (
        f"the runner took a {'prefill' if prefill else 'decode'} step for the other"
    )
    if prefill:
        coverage.prefill_steps += 1
    else:
        coverage.decode_steps += 1
        coverage.max_decode_batch = max(coverage.max_decode_batch, len(scheduled))

    # Each copy from a block no request of the step holds, into a block above (`wanted`); made
    # before the forward, in the layers of its own group.
    filled = sorted(block for blocks in wanted.values() for block in blocks.values())
    assert sorted(dst for _, dst in copies) == filled, (
        f"copies {copies}: the blocks holding the ends of the hits are {wanted}"
    )
    for src, _ in copies:
        holders = [
            r for r in scheduled if any(src in table for table in scheduler.kv_cache_manager.get_block_ids(r))
        ]
        assert not holders, f"a copy from block {src}, which {holders} hold"
    check_copies(runner, stamps, layer_copies)
    coverage.copies += len(copies)
    if copies and len(scheduled) > 1:
        coverage.copies_in_multi_request_steps += len(copies)

    batch_ids = runner.input_batch.req_ids
    assert sorted(batch_ids) == sorted(scheduled), (batch_ids, sorted(scheduled))
    input_ids = inputs["input_ids"]
    positions = inputs["positions"]
    null_block = scheduler.kv_cache_manager.block_pool.null_block.block_id
    for row, req_id in enumerate(batch_ids):
        ids, pos = _row_tokens(scheduler, output, req_id, computed[req_id])
        n = len(ids)
        assert input_ids[row, :n].tolist() == ids, (
            f"{req_id}: input ids {input_ids[row, :n].tolist()} != {ids}"
        )
        assert positions[row, :n].tolist() == pos, (
            f"{req_id}: positions {positions[row, :n].tolist()} != {pos}"
        )
        if req_id in drafts:
            coverage.draft_rows += 1
        # The block tables, of every KV cache group: the request state and the persistent row,
        # the scheduler's. A block that left a sliding window is the null block in the
        # scheduler's table and stays in the runner's: nothing tells the runner (upstream's
        # contract; attention never reads below the window).
        tables = scheduler.kv_cache_manager.get_block_ids(req_id)
        for group, blocks in enumerate(map(list, tables)):
            table = runner.input_batch.block_table[group]
            where = f"{req_id}, KV cache group {group}"
            state = list(runner.requests[req_id].block_ids[group])
            row_blocks = table.block_table.np[row, : int(table.num_blocks_per_row[row])].tolist()
            for name, got in (("the runner's table", state), ("the persistent row", row_blocks)):
                assert len(got) == len(blocks) and all(
                    ours in (theirs, null_block) for ours, theirs in zip(blocks, got, strict=True)
                ), f"{where}: {name} {got}, the scheduler's {blocks}"
        # The discard mask: a chunk that does not reach the request's known tokens samples nothing.
        samples = req_id in batch.record.sampled_req_ids
        assert bool(runner.discard_request_mask[row]) == (not samples), f"{req_id}: the discard mask"
        coverage.discarded_rows += not samples

    from vllm.distributed import get_pp_group

    if not get_pp_group().is_last_rank:
        # A non-last stage's worker sends the hidden states on and takes no sampled tokens
        # (no `_bookkeeping_sync` to check): the tokens the last stage sampled come back in the
        # next steps' `new_token_ids`, which the input ids above were checked against.
        coverage.non_last_stage_steps += 1
        return
    # Bookkeeping: the tokens the simulated model sampled, as the sampler returns them.
    sampled = dict(zip(batch.req_ids, batch.sampled, strict=True))
    width = max(len(drafts.get(r, ())) for r in batch_ids) + 1
    rows = [(sampled[r] or [h.SAMPLED_TOKEN]) + [-1] * (width - len(sampled[r] or [0])) for r in batch_ids]
    sampler_output = SamplerOutput(
        sampled_token_ids=torch.tensor(rows, dtype=torch.int32), logprobs_tensors=None
    )
    num_tokens = output.total_num_scheduled_tokens
    with set_current_vllm_config(built.vllm_config):
        kept = runner._bookkeeping_sync(
            output, sampler_output, None, torch.zeros(num_tokens, HEAD_SIZE), num_tokens
        )[2]
    for row, req_id in enumerate(batch_ids):
        assert list(kept[row]) == sampled[req_id], (
            f"{req_id}: bookkeeping kept {kept[row]}, sampled {sampled[req_id]}"
        )


@contextmanager
def npu_named(name: str | None) -> Iterator[None]:
    """The NPU vllm-rbln's platform names (`RBLN_FORCE_NPU_NAME`, read at each question)."""
    import os

    previous = os.environ.get("RBLN_FORCE_NPU_NAME")
    if name is None:
        os.environ.pop("RBLN_FORCE_NPU_NAME", None)
    else:
        os.environ["RBLN_FORCE_NPU_NAME"] = name
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("RBLN_FORCE_NPU_NAME", None)
        else:
            os.environ["RBLN_FORCE_NPU_NAME"] = previous


def drive(built: Built, **driver: Any) -> RunnerDriver:
    return RunnerDriver(built.scheduler, built=built, **driver)
