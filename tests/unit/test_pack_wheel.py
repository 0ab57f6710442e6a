"""The wheel packer: same files, same bytes; RECORD right; the environment untouched."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import time
import zipfile
from pathlib import Path

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
