"""Our TOML files for the conformance tier: the expected differences and the tests that cannot run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..files import read_toml
from .outcomes import OUTCOMES, CannotRun, ConformanceError, ExpectedDifference

# ---------------------------------------------------------------------------------------------
# Reading our TOML files.


def _load_toml(path: Path) -> dict[str, object]:
    return read_toml(path, missing_ok=False, error=ConformanceError)


def _entries(path: Path, data: dict[str, object], key: str) -> list[dict[str, object]]:
    entries = data.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConformanceError(f"{path}: '{key}' must be an array of tables ([[{key}]]).")
    return entries


def _text(path: Path, entry: dict[str, object], name: str, index: int) -> str:
    value = entry.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ConformanceError(f"{path}: entry {index + 1} needs a non-empty string '{name}'.")
    return value.strip()


def load_expected(path: Path, pin: str, patches_dir: Path | None = None) -> tuple[ExpectedDifference, ...]:
    """The expected differences that apply to ``pin``; with ``patches_dir``, each patch must exist."""
    data = _load_toml(path)
    result: list[ExpectedDifference] = []
    for i, entry in enumerate(_entries(path, data, "difference")):
        outcomes = []
        for side in ("unpatched", "patched"):
            value = _text(path, entry, side, i)
            if value not in OUTCOMES:
                raise ConformanceError(
                    f"{path}: entry {i + 1} has {side} = {value!r}; use one of {', '.join(OUTCOMES)}."
                )
            outcomes.append(value)
        pins = entry.get("pins", [])
        if not isinstance(pins, list) or not all(isinstance(p, str) for p in pins):
            raise ConformanceError(f"{path}: entry {i + 1}: 'pins' must be a list of versions.")
        item = ExpectedDifference(
            test=_text(path, entry, "test", i),
            unpatched=outcomes[0],
            patched=outcomes[1],
            patch=_text(path, entry, "patch", i),
            why=_text(path, entry, "why", i),
            pins=tuple(pins),
        )
        found = patches_dir is not None and any(
            (patches_dir / where / item.patch).is_file() for where in ("", pin)
        )
        if patches_dir is not None and not found:
            raise ConformanceError(
                f"{path}: {item.test} names patch {item.patch!r}, which is not in {patches_dir}. "
                "Name the file of patches/ that causes the difference."
            )
        if not item.pins or pin in item.pins:
            result.append(item)
    return tuple(result)


def load_cannot_run(path: Path) -> tuple[CannotRun, ...]:
    """``[[group]]`` tables, each a ``reason`` and the ``tests`` (node ids or files) it covers."""
    data = _load_toml(path)
    result: list[CannotRun] = []
    for i, group in enumerate(_entries(path, data, "group")):
        reason = _text(path, group, "reason", i)
        tests = group.get("tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t for t in tests):
            raise ConformanceError(f"{path}: group {i + 1} needs a non-empty list of node ids 'tests'.")
        result.extend(CannotRun(t, reason) for t in tests)
    seen = Counter(c.test for c in result)
    if twice := sorted(t for t, n in seen.items() if n > 1):
        raise ConformanceError(f"{path} lists {', '.join(twice)} more than once.")
    return tuple(result)
