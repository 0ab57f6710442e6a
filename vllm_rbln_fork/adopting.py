"""The adoption patches: vllm-rbln's released source moved onto the RBLN build of vLLM.

``adopting/<plugin>-<version>/`` holds git-format patches against that release's wheel (its
files are the source; ``series`` names them in order): what the plugin's maintainers apply to
switch (docs/adopting.md). This module applies them to an unpacked wheel, or to the
site-packages folder a wheel was installed into: ``git apply`` (which needs no repository),
every patch checked before any is applied, so a patch that does not apply leaves the tree as
it was. ``deletes`` (optional) names the release's files that go, one path a line: listed
rather than written as a deletion patch, which would carry every line of the file.

A ``series`` line may gate its patch on the vLLM pin: ``<name> vllm<specifier>`` (PEP 440,
``port-to-vllm-0.31.0.patch vllm>=0.31.0``) applies the patch only at pins the specifier
contains. vllm-rbln 0.12.0 is built for vLLM 0.30.0: at that pin its 0.31.0 port must not
apply (it would require ``vllm==0.31.0`` and lift a harmony gate 0.30.0 needs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from . import proc
from .errors import FailedProcess, PatchDoesNotApply, SeriesError
from .files import sha256_of
from .paths import PROJECT_ROOT
from .pins import Pin

ADOPTING = PROJECT_ROOT / "adopting"
VLLM_RBLN = "vllm-rbln-0.12.0"


@dataclass(frozen=True)
class AdoptionPatches:
    release: str  # the folder's name: <plugin>-<version>
    patches: tuple[Path, ...]  # in the order they apply
    deletions: tuple[str, ...] = ()  # paths in the release that go, after the patches
    gated_off: tuple[tuple[str, str], ...] = ()  # (name, its vllm specifier) left out at the pin

    @property
    def fingerprint(self) -> str:
        """Changes whenever a patch, the order or a deletion does (a cache key's part)."""
        return ",".join([*(f"{p.name}:{sha256_of(p)}" for p in self.patches), *self.deletions])


def adoption_patches(
    release: str = VLLM_RBLN, root: Path = ADOPTING, pin: Pin | None = None
) -> AdoptionPatches:
    """The patches ``root/release/series`` names, in its order: at ``pin``, only those whose
    gate (``<name> vllm<specifier>``) contains it; without a pin, every patch."""
    folder = root / release
    series = folder / "series"
    if not series.is_file():
        raise SeriesError(f"{folder} has no series file: list its patches there, one name a line.")
    entries = [_series_entry(series, line) for line in _lines(series)]
    outside = [name for name, _ in entries if PurePosixPath(name).name != name or name in (".", "..")]
    if outside:
        raise SeriesError(
            f"{series} names {', '.join(repr(n) for n in outside)}, which is not a file in {folder}: "
            f"a series line names a patch of its own folder by its file name alone (no / or ..); "
            f"move the patch into {folder} and name it so."
        )
    missing = [name for name, _ in entries if not (folder / name).is_file()]
    if missing:
        raise SeriesError(
            f"{series} names {', '.join(missing)}, which is not in {folder}: add it or drop the line."
        )
    if not entries:
        raise SeriesError(f"{series} names no patch: list the adoption patches there.")
    applied: list[Path] = []
    gated_off: list[tuple[str, str]] = []
    for name, gate in entries:
        if pin is None or gate is None or gate.contains(str(pin.version), prereleases=True):
            applied.append(folder / name)
        else:
            gated_off.append((name, f"vllm{gate}"))
    deletes = folder / "deletes"
    deletions = _deletions(deletes) if deletes.is_file() else ()
    return AdoptionPatches(release, tuple(applied), deletions, tuple(gated_off))


def _deletions(deletes: Path) -> tuple[str, ...]:
    """The ``deletes`` list: paths relative to the release's top, each inside it and listed once."""
    seen: dict[str, str] = {}
    for line in _lines(deletes):
        path = PurePosixPath(line)
        if path.is_absolute() or ".." in path.parts or "\\" in line or not path.parts:
            raise SeriesError(
                f"{deletes}: {line!r} is not a path inside the release: a deletes line is a file's "
                f"path relative to the unpacked wheel's top (vllm_rbln/...), with no leading / and "
                f"no ..; correct or drop the line."
            )
        if str(path) in seen:
            raise SeriesError(
                f"{deletes} lists {str(path)!r} twice ({seen[str(path)]!r} and {line!r}): "
                f"drop one of the lines."
            )
        seen[str(path)] = line
    return tuple(seen)


def _series_entry(series: Path, line: str) -> tuple[str, SpecifierSet | None]:
    """A series line: a patch name, and its gate on the vLLM pin (``vllm<specifier>``) if any."""
    name, _, rest = line.partition(" ")
    gate = rest.strip()
    if not gate:
        return name, None
    if not gate.startswith("vllm") or not gate[4:].strip():
        raise SeriesError(
            f"{series}: {line!r}: a patch's gate is 'vllm<specifier>' (say '{name} vllm>=0.31.0'), "
            f"not {gate!r}."
        )
    try:
        return name, SpecifierSet(gate[4:].strip())
    except InvalidSpecifier as error:
        raise SeriesError(
            f"{series}: {line!r}: {gate[4:].strip()!r} is no PEP 440 specifier ({error})."
        ) from None


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
    top = tree.resolve()
    # Checked before anything changes: a deletion resolves inside the tree (no .., no link out
    # of it) and is named once, however the list was made.
    outside = [path for path in patches.deletions if not (tree / path).resolve().is_relative_to(top)]
    repeated = sorted({path for path in patches.deletions if patches.deletions.count(path) > 1})
    if outside or repeated:
        raise PatchDoesNotApply(
            f"{patches.release}'s deletes list "
            + (f"names {', '.join(outside)}, outside {tree}" if outside else "")
            + ("; it " if outside and repeated else "")
            + (f"names {', '.join(repeated)} more than once" if repeated else "")
            + ": nothing was applied or deleted. Each line is a file inside the release, listed once."
        )
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
