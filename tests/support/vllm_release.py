"""The installed vLLM's release, read from its distribution: no import of vLLM, so it can
decide what to set before vLLM is imported."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def vllm_release() -> tuple[int, int]:
    """(major, minor) of the installed vLLM; (0, 0) where none is installed."""
    try:
        major, minor = version("vllm").split(".")[:2]
    except PackageNotFoundError:
        return (0, 0)
    return int(major), int(minor)
