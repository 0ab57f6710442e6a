"""PEP 440 on the requirement line of a plugin that moves onto our wheel (docs/adopting.md),
checked with ``packaging``: which specifiers accept ``0.31.0+rbln.N`` and how builds sort."""

from __future__ import annotations

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

OURS = "0.31.0+rbln.12"


@pytest.mark.parametrize(
    ("specifier", "accepts_ours"),
    [
        # A label in the specifier: that label only.
        ("==0.31.0+cpu", False),
        ("==0.31.0+rbln.11", False),
        ("==0.31.0+rbln.12", True),
        # No label: every build of the release.
        ("==0.31.0", True),
        ("==0.31.*", True),
        (">=0.31.0,<0.31.1", True),
        ("~=0.31.0", True),
        # Another release.
        ("==0.30.0", False),
    ],
)
def test_which_specifiers_accept_our_build(specifier: str, accepts_ours: bool) -> None:
    assert SpecifierSet(specifier).contains(OURS) is accepts_ours


def test_compatible_release_is_wider_than_the_pin() -> None:
    """``~=0.31.0`` also takes 0.31.5, a release the plugin was not tested on."""
    assert SpecifierSet("~=0.31.0").contains("0.31.5+rbln.1")
    assert not SpecifierSet("==0.31.0").contains("0.31.5+rbln.1")


def test_a_wildcard_label_is_not_pep_440() -> None:
    with pytest.raises(InvalidSpecifier):
        SpecifierSet("==0.31.0+rbln.*")


def test_builds_sort_by_their_local_label() -> None:
    """pip takes the highest version a specifier allows: our builds by number, after
    vLLM's CPU build and the plain release."""
    ordered = ["0.31.0", "0.31.0+cpu", "0.31.0+rbln.2", "0.31.0+rbln.12"]
    assert sorted(ordered, key=Version) == ordered
