"""The prefix-cache entries of a block pool, at every pin.

`BlockPool.cached_block_hash_to_block` has no public way to list its entries, and its
layout changed in vLLM 0.34.0: up to 0.33.0 `_cache` maps a key to a block, or to a dict
of blocks by id when several hold it; from 0.34.0 it maps a key to one block *id*, and
`_dup_ids` holds every id of a key cached by several blocks (block_pool.py,
`BlockHashToBlockMap`: ids, so the cyclic GC does not walk the cache).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def cached_blocks(pool: Any) -> Iterator[tuple[Any, Any]]:
    """Each (key, block) the pool's prefix cache holds: a key once per block."""
    cache = pool.cached_block_hash_to_block
    dup_ids: dict[Any, dict[int, None]] | None = getattr(cache, "_dup_ids", None)
    for key, held in cache._cache.items():
        if dup_ids is not None:  # 0.34.0 on: ids
            for block_id in dup_ids.get(key, (held,)):
                yield key, pool.blocks[block_id]
        elif isinstance(held, dict):
            yield from ((key, block) for block in held.values())
        else:
            yield key, held
