"""Signature changes by parameter kind (issue 15, bug 2): what still binds, by griffe's rules
for any caller (``compatible``) and for the patch's own calls (``call_binds``)."""

from __future__ import annotations

import pytest

from vllm_rbln_fork.review import pyast, signatures


def _fn(source: str) -> pyast.Symbol:
    return pyast.symbols(source)["f"]


# (old, new, still compatible for every caller) -- one row per kind of change.
API_CASES = [
    ("def f(a, b): pass", "def f(a, *, b): pass", False),  # positional or keyword -> keyword-only
    ("def f(a, b): pass", "def f(a, b, /): pass", False),  # positional or keyword -> positional-only
    ("def f(a, /, b): pass", "def f(a, *, b): pass", False),  # positional-only -> keyword-only
    ("def f(a, *, b): pass", "def f(a, b): pass", True),  # keyword-only -> positional or keyword
    ("def f(a, /, b): pass", "def f(a, b): pass", True),  # positional-only -> positional or keyword
    ("def f(a, *args): pass", "def f(a): pass", False),  # *args removed
    ("def f(a, **kw): pass", "def f(a): pass", False),  # **kwargs removed
    ("def f(a, b=1): pass", "def f(a, **kw): pass", False),  # **kwargs alone cannot take b positionally
    ("def f(a, b=1): pass", "def f(a, *args, **kw): pass", True),  # *args and **kwargs take it
    ("def f(a, *, b=1): pass", "def f(a, **kw): pass", True),  # a keyword-only one goes to **kwargs
    ("def f(a): pass", "def f(a, b=1): pass", True),  # new optional parameter
    ("def f(a): pass", "def f(a, *, b): pass", False),  # new required keyword-only parameter
    ("def f(a, b=1): pass", "def f(a, b): pass", False),  # default removed: now required
    ("def f(a, b): pass", "def f(b, a): pass", False),  # reordered
    ("def f(a, b=1): pass", "def f(a, c=0, b=1): pass", False),  # b moved one place right
]


@pytest.mark.parametrize(("old", "new", "expected"), API_CASES)
def test_compatible_follows_parameter_kinds(old: str, new: str, expected: bool) -> None:
    assert signatures.compatible(_fn(old), _fn(new)) is expected


def test_a_default_change_is_described_not_incompatible() -> None:
    old, new = _fn("def f(a=1): pass"), _fn("def f(a=2): pass")
    assert signatures.compatible(old, new)
    assert "default" in signatures.describe_signature_change(old, new)


def test_the_description_names_the_kind_change() -> None:
    text = signatures.describe_signature_change(_fn("def f(a, b): pass"), _fn("def f(a, *, b): pass"))
    assert "`b`" in text and "keyword-only" in text


def _call(source: str) -> pyast.CallSite:
    [site] = pyast.calls(source, {1})
    return site


# (old, new, the patch's call, binds the same way on new)
CALL_CASES = [
    ("def f(a, b): pass", "def f(a, *, b): pass", "f(1, 2)", False),
    ("def f(a, b): pass", "def f(a, *, b): pass", "f(1, b=2)", True),  # a keyword call still binds
    ("def f(a, b): pass", "def f(a, b, /): pass", "f(1, b=2)", False),
    ("def f(a, b): pass", "def f(a, b, /): pass", "f(1, 2)", True),
    ("def f(a, b=1): pass", "def f(a, c=0, b=1): pass", "f(1, 2)", False),  # 2 would go to c
    ("def f(a, b=1): pass", "def f(a, c=0, b=1): pass", "f(1, b=2)", True),
    ("def f(a, *args): pass", "def f(a): pass", "f(1, 2, 3)", False),  # too many positionals
    ("def f(a, *args): pass", "def f(a): pass", "f(1)", True),
    ("def f(a, **kw): pass", "def f(a): pass", "f(1, x=2)", False),
    ("def f(a): pass", "def f(a, *, b): pass", "f(1)", False),  # misses a new required one
    ("def f(a, b=1): pass", "def f(a, **kw): pass", "f(1, b=2)", True),  # goes to **kw
    ("def f(a, b): pass", "def f(b, a): pass", "f(a=1, b=2)", True),
    ("def f(a, b): pass", "def f(b, a): pass", "f(1, 2)", False),
]


@pytest.mark.parametrize(("old", "new", "call", "expected"), CALL_CASES)
def test_the_patch_calls_bind_by_position_and_keyword(old: str, new: str, call: str, expected: bool) -> None:
    problem = signatures.call_binds(_call(call), _fn(old), _fn(new))
    assert (problem is None) is expected, problem


def test_a_call_with_star_arguments_is_not_judged_by_binding() -> None:
    site = _call("f(*xs, **kw)")
    assert site.star_args and site.star_kwargs
    assert signatures.call_binds(site, _fn("def f(a, b): pass"), _fn("def f(a, *, b): pass")) == ""


def test_method_calls_skip_self() -> None:
    source = "class C:\n    def m(self, a, b): pass\n"
    new = "class C:\n    def m(self, a, *, b): pass\n"
    old_m, new_m = pyast.symbols(source)["C.m"], pyast.symbols(new)["C.m"]
    assert signatures.call_binds(_call("obj.m(1, b=2)"), old_m, new_m) is None
    assert signatures.call_binds(_call("obj.m(1, 2)"), old_m, new_m)
