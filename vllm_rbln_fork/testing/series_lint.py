"""The series lint, one of ``python build.py lint``'s checks (and a pre-commit hook).

Every series in ``series/`` reads and lints (each patch's ``Origin`` and description,
``series.lint``; every file it names exists), every ``series/<pin>`` is a pin ``pins.toml``
lists, every supported pin has its series (a pin being moved to may have none yet: its carry
stopped at a conflict), no file under ``patches/`` is left that no series names, and the
release ledger gives one label one tree (``releases.read_releases``). The build finds each of
these too, but only at the pin it builds.
"""

from __future__ import annotations

import sys

from ..errors import ForkError
from ..project import Project
from ..releases import dropped_from_main, read_releases
from ..series import read_series
from ..supported import listed_pins, series_pins, unused_patch_files


def problems(project: Project) -> list[str]:
    """What is wrong with the project's series; empty when every one may be built."""
    try:
        listed = listed_pins(project)
    except ForkError as exc:
        return [str(exc)]
    found = _ledger_problems(project)
    if not listed:
        try:
            read_series(project.series_file, project.patches_dir)
        except ForkError as exc:
            return [*found, str(exc)]
        return found
    names = {s.pin for s in listed}
    have = series_pins(project)
    for pin in have:
        if pin not in names:
            found.append(
                f"series/{pin}: {project.pins_file.name} does not list vllm {pin}. Add "
                f'[pin."{pin}"] status = "moving" to go on with that move, or delete series/{pin} '
                f"and patches/{pin}/ (docs/patch-workflow.md)."
            )
        try:
            read_series(project.series_dir / str(pin), project.patches_dir)
        except ForkError as exc:
            found.append(str(exc))
    for s in listed:
        # A pin being moved to has no series until its carry is exported (a move stopped at a
        # conflict: the watcher's commit); a supported pin must have one.
        if s.pin not in have and s.status != "moving":
            found.append(
                f"{project.pins_file.name} lists vllm {s.pin}, but series/{s.pin} does not exist: "
                f"export it ('python build.py export --dir <tree>') or remove the entry."
            )
    if found:  # the stray files are known once every series reads
        return found
    for path in unused_patch_files(project):
        found.append(
            f"{path.relative_to(project.root)}: no series names it. Export removes such files; "
            f"delete it, or add it to a series through the edit loop (docs/patch-workflow.md)."
        )
    return found


def _ledger_problems(project: Project) -> list[str]:
    """The release ledger (fork-releases.toml) reads, one label one tree, and holds every line
    main's holds: a merge that kept both branches' new lines, or only the other side's file,
    is caught at its commit, before a build meets it."""
    try:
        read_releases(project.releases_file)
        return dropped_from_main(project.releases_file)
    except ForkError as exc:
        return [str(exc)]


def main() -> int:
    found = problems(Project.default())
    for line in found:
        print(f"series lint: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
