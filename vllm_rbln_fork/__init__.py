"""vllm-rbln-fork: carry a fork of vLLM as a maintained patch series."""

from __future__ import annotations

__version__ = "0.1.0"
