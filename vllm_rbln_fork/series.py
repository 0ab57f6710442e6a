"""The patch series: ``series`` (quilt format) and ``patches/*.patch`` (git format-patch mbox).

Each patch's commit message ends in DEP-3-style trailers::

    Origin: backport, vllm-project/vllm#63288    (or: Origin: rbln)
    Applied-Upstream: 0.34.0                      (optional: drop at or past this pin)
    Forwarded: no                                 (optional)
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .errors import BadPin, SeriesError
from .paths import PROJECT_ROOT
from .pins import Pin

SERIES_FILE = PROJECT_ROOT / "series"
PATCHES_DIR = PROJECT_ROOT / "patches"
EXPORTED_AGAINST_HEADER = "Exported-Against"  # a patch's mail header: Patch.exported_against
EXPORTED_AGAINST_LINE = re.compile(rf"^{EXPORTED_AGAINST_HEADER}:(.*)$", re.M | re.I)
EXPORTED_AGAINST = re.compile(r"^#\s*Exported-Against:\s*vllm\s+(\S+)\s*$")
TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s+(.*\S)\s*$")
ORIGIN_KINDS = ("backport", "rbln")


@dataclass(frozen=True)
class Patch:
    name: str  # the file name; also the patch's identity across pins
    sha256: str
    description: str
    trailers: tuple[tuple[str, str], ...]
    body: str  # the commit message below the subject, verbatim (description and trailers)
    text: str  # the whole file, as git format-patch wrote it
    path: str = ""  # where in patches/: the name, or "<pin>/<name>" for a pin's own form

    @property
    def entry(self) -> str:
        """The line of ``series`` that names it."""
        return self.path or self.name

    @cached_property
    def _header(self) -> tuple[str, str, str]:
        """(From, Date, Subject) of the mail header, decoded (RFC 2047) and unfolded. Parsed
        on first use: a cache hit needs only the patches' bytes and trailers, and importing
        and running the email parser was a tenth of its time."""
        import email
        import email.policy

        header_text = self.text.partition("\n\n")[0]
        msg = email.message_from_string(header_text + "\n\n", policy=email.policy.default)
        subject = " ".join(str(msg.get("Subject", "")).split())
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
        return str(msg.get("From", "")), str(msg.get("Date", "")), subject

    @property
    def author(self) -> str:
        return self._header[0]

    @property
    def date(self) -> str:
        return self._header[1]

    @property
    def subject(self) -> str:
        return self._header[2]

    @property
    def exported_against(self) -> Pin | None:
        """The pin whose tree the patch's hunks and blob ids come from (its mail header
        ``Exported-Against: vllm <pin>``, written by export), or None in a patch without
        one. A shared patch that does not apply to another pin as it stands is merged
        there from this pin's build of it (apply.commit_series_on)."""
        # A plain ASCII line export writes: read without the email parser (a cache hit's
        # key names the homes, see pipeline.home_parts).
        found = EXPORTED_AGAINST_LINE.search(self.text.partition("\n\n")[0])
        if found is None:
            return None
        value = found.group(1).strip()
        version = value.removeprefix("vllm").strip()
        try:
            return Pin.parse(version)
        except BadPin:
            raise SeriesError(
                f"patches/{self.entry} has '{EXPORTED_AGAINST_HEADER}: {value}' in its mail header; "
                f"it must be 'vllm <version>', as export writes it. Fix the line or export again."
            ) from None

    def trailer(self, key: str) -> str | None:
        for k, v in self.trailers:
            if k.lower() == key.lower():
                return v
        return None

    @property
    def origin_kind(self) -> str | None:
        origin = self.trailer("Origin")
        return origin.split(",")[0].strip().lower() if origin else None

    @property
    def origin_ref(self) -> str | None:
        origin = self.trailer("Origin")
        if not origin or "," not in origin:
            return None
        return origin.split(",", 1)[1].strip() or None

    @property
    def applied_upstream(self) -> Version | None:
        value = self.trailer("Applied-Upstream")
        return Version(value) if value else None

    @property
    def is_backport(self) -> bool:
        return self.origin_kind == "backport"

    @property
    def message(self) -> str:
        """The commit message, as ``git am`` would make it."""
        return f"{self.subject}\n\n{self.body}\n" if self.body else f"{self.subject}\n"


