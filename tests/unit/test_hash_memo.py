"""A remembered sha256 is only trusted while the file is unchanged."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from vllm_rbln_fork.files import remember_sha256, sha256_remembered


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    path = tmp_path / "big.tar.gz"
    path.write_bytes(b"a" * 1000)
    memo = tmp_path / "memo"
    assert sha256_remembered(path, memo) == _sha(b"a" * 1000)
    remember_sha256(path, "0" * 64, memo)  # what the memo says is what an unchanged file gets
    assert sha256_remembered(path, memo) == "0" * 64


def test_same_size_and_mtime_but_other_bytes_is_hashed_again(tmp_path: Path) -> None:
    # Only the ctime tells this edit apart: same size, mtime put back as it was.
    path = tmp_path / "big.tar.gz"
    path.write_bytes(b"a" * 1000)
    memo = tmp_path / "memo"
    assert sha256_remembered(path, memo) == _sha(b"a" * 1000)
    st = path.stat()
    with path.open("r+b") as f:
        f.write(b"b")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    assert sha256_remembered(path, memo) == _sha(b"b" + b"a" * 999)


def test_a_file_replaced_by_another_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "w.whl"
    path.write_bytes(b"one")
    memo = tmp_path / "memo"
    assert sha256_remembered(path, memo) == _sha(b"one")
    other = tmp_path / "other"
    other.write_bytes(b"two")
    os.replace(other, path)
    assert sha256_remembered(path, memo) == _sha(b"two")
