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
        return self.root / "series"

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
    def dist_dir(self) -> Path:
        return self.root / "dist"

    @property
    def work_dir(self) -> Path:
        """Where checkouts and conflict trees go (ignored by git)."""
        return self.root / "work"