@dataclass(frozen=True)
class Series:
    exported_against: Pin
    patches: tuple[Patch, ...]
    stray_files: tuple[str, ...]  # patches/*.patch that the series does not name

    @property
    def fingerprint(self) -> str:
        """sha256 over the series order and every patch's bytes: part of the wheel cache key."""
        digest = hashlib.sha256(str(self.exported_against).encode())
        for patch in self.patches:
            digest.update(f"\0{patch.name}\0{patch.sha256}".encode())
        return digest.hexdigest()


def _utf8(data: bytes, where: str, way_out: str) -> str:
    """``data`` as text; a byte that is not UTF-8 is a SeriesError naming ``where``, its line and
    ``way_out``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SeriesError(
            f"{where}, line {line}: byte {data[exc.start]:#04x} is not UTF-8; {way_out}"
        ) from None


def parse_patch(name: str, data: bytes, path: str = "") -> Patch:
    """Parse one ``git format-patch`` file; raise SeriesError naming it if it is not one."""
    text = _utf8(
        data,
        f"patches/{name}",
        "a patch is UTF-8 text, as export writes it. Re-export it from its work tree ('python "
        f"build.py export'), or restore it from git (git checkout -- patches/{name}).",
    )
    if not text.startswith("From ") or "\ndiff --git " not in text:
        raise SeriesError(
            f"patches/{name} is not a git format-patch file (it must start with a 'From ' line "
            f"and contain a 'diff --git'). Re-export it with 'python build.py export'."
        )
    body = message_of(text.partition("\n\n")[2])
    description, trailers = _split_trailers(body)
    return Patch(
        name=name,
        sha256=hashlib.sha256(data).hexdigest(),
        description=description,
        trailers=trailers,
        body=body,
        text=text,
        path=path if path != name else "",
    )


# The end of a patch's message: the diffstat git format-patch writes without --no-stat
# ("---", then indented lines: " path | 2 +-", " 1 file changed"), before the diff.
STAT = re.compile(r"\n---\n(?:[ \t][^\n]*\n|\n)*\Z")


def message_of(rest: str) -> str:
    """The commit message below the subject of a format-patch file (``rest``: all after the
    header): up to the first ``diff --git`` line, less a diffstat. A ``---`` line of the
    message itself is kept (export writes no diffstat: --no-stat)."""
    body = rest.split("\ndiff --git ", 1)[0] if not rest.startswith("diff --git ") else ""
    return STAT.sub("\n", body + "\n").strip("\n")


def _split_trailers(body: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    paragraphs = body.split("\n\n")
    last = paragraphs[-1].strip().splitlines() if paragraphs else []
    matches = [TRAILER.match(line) for line in last]
    if last and all(matches):
        trailers = tuple((m.group(1), m.group(2)) for m in matches if m)
        return "\n\n".join(paragraphs[:-1]).strip(), trailers
    return body.strip(), ()


def lint(patch: Patch) -> list[str]:
    """What is wrong with a patch's metadata; empty when it may be built."""
    problems = []
    kind = patch.origin_kind
    if kind is None:
        problems.append("it has no 'Origin:' trailer (Origin: backport, <upstream PR> or Origin: rbln)")
    elif kind not in ORIGIN_KINDS:
        problems.append(f"its Origin kind {kind!r} is not one of {', '.join(ORIGIN_KINDS)}")
    if len(patch.description.split()) < 5:
        problems.append("its message has no description of why it exists (a paragraph under the subject)")
    if kind == "backport" and not patch.origin_ref:
        problems.append(
            "a backport must name what it backports ('Origin: backport, vllm-project/vllm#NNNNN'): "
            "that is how the build knows when it goes"
        )
    if (value := patch.trailer("Applied-Upstream")) is not None:
        try:
            Version(value)
        except InvalidVersion:
            problems.append(f"'Applied-Upstream: {value}' is not a version")
    return problems


