"""One sub-block rule for scheduler and runner (issue 29, part 3).

vllm-rbln's runner sizes its kernel blocks (`initialize_kv_cache`) and its dynamic-KV sizer
its copy-stream memory (`copy_stream_reserve_bytes`) from the sub-block size in use. With the
adoption patch both ask the fork's scheduler (`vllm.v1.core.sched.rbln_sub_block
.sub_block_size_in_use`, the decision the scheduler makes) instead of vllm-rbln's own copy of
the rules (`v1/core/utils.sub_block_size_in_use`), which takes layouts and connectors the
scheduler keeps on whole blocks. Each case builds our scheduler and vllm-rbln's real runner on
one `VllmConfig` and checks the three answers against the scheduler's.

Shown failing with the adoption patch's runner and sizer calls reverted (vllm-rbln's own
rules): `sliding-window` (the runner took the 32-token manager block as the layer's kernel
block, not its 16-token window, and reserved copy memory) and `connector` (copy memory
reserved for a scheduler on whole blocks).
"""

from __future__ import annotations

from typing import Any

import pytest
import runner_harness as rh
import torch


def _spec(layout: str) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    shape: dict[str, Any] = {
        "block_size": rh.BLOCK_SIZE,
        "num_kv_heads": rh.HEADS,
        "head_size": rh.HEAD_SIZE,
        "dtype": torch.float32,
    }
    if layout == "sliding-window":
        return SlidingWindowSpec(**shape, sliding_window=16)
    return FullAttentionSpec(**shape)


@pytest.mark.parametrize(
    ("case", "scheduler_size", "kernel_block"),
    [
        # Sub-blocks at the prefill chunk (vllm-rbln's default). MLA is not here: the harness
        # lays the KV tensor out for RBLNFlashAttentionBackend (K and V), not for vllm-rbln's
        # MLA backend; the scheduler tier covers MLA.
        ("full", rh.CHUNK, rh.BLOCK_SIZE),
        # A sliding window (rule 3 takes it since issue 29's part 1b): sub-blocks at the chunk,
        # and the runner compiles the layer on the manager block, as with vllm-rbln's own rules
        # (before part 1b: whole blocks, its window as its kernel block, 16).
        ("sliding-window", rh.CHUNK, rh.BLOCK_SIZE),
        # Whole blocks: a connector not known to key on tokens (rule 5; vLLM's mock is keyed on
        # nothing, but nobody listed it in sub_block_verified_connectors).
        ("connector", None, rh.BLOCK_SIZE),
    ],
)
def test_the_runner_sizes_from_the_scheduler_s_sub_block_size(
    case: str, scheduler_size: int | None, kernel_block: int
) -> None:
    from tests.v1.core.utils import mock_kv
    from vllm.v1.core.sched.rbln_sub_block import sub_block_size_in_use
    from vllm_rbln.v1.worker.dynamic_kv_sizer import DYNAMIC_KV_COPY_STREAM_RESERVE_BYTES, DynamicKvSizer

    harness: dict[str, Any] = {"use_kv_connector": mock_kv(0, False)} if case == "connector" else {}
    built = rh.build(kv_cache_spec=_spec("full" if case == "connector" else case), **harness)
    sub_blocks = built.scheduler.sub_block_cache
    assert (sub_blocks.sub_block_size if sub_blocks.enabled else None) == scheduler_size
    assert sub_block_size_in_use(built.vllm_config, built.runner.kv_cache_config) == scheduler_size
    assert built.runner._kernel_block_sizes == [kernel_block]
    sizer = DynamicKvSizer(built.vllm_config, built.runner, foreign_dram_used_bytes=0)
    reserve = DYNAMIC_KV_COPY_STREAM_RESERVE_BYTES if scheduler_size is not None else 0
    assert sizer.copy_stream_reserve_bytes() == reserve
