"""Stand-in: lmcache_rbln's LMCache connector, by module and name (../README.md)."""

from __future__ import annotations

from tests.v1.kv_connector.unit.utils import MockKVConnector


class RBLNLMCacheConnectorV1(MockKVConnector):
    """Where vllm-rbln's registered `RBLNLMCacheConnectorV1` comes from."""
