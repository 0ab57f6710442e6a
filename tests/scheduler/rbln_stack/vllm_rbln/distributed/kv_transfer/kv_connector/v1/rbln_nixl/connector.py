"""Stand-in: vllm-rbln 0.12.0's NIXL connectors, by module and name (README.md up the tree)."""

from __future__ import annotations

from tests.v1.kv_connector.unit.utils import MockKVConnector


class RblnNixlPullConnector(MockKVConnector):
    """Registered as RblnNixlPullConnector and RblnNixlConnector."""


class RblnNixlPushConnector(MockKVConnector):
    """Registered as RblnNixlPushConnector."""
