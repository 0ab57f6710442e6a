"""The parity tier's workloads: the one list, by name (docs/parity.md).

Each workload is the same requests, arrivals, drafts, accepted tokens, async loads and pool on
both sides: vllm-rbln 0.12.0's scheduler over vLLM 0.30.0, and our RBLN scheduler at the pin
under test. ``WORKLOADS`` is what the tier runs and what docs (docs/adopting.md's parity table)
point at: a workload's ``name`` is stable, and says what it is. ``judged`` names the figures
that matter for it (``Figure``): ours must match or beat vllm-rbln on each, or the pair
(workload, figure) is a listed difference in ``differences.toml`` with its reason.

Pure data: this module imports nothing of vLLM, so the tool env (the comparison, the docs)
and each side's venv (the driver, ``drive.py``) read the same list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Figure(StrEnum):
    """The figures the tier compares; each knows which way is better."""

    FINISHED = "finished"  # requests finished (higher is better)
    STEPS = "steps"  # schedule() calls until every request finished
    EMPTY_STEPS = "empty steps"  # schedule() calls that scheduled nothing
    PREEMPTIONS = "preemptions"
    HIDDEN_PREEMPTIONS = "hidden preemptions"  # preemptions the front end never counts
    TTFT = "ttft"  # steps from arrival to first token: the watched request's, else the mean
    STEPS_PER_TOKEN = "steps per output token"
    HIT_TOKENS = "hit tokens per admission"  # prefix-cache and connector hits (higher is better)
    LEAKED = "blocks leaked"  # at the end: neither free nor held by a request

    @property
    def higher_is_better(self) -> bool:
        return self in (Figure.FINISHED, Figure.HIT_TOKENS)


@dataclass(frozen=True)
class Arrival:
    """A request: its prompt (a distinct run of tokens from ``seed``, after ``shared_prefix``
    tokens of the shared run when given), its length, and when it arrives."""

    req_id: str
    prompt_len: int
    max_tokens: int
    at_step: int = 0  # added before the engine's step of this index (0: before the first)
    seed: int = 0
    shared_prefix: int = 0  # the first tokens come from one run shared by every such request
    priority: int = 0
    load_steps: int | None = None  # an async KV load of this request lands after these steps

    def prompt(self) -> list[int]:
        shared = [(31 * i) % 30000 + 1 for i in range(self.shared_prefix)]
        own = [(self.seed * 7919 + i) % 30000 + 1 for i in range(self.prompt_len - self.shared_prefix)]
        return shared + own


@dataclass(frozen=True)
class Connector:
    """A KV connector whose store holds the first ``matched_tokens`` of every prompt (at most
    all but the last token): the test prefix-hit connector of ``sched_harness``."""

    matched_tokens: int
    is_async: bool = False
    load_steps: int = 1  # an async load lands after this many engine steps


@dataclass(frozen=True)
class Workload:
    name: str
    what: str  # one line: what it shows
    arrivals: tuple[Arrival, ...]
    judged: tuple[Figure, ...]
    num_blocks: int = 200  # the pool, the null block included
    block_size: int = 16
    max_num_batched_tokens: int = 16
    max_num_seqs: int = 16
    max_model_len: int = 256
    num_spec_tokens: int | None = None  # ngram drafts per decode step
    accepted: int = 0  # drafts the simulated model accepts per step
    prefix_caching: bool = False
    sub_block_size: int | None = None  # sub-block prefix caching on, at this size
    # The KV cache groups: "full" attention or "mla" (a latent per token), one group; or
    # "full+window", full attention next to a sliding window (Gemma-2's two groups).
    kv_layout: str = "full"
    connector: Connector | None = None
    empty_connector: bool = False  # vLLM's MockKVConnector finding nothing
    policy: str = "fcfs"
    pipeline_parallel_size: int = 1
    async_scheduling: bool = False
    max_in_flight: int = 1  # batches in flight (EngineCore.step_with_batch_queue)
    max_steps: int = 200
    watch: str | None = None  # the request whose TTFT is the workload's TTFT
    notes: tuple[str, ...] = field(default=())


# ---------------------------------------------------------------------------------------------
# The livelock matrix (docs/livelock.md): two drafting decodes hold 4 of 6 usable blocks; a
# prompt arrives with 2 free blocks, in 12 cases (prompt 32 or 26; sub-block caching off, 4 or
# 8; a connector or none). The geometry is sched_harness's LIVELOCK_CASES, as data.

LIVELOCK_PROMPT_LENS = (32, 26)
LIVELOCK_SUB_BLOCK_SIZES: tuple[int | None, ...] = (None, 4, 8)


def _livelock(prompt_len: int, sub_block_size: int | None, connector: bool) -> Workload:
    sub = "off" if sub_block_size is None else str(sub_block_size)
    return Workload(
        name=f"livelock-prompt{prompt_len}-subblock-{sub}-{'connector' if connector else 'no-connector'}",
        what=(
            f"livelock matrix: a {prompt_len}-token prompt meets two ngram k=3 decodes holding 4 of "
            f"6 blocks; sub-block caching {sub}{', an empty connector' if connector else ''}"
        ),
        arrivals=(
            Arrival("decode-1", 20, 5, seed=1),
            Arrival("decode-2", 20, 5, seed=2),
            Arrival("prompt", prompt_len, 4, at_step=5, seed=100 + prompt_len),
        ),
        judged=(Figure.FINISHED, Figure.PREEMPTIONS, Figure.HIDDEN_PREEMPTIONS, Figure.LEAKED),
        num_blocks=7,
        num_spec_tokens=3,
        prefix_caching=sub_block_size is not None,
        sub_block_size=sub_block_size,
        empty_connector=connector,
        # As issue 20 measured it: a livelocked prompt preempts itself every other step.
        max_steps=400,
        watch="prompt",
    )


LIVELOCK = tuple(
    _livelock(prompt_len, sub_block_size, connector)
    for prompt_len in LIVELOCK_PROMPT_LENS
    for sub_block_size in LIVELOCK_SUB_BLOCK_SIZES
    for connector in (False, True)
)


def _requests(
    n: int, prompt_len: int, max_tokens: int, every: int = 0, **kwargs: object
) -> tuple[Arrival, ...]:
    return tuple(
        Arrival(f"req-{i}", prompt_len, max_tokens, at_step=i * every, seed=10 + i, **kwargs)  # type: ignore[arg-type]
        for i in range(n)
    )


WORKLOADS: tuple[Workload, ...] = (
    *LIVELOCK,
    Workload(
        name="roomy-pool",
        what="8 requests (40-token prompts, 16 tokens each) arriving every 2 steps; blocks to spare",
        arrivals=_requests(8, 40, 16, every=2),
        judged=(Figure.FINISHED, Figure.PREEMPTIONS, Figure.STEPS, Figure.TTFT),
    ),
    Workload(
        name="pressured-pool",
        what="8 requests (40-token prompts, 24 tokens each) at once in 15 usable blocks",
        arrivals=_requests(8, 40, 24),
        judged=(Figure.FINISHED, Figure.HIDDEN_PREEMPTIONS, Figure.LEAKED),
        num_blocks=16,
        max_steps=600,
    ),
    Workload(
        name="ngram-k3",
        what="6 requests decoding with ngram k=3 drafts, 2 of 3 accepted each step",
        arrivals=_requests(6, 24, 24),
        judged=(Figure.FINISHED, Figure.PREEMPTIONS, Figure.STEPS_PER_TOKEN),
        num_spec_tokens=3,
        accepted=2,
    ),
    Workload(
        name="ngram-k3-pressured",
        what="6 requests with ngram k=3 drafts (none accepted) in 12 usable blocks",
        arrivals=_requests(6, 24, 24),
        judged=(Figure.FINISHED, Figure.PREEMPTIONS, Figure.HIDDEN_PREEMPTIONS, Figure.LEAKED),
        num_spec_tokens=3,
        num_blocks=13,
        max_steps=600,
    ),
    Workload(
        name="priority-policy",
        what="the priority policy, 12 usable blocks: 5 low-priority requests, then an urgent one",
        arrivals=(
            *_requests(5, 30, 20, priority=5),
            Arrival("urgent", 30, 8, at_step=8, seed=99, priority=0),
        ),
        judged=(Figure.FINISHED, Figure.TTFT, Figure.HIDDEN_PREEMPTIONS, Figure.LEAKED),
        num_blocks=13,
        policy="priority",
        watch="urgent",
        max_steps=600,
    ),
    Workload(
        name="sub-block-shared-prefix",
        what="sub-block caching (size 4): 6 requests sharing a 30-token prefix that ends inside a block",
        arrivals=tuple(
            Arrival(f"req-{i}", 44, 4, at_step=6 * i, seed=20 + i, shared_prefix=30) for i in range(6)
        ),
        judged=(Figure.FINISHED, Figure.HIT_TOKENS, Figure.LEAKED),
        prefix_caching=True,
        sub_block_size=4,
    ),
    Workload(
        name="sub-block-siblings",
        what="sub-block caching (size 8, block 32): 6 prompts of 40 leave one run after 24 tokens",
        arrivals=tuple(
            Arrival(f"req-{i}", 40, 8, at_step=2 * i, seed=60 + i, shared_prefix=24) for i in range(6)
        ),
        judged=(Figure.FINISHED, Figure.HIT_TOKENS, Figure.LEAKED),
        block_size=32,
        prefix_caching=True,
        sub_block_size=8,
    ),
    Workload(
        name="mla-sub-block-shared-prefix",
        what="sub-block-shared-prefix on an MLA model's one KV cache group (MLAAttentionSpec)",
        arrivals=tuple(
            Arrival(f"req-{i}", 44, 4, at_step=6 * i, seed=20 + i, shared_prefix=30) for i in range(6)
        ),
        judged=(Figure.FINISHED, Figure.HIT_TOKENS, Figure.LEAKED),
        prefix_caching=True,
        sub_block_size=4,
        kv_layout="mla",
    ),
    Workload(
        name="mla-sub-block-siblings",
        what="sub-block-siblings on an MLA model's one KV cache group (MLAAttentionSpec)",
        arrivals=tuple(
            Arrival(f"req-{i}", 40, 8, at_step=2 * i, seed=60 + i, shared_prefix=24) for i in range(6)
        ),
        judged=(Figure.FINISHED, Figure.HIT_TOKENS, Figure.LEAKED),
        block_size=32,
        prefix_caching=True,
        sub_block_size=8,
        kv_layout="mla",
    ),
    Workload(
        name="window-sub-block-shared-prefix",
        what="sub-block-shared-prefix on full attention + a sliding window of 24 (two groups)",
        arrivals=tuple(
            Arrival(f"req-{i}", 44, 4, at_step=6 * i, seed=20 + i, shared_prefix=30) for i in range(6)
        ),
        judged=(Figure.FINISHED, Figure.HIT_TOKENS, Figure.LEAKED),
        prefix_caching=True,
        sub_block_size=4,
        kv_layout="full+window",
    ),
    Workload(
        name="window-sub-block-siblings",
        what="sub-block-siblings on full attention + a sliding window of 48 (two groups)",
        arrivals=tuple(
            Arrival(f"req-{i}", 40, 8, at_step=2 * i, seed=60 + i, shared_prefix=24) for i in range(6)
        ),
        judged=(Figure.FINISHED, Figure.HIT_TOKENS, Figure.LEAKED),
        block_size=32,
        prefix_caching=True,
        sub_block_size=8,
        kv_layout="full+window",
    ),
    Workload(
        name="pd-decode-side",
        what="P/D decode side: 8 requests, every prompt's KV but its last token loaded async (2 steps)",
        arrivals=_requests(8, 48, 16, every=1),
        judged=(Figure.FINISHED, Figure.STEPS_PER_TOKEN, Figure.TTFT),
        connector=Connector(matched_tokens=10_000, is_async=True, load_steps=2),
    ),
    Workload(
        name="full-prefix-hits",
        what="prefix caching: a 33-token prompt, then 6 more of it (a hit of 32) while it decodes",
        arrivals=(
            Arrival("first", 33, 24, shared_prefix=33),
            *(Arrival(f"hit-{i}", 33, 8, at_step=2 + 2 * i, shared_prefix=33) for i in range(6)),
        ),
        judged=(Figure.FINISHED, Figure.STEPS, Figure.STEPS_PER_TOKEN, Figure.TTFT, Figure.HIT_TOKENS),
        prefix_caching=True,
    ),
    Workload(
        name="full-prefix-hits-pp2",
        what="full-prefix-hits at pipeline parallelism 2 (two batches in flight), max_num_seqs 8",
        arrivals=(
            Arrival("first", 33, 24, shared_prefix=33),
            Arrival("other", 20, 24, seed=5),
            *(Arrival(f"hit-{i}", 33, 8, at_step=4 + 2 * i, shared_prefix=33) for i in range(6)),
        ),
        judged=(Figure.FINISHED, Figure.STEPS, Figure.STEPS_PER_TOKEN, Figure.TTFT),
        prefix_caching=True,
        max_num_seqs=8,
        pipeline_parallel_size=2,
        max_in_flight=2,
        max_steps=600,
    ),
    Workload(
        name="token-budget-used-by-decodes",
        what="8 ngram k=3 decodes use the whole 32-token budget; a prompt arrives at step 20",
        arrivals=(*_requests(8, 16, 40), Arrival("late", 16, 4, at_step=20, seed=77)),
        judged=(Figure.FINISHED, Figure.TTFT),
        max_num_batched_tokens=32,
        num_spec_tokens=3,
        watch="late",
        max_steps=400,
    ),
    Workload(
        name="late-prompt-under-token-budget",
        what="6 ngram k=3 decodes use 24 of 32 budget tokens; a 30-token prompt arrives at step 16",
        arrivals=(*_requests(6, 16, 40), Arrival("late", 30, 4, at_step=16, seed=78)),
        judged=(Figure.FINISHED, Figure.TTFT),
        max_num_batched_tokens=32,
        num_spec_tokens=3,
        watch="late",
        max_steps=400,
    ),
    Workload(
        name="pipeline-parallel-2",
        what="pipeline parallelism 2 (two batches in flight): 8 requests, 24 tokens each",
        arrivals=_requests(8, 24, 24),
        judged=(Figure.FINISHED, Figure.STEPS, Figure.PREEMPTIONS),
        pipeline_parallel_size=2,
        max_in_flight=2,
        max_steps=600,
    ),
    Workload(
        name="pipeline-parallel-2-ngram-k3",
        what="pipeline parallelism 2 (two batches in flight) with ngram k=3 drafts, 2 accepted a step",
        arrivals=_requests(8, 24, 24),
        judged=(Figure.FINISHED, Figure.STEPS, Figure.PREEMPTIONS, Figure.STEPS_PER_TOKEN),
        num_spec_tokens=3,
        accepted=2,
        pipeline_parallel_size=2,
        max_in_flight=2,
        max_steps=600,
    ),
    Workload(
        name="async-roomy",
        what="async scheduling, two batches in flight: 8 requests (24 tokens each), blocks to spare",
        arrivals=_requests(8, 24, 24, every=1),
        judged=(Figure.FINISHED, Figure.STEPS, Figure.STEPS_PER_TOKEN),
        async_scheduling=True,
        max_in_flight=2,
        max_steps=600,
    ),
    Workload(
        name="async-pressured",
        what="async scheduling, two batches in flight: 8 requests in 15 usable blocks",
        arrivals=_requests(8, 40, 24),
        judged=(Figure.FINISHED, Figure.STEPS, Figure.HIDDEN_PREEMPTIONS, Figure.LEAKED),
        num_blocks=16,
        async_scheduling=True,
        max_in_flight=2,
        max_steps=800,
    ),
    Workload(
        name="async-kv-loads-land-after-3-steps",
        what="a connector holding 32 tokens of every prompt, loaded async over 3 steps; 6 requests",
        arrivals=_requests(6, 40, 8, every=1),
        judged=(Figure.FINISHED, Figure.TTFT, Figure.LEAKED),
        connector=Connector(matched_tokens=32, is_async=True, load_steps=3),
    ),
    Workload(
        name="connector-external-hits",
        what="a connector holding 32 tokens of every prompt, loaded in the step; prefix caching on",
        arrivals=_requests(6, 40, 8, every=1),
        judged=(Figure.FINISHED, Figure.HIT_TOKENS, Figure.STEPS),
        connector=Connector(matched_tokens=32),
        prefix_caching=True,
    ),
    Workload(
        name="head-of-line-loading-request",
        what="a request loading remote KV for 10 steps heads the queue; the next one arrives 2 steps later",
        arrivals=(
            Arrival("decode-1", 16, 30, seed=1, load_steps=1),
            Arrival("decode-2", 16, 30, seed=2, load_steps=1),
            Arrival("loading", 40, 4, at_step=4, seed=3, load_steps=10),
            Arrival("next", 40, 4, at_step=6, seed=4, load_steps=1),
        ),
        judged=(Figure.FINISHED, Figure.TTFT),
        connector=Connector(matched_tokens=32, is_async=True),
        watch="next",
    ),
)

BY_NAME = {w.name: w for w in WORKLOADS}
assert len(BY_NAME) == len(WORKLOADS), "two workloads share a name"
