"""Which releases an unknown pin's error suggests: the version's neighbours, not the text's."""

from __future__ import annotations

from packaging.version import Version

from vllm_rbln_fork.index_client import nearby_releases

RELEASES = [
    Version(v)
    for v in ("0.8.5", "0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
]


def _names(version: str) -> list[str]:
    return [str(v) for v in nearby_releases(RELEASES, Version(version))]


def test_past_the_newest_the_newest_few() -> None:
    # Regression (issue 15): 9.9.9 was answered with 0.8.5, 0.9.0, 0.9.0.1, 0.9.1, 0.9.2.
    assert _names("9.9.9") == ["0.33.0", "0.32.0", "0.31.0", "0.30.0", "0.9.2"]


def test_before_the_oldest_the_oldest_few() -> None:
    assert _names("0.1") == ["0.9.2", "0.9.1", "0.9.0.1", "0.9.0", "0.8.5"]


def test_between_releases_both_sides() -> None:
    assert _names("0.31.5") == ["0.33.0", "0.32.0", "0.31.0", "0.30.0", "0.9.2"]
    assert _names("0.20.0") == ["0.31.0", "0.30.0", "0.9.2", "0.9.1", "0.9.0.1"]


def test_fewer_releases_than_asked() -> None:
    assert [str(v) for v in nearby_releases([Version("1.0")], Version("2.0"))] == ["1.0"]
    assert nearby_releases([], Version("2.0")) == []
