"""What every KV slot holds: a simulated model runner's KV pool, kept as identities.

The harness's `Driver` checks counts, block tables and liveness; none of that sees a
scheduler that hands a request the wrong KV. `KVOracle` does: it keeps, for every slot
`(block id, offset)` of the pool, the identity of the KV computed there, the tokens of
the prefix it was computed from (a chain hash of the token at each position and the
positions before it, so two slots agree exactly when their prefixes do). Every batch the
scheduler hands out is played against it, in the runner's order (docs/runner-contract.md):

1. the batch's copies (`kv_cache_block_copies`; vllm-rbln's `kv_cache_copy_ops`), whole
   blocks, every source read before any destination is written;
2. the KV a connector loads for the batch's new requests (a sync load), written into the
   blocks it was given (an async load lands when its request's load is reported done);
3. the batch's own tokens, every scheduled position written into the request's block
   table (the known tokens, drafts past them);
4. every scheduled request's attention: each position up to its last must hold the KV of
   the request's own prefix.

It fails on

* a **stale read**: a scheduled request attending a slot that holds another prefix's KV
  (or nothing);
* a **wrong entry**: a prefix-cache entry (a whole block's, or a sub-block boundary's)
  whose block does not hold what its key claims, checked after each batch has run (so an
  entry the step registered for the tokens it computes is valid once it has run);
* an **overwrite**: a batch writing into a slot, with other KV, that another live request
  has computed and still reads.

The device's view of a request is its own: a request's tokens are its prompt and every
token the simulated model sampled for it, known to the runner as soon as the batch is
scheduled (with batches in flight the scheduler learns them a step later); a step starts
where the request's KV really ends (under async scheduling the scheduler counts an
in-flight step's rejected drafts as computed until its output comes back; the runner
starts the next step where the accepted tokens end, as vLLM's runners do).

Every KV cache group is followed, each through its own block table (block ids are the one
pool's): groups of full attention, of a sliding window and of chunked local attention, all
of one block size (a full-attention model, a Gemma-style model's full and sliding-window
groups, a model whose every layer has a window, a Llama-4-style model's full and
chunked-local groups). A sliding-window group's request attends only the window before
each position it computes (`SlidingWindowSpec.sliding_window` positions, itself included),
so its reads are checked there, and the blocks below the window leave its table (null).
A chunked-local group's request attends only its own chunk (`first_attended`). Other
layouts run without the oracle (`KVOracle.applies`).

**Chunked local attention** (`ChunkedLocalAttentionSpec.attention_chunk_size`, C): the
positions are cut into chunks [k*C, (k+1)*C), and a position p attends the positions of
its own chunk up to itself, [p // C * C, p]. A step computing positions [start, end)
therefore reads [start // C * C, end): the chunk of its first position (its later
positions' chunks start at or after ``start``, so the union is that one range). This is
what vLLM's `ChunkedLocalAttentionManager` keeps (vllm/v1/core/single_type_kv_cache_manager.py,
the same at every pin, 0.30.0 to 0.34.0):

* `get_num_skipped_tokens(num_computed_tokens)` returns ``num_computed_tokens // C * C``,
  the tokens left of the chunk the next token is in, and the base class's
  `SingleTypeKVCacheManager.remove_skipped_blocks` frees the first ``skipped //
  block_size`` blocks of the request's table (capped at the blocks it has), putting the
  null block in their place: only whole blocks that lie entirely before the chunk go, a
  block the chunk starts inside stays;
* `find_longest_cache_hit(block_hashes, max_length, ...)` gives a hit the null block for
  each of the first ``(max_length // C * C) // block_size`` blocks ("marked as computed":
  they are outside the next token's chunk) and looks up the blocks from there to
  ``max_length // block_size``, stopping at the first miss; it asserts the group's block
  size equals the hit alignment ("KV cache groups with different block sizes are not
  compatible with chunked local attention now"), so a chunked-local group has whole-block
  hits only.

So the oracle checks a chunked-local group's reads from the chunk's first position on: a
read there from the null block (or from a block holding other KV) is a stale read; a
position before the chunk is not read, and its block may be null or anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from cached_blocks import cached_blocks

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler

ViolationKind = Literal["stale read", "wrong entry", "overwrite", "no block"]
# The identity of "nothing was ever computed here".
EMPTY = 0


class KVContentsError(AssertionError):
    """A scheduler handed out KV that does not hold what it should."""


@dataclass(frozen=True)
class Violation:
    step: int
    kind: ViolationKind
    request_id: str
    position: int
    block_id: int
    text: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.text} (step {self.step})"


def chain(tokens: Iterable[int], prev: int = EMPTY) -> list[int]:
    """The identity of the KV at each position of ``tokens`` (after a prefix whose last
    identity is ``prev``)."""
    out = []
    for token in tokens:
        prev = hash((prev, token))
        out.append(prev)
    return out


@dataclass
class KVOracle:
    scheduler: Scheduler
    # Raise at the first violation (the tests' default); else collect them.
    strict: bool = True
    # Token a draft slot is computed with (the harness's drafter proposes one token).
    draft_token: int = 7
    violations: list[Violation] = field(default_factory=list)
    step: int = 0
    _slots: dict[tuple[int, int], int] = field(default_factory=dict)
    _tokens: dict[str, list[int]] = field(default_factory=dict)
    _chain: dict[str, list[int]] = field(default_factory=dict)
    _device_computed: dict[str, int] = field(default_factory=dict)
    # Prefix-chain hash -> (request id, prefix length): what a cache key claims.
    _hash_source: dict[bytes, tuple[str, int]] = field(default_factory=dict)
    _num_hashes_seen: dict[str, int] = field(default_factory=dict)
    # (key, block id) pairs checked on blocks that have not changed since.
    _checked_entries: set[tuple[bytes, int]] = field(default_factory=set)
    # Connector loads: the local hit the connector was last shown, and (local, external)
    # once it was given blocks; written into the blocks when the load runs.
    _local_hit: dict[str, int] = field(default_factory=dict)
    _pending_loads: dict[str, tuple[int, int]] = field(default_factory=dict)
    _copied_to: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        manager = self.scheduler.kv_cache_manager
        managers = manager.coordinator.single_type_managers
        self.block_size = managers[0].block_size
        # Per KV cache group: its window (positions a token attends, itself included), or
        # None for full attention.
        self.windows: list[int | None] = [getattr(m, "sliding_window", None) for m in managers]
        # Per KV cache group: its attention chunk (chunked local attention), or None.
        self.chunks: list[int | None] = [getattr(m, "attention_chunk_size", None) for m in managers]
        self.null_block_id = manager.block_pool.null_block.block_id
        self.hash_block_size = manager.block_pool.hash_block_size
        connector = getattr(self.scheduler, "connector", None)
        if connector is not None:
            self._watch_connector(connector)

    @staticmethod
    def applies(scheduler: Scheduler) -> bool:
        """Whether the oracle can follow this scheduler's pool: KV cache groups of full
        attention, a sliding window or chunked local attention, all of one block size."""
        from vllm.v1.core.single_type_kv_cache_manager import (
            ChunkedLocalAttentionManager,
            FullAttentionManager,
            SlidingWindowManager,
        )

        # Exactly these classes: a subclass of upstream's with other semantics (sink tokens, a
        # rolling window) keeps its KV otherwise. The RBLN forms (sub-block caching) keep it so;
        # vllm-rbln's side of the parity tier runs an unpatched vLLM, which has none. (Sub-block
        # caching has no chunked-local form: the RBLN scheduler refuses a chunked-local group
        # with a sub-block size, rule 3 of rbln_sub_block.py.)
        followed: tuple[type, ...] = (
            FullAttentionManager,
            SlidingWindowManager,
            ChunkedLocalAttentionManager,
        )
        try:
            from vllm.v1.core.sched.rbln_kv_cache import RBLNFullAttentionManager, RBLNSlidingWindowManager
        except ModuleNotFoundError:
            pass
        else:
            followed += (RBLNFullAttentionManager, RBLNSlidingWindowManager)
        managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        return all(type(m) in followed and m.block_size == managers[0].block_size for m in managers)

    # -- the connector's loads ------------------------------------------------------

    def _watch_connector(self, connector: Any) -> None:
        """Follow the simulated connector's loads: the local hit it is shown
        (`get_num_new_matched_tokens`) and the blocks it is given to load into
        (`update_state_after_alloc`), as a connector's worker side learns them. The test
        connector's methods are wrapped on its instance; vLLM's code is not touched."""
        matched = connector.get_num_new_matched_tokens
        after_alloc = connector.update_state_after_alloc

        def get_num_new_matched_tokens(request: Any, num_computed_tokens: int) -> Any:
            self._local_hit[request.request_id] = num_computed_tokens
            return matched(request, num_computed_tokens)

        def update_state_after_alloc(request: Any, blocks: Any, num_external_tokens: int) -> Any:
            if num_external_tokens > 0:
                local = self._local_hit.get(request.request_id, 0)
                self._pending_loads[request.request_id] = (local, num_external_tokens)
            return after_alloc(request, blocks, num_external_tokens)

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        connector.update_state_after_alloc = update_state_after_alloc

    def _load(self, req_id: str) -> None:
        """The connector writes its external tokens' KV (the right KV: its store holds
        the request's prompt) into the request's blocks."""
        local, external = self._pending_loads.pop(req_id)
        request = self.scheduler.requests[req_id]
        self._know(request)
        written: set[int] = set()
        for table in self._tables(req_id):
            for pos in range(local, local + external):
                if pos // self.block_size < len(table) and table[pos // self.block_size]:
                    self._slots[(table[pos // self.block_size], pos % self.block_size)] = self._chain[req_id][
                        pos
                    ]
                    written.add(table[pos // self.block_size])
        # An entry checked on these blocks before is checked again after the next batch.
        self._checked_entries = {e for e in self._checked_entries if e[1] not in written}

    def loads_landed(self, req_ids: Iterable[str]) -> None:
        """Async loads reported done (`finished_recving`): their KV is in place."""
        for req_id in req_ids:
            if req_id in self._pending_loads and req_id in self.scheduler.requests:
                self._load(req_id)

    # -- one batch --------------------------------------------------------------------

    def execute(self, output: SchedulerOutput, sampled: Mapping[str, Sequence[int]]) -> None:
        """Run one scheduled batch on the pool; ``sampled``: the tokens the simulated model
        samples for each scheduled request (accepted drafts and the new token)."""
        self.step += 1
        scheduler = self.scheduler
        for request in scheduler.requests.values():
            self._know(request)
        self._copy(output)
        touched: set[int] = set(self._copied_to)

        writes: dict[str, tuple[int, list[int], list[int]]] = {}
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            request = scheduler.requests[req_id]
            if req_id in self._pending_loads:
                # A sync load (an async one landed already): before the forward.
                self._load(req_id)
            start = request.num_computed_tokens - num_tokens  # the scheduler's view
            start = min(start, self._device_computed.get(req_id, start))
            tokens = self._tokens[req_id]
            positions = list(range(start, start + num_tokens))
            executed = [tokens[p] if p < len(tokens) else self.draft_token for p in positions]
            prefix = self._chain[req_id][start - 1] if start > 0 else EMPTY
            writes[req_id] = (start, positions, chain(executed, prefix))

        for req_id, (_start, positions, ids) in writes.items():
            for table in self._tables(req_id):
                self._write(req_id, table, positions, ids, touched)

        for req_id, (start, _positions, ids) in writes.items():
            expected = self._chain[req_id][:start] + ids
            for group, table in enumerate(self._tables(req_id)):
                self._check_reads(req_id, table, expected, self.first_attended(group, start))

        for req_id, (start, positions, _ids) in writes.items():
            drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            got = sampled.get(req_id, ())
            accepted = max(0, len(got) - 1) if got else 0
            self._device_computed[req_id] = start + len(positions) - (drafts - accepted if got else 0)
            if got:
                self._extend(req_id, got)
        self._check_entries(touched)

    def first_attended(self, group: int, start: int) -> int:
        """The first position a step starting at ``start`` reads in KV cache group
        ``group``: 0 for full attention; the window of the step's first token for a sliding
        window; the first position of the step's first token's chunk for chunked local
        attention (module docstring). Every position from there to the step's last is
        read."""
        window, chunk = self.windows[group], self.chunks[group]
        if window is not None:
            return max(0, start - window + 1)
        if chunk is not None:
            return start // chunk * chunk
        return 0

    # -- the checks ---------------------------------------------------------------------

    def _write(
        self, req_id: str, table: list[int], positions: list[int], ids: list[int], touched: set[int]
    ) -> None:
        for pos, ident in zip(positions, ids, strict=True):
            index = pos // self.block_size
            if index >= len(table) or not table[index]:
                self._fail(
                    "no block",
                    req_id,
                    pos,
                    -1,
                    f"{req_id} writes position {pos} past its {len(table)} blocks, or into a null one",
                )
                continue
            slot = (table[index], pos % self.block_size)
            self._check_overwrite(req_id, slot, ident, pos)
            self._slots[slot] = ident
            touched.add(slot[0])

    def _check_reads(self, req_id: str, table: list[int], expected: list[int], first: int = 0) -> None:
        for pos in range(first, len(expected)):
            ident = expected[pos]
            index = pos // self.block_size
            if index >= len(table):
                self._fail("no block", req_id, pos, -1, f"{req_id} attends position {pos} past its blocks")
                return
            block_id = table[index]
            held = self._slots.get((block_id, pos % self.block_size), EMPTY)
            if held != ident:
                what = "nothing" if held == EMPTY else "another prefix's KV"
                null = " (the null block)" if block_id == self.null_block_id else ""
                self._fail(
                    "stale read",
                    req_id,
                    pos,
                    block_id,
                    f"{req_id} attends position {pos} in block {block_id}{null} slot "
                    f"{pos % self.block_size}, which holds {what}",
                )
                return

    def _check_overwrite(self, writer: str, slot: tuple[int, int], ident: int, pos: int) -> None:
        held = self._slots.get(slot, EMPTY)
        if held in (EMPTY, ident):
            return
        block_id, offset = slot
        for req_id in self.scheduler.requests:
            if req_id == writer or req_id not in self._device_computed:
                continue
            table = next((t for t in self._tables(req_id) if block_id in t), None)
            if table is None:
                continue
            their_pos = table.index(block_id) * self.block_size + offset
            if their_pos < self._device_computed[req_id] and self._chain[req_id][their_pos] == held:
                self._fail(
                    "overwrite",
                    writer,
                    pos,
                    block_id,
                    f"{writer} writes position {pos} into block {block_id} slot {offset}, "
                    f"which {req_id} computed (its position {their_pos}) and still reads",
                )
                return

    def _check_entries(self, touched: set[int]) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash

        pool = self.scheduler.kv_cache_manager.block_pool
        if not pool.enable_caching:
            return
        self._checked_entries = {e for e in self._checked_entries if e[1] not in touched}
        for key, block in cached_blocks(pool):
            entry = (key, block.block_id)
            if entry in self._checked_entries:
                continue
            self._checked_entries.add(entry)
            self._check_entry(bytes(get_block_hash(key)), block.block_id)

    def _check_entry(self, block_hash: bytes, block_id: int) -> None:
        source = self._hash_source.get(block_hash)
        if source is None:
            return  # a key no request of this run made (none is expected)
        req_id, num_tokens = source
        block_start = (num_tokens - 1) // self.block_size * self.block_size
        ids = self._chain[req_id]
        for pos in range(block_start, num_tokens):
            if self._slots.get((block_id, pos - block_start), EMPTY) != ids[pos]:
                self._fail(
                    "wrong entry",
                    req_id,
                    pos,
                    block_id,
                    f"the prefix-cache entry for {num_tokens} tokens of {req_id} points at block "
                    f"{block_id}, whose slot {pos - block_start} does not hold position {pos}'s KV",
                )
                return

    def _fail(self, kind: ViolationKind, req_id: str, pos: int, block_id: int, text: str) -> None:
        violation = Violation(self.step, kind, req_id, pos, block_id, text)
        self.violations.append(violation)
        if self.strict:
            raise KVContentsError(str(violation))

    # -- bookkeeping --------------------------------------------------------------------

    def _copy(self, output: SchedulerOutput) -> None:
        copies = [
            (c.src_block_id, c.dst_block_id)
            for c in getattr(output, "kv_cache_block_copies", None)
            or getattr(output, "kv_cache_copy_ops", None)
            or ()
        ]
        held = {src: [self._slots.get((src, o), EMPTY) for o in range(self.block_size)] for src, _ in copies}
        for src, dst in copies:
            for offset, ident in enumerate(held[src]):
                self._slots[(dst, offset)] = ident
        self._copied_to = [dst for _, dst in copies]

    def _tables(self, req_id: str) -> list[list[int]]:
        """The request's block table in each KV cache group (0: the null block, below a
        sliding window or before a chunk)."""
        return [list(ids) for ids in self.scheduler.kv_cache_manager.get_block_ids(req_id)]

    def _know(self, request: Any) -> None:
        """Start following a request (its prompt), and learn the keys its hashes make."""
        req_id = request.request_id
        if req_id not in self._tokens:
            self._tokens[req_id] = list(request.all_token_ids)
            self._chain[req_id] = chain(self._tokens[req_id])
        hashes = request.block_hashes
        seen = self._num_hashes_seen.get(req_id, 0)
        for i in range(seen, len(hashes)):
            self._hash_source.setdefault(bytes(hashes[i]), (req_id, (i + 1) * self.hash_block_size))
        self._num_hashes_seen[req_id] = len(hashes)

    def _extend(self, req_id: str, tokens: Sequence[int]) -> None:
        self._tokens[req_id].extend(tokens)
        ids = self._chain[req_id]
        ids.extend(chain(tokens, ids[-1] if ids else EMPTY))
