"""A cache-aware router's view of a scheduler: its KV events replayed, checked against the
event contract of docs/runner-contract.md ("KV events").

`EventReplay.apply` takes the events of one `KVEventBatch` (what vLLM's publisher sends) in
order and keeps what a router keeps: how many cached blocks hold each key. It fails on

* a `BlockStored` not in sub-blocks: `block_size` other than the scheduler's
  `hash_block_size`, or token ids that are not `block_size` per hash;
* a hash a router could not compute: each stored hash must be the prefix hash of its
  `block_size` tokens chained on the hash before it (`parent_block_hash` for the first),
  as the router hashes a prompt, over the extra keys the event names for it (its
  `extra_keys` entry: a cache salt, multimodal `(identifier, offset)` pairs, prompt
  embedding digests; tagged as the hash tags them from vLLM 0.31.0) and, from vLLM 0.34.0,
  the tokens after it the hash covers (`lookahead_token_ids`, as many as the engine's
  `num_hash_lookahead_tokens`, none where that is 0). An event whose extra keys or
  lookahead are not the ones its hashes were computed over fails here;
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
    # Tokens after each block its hash covers (`VllmConfig.num_hash_lookahead_tokens`,
    # vLLM 0.34.0 on; 0 before): each BlockStored names them per hash.
    num_hash_lookahead_tokens: int = 0
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
        num_hashes = len(event.block_hashes)
        if size != self.hash_block_size or len(event.token_ids) != size * num_hashes:
            raise KVEventContractError(
                f"BlockStored of {num_hashes} hashes over {len(event.token_ids)} tokens "
                f"with block_size {size}: the contract is one hash per {self.hash_block_size} tokens"
            )
        extra_keys = event.extra_keys or [None] * num_hashes
        if len(extra_keys) != num_hashes:
            raise KVEventContractError(
                f"BlockStored of {num_hashes} hashes with {len(extra_keys)} extra-key entries: "
                "the contract is one entry per hash"
            )
        lookahead = self._lookahead_of(event)
        parent = None
        if event.parent_block_hash is not None:
            parent = self._internal.get(event.parent_block_hash)
            if parent is None:
                raise KVEventContractError(f"BlockStored chained on {event.parent_block_hash}, never stored")
        for i, block_hash in enumerate(event.block_hashes):
            tokens = event.token_ids[i * size : (i + 1) * size]
            keys = self._hash_extra_keys(event, extra_keys[i])
            if lookahead is not None:
                keys = (keys, *lookahead[i])
            parent = hash_block_tokens(self.hash_function, parent, tokens, keys)
            if maybe_convert_block_hash(parent) != block_hash:
                raise KVEventContractError(
                    f"BlockStored hash {block_hash} is not the prefix hash of its tokens "
                    f"{list(tokens)} after the hashes before it, with the event's extra keys "
                    f"{extra_keys[i]!r}"
                    + ("" if lookahead is None else f" and lookahead tokens {list(lookahead[i])}")
                )
            self._internal[block_hash] = parent
            self.held[(block_hash, event.group_idx or 0)] += 1
            self.num_stored += 1

    def _lookahead_of(self, event: Any) -> list[list[int]] | None:
        """The event's tokens after each block (`lookahead_token_ids`, vLLM 0.34.0 on), as
        many per hash as the engine's `num_hash_lookahead_tokens`; None where it hashes
        none (every release before 0.34.0, whose events have no such field)."""
        lookahead = getattr(event, "lookahead_token_ids", None)
        expected = self.num_hash_lookahead_tokens
        if not expected:
            if lookahead is not None:
                raise KVEventContractError(
                    f"BlockStored with lookahead tokens {lookahead}, but the engine hashes none "
                    "past a block (num_hash_lookahead_tokens=0)"
                )
            return None
        num_hashes = len(event.block_hashes)
        if lookahead is None or len(lookahead) != num_hashes or any(len(t) != expected for t in lookahead):
            raise KVEventContractError(
                f"BlockStored of {num_hashes} hashes with lookahead tokens {lookahead}: each hash "
                f"covers the {expected} token(s) after its block (num_hash_lookahead_tokens="
                f"{expected}), so the event names them, a list per hash"
            )
        return lookahead

    def _hash_extra_keys(self, event: Any, published: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        """The extra keys a block's hash covers, from those its event publishes. Up to
        vLLM 0.30.0 the hash takes them as published; from 0.31.0 each is tagged with its
        source in the hash and published untagged (`to_event_extra_keys`), so a router tags
        them back: an `(identifier, offset)` pair is multimodal, bytes a prompt embedding
        digest, a string the cache salt (or the LoRA name, first, where the event names
        one; its hash key also holds the adapter's path, which no event carries)."""
        from vllm.v1.core import kv_cache_utils

        if not published:
            return None
        if event.lora_name is not None:
            raise KVEventContractError(
                f"BlockStored with LoRA {event.lora_name!r}: LoRA extra keys are outside these tests"
            )
        # A decoded msgspec batch gives a multimodal pair as a list.
        keys = [tuple(key) if isinstance(key, list) else key for key in published]
        if not hasattr(kv_cache_utils, "to_event_extra_keys"):
            return tuple(keys)
        tagged: list[Any] = []
        for key in keys:
            if isinstance(key, tuple) and len(key) == 2:
                tagged.append(("mm", *key))
            elif isinstance(key, bytes):
                tagged.append(("prompt_embeds", key))
            elif isinstance(key, str):
                tagged.append(("cache_salt", key))
            else:
                raise KVEventContractError(f"BlockStored with an extra key a router cannot read: {key!r}")
        return tuple(tagged)

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
