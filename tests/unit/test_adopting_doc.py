"""docs/adopting.md's parity table points every row at tests that exist (and docs/runner-contract.md
names only tests that exist): a renamed or removed test breaks this, not a reader's search."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The tiers whose tests the docs name by file alone: the scheduler tier's and the consumer tier's.
TEST_DIRS = tuple(ROOT / "tests" / tier for tier in ("scheduler", "consumer", "tooling", "engine"))
# Rows whose behaviour no workload or test shows yet (said in the row itself).
NONE_YET = "none yet"


def parity_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "adopting.md").read_text()
    table = text.split("## 7. The parity table", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]
    assert cells[0] == ["vllm-rbln 0.12.0", "ours", "answer", "workload / test"]
    return cells[2:]


def test_test_references() -> None:
    """Every `file.py::test_name` in the docs is a test function of that file."""
    for doc in ("docs/adopting.md", "docs/runner-contract.md"):
        text = (ROOT / doc).read_text()
        refs = re.findall(r"`(test_\w+\.py)(?:::(test_\w+))?(?:\[[\w-]+\])?`", text)
        assert refs, doc
        for file_name, function in refs:
            found = [d / file_name for d in TEST_DIRS if (d / file_name).is_file()]
            assert len(found) == 1, (
                f"{doc}: {file_name} is in none of {[d.name for d in TEST_DIRS]} (or in more than one)"
            )
            source = found[0]
            if function:
                assert re.search(rf"^def {function}\(", source.read_text(), re.M), (
                    f"{doc}: {file_name}::{function}"
                )


def test_every_row_has_an_answer_and_a_pointer() -> None:
    rows = parity_rows()
    assert len(rows) >= 30
    for row in rows:
        assert len(row) == 4, row
        assert row[2].split(" ")[0] in ("same", "better", "behind", "different"), row
        assert "`" in row[3] or row[3].startswith(NONE_YET), row


def test_every_workload_named_is_a_parity_workload() -> None:
    """The parity table's workloads are the parity tier's, by name (tests/parity/workloads.py,
    pure data)."""
    import importlib.util

    path = ROOT / "tests" / "parity" / "workloads.py"
    spec = importlib.util.spec_from_file_location("parity_workloads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    names = set(module.BY_NAME)
    named = 0
    for row in parity_rows():
        for ref in re.findall(r"`([a-z0-9][a-z0-9-]*)`", row[3]):
            assert ref in names, f"{ref} is not a parity workload"
            named += 1
    assert named >= 15
