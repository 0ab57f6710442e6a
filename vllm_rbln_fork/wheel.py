"""Build the patched tree into a reproducible, pure ``py3-none-any`` wheel."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.metadata import parse_email

from . import proc
from .errors import WheelError
from .manifest import BuildManifest, module_source

COMPILED_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".o", ".a", ".exe")
MANIFEST_MODULE = "vllm/_rbln_build.py"
ZIP_EPOCH_MIN = 315532800  # 1980-01-01: a zip file cannot say an earlier time


def build_env(version: str, epoch: int) -> dict[str, str]:
    """Everything that must be fixed for two builds to give the same bytes."""
    # PYTHONPATH goes too: this repo's build.py would shadow pypa's ``build``.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_", "SETUPTOOLS_SCM")) and k != "PYTHONPATH"
    }
    env.update(
        VLLM_TARGET_DEVICE="empty",
        VLLM_VERSION_OVERRIDE=version,
        SOURCE_DATE_EPOCH=str(epoch),
        LC_ALL="C.UTF-8",
        TZ="UTC",
        PYTHONHASHSEED="0",
    )
    return env


def build_wheel(tree: Path, version: str, epoch: int, manifest: BuildManifest, out_dir: Path) -> Path:
    """Build ``tree`` with vLLM's own setup.py (no kernels), then make it the wheel we ship."""
    old_umask = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=out_dir) as tmp:
            raw_dir = Path(tmp) / "raw"
            proc.run(
                # --skip-dependency-check: the build lock holds what an empty build uses, not
                # cmake and ninja (vLLM's build-system.requires), which only compile kernels;
                # nor torch 2.14.0, which 0.33.0 requires to build (the empty build reads only
                # the version of the local CPU torch 2.13.0).
                [
                    *(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check"),
                    *("--outdir", raw_dir, tree),
                ],
                env=build_env(version, epoch),
                cwd=tree,
                hint="vLLM's setup.py failed on the patched tree; its output is above.",
            )
            raw = _single_wheel(raw_dir)
            return repack_pure(raw, version, epoch, manifest, out_dir, Path(tmp) / "unpacked")
    finally:
        os.umask(old_umask)


def _single_wheel(directory: Path) -> Path:
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise WheelError(f"the build produced {len(wheels)} wheels in {directory}, expected one.")
    return wheels[0]


def repack_pure(
    raw: Path, version: str, epoch: int, manifest: BuildManifest, out_dir: Path, scratch: Path
) -> Path:
    """Check ``raw`` has no compiled file, add the manifest, retag ``py3-none-any``.

    vLLM tags even a kernel-less build for one CPython and platform; we check that it
    really is pure and say so in the tag, so one wheel serves every server.
    """
    with zipfile.ZipFile(raw) as zf:
        names = zf.namelist()
        compiled = [n for n in names if n.endswith(COMPILED_SUFFIXES)]
        if compiled:
            raise WheelError(
                f"the wheel contains compiled files ({', '.join(compiled[:5])}); an RBLN build must "
                f"be pure Python (VLLM_TARGET_DEVICE=empty). Refusing to tag it py3-none-any."
            )
        zf.extractall(scratch)
    dist_info = _only(scratch.glob("*.dist-info"), "dist-info directory")
    metadata_version = _metadata_version(dist_info / "METADATA")
    if metadata_version != version:
        raise WheelError(
            f"vLLM's setup.py built version {metadata_version}, not {version}: it no longer "
            f"honours VLLM_VERSION_OVERRIDE. Check setup.py's get_vllm_version() for this pin."
        )
    wheel_meta = dist_info / "WHEEL"
    kept = [
        line
        for line in wheel_meta.read_text().splitlines()
        if line.strip() and not line.startswith(("Tag:", "Root-Is-Purelib:"))
    ]
    wheel_meta.write_text("\n".join([*kept, "Root-Is-Purelib: true", "Tag: py3-none-any"]) + "\n")
    (dist_info / "RECORD").unlink()
    (scratch / MANIFEST_MODULE).write_text(module_source(manifest))
    name = dist_info.name.removesuffix(".dist-info")  # vllm-<version>
    return pack_wheel(scratch, out_dir / f"{name}-py3-none-any.whl", epoch)


def pack_wheel(src: Path, target: Path, epoch: int) -> Path:
    """Zip an unpacked wheel at ``src`` into ``target``, RECORD regenerated: entries in sorted
    order with the .dist-info files last and RECORD at the very end (as the wheel spec
    recommends), each stamped ``epoch`` with mode 0644 (0755 if executable): same files,
    same bytes."""
    dist_info = _only(src.glob("*.dist-info"), "dist-info directory")
    record = f"{dist_info.name}/RECORD"
    names = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    names = [n for n in names if n != record]
    names.sort(key=lambda n: n.startswith(f"{dist_info.name}/"))  # stable: dist-info last
    stamp = time.gmtime(max(epoch, ZIP_EPOCH_MIN))[:6]
    rows = []
    with zipfile.ZipFile(target, "w") as zf:
        for name in names:
            path = src / name
            data = path.read_bytes()
            _add(zf, name, data, stamp, executable=os.access(path, os.X_OK))
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((name, f"sha256={digest}", str(len(data))))
        rows.append((record, "", ""))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        _add(zf, record, text.getvalue().encode(), stamp, executable=False)
    return target


def _add(zf: zipfile.ZipFile, name: str, data: bytes, stamp: tuple[int, ...], *, executable: bool) -> None:
    info = zipfile.ZipInfo(name, date_time=stamp)  # type: ignore[arg-type]
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def _only(paths: object, what: str) -> Path:
    found = list(paths)  # type: ignore[call-overload]
    if len(found) != 1:
        raise WheelError(f"the wheel has {len(found)} {what}s, expected one.")
    return Path(found[0])


def _metadata_version(path: Path) -> str:
    """The Version field of a METADATA file (parsed by packaging.metadata, as publish reads it)."""
    raw, _ = parse_email(path.read_bytes())
    if "version" not in raw:
        raise WheelError(f"{path.name} has no Version field.")
    return raw["version"]
