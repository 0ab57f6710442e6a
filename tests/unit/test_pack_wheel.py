"""The wheel packer: same files, same bytes; RECORD right; the environment untouched."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from vllm_rbln_fork.wheel import pack_wheel

EPOCH = 1_700_000_000


def _tree(root: Path, mtime: int) -> Path:
    files = {
        "vllm/__init__.py": "x = 1\n",
        "vllm/core/gate.py": "def f(): pass\n",
        "vllm-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 1.0\n",
        "vllm-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (mtime, mtime))
    return root


def test_same_files_give_the_same_bytes_and_the_environment_is_untouched(tmp_path) -> None:
    before = dict(os.environ)
    a = pack_wheel(_tree(tmp_path / "a", 1), tmp_path / "a.whl", EPOCH)
    b = pack_wheel(_tree(tmp_path / "b", 2_000_000_000), tmp_path / "b.whl", EPOCH)
    assert a.read_bytes() == b.read_bytes()
    assert dict(os.environ) == before


def test_record_lists_every_entry_with_its_hash_and_comes_last(tmp_path) -> None:
    wheel = pack_wheel(_tree(tmp_path / "t", 1), tmp_path / "t.whl", EPOCH)
    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        assert names[-1] == "vllm-1.0.dist-info/RECORD"
        assert names[:2] == ["vllm/__init__.py", "vllm/core/gate.py"]  # dist-info after the package
        rows = list(csv.reader(io.StringIO(zf.read(names[-1]).decode())))
        for name, digest, size in rows[:-1]:
            data = zf.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={expected}", str(len(data)))
        assert [r[0] for r in rows] == names and rows[-1] == [names[-1], "", ""]
        assert {i.date_time for i in infos} == {time.gmtime(EPOCH)[:6]}
        assert {i.external_attr >> 16 for i in infos} == {0o100644}


def _manifest():
    from vllm_rbln_fork.manifest import BuildManifest, PatchRecord

    patch = PatchRecord("add-rbln-padding.patch", "0" * 64, "rbln", "Add RBLN padding")
    return BuildManifest(
        *("1.0", "1.0+rbln.1", 1, "index", "vllm-1.0.tar.gz", "1" * 64, "2" * 40, "3" * 40, "4" * 40),
        *("1.0", EPOCH, "0.1.0", (patch,), ()),
    )


def _raw_wheel(path: Path, *, stored: str = "") -> Path:
    """A wheel as setuptools writes one: deflated at zlib's default level, tagged for one
    CPython, with a RECORD of its own."""
    files = {
        "vllm/__init__.py": b"x = 1\n" * 50,
        "vllm/core/gate.py": b"def f(): pass\n" * 20,
        "vllm-1.0+rbln.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 1.0+rbln.1\n",
        "vllm-1.0+rbln.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n"
        ),
        "vllm-1.0+rbln.1.dist-info/RECORD": b"whatever setuptools wrote\n",
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data, compress_type=zipfile.ZIP_STORED if name == stored else None)
    return path


def test_repack_copies_entries_still_deflated_and_gives_the_bytes_of_a_full_repack(tmp_path) -> None:
    from vllm_rbln_fork.manifest import module_source
    from vllm_rbln_fork.wheel import MANIFEST_MODULE, repack_pure

    manifest = _manifest()
    for stored in ("", "vllm/core/gate.py"):  # a stored entry is deflated like a new one
        raw = _raw_wheel(tmp_path / f"raw{bool(stored)}.whl", stored=stored)
        out = tmp_path / f"out{bool(stored)}"
        out.mkdir()
        fast = repack_pure(raw, "1.0+rbln.1", EPOCH, manifest, out)
        # The reference: extract, rewrite WHEEL, drop RECORD, add the manifest, pack_wheel.
        ref = tmp_path / f"ref{bool(stored)}"
        with zipfile.ZipFile(raw) as zf:
            zf.extractall(ref)
        wheel_file = ref / "vllm-1.0+rbln.1.dist-info" / "WHEEL"
        wheel_file.write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        (ref / "vllm-1.0+rbln.1.dist-info" / "RECORD").unlink()
        (ref / MANIFEST_MODULE).write_text(module_source(manifest))
        expected = pack_wheel(ref, tmp_path / f"ref{bool(stored)}.whl", EPOCH)
        assert fast.name == "vllm-1.0+rbln.1-py3-none-any.whl"
        assert fast.read_bytes() == expected.read_bytes()


def test_repack_refuses_a_damaged_entry(tmp_path) -> None:
    from vllm_rbln_fork.wheel import repack_pure

    raw = _raw_wheel(tmp_path / "raw.whl")
    data = bytearray(raw.read_bytes())
    with zipfile.ZipFile(raw) as zf:
        info = zf.getinfo("vllm/__init__.py")
    data[info.header_offset + 30 + len(info.filename) + 2] ^= 0xFF  # inside the deflated bytes
    raw.write_bytes(bytes(data))
    with pytest.raises((zipfile.BadZipFile, zlib.error)):
        repack_pure(raw, "1.0+rbln.1", EPOCH, _manifest(), tmp_path)
