"""Build the patched tree into a reproducible, pure ``py3-none-any`` wheel."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import struct
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from packaging.metadata import parse_email

from . import proc
from .errors import WheelError
from .manifest import BuildManifest, module_source

COMPILED_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".o", ".a", ".exe")
MANIFEST_MODULE = "vllm/_rbln_build.py"
HOOK_RUNNER = Path(__file__).with_name("hook_runner.py")
LOCAL_HEADER = struct.Struct("<4s22xHH")  # a zip entry's local header: signature ... name and extra lengths
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
    """Build ``tree`` with vLLM's own setup.py (no kernels), then make it the wheel we ship.

    The backend's ``build_wheel`` hook is called as ``python -m build --wheel --no-isolation
    --skip-dependency-check`` calls it (pyproject_hooks, in a subprocess of its own), without
    that front end's own interpreter; and a setuptools backend writes its wheel uncompressed
    (``--compression=stored``), since :func:`repack_pure` deflates every entry anyway: each
    file is deflated once, as in a plain ``pip wheel``, not deflated, inflated and copied.
    setuptools' two copies of the tree's files (``build_py``, ``install_lib``) are hard links
    (:mod:`vllm_rbln_fork.hook_runner`)."""
    # pyproject_hooks (what ``build`` calls the hooks with), not ``build.ProjectBuilder``:
    # inside this project's tool process ``import build`` finds the repository's build.py.
    from pyproject_hooks import BackendUnavailable, BuildBackendHookCaller, HookMissing

    backend, backend_path = _build_backend(tree)
    env = build_env(version, epoch)
    hint = "vLLM's setup.py failed on the patched tree; its output is above."

    # The hook runs as pyproject_hooks runs it (cmd: python, its _in_process script, the hook,
    # its control folder), through hook_runner, which makes setuptools' copies hard links.
    links = ["--link-copies"] if backend.startswith("setuptools.") else []

    writable = [tree]  # and the wheel's temporary folder, below
    cage_root = os.environ.get(CAGE_ENV)  # the watcher's: vLLM's setup.py is unreviewed

    def runner(
        cmd: Sequence[str], cwd: str | None = None, extra_environ: Mapping[str, str] | None = None
    ) -> None:
        wrapped = [cmd[0], str(HOOK_RUNNER), *links, *cmd[1:]]
        where = Path(cwd) if cwd else tree
        hook_env = {**env, **(extra_environ or {})}
        if cage_root:  # its environment is the one the cage's command line gives
            proc.run(_caged_hook(wrapped, where, hook_env, Path(cage_root), writable), cwd=where, hint=hint)
            return
        proc.run(wrapped, cwd=where, env=hook_env, hint=hint)

    # --skip-dependency-check, as before: the build lock holds what an empty build uses, not
    # cmake and ninja (vLLM's build-system.requires), which only compile kernels; nor torch
    # 2.14.0, which 0.33.0 requires to build (the empty build reads only the version of the
    # local CPU torch 2.13.0). So no get_requires_for_build_wheel hook is called.
    settings = {"--build-option": ["--compression=stored"]} if backend.startswith("setuptools.") else None
    old_umask = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=out_dir) as tmp:
            raw_dir = Path(tmp) / "raw"
            raw_dir.mkdir()
            writable.append(Path(tmp))
            caller = BuildBackendHookCaller(
                str(tree), backend, backend_path, runner=runner, python_executable=sys.executable
            )
            try:
                caller.build_wheel(str(raw_dir), settings)
            except (BackendUnavailable, HookMissing) as exc:
                raise WheelError(
                    f"the patched tree's build backend {backend!r} cannot build a wheel here ({exc}); "
                    f"the tool env's lock (requirements/build.lock) must hold it."
                ) from None
            raw = _single_wheel(raw_dir)
            return repack_pure(raw, version, epoch, manifest, out_dir)
    finally:
        os.umask(old_umask)


# Set by the watcher (watch.caged_env) to its cage folder: the build hook (vLLM's setup.py, the
# new release's unreviewed code) then runs in bubblewrap (docs/building.md, "The watcher's cage").
CAGE_ENV = "VLLM_RBLN_FORK_CAGE"
# What of the build's environment the caged hook gets: the variables that fix its bytes
# (build_env) and a PATH, nothing else of the caller's.
_HOOK_VARIABLES = ("PATH", "VLLM_TARGET_DEVICE", "VLLM_VERSION_OVERRIDE", "SOURCE_DATE_EPOCH", "LC_ALL", "TZ")


def _caged_hook(
    cmd: list[str], cwd: Path, env: Mapping[str, str], cage: Path, writable: list[Path]
) -> list[str]:
    """``cmd`` (the build hook) in the cage: the file system read-only but the tree, the wheel's
    temporary folder and the hook's control folder (its last argument); no network, no process
    of the caller's in sight, an environment of ``_HOOK_VARIABLES`` alone."""
    from .cage import caged
    from .paths import PROJECT_ROOT

    control = Path(cmd[-1])
    own = {k: env[k] for k in _HOOK_VARIABLES if k in env}
    own.update(
        {k: v for k, v in env.items() if k.startswith(("PEP517_", "_PYPROJECT_HOOKS"))},
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        HOME=str(control),
        TMPDIR=str(control),
    )
    return caged(cmd, cwd=cwd, env=own, readable=[PROJECT_ROOT, cage], writable=[*writable, control])


