"""The adoption patches' other changes, each as the RBLN team would meet it on our wheel:
the platform's answer, the install guard, what the patch deletes and what must stay, the
requirement line, and the 0.31.0 port (harmony, the sliding-window manager, the optimum
path's scheduler)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import runner_harness as rh
import sched_harness as h
from packaging.requirements import Requirement
from packaging.version import Version

HERE = Path(__file__).resolve().parent
PIN = Version(os.environ.get("VLLM_RBLN_PIN", "0.31.0"))


def _platform() -> type:
    from vllm_rbln.platform import RblnPlatform

    return RblnPlatform


def test_vllm_runs_on_vllm_rbln_s_platform() -> None:
    import vllm.platforms

    assert type(vllm.platforms.current_platform).__name__ == "RblnPlatform"


def test_the_platform_answer_never_raises() -> None:
    """`supports_prefill_chunk_across_kv_blocks()`: a CR13 says yes, another NPU no, and a host
    that cannot name its NPU (a compile-only worker) no, where `is_cr13()` raises; our scheduler
    asks only for a sub-block size below the chunk, and starts there on the default settings."""
    from sched_harness import create_scheduler
    from vllm_rbln.config import build_rbln_config

    platform = _platform()
    with rh.npu_named("RBLN-CR13"):
        assert platform.supports_prefill_chunk_across_kv_blocks() is True
    with rh.npu_named("RBLN-CA25"):
        assert platform.supports_prefill_chunk_across_kv_blocks() is False
    with rh.npu_named(None):
        with pytest.raises(RuntimeError, match="Could not determine the RBLN NPU name"):
            platform.is_cr13()
        assert platform.supports_prefill_chunk_across_kv_blocks() is False
        scheduler = create_scheduler(
            scheduler_cls=h.rbln_scheduler_factory(build_rbln_config({}), chunks_cross_kv_blocks=False),  # type: ignore[arg-type]
            block_size=rh.BLOCK_SIZE,
            max_num_batched_tokens=rh.CHUNK,
            enable_prefix_caching=True,
        )
        assert type(scheduler).__name__ == "RBLNScheduler"


def test_a_sub_block_below_the_chunk_is_refused_off_a_cr13() -> None:
    with (
        rh.npu_named("RBLN-CA25"),
        pytest.raises(ValueError, match="supports_prefill_chunk_across_kv_blocks"),
    ):
        rh.build(rbln_settings={"sub_block_size": 8})


def _python_with(pythonpath: list[Path], code: str, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(p) for p in [*pythonpath, HERE]),
        **env_overrides,
    }
    prelude = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import rbln_sdk_stubs; rbln_sdk_stubs.install()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_install_guard_refuses_a_vllm_that_is_not_the_rbln_build() -> None:
    """On our wheel the guard passes (every `build` here goes through it); on the same release
    unpatched (the pin's upstream tree first on the path: no `vllm._rbln_build`) it stops with
    one line that names the install."""
    from vllm_rbln.platform import require_rbln_vllm

    require_rbln_vllm()
    upstream = Path(os.environ["VLLM_RBLN_UPSTREAM_TREE"])
    assert not (upstream / "vllm" / "_rbln_build.py").exists()
    code = "import vllm.platforms\nfrom vllm_rbln.platform import require_rbln_vllm\nrequire_rbln_vllm()"
    result = _python_with([upstream], code)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    base = PIN.base_version
    assert last.startswith(f"RuntimeError: vllm-rbln needs the RBLN build of vLLM (vllm=={base}+rbln.<n>)"), (
        last
    )
    assert last.endswith(
        f'install it with pip install --index-url <the RBLN wheel index>/simple "vllm=={base}+rbln.<n>"'
    )


def test_the_install_guard_speaks_first_when_an_engine_config_is_made() -> None:
    """On the vllm model path, `EngineArgs.create_engine_config()` calls the platform's
    `pre_register_and_update` first, which applies vllm-rbln's run-time patches; they import
    the model runner, which imports the RBLN build's `rbln_sub_block`. On a vLLM that is not
    the RBLN build the guard must speak before that import fails (it stopped with
    `ModuleNotFoundError: No module named 'vllm.v1.core.sched.rbln_sub_block'` while the guard
    was only in `check_and_update_config`)."""
    upstream = Path(os.environ["VLLM_RBLN_UPSTREAM_TREE"])
    code = (
        "import vllm.platforms\nassert type(vllm.platforms.current_platform).__name__ == 'RblnPlatform'\n"
        "from vllm.engine.arg_utils import EngineArgs\n"
        "EngineArgs(model='facebook/opt-125m', max_num_batched_tokens=128, block_size=32)"
        ".create_engine_config()"
    )
    # A REBEL CR13: the host class that serves the vllm model path (vllm-rbln refuses that path
    # on an RBLN-CA, the name the rest of this tier's processes report).
    result = _python_with([upstream], code, RBLN_FORCE_NPU_NAME="RBLN-CR13")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: vllm-rbln needs the RBLN build of vLLM"), result.stderr[-3000:]


def test_the_replaced_scheduler_is_gone_and_the_runner_imports_without_it() -> None:
    """The patch deletes `v1/core/rbln_scheduler.py` (nothing imports it any more); the runner
    imports (this tier runs it); `rbln_kv_cache_manager.py` stays, for the `KVCacheCopyOp` the
    runner imports (and `can_use_sub_block_caching`, which vllm-rbln's own, now unused,
    `sub_block_size_in_use` reads)."""
    assert importlib.util.find_spec("vllm_rbln.v1.core.rbln_scheduler") is None
    import vllm_rbln.v1.worker.rbln_model_runner  # noqa: F401
    from vllm_rbln.v1.core.rbln_kv_cache_manager import KVCacheCopyOp, RBLNKVCacheManager

    assert KVCacheCopyOp and RBLNKVCacheManager.can_use_sub_block_caching


def test_without_rbln_kv_cache_manager_the_runner_does_not_import(tmp_path: Path) -> None:
    """The removal the old docs/adopting.md advised (both scheduler files): the runner stops at
    its import of `KVCacheCopyOp`."""
    spec = importlib.util.find_spec("vllm_rbln")
    assert spec is not None and spec.submodule_search_locations
    copy = tmp_path / "vllm_rbln"
    shutil.copytree(
        Path(next(iter(spec.submodule_search_locations))), copy, ignore=shutil.ignore_patterns("__pycache__")
    )
    (copy / "v1" / "core" / "rbln_kv_cache_manager.py").unlink()
    result = _python_with([tmp_path], "import vllm_rbln.v1.worker.rbln_model_runner")
    assert result.returncode != 0
    assert (
        "No module named 'vllm_rbln.v1.core.rbln_kv_cache_manager'" in result.stderr.strip().splitlines()[-1]
    )


def test_the_requirement_lines() -> None:
    """vllm==0.30.0, the release vllm-rbln 0.12.0 is built for, below 0.31.0, vllm==0.31.0
    where the 0.31.0 port applies and vllm==0.34.0 where the 0.34.0 port does (every RBLN
    build of it: a `==` with a local label would accept that label only); and numba, which the
    pure wheel does not bring, at the version vLLM's own builds pin."""
    requires = [Requirement(r) for r in importlib.metadata.requires("vllm-rbln") or ()]
    by_name = {r.name: r for r in requires if r.marker is None}
    release = "0.30.0" if PIN < Version("0.31.0") else "0.31.0" if PIN < Version("0.34.0") else "0.34.0"
    assert str(by_name["vllm"].specifier) == f"=={release}"
    assert by_name["vllm"].specifier.contains(f"{release}+rbln.22")
    assert not Requirement("vllm==0.30.0+cpu").specifier.contains("0.30.0+rbln.1")
    assert by_name["numba"].specifier.contains(importlib.metadata.version("numba"))


def test_the_attention_backends_and_the_dynamic_kv_sizer_import() -> None:
    """vllm-rbln's attention backends import `is_quantized_kv_cache`, and its dynamic-KV sizer
    (which the worker imports before the runner) `_max_memory_usage_bytes_from_groups`,
    `_pool_bytes_per_block` and `get_kv_cache_groups`, from where the pin keeps them: 0.33.0
    moved them to `vllm.v1.kv_cache_interface` and `vllm.v1.core.kv_cache_planning`, and the
    0.34.0 port imports them from there (at 0.33.0, which takes no port of it, this is listed in
    cannot-run.toml)."""
    for module in (
        "vllm_rbln.v1.attention.backends.flash_attention",
        "vllm_rbln.v1.attention.backends.mla.flashattn_mla",
        "vllm_rbln.v1.worker.dynamic_kv_sizer",
    ):
        importlib.import_module(module)


def test_vllm_rbln_patches_import() -> None:
    """`import vllm_rbln.patches` (the vllm model path's run-time patches): the Harmony
    backport is imported, under its new gate, where the pin lacks the fix (below 0.32.0)."""
    import vllm_rbln.patches  # noqa: F401

    assert ("vllm_rbln.patches.harmony" in sys.modules) == (PIN < Version("0.32.0"))


def test_a_sliding_window_model() -> None:
    """vllm-rbln's sliding-window spec and manager (registered by its platform): its manager
    takes 0.31.0's `prefill_end` (the port; 0.30.0 has none), and the runner holds one block
    per request."""
    import torch
    from vllm_rbln.v1.kv_cache import RBLNSlidingWindowSpec

    spec = RBLNSlidingWindowSpec(
        block_size=rh.BLOCK_SIZE,
        num_kv_heads=rh.HEADS,
        head_size=rh.HEAD_SIZE,
        dtype=torch.float32,
        sliding_window=32,
    )
    driver = rh.drive(rh.build(kv_cache_spec=spec, prefix_caching=False))
    for i in range(2):
        driver.add(h.make_request(f"s{i}", h.distinct_prompt(40 + i, 40), max_tokens=5))
    driver.run(40)
    assert driver.finished == {"s0", "s1"}
    assert driver.coverage.max_decode_batch == 2


def test_the_optimum_scheduler_is_built_and_schedules() -> None:
    """The optimum path (vllm-rbln's default, the only one on RBLN-CA devices) keeps its own
    scheduler, which never calls `Scheduler.__init__`: the first patch sets the preemption count
    the RBLN build's `make_stats` reads (without it, `AttributeError` at the first
    `update_from_output` with stats on). At 0.30.0 it schedules two requests to the end; from
    0.31.0 it reads routed experts from `AuxOutputConfig` (the port), and it stops at its first
    step: its waiting loop is 0.30.0's (`_select_waiting_queue_for_scheduling`,
    `skipped_waiting`), and 0.31.0's inherited methods read `kv_holding_waiting`, which
    `Scheduler.__init__` makes (docs/adopting.md, "Not ported")."""
    from sched_harness import create_scheduler
    from vllm_rbln.config import build_optimum_rbln_config
    from vllm_rbln.v1.core.optimum_scheduler import RBLNOptimumScheduler

    def optimum(*, vllm_config: object, **kwargs: object) -> object:
        vllm_config.additional_config = build_optimum_rbln_config({})  # type: ignore[attr-defined]
        return RBLNOptimumScheduler(vllm_config=vllm_config, **kwargs)  # type: ignore[arg-type]

    scheduler = create_scheduler(
        scheduler_cls=optimum, block_size=32, max_num_batched_tokens=64, max_model_len=512
    )  # type: ignore[arg-type]
    assert scheduler.log_stats, "the harness builds schedulers with stats on, as an engine does"
    driver = h.Driver(scheduler)
    for i in range(2):
        driver.add(h.make_request(f"o{i}", h.distinct_prompt(i + 1, 40), max_tokens=4))
    if PIN < Version("0.31.0"):
        assert scheduler.enable_return_routed_experts is False
        driver.run(40)
        assert driver.finished == {"o0", "o1"}
    else:
        assert scheduler.aux_output_connector is None
        # 0.31.0's queue of waiting requests holding KV, which its inherited methods read.
        with pytest.raises(AttributeError, match="kv_holding_waiting"):
            driver.run(40)


def test_check_and_update_ends_in_setup_runtime_env_after_wire() -> None:
    """docs/adopting.md, "`_wire`'s scheduler class": vllm-rbln's `check_and_update` runs
    `_validate`, `_override`, `_wire`, then `_setup_runtime_env` (the page once said it ended
    in `_wire`). Read from the installed (patched) file, without importing it."""
    import ast

    spec = importlib.util.find_spec("vllm_rbln")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "platform" / "vllm_impl.py"
    (hook,) = [
        node
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == "check_and_update"
    ]
    steps = [
        stmt.value.func.id
        for stmt in hook.body
        if isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Name)
    ]
    assert steps == ["_validate", "_override", "_wire", "_setup_runtime_env"]
