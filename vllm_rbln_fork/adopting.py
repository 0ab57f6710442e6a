"""The adoption patches: vllm-rbln's released source moved onto the RBLN build of vLLM.

``adopting/<plugin>-<version>/`` holds git-format patches against that release's wheel (its
files are the source; ``series`` names them in order): what the plugin's maintainers apply to
switch (docs/adopting.md). This module applies them to an unpacked wheel, or to the
site-packages folder a wheel was installed into: ``git apply`` (which needs no repository),
every patch checked before any is applied, so a patch that does not apply leaves the tree as
it was. ``deletes`` (optional) names the release's files that go, one path a line: listed
rather than written as a deletion patch, which would carry every line of the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import proc
from .errors import FailedProcess, PatchDoesNotApply, SeriesError
from .files import sha256_of
from .paths import PROJECT_ROOT

ADOPTING = PROJECT_ROOT / "adopting"
VLLM_RBLN = "vllm-rbln-0.12.0"


@dataclass(frozen=True)
class AdoptionPatches:
    release: str  # the folder's name: <plugin>-<version>
    patches: tuple[Path, ...]  # in the order they apply
    deletions: tuple[str, ...] = ()  # paths in the release that go, after the patches

    @property
    def fingerprint(self) -> str:
        """Changes whenever a patch, the order or a deletion does (a cache key's part)."""
        return ",".join([*(f"{p.name}:{sha256_of(p)}" for p in self.patches), *self.deletions])


def adoption_patches(release: str = VLLM_RBLN, root: Path = ADOPTING) -> AdoptionPatches:
    """The patches ``root/release/series`` names, in its order."""
    folder = root / release
    series = folder / "series"
    if not series.is_file():
        raise SeriesError(f"{folder} has no series file: list its patches there, one name a line.")
    names = _lines(series)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise SeriesError(
            f"{series} names {', '.join(missing)}, which is not in {folder}: add it or drop the line."
        )
    if not names:
        raise SeriesError(f"{series} names no patch: list the adoption patches there.")
    deletes = folder / "deletes"
    deletions = tuple(_lines(deletes)) if deletes.is_file() else ()
    return AdoptionPatches(release, tuple(folder / name for name in names), deletions)


def _lines(path: Path) -> list[str]:
    """A list file's entries: one a line, blank lines and ``#`` comments skipped."""
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def apply_adoption_patches(tree: Path, patches: AdoptionPatches, *, exclude: tuple[str, ...] = ()) -> None:
    """Apply ``patches`` (but those named in ``exclude``) to ``tree``, the unpacked release.

    Each patch is checked on the tree the ones before it left, then applied; the first that
    does not apply stops the run with its name and git's reason, and the patches applied
    before it are reversed. git looks for no repository above ``tree`` (a site-packages
    folder inside a checkout would make it apply the paths to that checkout instead)."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)}
    applied: list[Path] = []
    for patch in patches.patches:
        if patch.name in exclude:
            continue
        try:
            proc.run(["git", "apply", "--check", str(patch)], cwd=tree, env=env)
        except FailedProcess as error:
            for done in reversed(applied):
                proc.run(["git", "apply", "--reverse", str(done)], cwd=tree, env=env)
            reason = error.output.strip().splitlines()[0] if error.output.strip() else "no reason given"
            raise PatchDoesNotApply(
                f"the adoption patch {patch.name} does not apply to {tree} ({reason}): is that "
                f"{patches.release}'s unpacked wheel, with the patches before it in "
                f"{patch.parent / 'series'} and no others applied?"
            ) from error
        proc.run(["git", "apply", str(patch)], cwd=tree, env=env)
        applied.append(patch)
    missing = [path for path in patches.deletions if not (tree / path).is_file()]
    if missing:
        for done in reversed(applied):
            proc.run(["git", "apply", "--reverse", str(done)], cwd=tree, env=env)
        raise PatchDoesNotApply(
            f"{tree} has no {', '.join(missing)}, which {patches.release}'s deletes list removes: "
            f"is that {patches.release}'s unpacked wheel?"
        )
    for path in patches.deletions:
        (tree / path).unlink()
