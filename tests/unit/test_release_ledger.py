"""fork-releases.toml: a number is looked up without writing, and recorded only once."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from vllm_rbln_fork.errors import ForkError
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.releases import record_release, release_number


def test_a_number_is_not_written_until_it_is_recorded(tmp_path: Path) -> None:
    ledger = tmp_path / "fork-releases.toml"
    pin = Pin.parse("1.0")
    assert release_number(ledger, pin, "a" * 40) == (1, True)
    assert not ledger.exists()
    record_release(ledger, pin, 1, "a" * 40)
    record_release(ledger, pin, 1, "a" * 40)  # the same entry again: nothing changes
    assert release_number(ledger, pin, "a" * 40) == (1, False)
    assert release_number(ledger, pin, "b" * 40) == (2, True)
    assert len(tomllib.loads(ledger.read_text())["release"]) == 1


@pytest.mark.parametrize(("n", "tree"), [(1, "b" * 40), (2, "a" * 40)])
def test_a_number_or_tree_taken_meanwhile_is_refused(tmp_path: Path, n: int, tree: str) -> None:
    ledger = tmp_path / "fork-releases.toml"
    pin = Pin.parse("1.0")
    record_release(ledger, pin, 1, "a" * 40)
    before = ledger.read_text()
    with pytest.raises(ForkError, match="changed while this build ran"):
        record_release(ledger, pin, n, tree)
    assert ledger.read_text() == before
