"""Fork release numbers: ``<pin>+rbln.<n>``, monotonic per pin, never reused.

``fork-releases.toml`` maps each (pin, patched source tree) to its number. The
same tree always gets its number back; a new tree gets the next one.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import NoReturn

from .errors import ForkError
from .files import read_toml, write_atomic
from .pins import Pin

HEADER = (
    "# Fork release numbers: a build of vllm <pin> whose patched source is `tree` (a git\n"
    "# tree id) is version <pin>+rbln.<n>. Appended by the build; never edit or reuse.\n"
)


def read_releases(path: Path) -> list[dict[str, object]]:
    """Every ``[[release]]`` entry, each checked to be ``pin`` (text), ``n`` (> 0), ``tree`` (text),
    and the whole refused when one (pin, n) names two trees or one (pin, tree) two numbers
    (:func:`_check_one_label_one_tree`)."""
    releases = read_toml(path).get("release", [])
    if not isinstance(releases, list):
        raise ForkError(f"{path}: 'release' must be an array of tables ([[release]]); restore it from git.")
    for index, entry in enumerate(releases, start=1):
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("pin"), str)
            and isinstance(entry.get("tree"), str)
            and isinstance(entry.get("n"), int)
            and entry["n"] > 0
        )
        if not ok:
            raise ForkError(
                f'{path}: [[release]] entry {index} ({entry!r}) needs pin = "<version>", n = <number '
                f'> 0> and tree = "<git tree id>". Restore the file from git (git checkout -- '
                f"{path.name}); release numbers are never edited by hand."
            )
    _check_one_label_one_tree(path, releases)
    return releases


def _lines(path: Path, releases: list[dict[str, object]]) -> list[int | None]:
    """The line of the file each entry is written on (the build writes one a line), or None."""
    lines = path.read_text(encoding="utf-8").splitlines()
    taken: set[int] = set()
    found: list[int | None] = []
    for entry in releases:
        where = None
        for number, line in enumerate(lines, start=1):
            if (
                number not in taken
                and f'"{entry["pin"]}"' in line
                and f'"{entry["tree"]}"' in line
                and re.search(rf"\bn\s*=\s*{entry['n']}\b", line)
            ):
                where = number
                break
        if where is not None:
            taken.add(where)
        found.append(where)
    return found


def _refuse(path: Path, releases: list[dict[str, object]], first: int, index: int) -> NoReturn:
    """Raise the error naming the two clashing entries by their lines."""
    other, entry = releases[first], releases[index]
    lines = _lines(path, releases)
    at = [f"line {lines[i]}" if lines[i] else f"entry {i + 1}" for i in (first, index)]
    if other["n"] == entry["n"]:
        clash = (
            f"both give vllm {entry['pin']}+rbln.{entry['n']}, to tree {other['tree']} "
            f"({at[0]}) and to tree {entry['tree']} ({at[1]}): one label names one tree"
        )
    else:
        clash = (
            f"both give tree {entry['tree']} of vllm {entry['pin']} a number, "
            f"+rbln.{other['n']} ({at[0]}) and +rbln.{entry['n']} ({at[1]}): a tree keeps "
            f"the one number it was first given"
        )
    raise ForkError(
        f"{path.name}: {clash}. Keeping both sides of a merge of two "
        f"branches that each built leaves this. Keep the line main had before "
        f"the merge and delete the other (its tree gets the next number when it is built "
        f"again); never publish a wheel built with the deleted line's label."
    )


def _check_one_label_one_tree(path: Path, releases: list[dict[str, object]]) -> None:
    """Refuse a ledger where one ``<pin>+rbln.<n>`` is given to two trees, or one tree of a pin
    two numbers: what keeping both sides of a merge of two branches that each built leaves."""
    by_label: dict[tuple[object, object], int] = {}
    by_tree: dict[tuple[object, object], int] = {}
    for index, entry in enumerate(releases):
        label, tree = (entry["pin"], entry["n"]), (entry["pin"], entry["tree"])
        for first in (by_label.get(label), by_tree.get(tree)):
            if first is not None and releases[first] != entry:
                _refuse(path, releases, first, index)
        by_label.setdefault(label, index)
        by_tree.setdefault(tree, index)


def release_number(path: Path, pin: Pin, tree: str) -> tuple[int, bool]:
    """Return (n, new) for this pin and patched tree: its recorded number, or the next one
    (``new``), which nothing records until :func:`record_release` (the build calls it only
    once the wheel is built, under the project lock: a killed or failed build leaves the ledger as it was)."""
    same_pin = [r for r in read_releases(path) if r["pin"] == str(pin)]
    for release in same_pin:
        if release["tree"] == tree:
            return int(release["n"]), False  # type: ignore[call-overload]
    return max((int(r["n"]) for r in same_pin), default=0) + 1, True  # type: ignore[call-overload]


def record_release(path: Path, pin: Pin, n: int, tree: str) -> None:
    """Append (pin, n, tree) to the ledger; refuse (nothing written) a number or a tree that
    it already gives to another tree or number."""
    releases = read_releases(path)
    for release in releases:
        if release["pin"] == str(pin) and (release["n"] == n) != (release["tree"] == tree):
            raise ForkError(
                f"{path.name} already gives vllm {pin}+rbln.{release['n']} to tree {release['tree']}; "
                f"it changed while this build ran. Run the build again."
            )
        if release["pin"] == str(pin) and release["n"] == n:
            return
    releases.append({"pin": str(pin), "n": n, "tree": tree})
    import tomli_w  # here: most runs only read the ledger

    write_atomic(path, HEADER + tomli_w.dumps({"release": releases}))


# Where main's ledger is read from: the local branch and the remote's (a CI clone may have only
# the second).
MAIN_REFS = ("refs/heads/main", "refs/remotes/origin/main")


def _main_ledgers(root: Path) -> list[tuple[str, str]]:
    """The commits whose ledger the work tree's must keep, as (commit, how it is named), most
    authoritative first: main's tip being merged in (a branch merging main); main before the
    merge, when main's tip is a merge commit checked out (CI linting it); where the branch left
    main (its lines are main's, whatever the branch did since); the commit a merge under way
    goes onto (its own lines, but for a label main gave another tree). Main's lines added after
    the branch left it are not asked of the branch until it merges main."""
    head = _git_out(root, "rev-parse", "--verify", "-q", "HEAD")
    if head is None:
        return []
    head = head.strip()
    merging = _git_out(root, "rev-parse", "--verify", "-q", "MERGE_HEAD")
    found: list[tuple[str, str]] = []
    for ref in MAIN_REFS:
        tip = _git_out(root, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        if tip is None:
            continue
        tip, name = tip.strip(), ref.removeprefix("refs/heads/").removeprefix("refs/remotes/")
        if merging is not None and merging.strip() == tip:
            found.append((tip, f"{name}, being merged"))
        parents = (_git_out(root, "rev-parse", f"{head}^@") or "").split()
        if tip == head and len(parents) > 1:
            found.append((parents[0], f"{name} before the merge {head[:12]}"))
        base = _git_out(root, "merge-base", head, tip)
        if base is not None:
            found.append((base.strip(), name if base.strip() == tip else f"where this branch left {name}"))
    if merging is not None and found:
        found.append((head, "HEAD, which the merge goes onto"))
    return found


def dropped_from_main(path: Path) -> list[str]:
    """Each label main gave that ``path`` (the work tree's ledger) no longer gives to the same
    tree (see :func:`_main_ledgers` for which of main's commits are read). A merge resolved with
    one side's file (``git checkout --theirs``) reads well and gives one label one tree, yet
    drops main's released line, and another tree would then be built under a published label.
    Empty outside a git work tree or without a main branch."""
    have = {(str(r["pin"]), int(r["n"])): str(r["tree"]) for r in read_releases(path)}  # type: ignore[call-overload]
    first: dict[tuple[str, int], tuple[str, str]] = {}  # label -> (tree, where it is recorded)
    for commit, name in _main_ledgers(path.parent):
        text = _git_out(path.parent, "show", f"{commit}:{path.name}")
        try:
            entries = tomllib.loads(text or "").get("release", [])
        except tomllib.TOMLDecodeError:
            continue  # a ledger that did not read there: the work tree's is checked on its own
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("n"), int):
                label = (str(entry.get("pin")), int(entry["n"]))
                first.setdefault(label, (str(entry.get("tree")), f"{name}, {commit[:12]}"))
    problems = []
    for (pin, n), (tree, where) in sorted(first.items()):
        if have.get((pin, n)) == tree:
            continue
        now = f"this ledger gives it to tree {have[(pin, n)]}" if (pin, n) in have else "this ledger lacks it"
        problems.append(
            f"{path.name}: main gave vllm {pin}+rbln.{n} to tree {tree} ({where}), and {now}: "
            f"a label never moves to another tree. A merge resolved with one side's file (git "
            f"checkout --theirs) drops main's lines. Put main's line back "
            f'({{ pin = "{pin}", n = {n}, tree = "{tree}" }}) and delete the other side\'s line '
            f"for that label (its tree gets the next number when it is built again)."
        )
    return problems


def _git_out(root: Path, *args: str) -> str | None:
    """git's output in ``root``, or None where git fails (no repository, no such ref or file)."""
    from . import proc
    from .errors import FailedProcess

    try:
        return proc.run(["git", "-C", str(root), *args])
    except (FailedProcess, OSError):
        return None
