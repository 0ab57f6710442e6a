"""What the engine tier's cases share: the tiny model, the prompts, one engine run.

Runs inside the engine venv (the binary RBLN wheel installed with pip), never in the
tool env. Every run is vLLM's real engine on this machine's CPU.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RBLN = "vllm.v1.core.sched.rbln_scheduler.RBLNScheduler"
COUNTING = "counting_scheduler.CountingRBLNScheduler"
COUNTING_UPSTREAM = "counting_scheduler.CountingScheduler"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
BLOCK = 32  # the CPU attention kernel takes multiples of 32 only
VOCAB = 512
HERE = Path(__file__).resolve().parent
RESULT = "ENGINE-RESULT "
MAX_MODEL_LEN = 256


def make_model(dest: Path, seed: int = 0) -> Path:
    """A random Llama (head_dim 64: the CPU kernel refuses 16), safetensors, and a word-level
    tokenizer (``w0`` .. ``w511``) with a chat template, so ``vllm serve`` can load it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(dest, safe_serialization=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    tokenizer.save_pretrained(dest)
    return dest


def make_mla_model(dest: Path, seed: int = 0) -> Path:
    """A random DeepSeek-V2 (MLA: one latent of ``kv_lora_rank`` + ``qk_rope_head_dim`` = 576
    a token, the head size vLLM's AMX MLA kernel takes), bfloat16 (that kernel's only dtype),
    every layer dense (``first_k_dense_replace`` = the layer count). No tokenizer: the cases
    send token ids."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=2,
        first_k_dense_replace=2,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_rope_head_dim=64,
        qk_nope_head_dim=64,
        v_head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=1,
        eos_token_id=2,
    )
    DeepseekV2ForCausalLM(config).to(torch.bfloat16).save_pretrained(dest, safe_serialization=True)
    return dest


def make_window_model(dest: Path, seed: int = 0) -> Path:
    """A random Gemma-2 of two layers, one with full attention and one with a sliding window of
    ``WINDOW_TOKENS`` (Gemma-2 alternates them; vLLM makes two KV cache groups), head_dim 64
    (the CPU kernel refuses 16). No tokenizer: the cases send token ids."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        sliding_window=WINDOW_TOKENS,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    Gemma2ForCausalLM(config).save_pretrained(dest, safe_serialization=True)
    return dest


WINDOW_TOKENS = 48
MODELS = {
    "tiny-llama": make_model,
    "tiny-deepseek-mla": make_mla_model,
    "tiny-gemma2-window": make_window_model,
}


def prompts_with_shared_prefixes(seed: int, count: int, prefixes: int = 4) -> list[list[int]]:
    """Token-id prompts of 40-140 tokens; groups share a prefix of 20-90 tokens (prefix hits),
    and every other prompt repeats a phrase (so ngram drafts get accepted)."""
    rng = random.Random(seed)
    shared = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(20, 90))] for _ in range(prefixes)]
    prompts = []
    for i in range(count):
        body = list(shared[i % prefixes])
        tail = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(10, 50))]
        if i % 2:
            tail += tail[:8]
        prompts.append(body + tail)
    return prompts


@dataclass(frozen=True)
class Admission:
    """A request's first scheduling, as a counting scheduler saw it (``counting_scheduler``)."""

    request_id: str
    prompt_tokens: int
    computed: int  # tokens computed before it: local prefix-cache hits plus a KV connector's load
    scheduled: int  # tokens scheduled for it in that step
    step: int  # the step's index among the steps that scheduled tokens
    step_requests: int  # requests the step scheduled, this one included


