"""A pin is a vLLM release: a PEP 440 version, and its sdist hash recorded in pins.lock."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomli_w
from packaging.version import InvalidVersion, Version

from .errors import BadPin, ForkError, SourceHashMismatch
from .files import read_toml, write_atomic
from .paths import PROJECT_ROOT

PINS_LOCK = PROJECT_ROOT / "pins.lock"


@dataclass(frozen=True, order=True)
class Pin:
    version: Version

    @classmethod
    def parse(cls, text: str) -> Pin:
        """Accept only a plain public PEP 440 version: nothing else reaches git or a path."""
        try:
            version = Version(text)
        except InvalidVersion:
            raise BadPin(
                f"--pin {text!r} is not a PEP 440 version. Give a vLLM release such as 0.31.0."
            ) from None
        if version.local is not None or str(version) != text.strip():
            raise BadPin(
                f"--pin {text!r} is not a plain release version (no local label, normalised "
                f"form {version.public!r}). Give a vLLM release such as 0.31.0."
            )
        return cls(version)

    def __str__(self) -> str:
        return str(self.version)

    @property
    def tag(self) -> str:
        return f"upstream/v{self}"


@dataclass(frozen=True)
class LockedSdist:
    filename: str
    sha256: str
    size: int | None = None


class PinsLock:
    """``pins.lock``: the sha256 of each pin's sdist, written the first time it is fetched."""

    def __init__(self, path: Path = PINS_LOCK) -> None:
        self.path = path

    def _read(self) -> dict[str, dict[str, object]]:
        """The ``[vllm."<pin>"]`` tables, each checked to have a text ``filename`` and ``sha256``."""
        entries = read_toml(self.path).get("vllm", {})
        if not isinstance(entries, dict):
            raise ForkError(f"{self.path}: 'vllm' must be a table of pins; restore the file from git.")
        for pin, entry in entries.items():
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("filename"), str)
                and isinstance(entry.get("sha256"), str)
                and isinstance(entry.get("size", 0), int)
            ):
                raise ForkError(
                    f'{self.path}: the entry of vllm {pin} ({entry!r}) needs filename = "..." and '
                    f'sha256 = "..." (and an optional whole-number size). Restore the file from git '
                    f"(git checkout -- {self.path.name}), or delete the entry to record it again."
                )
        return dict(entries)

    def get(self, pin: Pin) -> LockedSdist | None:
        entry = self._read().get(str(pin))
        if entry is None:
            return None
        size = entry.get("size")
        return LockedSdist(str(entry["filename"]), str(entry["sha256"]), int(size) if size else None)  # type: ignore[call-overload]

    def check_or_record(self, pin: Pin, sdist: LockedSdist) -> bool:
        """Record a new pin, or verify a known one. Returns True when it was newly recorded."""
        known = self.get(pin)
        if known is not None:
            if known.sha256 != sdist.sha256:
                raise SourceHashMismatch(
                    f"the sdist {sdist.filename} has sha256 {sdist.sha256}, but {self.path.name} "
                    f"recorded {known.sha256} for vllm {pin}. Nothing was built. If upstream "
                    f"really re-released this version, review why and remove the entry from "
                    f"{self.path.name} by hand; otherwise check the index (--index-url)."
                )
            return False
        entries = self._read()
        entries[str(pin)] = {"filename": sdist.filename, "sha256": sdist.sha256}
        if sdist.size is not None:
            entries[str(pin)]["size"] = sdist.size
        ordered = dict(sorted(entries.items(), key=lambda kv: Version(kv[0])))
        header = (
            "# sha256 of each pinned vLLM sdist, recorded the first time it is fetched.\n"
            "# A later download with another hash is refused.\n"
        )
        write_atomic(self.path, header + tomli_w.dumps({"vllm": ordered}))
        return True
