"""Fork release numbers: ``<pin>+rbln.<n>``, monotonic per pin, never reused.

``fork-releases.toml`` maps each (pin, patched source tree) to its number. The
same tree always gets its number back; a new tree gets the next one.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import tomli_w

from .files import write_atomic
from .pins import Pin

HEADER = (
    "# Fork release numbers: a build of vllm <pin> whose patched source is `tree` (a git\n"
    "# tree id) is version <pin>+rbln.<n>. Appended by the build; never edit or reuse.\n"
)


def _read(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    with path.open("rb") as f:
        return list(tomllib.load(f).get("release", []))


def release_number(path: Path, pin: Pin, tree: str) -> tuple[int, bool]:
    """Return (n, newly assigned) for this pin and patched tree, recording a new one."""
    releases = _read(path)
    same_pin = [r for r in releases if r["pin"] == str(pin)]
    for release in same_pin:
        if release["tree"] == tree:
            return int(release["n"]), False  # type: ignore[call-overload]
    n = max((int(r["n"]) for r in same_pin), default=0) + 1  # type: ignore[call-overload]
    releases.append({"pin": str(pin), "n": n, "tree": tree})
    write_atomic(path, HEADER + tomli_w.dumps({"release": releases}))
    return n, True
