"""Out-of-tree KV connectors for test_sub_block_cache.py, loaded through
`kv_connector_module_path="oot_connectors"` as an operator's own connector is.

Each is vLLM's MockKVConnector under another name: what matters to the RBLN
scheduler's check is where the class comes from, not what it does.
"""

from __future__ import annotations

from tests.v1.kv_connector.unit.utils import MockKVConnector
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector


class BlockHashKeyedConnector(MockKVConnector):
    """Stands for a connector that keys its store on request.block_hashes."""


class LMCacheConnectorV1(MockKVConnector):
    """An out-of-tree class with the name of a connector checked to key on
    tokens: its name alone must not let it through."""


class OperatorMultiConnector(MultiConnector):
    """An operator's subclass of vLLM's MultiConnector (say, routing loads its
    own way): still a container, whose children the check must see."""