@dataclass
class Outcome:
    tokens: list[list[int]]
    metrics: dict[str, float]
    preemptions: list[str] = field(default_factory=list)  # request ids, one per preemption
    preempted_before_first_token: int = 0
    steps: int = 0  # counting schedulers only
    admissions: list[Admission] = field(default_factory=list)  # counting schedulers only
    num_cached_tokens: list[int] = field(default_factory=list)  # each RequestOutput's, in order
    # With kv_events=True: a router's hit from the KV events for each prompt as it was sent,
    # and how many event batches, stored and removed entries the router read.
    router_hits: list[int] = field(default_factory=list)
    kv_events: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of generate() (not the engine's start)
    vllm_file: str = ""  # which vllm ran (the installed wheel, or a variant site)
    async_scheduling: bool = False  # the engine's own setting after the platform's changes
    log: str = ""


def metric_values(llm: Any) -> dict[str, float]:
    from vllm.v1.metrics.reader import Counter, Gauge

    values: dict[str, float] = {}
    for metric in llm.get_metrics():
        if isinstance(metric, Counter | Gauge):
            values[metric.name] = values.get(metric.name, 0) + metric.value
    return values


def engine_args(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        block_size=BLOCK,
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        disable_log_stats=False,
        # The CPU worker reserves gpu_memory_utilization x RAM unless told the KV size.
        kv_cache_memory_bytes=64 << 20,
    )
    args.update(overrides)
    return args


def variant_site(patch: Path, dest: Path) -> Path:
    """The installed ``vllm`` package with a test-only variant patch applied (the scheduler
    tier's ``tests/scheduler/variants/*.patch``), as a directory to put first on PYTHONPATH.

    Every file is a symlink to the installed wheel's (its compiled kernels included) except
    the ones the patch changes, which are copied and patched. The installed wheel is not
    touched.
    """
    import importlib.util
    import re
    import shutil

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    installed = Path(next(iter(spec.submodule_search_locations)))
    # The installed bytecode is linked too: a linked source's stat is the installed file's, so
    # its .pyc stays valid, and the variant's zygote imports vLLM as fast as the installed
    # one's (without them it compiled every module again: 10-30 s a variant here).
    shutil.copytree(installed, dest / "vllm", copy_function=os.symlink)
    for name in re.findall(r"^\+\+\+ b/(\S+)$", patch.read_text(), re.M):
        target = dest / name
        target.unlink(missing_ok=True)  # a file the patch creates is not there yet
        for stale in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            stale.unlink()  # the patched file's bytecode is compiled afresh
        if (installed.parent / name).exists():
            shutil.copyfile(installed.parent / name, target)
    # No repository above ``dest``: inside one, git apply skips, silently, every path outside
    # the current directory (a site made in a worktree's work/ got no change at all).
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(dest.resolve().parent)}
    subprocess.run(["git", "apply", str(patch.resolve())], cwd=dest, check=True, env=env)
    return dest


def run(
    model: Path,
    prompts: list[list[int]],
    max_tokens: int,
    *,
    one_by_one: bool = False,
    batches: list[int] | None = None,
    site: Path | None = None,
    kv_events: bool = False,
    arrivals: list[int | str] | None = None,
    priorities: list[int] | None = None,
    **overrides: Any,
) -> Outcome:
    """One ``vllm.LLM`` on the prompts, greedy, in a fresh process (forked from a
    :class:`Zygote` that has imported vLLM): its outputs, metrics and the preemptions the
    scheduler made. ``site``: a variant_site() to run instead of the
    installed vllm. ``one_by_one``: each prompt finishes before the next
    is sent (so later prompts can hit what earlier ones cached). ``batches``: the sizes of
    consecutive groups of prompts, each group sent at once when the previous one finished.
    ``kv_events``: publish KV events over ZMQ and follow them with a :class:`KVEventRouter`.
    ``arrivals``: step by step instead (``LLMEngine.add_request`` and ``step``), each prompt
    added at the engine step it names, or at the first step after the scheduler preempted
    (``AFTER_PREEMPTION``: a counting scheduler only); ``priorities``: each prompt's priority
    (``scheduling_policy="priority"``).

    One engine per process: vLLM 0.31.0's CPU platform re-registers its Triton kernel
    overrides at every worker start by walking every loaded module, and after an ngram
    drafter has loaded numba the walk fails (``'_lib_fn_wrapper' object has no attribute
    'get'``), so a second engine in the same process cannot start.
    """
    if batches is None:
        batches = [1] * len(prompts) if one_by_one else [len(prompts)]
    assert sum(batches) == len(prompts), (batches, len(prompts))
    job = {"model": str(model), "prompts": prompts, "max_tokens": max_tokens, "overrides": overrides,
           "batches": batches, "kv_events": kv_events, "arrivals": arrivals,
           "priorities": priorities or [0] * len(prompts)}  # fmt: skip
    started = time.perf_counter()
    code, output, data = _zygote(site).run(job)
    _record_run(job, site, time.perf_counter() - started, data)
    if code != 0 or data is None:
        raise AssertionError(
            f"the engine run failed (exit {code}) with {overrides}:\n" + "\n".join(output.splitlines()[-60:])
        )
    data["admissions"] = [Admission(**a) for a in data["admissions"]]
    return Outcome(**data, log=output)


