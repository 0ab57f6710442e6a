"""What the command line prints (issue 22): messages verbatim, never read as rich markup; each
line once; every option with its help."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_rbln_fork import cli
from vllm_rbln_fork.project import Project


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(argv)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_an_error_naming_a_toml_table_keeps_its_brackets(
    fork: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (fork.project.root / "pins.toml").write_text('[pin."1.0"]\nstatus = "bogus"\n')
    monkeypatch.setattr(Project, "default", classmethod(lambda cls: fork.project))
    rc, out = _run(["--pin", "1.0"], capsys)
    assert rc == 2 and """pins.toml: [pin."1.0"] has status = 'bogus'""" in out, out


def test_a_path_with_rich_markup_in_it_is_printed_not_parsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'[/y]' closes a tag that was never opened: rich raised MarkupError from the error printer."""
    missing = tmp_path / "x[/y]" / "[bold]missing.tar.gz"
    rc, out = _run(["--pin", "1.0", "--source", str(missing)], capsys)
    assert rc == 2 and str(missing) in out, out


def test_yank_says_what_it_did_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import indexkit

    from vllm_rbln_fork.publish import publish

    wheel = indexkit.make_wheel(tmp_path / "dist")
    index = tmp_path / "index"
    publish(wheel, str(index))
    capsys.readouterr()
    rc, out = _run(["yank", wheel.name, "--from", str(index), "--reason", "broken [see #1]"], capsys)
    assert rc == 0 and out.count(f"yanked {wheel.name}") == 1, out
    assert "broken [see #1]" in out


@pytest.mark.parametrize("option", ["--pin", "--index-url", "--source", "--dir"])
def test_checkout_help_explains_every_option(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["checkout", "--help"])
    assert done.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{option} "))
    # argparse: "  --pin PIN   help..." or "  --pin PIN" with the help on deeper-indented lines
    own = lines[start].strip().split(None, 2)[2:]
    more = [
        line.strip() for line in lines[start + 1 :] if line.startswith("    ") and line.strip()[:1] != "-"
    ]
    described = " ".join(own + more[: 1 if not own else 0])
    assert len(described.split()) >= 3, lines


def test_continue_names_the_tree_in_its_next_step(fork: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`build.py continue` that carried every patch says the export command with the tree's path
    (a missing f-prefix printed a literal '{tree}', issue 30)."""
    from moves import resolve_by_hand

    from vllm_rbln_fork.errors import PatchDoesNotApply
    from vllm_rbln_fork.pins import Pin
    from vllm_rbln_fork.pipeline import build

    with pytest.raises(PatchDoesNotApply):
        build(Pin.parse("1.3"), fork.spec(), fork.project)
    tree = fork.project.work_dir / "conflict-v1.3"
    resolve_by_hand(tree)
    capsys.readouterr()
    rc, out = _run(["continue", "--dir", str(tree)], capsys)
    assert rc == 0, out
    assert f"next: python build.py export --dir {tree.resolve()}" in out, out
    assert "{tree}" not in out
