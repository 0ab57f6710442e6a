"""Case 3: the admission livelock of docs/livelock.md, in vLLM's real engine.

Block 32, ngram drafts of 3 (lookahead 3), prefill chunks of 32 tokens. Two drafting
decodes (36-token prompts, 20 output tokens: 2 blocks each for their whole life) hold 4 of
6 usable blocks when a prompt P arrives (all three are sent together; the RBLN scheduler
prefills them one at a time, in order). P's prompt repeats a 4-token phrase, so ngram
proposes drafts for it.

* P of 58 tokens fits with its lookahead (61 slots, 2 blocks) but its first decode step
  needs 58 + 1 + 3 + 3 = 65 slots: a third block.
* P of 64 tokens (block-aligned): its final prefill chunk already needs 64 + 3 slots.

The series' gate counts through the first decode step, so P waits until a decode finishes
and is never preempted; nothing is. The no-backport variant (the series with vLLM 0.31.0's
gate, ``tests/scheduler/variants/no-backport.patch``, applied over the installed wheel)
admits P into the last two blocks: the 58-token P is preempted at a decode step (the
livelock's first turn; it stays out afterwards), and the block-aligned P's final chunk
cannot get a block, so the progress guarantee preempts a decode. In the engine neither
stalls for good: the RBLN scheduler hands a failed step to the decodes, which finish and
free the pool (the scheduler tier shows the same; docs/livelock.md). So the test asserts
the difference the backport makes, preemptions against none, with every request finishing
and the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_kit import COUNTING, NGRAM, assert_same_tokens, run, variant_site

NO_BACKPORT = Path(__file__).resolve().parents[1] / "scheduler" / "variants" / "no-backport.patch"
DECODES = [[3 + (7 * i + j) % 500 for j in range(36)] for i in range(2)]
SETTINGS = dict(
    scheduler_cls=COUNTING,
    speculative_config=NGRAM,
    enable_prefix_caching=False,
    num_gpu_blocks_override=7,  # block 0 is vLLM's null block: 6 usable
    max_model_len=128,
    max_num_seqs=3,
    max_num_batched_tokens=32,  # prefill chunks of one block, as in the matrix
)


@pytest.fixture(scope="module")
def no_backport(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return variant_site(NO_BACKPORT, tmp_path_factory.mktemp("no-backport"))


@pytest.mark.parametrize("prompt_len", [58, 64], ids=["first-decode-step", "block-aligned"])
def test_the_gate_keeps_the_prompt_out_until_it_fits(model: Path, no_backport: Path, prompt_len: int) -> None:
    phrase = [11, 12, 13, 14]
    prompt = (phrase * 20)[:prompt_len]
    prompts = [*DECODES, prompt]
    series = run(model, prompts, 20, **SETTINGS)
    variant = run(model, prompts, 20, site=no_backport, **SETTINGS)

    assert variant.vllm_file.startswith(str(no_backport)), variant.vllm_file
    assert not series.vllm_file.startswith(str(no_backport))

    def requests(ids: list[str]) -> list[str]:  # "2-1a2b3c4d" -> "2": vLLM suffixes request ids
        return [i.split("-")[0] for i in ids]

    assert series.preemptions == [], f"the series preempted {series.preemptions}"
    assert all(len(t) == 20 for t in series.tokens) and all(len(t) == 20 for t in variant.tokens)
    if prompt_len == 58:  # admitted into the last two blocks, then preempted at a decode step
        assert "2" in requests(variant.preemptions), f"no-backport preempted {variant.preemptions}"
    else:  # its final chunk cannot get a block: the progress guarantee preempts a decode
        assert variant.preemptions and "2" not in requests(variant.preemptions), variant.preemptions
    # Whatever the scheduling, greedy outputs agree.
    assert_same_tokens(variant, series, "the variant")
