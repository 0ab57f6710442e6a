"""Scheduler tier: the real patched vLLM, driven through vLLM's own harness.

Needs, from the test runner:

* ``VLLM_RBLN_SOURCE_TREE``: a checkout of the patched vLLM source tree (the
  pin's sdist with the series applied). Its ``tests/`` package provides
  ``tests/v1/core/utils.py``; ``vllm`` itself is imported from the
  environment (the installed RBLN wheel), so the two must be the same build.
* ``VLLM_RBLN_VARIANT_TREES`` (for the fault-injection proofs): a JSON object
  ``{"no-backport": "/path", "lookahead-only": "/path"}`` naming source trees
  built as ``tests/scheduler/variants/README.md`` says.

Run with ``pytest --import-mode=importlib`` (this repository's ``tests/`` has
no ``__init__.py`` and must not shadow the source tree's ``tests`` package).
Nothing is skipped: without these variables the tests fail and say so.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# The repository ships the one Hugging Face file vLLM's harness reads
# (facebook/opt-125m's config.json); vLLM needs the CPU platform to build a
# VllmConfig without a GPU. Set before vLLM is imported; a runner may override.
os.environ.setdefault("HF_HOME", str(HERE.parent / "fixtures" / "hf"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# The suite has no packages (--import-mode=importlib): shared test kits live in tests/support.
sys.path.insert(0, str(HERE.parent / "support"))

import sched_harness  # noqa: E402

_SOURCE_TREE = os.environ.get(sched_harness.SOURCE_TREE_ENV)
_SETUP_ERROR = sched_harness.load_harness_from_env()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs the real patched vLLM (scheduler tier)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.path)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(autouse=True)
def _require_source_tree() -> None:
    if _SETUP_ERROR is not None:
        pytest.fail(_SETUP_ERROR, pytrace=False)


@pytest.fixture(scope="session")
def source_tree() -> Path:
    assert _SOURCE_TREE is not None
    return Path(_SOURCE_TREE)


@pytest.fixture(scope="session")
def eagle_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An EAGLE draft model's directory for `sched_harness.with_eagle`: a tiny Llama
    `config.json`, no weights (the scheduler never loads a model)."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("eagle-draft")
    LlamaConfig(
        vocab_size=50272,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    return path
