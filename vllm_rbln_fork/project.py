"""The files of a fork project: by default this repository; tests make their own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .paths import PROJECT_ROOT


@dataclass(frozen=True)
class Project:
    root: Path

    @classmethod
    def default(cls) -> Project:
        return cls(PROJECT_ROOT)

    @property
    def series_file(self) -> Path:
        """The one series of a single-series project (the synthetic ones in tests/tooling)."""
        return self.root / "series"

    @property
    def pins_file(self) -> Path:
        """``pins.toml``: the supported pins; with it, each has its own ``series/<pin>``."""
        return self.root / "pins.toml"

    @property
    def series_dir(self) -> Path:
        return self.root / "series"

    @property
    def rerere_dir(self) -> Path:
        """Recorded conflict resolutions (git rerere's rr-cache), kept in the repo."""
        return self.root / "rerere"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def pins_lock(self) -> Path:
        return self.root / "pins.lock"

    @property
    def base_wheel_policy(self) -> Path:
        """What a ``--base-wheel`` may differ in from the sdist, and its moved requirements."""
        return self.root / "base-wheel.toml"

    @property
    def releases_file(self) -> Path:
        return self.root / "fork-releases.toml"

    @property
    def lock_file(self) -> Path:
        """Held while a build records in ``fork-releases.toml`` and ``pins.lock`` and writes
        ``dist/``: one writer of the project at a time, whatever build cache each uses
        (ignored by git)."""
        return self.root / ".project.lock"

    @property
    def dist_dir(self) -> Path:
        return self.root / "dist"

    @property
    def work_dir(self) -> Path:
        """Where checkouts and conflict trees go (ignored by git)."""
        return self.root / "work"