def _record_run(job: dict[str, Any], site: Path | None, wall: float, data: dict[str, Any] | None) -> None:
    """With ``ENGINE_RUNS_LOG`` set, one JSON line a run: the test, the job's key, the run's
    wall time (engine start and generate) and generate's alone (for measuring the tier)."""
    path = os.environ.get("ENGINE_RUNS_LOG")
    if not path:
        return
    import hashlib

    key = hashlib.sha256(
        json.dumps([{**job, "model": ""}, bool(site)], sort_keys=True, default=str).encode()
    ).hexdigest()[:12]
    line = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "key": key, "wall": round(wall, 2),
            "generate": round((data or {}).get("seconds", 0.0), 2), "pid": os.getpid(),
            "at": round(time.time(), 1), "site": str(site) if site else ""}  # fmt: skip
    try:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError as exc:  # a measurement aid never hides the run's own outcome
        print(f"ENGINE_RUNS_LOG {path}: {exc}", file=sys.stderr)


class Zygote:
    """A process that has imported vLLM (``python engine_kit.py --zygote``) and forks one child
    per engine run: the child starts the ``vllm.LLM``, runs the job and exits. Importing vLLM
    and torch is 8-10 s of CPU here, two thirds of an engine's start; a run now pays it once a
    test process (and variant site), not once an engine. Each engine still starts in a process
    of its own, in which no engine ran before (the reason runs never share a process: see
    :func:`run`); the zygote imports vLLM and nothing else, never starts an engine or a torch
    thread pool. ``site``: a variant_site() first on the zygote's PYTHONPATH."""

    def __init__(self, site: Path | None) -> None:

        path = [str(site)] if site else []
        env = {
            **os.environ,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "PYTHONPATH": os.pathsep.join(
                [
                    *path,
                    str(HERE),
                    str(HERE.parent / "support"),
                    *filter(None, [os.environ.get("PYTHONPATH")]),
                ]
            ),
        }
        self.work = Path(tempfile.mkdtemp(prefix="engine-runs-"))
        self.runs = 0
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "engine_kit.py"), "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.work / "zygote.log").open("w"),
            text=True,
            env=env,
            start_new_session=True,  # its children with it: a timed-out run is killed as a group
        )

    def run(self, job: dict[str, Any], timeout: float = 600) -> tuple[int, str, dict[str, Any] | None]:
        """The engine run's exit code, its output (stdout and stderr) and its result."""
        import select

        self.runs += 1
        log, result = self.work / f"run-{self.runs}.log", self.work / f"run-{self.runs}.json"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({**job, "log": str(log), "result": str(result)}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(EXITED):
            self.stop(keep_logs=True)  # its logs are read below, then removed
            code = -1 if ready else -9
            why = "" if ready else f"no result in {timeout} s; killed\n"
            zygote = (self.work / "zygote.log").read_text(errors="replace")
            output = log.read_text(errors="replace") if log.exists() else ""
            shutil.rmtree(self.work, ignore_errors=True)
            return code, why + zygote + output, None
        output = log.read_text(errors="replace")
        data = json.loads(result.read_text()) if result.exists() else None
        return int(line.removeprefix(EXITED)), output, data

    def stop(self, *, keep_logs: bool = False) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        _ZYGOTES.pop(next((k for k, v in _ZYGOTES.items() if v is self), None), None)
        if not keep_logs:
            shutil.rmtree(self.work, ignore_errors=True)


EXITED = "ENGINE-EXITED "
_ZYGOTES: dict[Path | None, Zygote] = {}


def _zygote(site: Path | None) -> Zygote:
    if site not in _ZYGOTES or _ZYGOTES[site].proc.poll() is not None:
        import atexit

        if not _ZYGOTES:
            atexit.register(lambda: [z.stop() for z in list(_ZYGOTES.values())])
        _ZYGOTES[site] = Zygote(site)
    return _ZYGOTES[site]


def _serve_forks() -> None:
    """The zygote's loop (``--zygote``): vLLM imported once, then a fork a job (one JSON line
    on stdin), each child's output in the job's log; one ``ENGINE-EXITED <code>`` line back.

    The answer line has stdout to itself: fd 1 is pointed at stderr (the zygote's log) before
    vLLM is imported, since vLLM logs to stdout and 0.30.0 logs at import (triton_utils'
    "Triton is installed but 0 active driver(s) found"), which the caller would read as the
    answer."""
    answers = os.fdopen(os.dup(1), "w")  # not inherited across exec (os.dup is non-inheritable)
    os.dup2(2, 1)
    import counting_scheduler  # noqa: F401  (vllm's scheduler modules, as every engine loads them)
    import vllm  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401
    from vllm.inputs import TokensPrompt  # noqa: F401

    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                data = _make_model_here(job) if "make_model" in job else _run_here(job)
                Path(job["result"]).write_text(json.dumps(data))
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                import atexit

                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(EXITED + str(os.waitstatus_to_exitcode(status)), file=answers, flush=True)


def _make_model_here(job: dict[str, Any]) -> dict[str, Any]:
    MODELS[job["kind"]](Path(job["make_model"]))
    return {}


def shared_model(base: Path, kind: str = "tiny-llama") -> Path:
    """The tiny model ``kind`` (a name of ``MODELS``) in ``base/<kind>``, made once for every
    test process that shares ``base`` (the pytest workers of one run), in a child of the zygote
    (torch is imported there already; each worker importing torch and transformers to make its
    own cost about 50 s of a worker's time under load)."""
    import fcntl

    dest = base / kind
    _zygote(None)  # its import of vLLM starts now, beside another worker's making of the model
    with (base / f"{kind}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / "made").exists():
            code, output, data = _zygote(None).run({"make_model": str(dest), "kind": kind})
            if code != 0 or data is None:
                raise AssertionError(f"making the tiny model failed (exit {code}):\n{output[-4000:]}")
            (dest / "made").write_text("")
    return dest


def _run_here(job: dict[str, Any]) -> dict[str, Any]:
    import counting_scheduler
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    overrides = dict(job["overrides"])
    # IPC endpoints, which the publisher binds (it connects to a plain tcp:// host, for a
    # subscriber that binds), on this machine only.
    sockets = Path(tempfile.mkdtemp(prefix="kv-events-")) if job.get("kv_events") else None
    endpoints = [f"ipc://{sockets}/events", f"ipc://{sockets}/replay"] if sockets else None
    if endpoints:
        from vllm.config import KVEventsConfig

        overrides["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=endpoints[0], replay_endpoint=endpoints[1]
        )
    llm = LLM(model=job["model"], **engine_args(**overrides))
    params = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True)
    events = KVEventRouter(llm, *endpoints) if endpoints else None
    outputs = []
    batches, rest = [], list(job["prompts"])
    for size in job["batches"]:
        batches.append(rest[:size])
        rest = rest[size:]
    start = time.perf_counter()
    router_hits: list[int] = []
    if job["arrivals"] is not None:
        outputs = _step_through_arrivals(llm, job, params)
        if events:
            events.catch_up()
    else:
        for batch in batches:
            if events:
                router_hits += [events.hit_tokens(p) for p in batch]
            outputs += llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)
            if events:
                events.catch_up()
    seconds = time.perf_counter() - start
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "metrics": metric_values(llm),
        "preemptions": list(counting_scheduler.PREEMPTED),
        "preempted_before_first_token": counting_scheduler.PREEMPTED_BEFORE_FIRST_TOKEN[0],
        "steps": counting_scheduler.STEPS[0],
        "admissions": counting_scheduler.ADMISSIONS,
        "num_cached_tokens": [o.num_cached_tokens for o in outputs],
        "vllm_file": vllm.__file__,
        # What the engine really runs with (the platform may override what was asked).
        "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
        "seconds": seconds,
        "router_hits": router_hits,
        "kv_events": events.counts() if events else {},
    }


