"""``build.py --help`` names every other command (it left out ``yank``)."""

from __future__ import annotations

import pytest

from vllm_rbln_fork import cli


def test_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for command in ("checkout", "export", "continue", "forget", "yank", "watch", "matrix", "test", "lint"):
        assert f"'build.py {command}'" in text
    assert set(cli.COMMANDS) == {
        "checkout",
        "export",
        "continue",
        "forget",
        "yank",
        "watch",
        "matrix",
        "test",
        "lint",
    }
