"""A cache-aware router's view of a scheduler: its KV events replayed, checked against the
event contract of docs/runner-contract.md ("KV events").

`EventReplay.apply` takes the events of one `KVEventBatch` (what vLLM's publisher sends) in
order and keeps what a router keeps: how many cached blocks hold each key. It fails on

* a `BlockStored` not in sub-blocks: `block_size` other than the scheduler's
  `hash_block_size`, or token ids that are not `block_size` per hash;
* a hash a router could not compute: each stored hash must be the prefix hash of its
  `block_size` tokens chained on the hash before it (`parent_block_hash` for the first),
  as the router hashes a prompt;
* a `BlockRemoved` of a key no stored event holds (an entry removed twice, or never
  stored).

`check_pool` compares the replay with the pool itself: exactly the keys the pool holds, each
as many times as blocks hold it. `hit_tokens` is the router's hit for a prompt's hashes.
Used by the scheduler tier's driver (sched_harness.Driver) and the engine tier's event test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cached_blocks import cached_blocks

Key = tuple[Any, int]  # (external block hash, KV cache group)


class KVEventContractError(AssertionError):
    """The KV events do not say what the scheduler's cache holds."""


@dataclass
class EventReplay:
    hash_block_size: int
    # The hash function the engine hashes prompts with (vllm.utils.hashing's, by name in
    # `CacheConfig.prefix_caching_hash_algo`).
    hash_function: Callable[[Any], bytes]
    held: Counter[Key] = field(default_factory=Counter)
    num_stored: int = 0
    num_removed: int = 0
    # External hash -> the internal one it was computed as: the parent of a later event.
    _internal: dict[Any, bytes] = field(default_factory=dict)

    def apply(self, events: Iterable[Any]) -> None:
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    key = (block_hash, event.group_idx or 0)
                    if self.held[key] <= 0:
                        raise KVEventContractError(
                            f"BlockRemoved of {block_hash}, which no stored event holds"
                        )
                    self.held[key] -= 1
                    self.num_removed += 1
                    if not self.held[key]:
                        del self.held[key]
            elif isinstance(event, AllBlocksCleared):
                self.held.clear()

    def _stored(self, event: Any) -> None:
        from vllm.v1.core.kv_cache_utils import hash_block_tokens, maybe_convert_block_hash

        size = event.block_size
        if size != self.hash_block_size or len(event.token_ids) != size * len(event.block_hashes):
            raise KVEventContractError(
                f"BlockStored of {len(event.block_hashes)} hashes over {len(event.token_ids)} tokens "
                f"with block_size {size}: the contract is one hash per {self.hash_block_size} tokens"
            )
        if any(extra is not None for extra in event.extra_keys or ()):
            raise KVEventContractError("extra keys (LoRA, multimodal, salt) are outside these tests")
        parent = None
        if event.parent_block_hash is not None:
            parent = self._internal.get(event.parent_block_hash)
            if parent is None:
                raise KVEventContractError(f"BlockStored chained on {event.parent_block_hash}, never stored")
        for i, block_hash in enumerate(event.block_hashes):
            tokens = event.token_ids[i * size : (i + 1) * size]
            parent = hash_block_tokens(self.hash_function, parent, tokens, None)
            if maybe_convert_block_hash(parent) != block_hash:
                raise KVEventContractError(
                    f"BlockStored hash {block_hash} is not the prefix hash of its tokens "
                    f"{list(tokens)} after the hashes before it"
                )
            self._internal[block_hash] = parent
            self.held[(block_hash, event.group_idx or 0)] += 1
            self.num_stored += 1

    def check_pool(self, block_pool: Any) -> None:
        """The replay holds exactly the pool's prefix-cache entries."""
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, maybe_convert_block_hash

        pool: Counter[Key] = Counter()
        for key, _block in cached_blocks(block_pool):
            pool[(maybe_convert_block_hash(get_block_hash(key)), get_group_id(key))] += 1
        if pool != self.held:
            missing = pool - self.held
            extra = self.held - pool
            raise KVEventContractError(
                f"the events' replay disagrees with the pool: {sum(missing.values())} entries held "
                f"but never reported, {sum(extra.values())} reported but not held"
            )

    def hit_tokens(self, block_hashes: Sequence[bytes], group: int = 0) -> int:
        """A router's hit for a prompt with these (internal) hashes: the longest run of
        its sub-blocks from the start that the events say are cached."""
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        hit = 0
        for block_hash in block_hashes:
            if not self.held[(maybe_convert_block_hash(block_hash), group)]:
                break
            hit += 1
        return hit * self.hash_block_size
