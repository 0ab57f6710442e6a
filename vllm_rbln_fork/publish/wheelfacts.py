"""What the index needs to know about a wheel, read from its bytes and refused if malformed."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.metadata import parse_email
from packaging.utils import InvalidWheelFilename, NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ..errors import IndexConflict, WheelError
from ..files import sha256_of


@dataclass(frozen=True)
class WheelFacts:
    """What the index needs to know about one wheel, read from its bytes."""

    filename: str
    name: NormalizedName
    version: Version
    sha256: str
    size: int
    metadata: bytes  # the wheel's .dist-info/METADATA, unchanged
    requires_python: str | None

    @property
    def metadata_sha256(self) -> str:
        return hashlib.sha256(self.metadata).hexdigest()


def read_wheel(wheel: Path) -> WheelFacts:
    """Name, version, hashes and core metadata of ``wheel``; refuse anything malformed."""
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise WheelError(
            f"{wheel.name} is not a wheel file name ({exc}); only wheels are published."
        ) from None
    if not wheel.is_file():
        raise WheelError(f"{wheel} does not exist; build it first (python build.py --pin ...).")
    try:
        with zipfile.ZipFile(wheel) as zf:
            metadata_names = [
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            ]
            if len(metadata_names) != 1:
                raise WheelError(
                    f"{wheel.name} has {len(metadata_names)} .dist-info/METADATA files, expected one; "
                    f"it is not a valid wheel."
                )
            metadata = zf.read(metadata_names[0])
    except zipfile.BadZipFile:
        raise WheelError(f"{wheel} is not a zip file; it is not a valid wheel.") from None
    raw, _ = parse_email(metadata)
    meta_name, meta_version = raw.get("name", ""), raw.get("version", "")
    if canonicalize_name(meta_name) != name or not meta_version or Version(meta_version) != version:
        raise WheelError(
            f"{wheel.name} says {meta_name} {meta_version} in its METADATA but {name} {version} in "
            f"its file name; refusing to publish a wheel that contradicts itself."
        )
    digest, size = sha256_of(wheel), wheel.stat().st_size
    return WheelFacts(
        filename=wheel.name,
        name=name,
        version=version,
        sha256=digest,
        size=size,
        metadata=metadata,
        requires_python=raw.get("requires_python"),
    )


def is_pure(filename: str) -> bool:
    """A pure-Python wheel (``py3-none-any``), as opposed to a binary one (platform tags)."""
    tags = parse_wheel_filename(filename)[3]
    return all(tag.abi == "none" and tag.platform == "any" for tag in tags)


def check_kinds(facts: WheelFacts, published: list[str], where: str) -> None:
    """Refuse a pure and a binary wheel of one version in one index: pip takes the binary
    one whenever its tags fit, so ``vllm==<version>`` would not say which was installed."""
    kind = "pure" if is_pure(facts.filename) else "binary"
    for other in sorted(published):
        try:
            name, version, _, _ = parse_wheel_filename(other)
        except InvalidWheelFilename:
            continue
        if name == facts.name and version == facts.version and str(version) != str(facts.version):
            raise IndexConflict(
                f"{where} already has {other}, of {facts.name} {version}, which PEP 440 holds equal "
                f"to {facts.version} ({facts.filename}): 'pip install {facts.name}=={facts.version}' "
                f"could get either. One version has one spelling; build with the sdist's own "
                f"spelling of the pin (--pin {version.public}). Nothing was published."
            )
        if name == facts.name and version == facts.version and is_pure(other) != (kind == "pure"):
            other_kind = "pure" if kind == "binary" else "binary"
            raise IndexConflict(
                f"{where} already has {other}, the {other_kind} wheel of {facts.name} {facts.version}, "
                f"and {facts.filename} is the {kind} one. pip prefers a binary wheel over a pure one "
                f"of the same version wherever its tags fit, so 'pip install {facts.name}=={facts.version}' "
                f"would not say which one a server gets. Publish pure and binary wheels to separate "
                f"indexes (e.g. DEST/pure and DEST/cpu). Nothing was published."
            )
