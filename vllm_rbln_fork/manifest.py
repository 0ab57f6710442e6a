"""The build manifest: what went into a wheel, beside it in dist/ and inside it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

# How the source was obtained, and the wheel's own name and hash: beside the wheel only.
# Inside, the manifest holds what the wheel is made of (the sdist's hash, the commits, the
# series), so the same inputs give the same bytes however the sdist was fetched.
BESIDE_ONLY = ("source_kind", "source_file", "wheel_file", "wheel_sha256")


@dataclass(frozen=True)
class PatchRecord:
    name: str
    sha256: str
    origin: str
    subject: str
    reason: str = ""  # why it was dropped; empty for an applied patch


@dataclass(frozen=True)
class BuildManifest:
    pin: str
    wheel_version: str
    fork_release: int
    source_kind: str
    source_file: str
    source_sha256: str
    upstream_commit: str
    patched_commit: str
    patched_tree: str
    series_exported_against: str
    source_date_epoch: int
    tool_version: str
    applied: tuple[PatchRecord, ...]
    dropped: tuple[PatchRecord, ...]
    wheel_file: str = ""
    wheel_sha256: str = ""  # only in the copy beside the wheel: a file cannot hold its own hash
    base_wheel_file: str = ""  # --base-wheel: the binary vLLM wheel under the patched Python
    base_wheel_sha256: str = ""
    # The base's device ("cpu" for vLLM's CPU build): the series' platform patch reads it,
    # since our version label no longer says +cpu. Empty for the pure wheel.
    base_wheel_device: str = ""
    schema: int = field(default=1)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    def inside_json(self) -> str:
        """The manifest as the wheel carries it (without the fields of ``BESIDE_ONLY``)."""
        data = {k: v for k, v in asdict(self).items() if k not in BESIDE_ONLY}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BuildManifest:
        data = json.loads(text)
        data["applied"] = tuple(PatchRecord(**p) for p in data["applied"])
        data["dropped"] = tuple(PatchRecord(**p) for p in data["dropped"])
        return cls(**data)


def module_source(manifest: BuildManifest) -> str:
    """``vllm/_rbln_build.py``: the manifest (inside form), importable from the installed vllm."""
    return (
        '"""How this RBLN build of vLLM was made (written by vllm-rbln-fork; do not edit)."""\n\n'
        "import json\n\n"
        f"MANIFEST_JSON = {manifest.inside_json()!r}\n"
        "MANIFEST = json.loads(MANIFEST_JSON)\n"
    )
