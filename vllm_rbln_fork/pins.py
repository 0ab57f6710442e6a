"""A pin is a vLLM release: a PEP 440 version, and its sdist hash recorded in pins.lock."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    """A file recorded in pins.lock: its name and sha256 (the hash says all; no size is kept)."""

    filename: str
    sha256: str


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _entry(locked: LockedSdist, *, with_filename: bool) -> dict[str, object]:
    entry: dict[str, object] = {"filename": locked.filename} if with_filename else {}
    entry["sha256"] = locked.sha256
    return entry


class PinsLock:
    """``pins.lock``: the sha256 of each pin's sdist and each base wheel.

    A new entry is checked and held in memory (:meth:`check_or_record`) and written by
    :meth:`commit`, which the build calls only once the wheel is built (before dist/; a checkout or a
    review once the sdist has unpacked cleanly): a truncated, unsafe or killed fetch never
    leaves a hash behind that would refuse the right file afterwards."""

    def __init__(self, path: Path = PINS_LOCK) -> None:
        self.path = path
        self._staged: dict[str, dict[str, LockedSdist]] = {"vllm": {}, "base-wheel": {}}

    def _read(self, table: str = "vllm") -> dict[str, dict[str, object]]:
        """The ``[vllm."<pin>"]`` tables (or ``[base-wheel."<file>"]``), each checked to have a
        text ``sha256`` (and, for a pin, a text ``filename``)."""
        entries = read_toml(self.path).get(table, {})
        if not isinstance(entries, dict):
            raise ForkError(f"{self.path}: '{table}' must be a table; restore the file from git.")
        for name, entry in entries.items():
            if not (
                isinstance(entry, dict)
                and (table != "vllm" or isinstance(entry.get("filename"), str))
                and isinstance(entry.get("sha256"), str)
            ):
                what = f"vllm {name}" if table == "vllm" else f"the base wheel {name}"
                needs = 'filename = "..." and sha256 = "..."' if table == "vllm" else 'sha256 = "..."'
                raise ForkError(
                    f"{self.path}: the entry of {what} ({entry!r}) needs {needs}. Restore the file "
                    f"from git (git checkout -- {self.path.name}), or delete the entry to record it again."
                )
        return dict(entries)

    def pinned(self) -> list[str]:
        """The pins recorded, as spelled in the file."""
        return [name for name in self._read() if _is_version(name)]

    def get(self, pin: Pin) -> LockedSdist | None:
        entry = self._read().get(str(pin))
        if entry is None:
            return self._staged["vllm"].get(str(pin))
        return LockedSdist(str(entry["filename"]), str(entry["sha256"]))

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
        self._staged["vllm"][str(pin)] = sdist
        return True

    def staged(self) -> list[str]:
        """The names of the entries held back for :meth:`commit` (not in the file yet)."""
        return [*self._staged["vllm"], *self._staged["base-wheel"]]

    def commit(self) -> list[str]:
        """Write the entries :meth:`check_or_record` and :meth:`check_or_record_base_wheel`
        held back; return their names (empty when there were none)."""
        if not any(self._staged.values()):
            return []
        vllm = self._read()
        for name, sdist in self._staged["vllm"].items():
            vllm.setdefault(name, _entry(sdist, with_filename=True))
        wheels = self._read("base-wheel")
        for name, wheel in self._staged["base-wheel"].items():
            wheels.setdefault(name, _entry(wheel, with_filename=False))
        self._write(
            vllm=dict(sorted(vllm.items(), key=lambda kv: Version(kv[0]))),
            base_wheel=dict(sorted(wheels.items())),
        )
        names = [*self._staged["vllm"], *self._staged["base-wheel"]]
        self._staged = {"vllm": {}, "base-wheel": {}}
        return names

    def base_wheels(self) -> list[str]:
        """The file names of every base wheel recorded."""
        return [*self._read("base-wheel"), *self._staged["base-wheel"]]

    def get_base_wheel(self, filename: str) -> LockedSdist | None:
        """A ``--base-wheel`` file recorded under ``[base-wheel."<file name>"]``."""
        entry = self._read("base-wheel").get(filename)
        if entry is None:
            return self._staged["base-wheel"].get(filename)
        return LockedSdist(filename, str(entry["sha256"]))

    def check_or_record_base_wheel(self, wheel: LockedSdist) -> bool:
        """Record a new base wheel, or verify a known one (by file name). True when newly recorded."""
        known = self.get_base_wheel(wheel.filename)
        if known is not None:
            if known.sha256 != wheel.sha256:
                raise SourceHashMismatch(
                    f"the base wheel {wheel.filename} has sha256 {wheel.sha256}, but {self.path.name} "
                    f"recorded {known.sha256} for it. Nothing was built. Use the file the lock was made "
                    f"from, or, after review, remove its entry from {self.path.name} by hand."
                )
            return False
        self._staged["base-wheel"][wheel.filename] = wheel
        return True

    def _write(
        self,
        vllm: dict[str, dict[str, object]] | None = None,
        base_wheel: dict[str, dict[str, object]] | None = None,
    ) -> None:
        header = (
            "# sha256 of each pinned vLLM sdist and of each --base-wheel file (by file name), recorded\n"
            "# once the first wheel built from it is in dist/. A later file with another hash is refused.\n"
        )
        tables = {
            "vllm": vllm if vllm is not None else self._read(),
            "base-wheel": base_wheel if base_wheel is not None else self._read("base-wheel"),
        }
        import tomli_w  # here: most runs only read pins.lock

        write_atomic(self.path, header + tomli_w.dumps({k: v for k, v in tables.items() if v}))
