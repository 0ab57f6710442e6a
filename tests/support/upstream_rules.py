"""Upstream vLLM's rules that differ between supported pins, as the vLLM tiers expect them.

Each rule is read in the pins' sdists and stated here once, with where it lives; the scheduler
and engine tiers derive their per-pin expectations from it. Needs only the standard library and
``packaging``: importable in every test venv.

**Partial prefix-cache entries.** ``FullAttentionManager._cache_partial_tail_block``
(vllm/v1/core/single_type_kv_cache_manager.py) registers one partial entry per prompt, at a
hash (sub-block) boundary inside the prompt's last block:

* 0.31.0: the last boundary at or below the prompt's end
  (``num_prompt_tokens // hash_block_size * hash_block_size``);
* 0.32.0 and 0.33.0: the last boundary at or below ``num_prompt_tokens - 1`` ("A resend
  matches at most ``prompt_len - 1`` tokens"), or the prompt's end when EAGLE drafts
  ("EAGLE lookups read the whole prompt before dropping a hash unit").
* 0.33.0 also caps the boundary at the request's hashed sub-blocks
  (``min(token_limit // hash_block_size, len(request.block_hashes))``). Without a drafter
  that needs lookahead every sub-block of the prompt is hashed and the cap changes
  nothing; with ``num_hash_lookahead_tokens`` > 0 (EAGLE with prefix caching) the hasher
  stops that many tokens short (``kv_cache_utils.get_request_block_hasher``), so the
  entry can end before the prompt's end.

So a prompt that ends exactly on a sub-block boundary is cached one sub-block shorter from
0.32.0, and a later prompt extending it hits one sub-block fewer. Neither the series nor the
RBLN scheduler touches this method (the sub-block patches open upstream's machinery to a
single full-attention group; they keep its rules).

**A waiting request stalled on the encoder budget.** When ``Scheduler.schedule()``'s waiting
loop can schedule none of a request's tokens because its encoder input does not fit
(``_try_schedule_encoder_inputs`` leaves ``num_new_tokens == 0``):

* 0.31.0 and 0.32.0 end the waiting pass there (``break``): the request stays at the head of
  its queue, uncounted, and every request behind it waits too;
* 0.33.0 requeues it through ``skip_request`` (counted in ``deferred_waiting``, put back on
  the queue it came from) and goes on to the next request ("Requeue it so it does not stall
  the requests behind it"; upstream's ``test_waiting_encoder_stall_*``).
"""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version


def installed_vllm_release() -> tuple[int, ...]:
    """The release of the vLLM installed here (``0.32.0+rbln.4`` -> ``(0, 32, 0)``)."""
    return Version(version("vllm")).release


def stall_requeues(release: tuple[int, ...] | None = None) -> bool:
    """Whether ``release`` (default: the installed vLLM) requeues a waiting request stalled on
    the encoder budget and goes on (0.33.0 and later) rather than ending the pass (0.31.0,
    0.32.0)."""
    return (installed_vllm_release() if release is None else release) >= (0, 33)


def resend_limited(release: tuple[int, ...] | None = None) -> bool:
    """Whether ``release`` (default: the installed vLLM) caps a prompt's partial entry at
    ``num_prompt_tokens - 1`` (0.32.0 and later) rather than at its end (0.31.0)."""
    return (installed_vllm_release() if release is None else release) >= (0, 32)


def partial_entry_tokens(
    num_prompt_tokens: int,
    hash_block_size: int,
    *,
    release: tuple[int, ...] | None = None,
) -> int:
    """The tokens of a cached prompt that its partial entry covers: how far a later request
    that extends the prompt can hit. Holds while the block holding the boundary has not
    filled (``BlockPool.cache_full_blocks`` replaces a block's partial entry by its full
    hash) and the boundary is not a block boundary (there the whole-block entry serves;
    upstream registers no partial one)."""
    # Without EAGLE, the one rule the tiers use: no case here drafts with EAGLE, whose
    # rules differ (the prompt's end at 0.32.0; at 0.33.0 also capped by the hash lookahead).
    limit = num_prompt_tokens - 1 if resend_limited(release) else num_prompt_tokens
    return limit // hash_block_size * hash_block_size
