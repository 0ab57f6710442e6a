"""A KV connector whose loads leave one token to compute: the P/D decode side, on the CPU.

Upstream's reference connector (``ExampleConnector``, vLLM's own disk connector, which runs on
the CPU) moves whole blocks of the prompt less one token, so a request it loads always has at
least two tokens left to compute: it is never decode-ready. On a P/D decode instance every
request arrives with its whole prompt's KV. This subclass keeps ``ExampleConnector``'s disk
format, file names and worker-side copies (``start_load_kv``, ``save_kv_layer``: vLLM's own
code moves the KV) and changes what it keys and moves: a prompt is keyed by its first
``n - 1`` tokens and stored as every block that holds its ``n`` tokens. Selected through
vLLM's documented extension point (``kv_connector_module_path``), as a scheduler subclass is
with ``scheduler_cls``.

``kv_role="kv_both"``: a prompt the store does not hold is stored from its prefill step; a
prompt it holds is loaded, in one of two ways (``kv_connector_extra_config``):

* synchronously (the default): the ``n - 1`` tokens are loaded in the step that admits the
  request and computes its last token;
* ``"async_load": True``, as a P/D decode instance receives its KV (vLLM's NIXL connector):
  the whole prompt is announced as loading asynchronously, the request waits
  (``WAITING_FOR_REMOTE_KVS``) while a step copies it, the worker reports it received, and
  the scheduler leaves its last token to compute (upstream's ``_update_waiting_for_remote_kv``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    ReqMeta,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass
class WholePromptMetadata(ExampleConnectorMetadata):
    async_loads: list[str] = field(default_factory=list)  # request ids the worker reports received


def _meta(prompt: list[int], block_ids: list[int], block_size: int, *, is_store: bool) -> ReqMeta:
    """``ReqMeta.make_meta`` keyed on the prompt less its last token, moving every slot of the
    blocks that hold the prompt.

    Whole blocks, the partial tail block included, never single slots: the copies index a
    layer's cache as ``[block, head, slot, channel]``, but the CPU attention backend's block is
    not slot-major (``cpu_attn.py`` views it as the block's keys, then its values: slot ``s``
    of that view holds the keys of slots ``2s`` and ``2s + 1``, or values), so a partial block
    copied slot by slot loses the values of its slots (measured: other greedy tokens for
    prompts whose ``n - 1`` tokens end inside a block). A whole block is copied exactly
    whatever its interior. Its slots past the prompt are written before they are read.
    """
    num_blocks = -(-len(prompt) // block_size)
    assert len(block_ids) >= num_blocks, (len(block_ids), num_blocks)
    blocks = torch.tensor(block_ids[:num_blocks])
    slots = torch.arange(block_size).reshape(1, block_size) + blocks.reshape(-1, 1) * block_size
    return ReqMeta(
        token_ids=torch.tensor(prompt[:-1]), slot_mapping=slots.flatten(), is_store=is_store, mm_hashes=[]
    )


class WholePromptConnector(ExampleConnector):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._async_load = bool(self._kv_transfer_config.get_from_extra_config("async_load", False))
        self._load_blocks: dict[str, list[int]] = {}  # async loads: the blocks allocated for them

    # The scheduler's side.

    def _found_match_for_prompt(self, prompt_token_ids: list[int], mm_hashes: list[str]) -> bool:
        folder = self._generate_foldername_debug(
            torch.tensor(list(prompt_token_ids)[:-1]), mm_hashes, create_folder=False
        )
        return os.path.exists(folder)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if not self._found_match_for_request(request):
            return 0, False
        if self._async_load:
            return request.num_prompt_tokens - num_computed_tokens, True
        return request.num_prompt_tokens - 1 - num_computed_tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0 and self._async_load:
            self._load_blocks[request.request_id] = list(blocks.get_block_ids()[0])

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = WholePromptMetadata()
        for new_req in scheduler_output.scheduled_new_reqs:
            prompt = list(new_req.prompt_token_ids or [])
            if new_req.req_id in self._requests_need_load:  # a synchronous load
                meta.requests.append(_meta(prompt, new_req.block_ids[0], self._block_size, is_store=False))
                del self._requests_need_load[new_req.req_id]
            elif not self._found_match_for_prompt(prompt, []):
                # Stored from this step's forward: the whole prompt must be computed in it.
                scheduled = scheduler_output.num_scheduled_tokens[new_req.req_id]
                if new_req.num_computed_tokens + scheduled < len(prompt):
                    raise RuntimeError(
                        f"{new_req.req_id}: its prompt ({len(prompt)} tokens) is not prefilled in one "
                        f"step ({scheduled} scheduled); raise max_num_batched_tokens"
                    )
                meta.requests.append(_meta(prompt, new_req.block_ids[0], self._block_size, is_store=True))
        for req_id, request in self._requests_need_load.items():  # admitted, not scheduled
            if not self._async_load:
                raise RuntimeError(f"{req_id}: a load outside its admission step (a resumed request?)")
            blocks = self._load_blocks.pop(req_id)
            meta.requests.append(
                _meta(list(request.prompt_token_ids or []), blocks, self._block_size, is_store=False)
            )
            meta.async_loads.append(req_id)
        self._requests_need_load.clear()
        return meta

    # The worker's side.

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if forward_context.attn_metadata is not None:
            super().start_load_kv(forward_context, **kwargs)
            return
        # A step without a forward (only async loads to start): upstream's copy, which wants
        # the attention metadata only to tell MLA from other attention (this model is not MLA).
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, WholePromptMetadata)
        for request in metadata.requests:
            if request.is_store:
                continue
            for name, layer in forward_context.no_compile_layers.items():
                kv_cache = getattr(layer, "kv_cache", None)
                if kv_cache is None:
                    continue
                filename = self._generate_filename_debug(name, request.token_ids, request.mm_hashes)
                kv = safetensors.torch.load_file(filename)["kv_cache"].to(kv_cache.device)
                slots = request.slot_mapping.to(kv_cache.device)
                kv_cache[slots // self._block_size, :, slots % self._block_size] = kv

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # The copies above are done when start_load_kv returns: every async load of the step
        # is received in it.
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, WholePromptMetadata)
        return None, set(metadata.async_loads) or None
