"""Where things live: the user cache (XDG) and the project's own files."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """``$VLLM_RBLN_FORK_CACHE``, else the user cache dir (``$XDG_CACHE_HOME/vllm-rbln-fork``):
    the build caches (downloads, upstream.git, wheels, hashes, locks, tmp, venvs).

    The tool environments are not here: build.py keeps them under the user cache dir
    (``tool-envs/``) whatever ``$VLLM_RBLN_FORK_CACHE`` says (build.py's ``tool_env_dir``).
    """
    if override := os.environ.get("VLLM_RBLN_FORK_CACHE"):
        return Path(override)
    return Path(platformdirs.user_cache_dir("vllm-rbln-fork", appauthor=False))


def downloads_dir() -> Path:
    return cache_root() / "downloads"


def upstream_repo_dir() -> Path:
    return cache_root() / "upstream.git"


def wheel_cache_dir() -> Path:
    return cache_root() / "wheels"


def hash_memo_dir() -> Path:
    """Remembered sha256 of big files that have not changed (files.sha256_remembered)."""
    return cache_root() / "hashes"


def locks_dir() -> Path:
    return cache_root() / "locks"