def _build_backend(tree: Path) -> tuple[str, list[str] | None]:
    """``tree``'s PEP 517 backend and backend-path, as ``build`` reads them from pyproject.toml
    (setuptools' legacy backend where it names none, or has no pyproject.toml)."""
    import tomllib

    pyproject = tree / "pyproject.toml"
    try:
        system = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("build-system", {})
    except FileNotFoundError:
        system = {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise WheelError(f"cannot read the patched tree's pyproject.toml ({exc}).") from None
    backend = system.get("build-backend") or "setuptools.build_meta:__legacy__"
    path = system.get("backend-path")
    return str(backend), [str(p) for p in path] if isinstance(path, list) else None


def _single_wheel(directory: Path) -> Path:
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise WheelError(f"the build produced {len(wheels)} wheels in {directory}, expected one.")
    return wheels[0]


def repack_pure(raw: Path, version: str, epoch: int, manifest: BuildManifest, out_dir: Path) -> Path:
    """Check ``raw`` has no compiled file, add the manifest, retag ``py3-none-any``.

    vLLM tags even a kernel-less build for one CPython and platform; we check that it
    really is pure and say so in the tag, so one wheel serves every server. The entries
    are laid out as :func:`pack_wheel` lays them out (the same bytes). A stored entry (the
    setuptools build writes its wheel stored: :func:`build_wheel`) is deflated here, once; a
    deflated one (another backend's) is copied still deflated, not extracted and deflated
    again. Each is read once, its CRC checked, and hashed for RECORD.
    """
    with zipfile.ZipFile(raw) as zf, raw.open("rb") as raw_file:
        infos = {i.filename: i for i in zf.infolist() if not i.is_dir()}
        compiled = [n for n in infos if n.endswith(COMPILED_SUFFIXES)]
        if compiled:
            raise WheelError(
                f"the wheel contains compiled files ({', '.join(compiled[:5])}); an RBLN build must "
                f"be pure Python (VLLM_TARGET_DEVICE=empty). Refusing to tag it py3-none-any."
            )
        tops = {n.split("/", 1)[0] for n in infos if "/" in n}
        dist_info = _only((t for t in tops if t.endswith(".dist-info")), "dist-info directory").name
        metadata_version = _metadata_version(zf.read(f"{dist_info}/METADATA"))
        if metadata_version != version:
            raise WheelError(
                f"vLLM's setup.py built version {metadata_version}, not {version}: it no longer "
                f"honours VLLM_VERSION_OVERRIDE. Check setup.py's get_vllm_version() for this pin."
            )
        kept = [
            line
            for line in zf.read(f"{dist_info}/WHEEL").decode().splitlines()
            if line.strip() and not line.startswith(("Tag:", "Root-Is-Purelib:"))
        ]
        written = {
            f"{dist_info}/WHEEL": (
                "\n".join([*kept, "Root-Is-Purelib: true", "Tag: py3-none-any"]) + "\n"
            ).encode(),
            MANIFEST_MODULE: module_source(manifest).encode(),
        }
        copied = {n: i for n, i in infos.items() if n not in written}
        target = out_dir / f"{dist_info.removesuffix('.dist-info')}-py3-none-any.whl"  # vllm-<version>
        return repack(target, zf, raw_file, copied, written, dist_info, epoch, executable=lambda _: False)


def repack(
    target: Path,
    source: zipfile.ZipFile,
    source_file: BinaryIO,
    kept: dict[str, zipfile.ZipInfo],
    written: dict[str, bytes],
    dist_info: str,
    epoch: int,
    *,
    executable: Callable[[str], bool],
) -> Path:
    """Write ``target``: the entries of ``source`` in ``kept`` (under their new names, the
    keys) and the ``written`` ones, laid out as :func:`pack_wheel` lays them out, RECORD
    regenerated. A kept entry stored deflated is copied still deflated (not inflated and
    deflated again); each is read once, its CRC checked, and hashed for RECORD."""
    record = f"{dist_info}/RECORD"
    names = sorted((set(kept) | set(written)) - {record})
    names.sort(key=lambda n: n.startswith(f"{dist_info}/"))  # stable: dist-info last
    stamp = time.gmtime(max(epoch, ZIP_EPOCH_MIN))[:6]
    rows = []
    with zipfile.ZipFile(target, "w") as out:
        for name in names:
            info = None if name in written else kept[name]
            data = written[name] if info is None else source.read(info)  # inflated, CRC checked
            if info is not None and info.compress_type == zipfile.ZIP_DEFLATED:
                _add_deflated(out, source_file, info, name, stamp, executable=executable(name))
            else:
                _add(out, name, data, stamp, executable=executable(name))
            rows.append((name, _record_digest(data), str(len(data))))
        _add(out, record, _record(rows, record), stamp, executable=False)
    return target


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record(rows: list[tuple[str, str, str]], record: str) -> bytes:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([*rows, (record, "", "")])
    return text.getvalue().encode()


def _add_deflated(
    out: zipfile.ZipFile,
    source: BinaryIO,
    info: zipfile.ZipInfo,
    name: str,
    stamp: tuple[int, ...],
    *,
    executable: bool,
) -> None:
    """Write ``info``'s entry of the zip file ``source`` into ``out`` as ``name``, still
    deflated, with the header :func:`_add` would write for it (stamp, mode 0644 or 0755): the
    same bytes ``_add`` gives when the entry was deflated by zlib at its default level, as
    setuptools does, without deflating it again.

    zipfile has no public call for this; this does what ``ZipFile.writestr`` does around
    its compressor (``_open_to_write`` and ``_ZipWriteFile.close``)."""
    source.seek(info.header_offset)
    signature, name_length, extra_length = LOCAL_HEADER.unpack(source.read(LOCAL_HEADER.size))
    if signature != b"PK\x03\x04":
        raise WheelError(f"the built wheel's entry {info.filename} has a bad local header.")
    source.seek(info.header_offset + LOCAL_HEADER.size + name_length + extra_length)
    deflated = source.read(info.compress_size)
    copy = zipfile.ZipInfo(name, date_time=stamp)  # type: ignore[arg-type]
    copy.external_attr = (0o100755 if executable else 0o100644) << 16
    copy.compress_type = zipfile.ZIP_DEFLATED
    copy.flag_bits = 0
    copy.CRC, copy.compress_size, copy.file_size = info.CRC, info.compress_size, info.file_size
    zip64 = copy.file_size * 1.05 > zipfile.ZIP64_LIMIT
    copy.header_offset = out.fp.tell()  # type: ignore[union-attr]
    out.fp.write(copy.FileHeader(zip64))  # type: ignore[union-attr]
    out.fp.write(deflated)  # type: ignore[union-attr]
    out.filelist.append(copy)
    out.NameToInfo[copy.filename] = copy
    out.start_dir = out.fp.tell()  # type: ignore[attr-defined,union-attr]
    out._didModify = True  # type: ignore[attr-defined]


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
            rows.append((name, _record_digest(data), str(len(data))))
        _add(zf, record, _record(rows, record), stamp, executable=False)
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


def _metadata_version(metadata: bytes) -> str:
    """The Version field of a METADATA file (parsed by packaging.metadata, as publish reads it)."""
    raw, _ = parse_email(metadata)
    if "version" not in raw:
        raise WheelError("the wheel's METADATA has no Version field.")
    return raw["version"]
