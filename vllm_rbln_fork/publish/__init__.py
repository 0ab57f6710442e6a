"""The internal wheel index (``--publish DEST``, ``yank``): wheel facts, folder index, pages, upload."""

from __future__ import annotations

from .folder import publish, yank

__all__ = ["publish", "yank"]