AFTER_PREEMPTION = "after-preemption"
MAX_STEPS = 2000


def _step_through_arrivals(llm: Any, job: dict[str, Any], params: Any) -> list[Any]:
    """The prompts added one by one at their arrival steps; the outputs in prompt order."""
    import counting_scheduler
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    waiting = list(range(len(job["prompts"])))
    finished: dict[int, Any] = {}
    for step in range(MAX_STEPS):
        for i in list(waiting):
            arrival = job["arrivals"][i]
            if arrival == step or (arrival == AFTER_PREEMPTION and counting_scheduler.PREEMPTED):
                prompt = TokensPrompt(prompt_token_ids=job["prompts"][i])
                engine.add_request(str(i), prompt, params, priority=job["priorities"][i])
                waiting.remove(i)
        for output in engine.step():
            if output.finished:
                finished[int(output.request_id)] = output
        if not waiting and len(finished) == len(job["prompts"]):
            return [finished[i] for i in range(len(job["prompts"]))]
    raise AssertionError(
        f"not finished after {MAX_STEPS} engine steps: {sorted(finished)}, {waiting} not sent"
    )


class KVEventRouter:
    """A cache-aware router on the engine's KV events: a ZMQ subscriber decoding the
    publisher's msgspec `KVEventBatch`es into a replay (kv_event_replay.py, the event
    contract of docs/runner-contract.md). The engine core runs in this process, so after
    each batch of prompts the replay is compared with the scheduler's own pool. A batch
    missed (published before the subscription took, ZMQ's slow joiner) is asked again from
    the publisher's replay endpoint by its sequence number, as a router does."""

    def __init__(self, llm: Any, endpoint: str, replay_endpoint: str) -> None:
        import msgspec
        import zmq
        from kv_event_replay import EventReplay
        from vllm.distributed.kv_events import KVEventBatch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import init_none_hash

        config = llm.llm_engine.vllm_config.cache_config
        self.hash_function = get_hash_fn_by_name(config.prefix_caching_hash_algo)
        init_none_hash(self.hash_function)  # as the engine core did: the first block's parent
        self.scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        self.pool = self.scheduler.kv_cache_manager.block_pool
        self.replay = EventReplay(
            self.pool.hash_block_size,
            self.hash_function,
            num_hash_lookahead_tokens=getattr(llm.llm_engine.vllm_config, "num_hash_lookahead_tokens", 0),
        )
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(endpoint)
        self.replay_socket = zmq.Context.instance().socket(zmq.DEALER)
        self.replay_socket.connect(replay_endpoint)
        self.next_seq = 0
        self.batches = 0
        self.replayed = 0

    def _take(self, seq: int, payload: bytes) -> None:
        if seq < self.next_seq:
            return  # had it already (from a replay)
        if seq > self.next_seq:
            self._ask_replay()
            if seq < self.next_seq:
                return
        self.replay.apply(self.decoder.decode(payload).events)
        self.batches += 1
        self.next_seq = seq + 1

    def _ask_replay(self) -> None:
        """Every buffered batch from `next_seq` on, from the replay endpoint."""
        self.replay_socket.send_multipart((b"", self.next_seq.to_bytes(8, "big")))
        while True:
            _, _topic, seq_bytes, payload = self.replay_socket.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq < 0:
                return
            if seq == self.next_seq:
                self.replay.apply(self.decoder.decode(payload).events)
                self.batches += 1
                self.replayed += 1
                self.next_seq = seq + 1

    def catch_up(self, timeout: float = 10.0) -> None:
        """Take the batches published so far, until the replay holds what the pool holds
        (the publisher sends from its own thread); fail if it never does."""
        from kv_event_replay import KVEventContractError

        deadline = time.monotonic() + timeout
        while True:
            while self.socket.poll(50):
                _topic, seq, payload = self.socket.recv_multipart()
                self._take(int.from_bytes(seq, "big"), payload)
            try:
                self.replay.check_pool(self.pool)
                return
            except KVEventContractError as error:
                if time.monotonic() > deadline:
                    raise KVEventContractError(
                        f"{error} ({self.counts()}, next batch {self.next_seq})"
                    ) from None
                self._ask_replay()  # batches missed with none after them to show the gap

    def hit_tokens(self, prompt: list[int]) -> int:
        """The router's hit for a prompt, capped as the scheduler caps its own (a token
        left to compute)."""
        from vllm.v1.core.kv_cache_utils import hash_block_tokens

        size = self.replay.hash_block_size
        hashes, parent = [], None
        for start in range(0, len(prompt) - size + 1, size):
            parent = hash_block_tokens(self.hash_function, parent, prompt[start : start + size], None)
            hashes.append(parent)
        return min(self.replay.hit_tokens(hashes), (len(prompt) - 1) // size * size)

    def counts(self) -> dict[str, int]:
        return {
            "batches": self.batches,
            "replayed": self.replayed,
            "stored": self.replay.num_stored,
            "removed": self.replay.num_removed,
        }


def first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            at = next((j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            return f"request {i} differs at output token {at}: {x[at : at + 5]} vs {y[at : at + 5]}"
    return "identical"


def assert_same_tokens(outcome: Outcome, reference: Outcome, name: str) -> None:
    assert outcome.tokens == reference.tokens, f"{name}: " + first_difference(
        reference.tokens, outcome.tokens
    )


def assert_decode_ready(
    outcome: Outcome, prompts: list[list[int]], *, one_batch: bool, width: int = 1
) -> None:
    """The last ``len(prompts)`` admissions are the prompts', each with all but its last token
    computed and that token scheduled (``width``: with the draft slots of a padded spec-decode
    step); ``one_batch``: all in one step, alone in it, one decode batch (the RBLN scheduler's
    decode-ready admissions join one batch; before issue 21's gap 2 each took a step)."""
    admissions = outcome.admissions[-len(prompts) :]
    assert sorted(a.prompt_tokens for a in admissions) == sorted(map(len, prompts)), admissions
    assert all(a.computed == a.prompt_tokens - 1 for a in admissions), admissions
    assert all(a.scheduled in (1, width) for a in admissions), admissions
    if one_batch:
        assert {(a.step, a.step_requests) for a in admissions} == {(admissions[0].step, len(prompts))}, (
            f"the decode-ready admissions did not run as one decode batch: {admissions}"
        )


def dump(outcome: Outcome) -> str:
    return json.dumps({"metrics": outcome.metrics, "preemptions": len(outcome.preemptions)})


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``vllm serve`` on 127.0.0.1 in its own process group (the engine core is a child of it)."""

    def __init__(
        self, args: list[str], log_path: Path, *, port: int | None = None, cwd: Path | None = None
    ) -> None:
        """``port``: the command already listens there; else ``--host``/``--port`` are added."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            args if port else [*args, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 300) -> None:
        import time
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(1)
        raise AssertionError(f"vllm serve was not ready in {timeout} s:\n{self.tail()}")

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return response.read().decode()

    def tail(self, lines: int = 60) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def serve_args(model: Path, *extra: str) -> list[str]:
    """``vllm serve`` of the tiny model, as a user runs it (the venv's own ``vllm`` script)."""
    vllm = Path(sys.executable).parent / "vllm"
    return [
        str(vllm), "serve", str(model),
        "--dtype", "float32", "--enforce-eager", "--block-size", str(BLOCK),
        "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(64 << 20),
        *extra,
    ]  # fmt: skip


def metric_samples(text: str, name: str) -> dict[str, float]:
    """Prometheus samples of ``name`` (labels as text) from a /metrics page."""
    samples = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def words(tokens: list[int]) -> str:
    """The word-level tokenizer's text for token ids (``w<id>``)."""
    return " ".join(f"w{t}" for t in tokens)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        _serve_forks()
    else:  # one run, the job on stdin (as bench/bench_engine.py and a developer run it)
        print(RESULT + json.dumps(_run_here(json.loads(sys.stdin.read()))), flush=True)
