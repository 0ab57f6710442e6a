"""Case 4: preemptions as users see them.

``LLM.get_metrics()``'s ``vllm:num_preemptions`` must equal the preemptions the scheduler
really made (counted by a subclass at upstream's ``_preempt_request``), including requests
preempted before their first token, which upstream 0.31.0 counts late or never (a
PREEMPTED event reaches the front end only with a request's next output).

Under the RBLN policy a prefill runs alone and its blocks were checked at admission, so the
RBLN scheduler preempts running decodes; requests preempted in the middle of their prefill
come from upstream's scheduler with chunked prefills mixed into decode steps. Both run here.
The RBLN scheduler's repeated-preemption warning must reach the log (threshold 1: a warning
for every preemption, naming the request).
"""

from __future__ import annotations

import re
from pathlib import Path

from engine_kit import COUNTING, COUNTING_UPSTREAM, NGRAM, prompts_with_shared_prefixes, run

PROMPTS = prompts_with_shared_prefixes(seed=5, count=16)
WARNING = re.compile(r"Request (\S+) was preempted \d+ times in a row without emitting a token")
PRESSURE = dict(enable_prefix_caching=False, num_gpu_blocks_override=10, max_num_seqs=8)


def test_preemptions_before_the_first_token_are_counted(model: Path) -> None:
    # Chunks of 2 blocks: a long prompt is still prefilling when the decodes beside it need
    # its blocks, so upstream's scheduler preempts it before its first token.
    outcome = run(model, PROMPTS, 32, scheduler_cls=COUNTING_UPSTREAM, max_num_batched_tokens=64, **PRESSURE)
    assert outcome.preempted_before_first_token > 0, "no preemption before a first token: the case is void"
    assert outcome.metrics["vllm:num_preemptions"] == len(outcome.preemptions), outcome.metrics


def test_rbln_preemptions_are_counted_and_each_is_warned_about(model: Path) -> None:
    outcome = run(model, PROMPTS, 32, scheduler_cls=COUNTING, speculative_config=NGRAM,
                  additional_config={"preemption_warning_threshold": 1}, **PRESSURE)  # fmt: skip
    assert outcome.preemptions, "the small pool preempted nothing: the case is void"
    assert outcome.metrics["vllm:num_preemptions"] == len(outcome.preemptions), outcome.metrics
    assert sorted(WARNING.findall(outcome.log)) == sorted(outcome.preemptions)
