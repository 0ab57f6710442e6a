"""Issue 32 in the engine: a prefix shared after a priority preemption, with ngram drafts.

The scheduler tier's scenario (tests/scheduler/test_kv_contents.py,
``_preempted_after_registering``) in vLLM's real engine on the CPU, stepped with
``LLMEngine.add_request`` and ``step``: L (priority 1, 22 tokens) decodes alone with ngram
drafts; H (priority 0) arrives at step 3 and, once the five-block pool has no block for it,
preempts L; X, sent at the first step after the preemption, asks for L's first 42 tokens and
one more. Sub-block caching is on at its default, the prefill chunk (8 tokens; the CPU
platform takes no size below the chunk). X hits the full block of L that the pool kept (32
tokens), and every request's greedy tokens equal those of a plain run (prefix caching off),
L's own after its resumption too.

What the engine cannot show: the wrong KV the scheduler tier's oracle found before the fix
(an entry registered by the step the preemption took back). With the fix reverted over the
installed wheel (the revert of the step-entry commit, then a patch of its own, applied with
``engine_kit.variant_site``), measured on 2026-12-03 at 0.31.0 over 32
geometries (L of 22 and 40 tokens, X to 20 and 36 tokens past L's prompt, pools of 4 and 5
blocks, H at steps 2 to 9): the tokens stay the same and X never hits more than L's kept full
block. The preempted request's blocks are freed tail first, so the block holding the stale
entry is the first the pool hands out again (to H), and the entry goes with it before X
comes; the scheduler tier saw the same under the RBLN policy and caught the bug with its
entry check, which needs a view of what each KV slot holds that the engine does not give.
"""

from __future__ import annotations

import random
from pathlib import Path

from engine_kit import AFTER_PREEMPTION, COUNTING, NGRAM, VOCAB, assert_same_tokens, run

rng = random.Random(3)
LOW = [rng.randrange(3, VOCAB) for _ in range(22)]
HIGH = [rng.randrange(3, VOCAB) for _ in range(22)]
MAX_TOKENS = 40
SHARED = 42  # of L's tokens, prompt and output, in X's prompt
BLOCKS = 5  # the null block and four of 32 tokens: L and H cannot both hold two
COMMON = dict(scheduler_cls=COUNTING, speculative_config=NGRAM, max_num_batched_tokens=8, max_num_seqs=4)


def test_a_prefix_shared_after_a_priority_preemption_keeps_the_tokens(model: Path) -> None:
    (low_tokens,) = run(model, [LOW], MAX_TOKENS, enable_prefix_caching=False, **COMMON).tokens
    shared = [*(LOW + low_tokens)[:SHARED], 77]
    prompts = [LOW, HIGH, shared]
    plain = run(model, prompts, MAX_TOKENS, enable_prefix_caching=False, **COMMON)
    stepped = run(
        model,
        prompts,
        MAX_TOKENS,
        arrivals=[0, 3, AFTER_PREEMPTION],
        priorities=[1, 0, 0],
        scheduling_policy="priority",
        enable_prefix_caching=True,
        num_gpu_blocks_override=BLOCKS,
        max_model_len=(BLOCKS - 1) * 32,
        **COMMON,
    )
    assert [p.split("-")[0] for p in stepped.preemptions] == ["0"], "H did not preempt L once"
    assert stepped.num_cached_tokens == [0, 0, 32], "X did not hit the block of L the pool kept"
    assert plain.tokens[0] == low_tokens
    assert_same_tokens(stepped, plain, "a prefix shared after a priority preemption")
