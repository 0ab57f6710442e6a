"""The CLI's printing: styles only where stderr takes them, and text never read as markup."""

from __future__ import annotations

import pytest

from vllm_rbln_fork.cli import say


def test_styles_reach_a_terminal_and_never_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("FORCE_COLOR", "NO_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    say(("error:", "bold red"), ' [pin."1.1"] /tmp/x[/y]')  # captured: not a terminal
    assert capsys.readouterr().err == 'error: [pin."1.1"] /tmp/x[/y]\n'
    monkeypatch.setenv("FORCE_COLOR", "1")
    say(("error:", "bold red"), " plain", ("", "dim"))
    assert capsys.readouterr().err == "\x1b[1;31merror:\x1b[0m plain\x1b[2m\x1b[0m\n"
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    say(("done", "green"))
    assert capsys.readouterr().err == "done\n"
