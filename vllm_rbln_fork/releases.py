"""Fork release numbers: ``<pin>+rbln.<n>``, monotonic per pin, never reused.

``fork-releases.toml`` maps each (pin, patched source tree) to its number. The
same tree always gets its number back; a new tree gets the next one.
"""

from __future__ import annotations

from pathlib import Path

import tomli_w

from .errors import ForkError
from .files import read_toml, write_atomic
from .pins import Pin

HEADER = (
    "# Fork release numbers: a build of vllm <pin> whose patched source is `tree` (a git\n"
    "# tree id) is version <pin>+rbln.<n>. Appended by the build; never edit or reuse.\n"
)


def _read(path: Path) -> list[dict[str, object]]:
    """Every ``[[release]]`` entry, each checked to be ``pin`` (text), ``n`` (> 0), ``tree`` (text)."""
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
    return releases


def release_number(path: Path, pin: Pin, tree: str) -> tuple[int, bool]:
    """Return (n, new) for this pin and patched tree: its recorded number, or the next one
    (``new``), which nothing records until :func:`record_release` (the build calls it only
    once the wheel is in dist/: a killed or failed build leaves the ledger as it was)."""
    same_pin = [r for r in _read(path) if r["pin"] == str(pin)]
    for release in same_pin:
        if release["tree"] == tree:
            return int(release["n"]), False  # type: ignore[call-overload]
    return max((int(r["n"]) for r in same_pin), default=0) + 1, True  # type: ignore[call-overload]


def record_release(path: Path, pin: Pin, n: int, tree: str) -> None:
    """Append (pin, n, tree) to the ledger; refuse (nothing written) a number or a tree that
    it already gives to another tree or number."""
    releases = _read(path)
    for release in releases:
        if release["pin"] == str(pin) and (release["n"] == n) != (release["tree"] == tree):
            raise ForkError(
                f"{path.name} already gives vllm {pin}+rbln.{release['n']} to tree {release['tree']}; "
                f"it changed while this build ran. Run the build again."
            )
        if release["pin"] == str(pin) and release["n"] == n:
            return
    releases.append({"pin": str(pin), "n": n, "tree": tree})
    write_atomic(path, HEADER + tomli_w.dumps({"release": releases}))
