"""urls.redact: the secret of a URL's user info is never shown, whatever it holds."""

from __future__ import annotations

import pytest

from vllm_rbln_fork.urls import redact


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://user:t0ken@host/simple/", "http://user:***@host/simple/"),
        ("https://t0ken@host/simple/", "https://***@host/simple/"),
        # An '@' in the password, not percent-encoded: requests (urllib.parse) splits the
        # user info at the last '@' before the host, so all of 'p@ss' is the password.
        ("http://user:p@ss@host/simple/", "http://user:***@host/simple/"),
        ("http://user:p@ss@host:8080", "http://user:***@host:8080"),
        ("get http://u:a@b@h/x and http://v:c@h2/y", "get http://u:***@h/x and http://v:***@h2/y"),
        ("http://host/simple/ (user@example.com)", "http://host/simple/ (user@example.com)"),
    ],
)
def test_the_whole_secret_is_hidden(text: str, shown: str) -> None:
    assert redact(text) == shown
