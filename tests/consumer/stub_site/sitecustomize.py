"""Rebellions' SDK stubs in every Python process the consumer tier starts (vLLM inspects model
architectures in a subprocess of its own, which loads vllm-rbln's platform plugin): on the
``PYTHONPATH`` the tier's conftest sets. The stubs themselves are ``rbln_sdk_stubs.py``."""

import rbln_sdk_stubs

rbln_sdk_stubs.install()
