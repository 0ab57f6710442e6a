"""Rebellions' SDK, stubbed: the only stand-ins of the consumer tier.

vllm-rbln's model runner imports Rebellions' device stack, which is not on the package index
and needs an RBLN NPU. Everything else it imports is real: vLLM (our wheel), vllm-rbln itself
(its released wheel with the adoption patches applied), torch, numba. Each stub is a module in
``sys.modules`` whose attributes are ``MagicMock``s and whose submodules are stubs too; none is
ever asked to compute anything the tier checks (the KV copies of the checked path are torch's,
``_process_kv_cache_copy_ops`` with eager tensors).

The stubs, and why each is needed:

* ``rebel`` (the RBLN compiler and runtime, ``rebel-compiler``): imported at the top of
  ``vllm_rbln/platform/__init__.py`` (``register_backend``, ``rebel.get_npu_name``), of the
  runner and its attention ops (``rebel.triton``, ``rebel.kv_cache``, ``rebel.core``).
  ``get_npu_name`` answers None, as on a host with no NPU mounted (a compile-only worker):
  the platform then names the device from ``RBLN_FORCE_NPU_NAME`` or cannot name it.
* ``torch_rbln`` (PyTorch's RBLN device, ``torch-rbln``), and ``torch.rbln``, the module it
  registers: ``dynamic_kv_sizer.py`` and the worker import ``torch.rbln``; no device is
  available (``is_available()`` is False, ``device_count()`` 0).
* ``lmcache_rbln`` (RBLN's LMCache build): vllm-rbln's LMCache connector imports it.
* ``nixl_rbln`` (RBLN's NIXL build): its NIXL connectors import it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from unittest.mock import MagicMock

import torch

# Each stubbed package, and why (the module docstring has the detail).
STUBBED = {
    "rebel": "the RBLN compiler and runtime (rebel-compiler): the platform, runner and attention ops",
    "torch_rbln": "PyTorch's RBLN device (torch-rbln), which registers torch.rbln",
    "lmcache_rbln": "RBLN's LMCache build: vllm-rbln's LMCache connector",
    "nixl_rbln": "RBLN's NIXL build: vllm-rbln's NIXL connectors",
}


class StubModule(types.ModuleType):
    """A module whose every attribute is a MagicMock (made once, then kept)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package: its submodules are stubs too
        self.__spec__ = importlib.machinery.ModuleSpec(name, _FINDER, is_package=True)

    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = MagicMock(name=f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every module under a stubbed package (``rebel.triton.language.extra.rbln``...)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        parent, _, child = module.__name__.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


_FINDER = _StubFinder()


def install() -> None:
    """Put the stubs in place (once per process), before anything imports vllm_rbln."""
    if _FINDER in sys.meta_path:
        return
    sys.meta_path.insert(0, _FINDER)
    import rebel  # type: ignore[import-not-found]

    # No NPU mounted: the platform falls back to RBLN_FORCE_NPU_NAME, else cannot name one.
    rebel.get_npu_name = lambda device_id=0: None
    device = StubModule("torch.rbln")
    device.is_available = lambda: False  # type: ignore[attr-defined]
    device.device_count = lambda: 0  # type: ignore[attr-defined]
    sys.modules["torch.rbln"] = device
    torch.rbln = device  # type: ignore[attr-defined]  # what torch_rbln registers
