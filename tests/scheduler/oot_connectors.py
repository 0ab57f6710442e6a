"""Out-of-tree KV connectors for test_sub_block_cache.py, loaded through
`kv_connector_module_path="oot_connectors"` as an operator's own connector is.

Each is vLLM's MockKVConnector under another name: what matters to the RBLN
scheduler's check is where the class comes from, not what it does.
"""

from __future__ import annotations

from typing import Any

from tests.v1.kv_connector.unit.utils import MockKVConnector
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector


class BlockHashKeyedConnector(MockKVConnector):
    """Stands for a connector that keys its store on request.block_hashes."""


class LMCacheConnectorV1(MockKVConnector):
    """An out-of-tree class with the name of a connector checked to key on
    tokens: its name alone must not let it through."""


class OperatorMultiConnector(MultiConnector):
    """An operator's subclass of vLLM's MultiConnector (say, routing loads its
    own way): still a container, whose children the check must see."""


class LMCacheBookkeepingConnector(MockKVConnector):
    """LMCache's scheduler-side bookkeeping (lmcache 0.5.6,
    `lmcache/integration/vllm/vllm_v1_adapter.py`), with its two assertions,
    over a store holding the first `matched_tokens` tokens of every prompt.

    * `get_num_new_matched_tokens` records (the local count it was shown, the
      tokens it holds) and answers the difference, one token less for a full
      hit (it makes vLLM recompute the last token);
    * `update_state_after_alloc` asserts that a load is exactly that
      difference;
    * `build_connector_meta` asserts, for a request resumed from preemption,
      `num_computed_tokens == max(held, shown)` (less one for a full hit
      beyond the local count): LMCache rebuilds its per-request token state
      from that count, so a resume point it was not shown fails here, in the
      engine core, as `Preempted request ... has num_computed_tokens ...`.

    The real adapter cannot run here (it starts an LMCache engine on a CUDA
    device); the assertions are its conditions, not its code.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # request id -> (local tokens shown, tokens held)
        self.load_specs: dict[str, tuple[int, int]] = {}
        self.requests: dict[str, Any] = {}
        self.resumes_checked = 0
        self.sent: set[str] = set()  # the requests sent as new so far

    def _held(self, request: Any) -> int:
        return min(self.config.matched_tokens, request.num_tokens)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        held = self._held(request)
        self.load_specs[request.request_id] = (num_computed_tokens, held)
        need = held - num_computed_tokens - (1 if held == request.num_tokens else 0)
        return max(need, 0), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.requests[request.request_id] = request
        spec = self.load_specs.get(request.request_id)
        if spec is None or num_external_tokens == 0:
            return
        shown, held = spec
        recalc_last = 1 if held == request.num_tokens else 0
        assert num_external_tokens == held - shown - recalc_last, (
            f"Mismatch in tokens to load: {num_external_tokens} vs {held} - {shown} - {recalc_last}"
        )

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        # A resumed request comes as cached, named in `resumed_req_ids`, or,
        # from vLLM 0.34.0 (and from a V2 runner's scheduler before it), as new
        # again: a new request this connector has been sent before.
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()))
        for request in scheduler_output.scheduled_new_reqs:
            if request.req_id in self.sent:
                resumed.add(request.req_id)
            self.sent.add(request.req_id)
        for req_id in [*cached.req_ids, *(r.req_id for r in scheduler_output.scheduled_new_reqs)]:
            spec = self.load_specs.pop(req_id, None)
            if req_id not in resumed:
                continue
            assert spec is not None, f"Request {req_id} is preempted but was not given a load spec"
            shown, held = spec
            request = self.requests[req_id]
            expected = max(held, shown)
            if held == len(request.all_token_ids) and held > shown:
                expected -= 1
            assert request.num_computed_tokens == expected, (
                f"Preempted request {req_id} has num_computed_tokens "
                f"{request.num_computed_tokens} but expected {expected}"
            )
            self.resumes_checked += 1
        return super().build_connector_meta(scheduler_output)