def read_series_names(series_file: Path = SERIES_FILE) -> tuple[Pin, list[str]]:
    """The series file alone: its Exported-Against pin and the patch names, in order (the
    patch files are not read); every problem is a SeriesError naming the line."""
    if not series_file.exists():
        raise SeriesError(f"{series_file} does not exist. It lists the patches of the fork, one per line.")
    exported_against: Pin | None = None
    names: list[str] = []
    text = _utf8(
        series_file.read_bytes(),
        series_file.name,
        "a series file is UTF-8 text, as export writes it. Fix that line, or restore the file "
        f"from git (git checkout -- {series_file.name}).",
    )
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if match := EXPORTED_AGAINST.match(line):
            try:
                exported_against = Pin.parse(match.group(1))
            except BadPin as exc:
                raise SeriesError(f"{series_file.name} line {number}: {exc}") from None
            continue
        if not line or line.startswith("#"):
            continue
        entry = line.split()[0]  # quilt allows options after the name; we take none
        if len(line.split()) > 1:
            raise SeriesError(
                f"{series_file.name} line {number}: {line!r}: patch options are not supported; "
                f"give one patch file name per line."
            )
        if not _valid_entry(entry):
            raise SeriesError(
                f"{series_file.name} line {number}: {entry!r} is not a patch file name in patches/ "
                f"(a plain name ending in .patch, or <pin>/<name>.patch for a pin's own form)."
            )
        if entry.rsplit("/", 1)[-1] in [e.rsplit("/", 1)[-1] for e in names]:
            raise SeriesError(f"{series_file.name} line {number}: {entry} is listed twice.")
        names.append(entry)
    if exported_against is None:
        raise SeriesError(
            f"{series_file.name} has no '# Exported-Against: vllm <version>' header line; "
            f"'python build.py export' writes it."
        )
    return exported_against, names


def read_series(series_file: Path = SERIES_FILE, patches_dir: Path = PATCHES_DIR) -> Series:
    """Read and lint the series; every problem is a SeriesError naming the file and the fix."""
    exported_against, names = read_series_names(series_file)
    patches = []
    for entry in names:
        path = patches_dir / entry
        if not path.is_file():
            raise SeriesError(
                f"{series_file.name} names {entry}, but patches/{entry} does not exist. Restore the "
                f"file or remove the line from {series_file.name}."
            )
        patch = parse_patch(path.name, path.read_bytes(), entry)
        if problems := lint(patch):
            raise SeriesError(f"patches/{entry} fails lint: " + "; ".join(problems) + ".")
        patches.append(patch)
    stray = tuple(sorted(p.name for p in patches_dir.glob("*.patch") if p.name not in names))
    return Series(exported_against, tuple(patches), stray)


def _valid_entry(entry: str) -> bool:
    """``name.patch``, or ``<pin>/name.patch`` (a pin's own form of the patch)."""
    parts = entry.split("/")
    if len(parts) > 2 or not parts[-1].endswith(".patch") or any(p.startswith(".") or not p for p in parts):
        return False
    if len(parts) == 2:
        try:
            Pin.parse(parts[0])
        except BadPin:
            return False
    return True


def render_series(exported_against: Pin, names: list[str]) -> str:
    """The series file: a header recording the pin, then one entry (``name`` or ``<pin>/name``) a line."""
    header = (
        "# The RBLN patch series for vLLM, applied in this order (quilt format:\n"
        "# one file of patches/ per line). Written by 'python build.py export'.\n"
        f"# Exported-Against: vllm {exported_against}\n"
    )
    return header + "".join(f"{name}\n" for name in names)
