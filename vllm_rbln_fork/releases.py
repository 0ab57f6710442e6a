"""Fork release numbers: ``<pin>+rbln.<n>``, monotonic per pin, never reused.

``fork-releases.toml`` maps each (pin, patched source tree) to its number. The
same tree always gets its number back; a new tree gets the next one.
"""

from __future__ import annotations

import re
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
