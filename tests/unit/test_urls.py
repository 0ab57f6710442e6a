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
        # A secret in the query string goes; the other parameters tell which file it is.
        ("https://host/v.whl?token=abc123", "https://host/v.whl?token=***"),
        (
            "https://host/v.whl?X-Amz-Credential=AK%2F1&X-Amz-Signature=f00d&name=v.whl#sha256=aa",
            "https://host/v.whl?X-Amz-Credential=***&X-Amz-Signature=***&name=v.whl#sha256=aa",
        ),
        ("http://u:pw@host/x?access_token=s3cr3t&page=2", "http://u:***@host/x?access_token=***&page=2"),
        (
            "pip install vllm==0.31.0+rbln.1 (token=abc is no URL)",
            "pip install vllm==0.31.0+rbln.1 (token=abc is no URL)",
        ),
        ("https://host/simple/?page=2&apikey=", "https://host/simple/?page=2&apikey="),
        ("https://host/f.whl?sv=1&sig=S3cr&pwd=p", "https://host/f.whl?sv=1&sig=***&pwd=***"),
        # A name with brackets (nested form parameters) is a secret's when a part of it is.
        (
            "https://host/x?auth[token]=T0k&credentials[password]=pw&user[name]=ann",
            "https://host/x?auth[token]=***&credentials[password]=***&user[name]=ann",
        ),
        ("https://host/x?auth%5Btoken%5D=T0k&q=1", "https://host/x?auth%5Btoken%5D=***&q=1"),
        # The fragment too (OAuth's implicit flow); a file's hash there stays.
        (
            "https://host/cb#access_token=T0k&expires_in=3600",
            "https://host/cb#access_token=***&expires_in=3600",
        ),
        ("https://host/x?page=2#id_token=T0k", "https://host/x?page=2#id_token=***"),
        ("https://host/v.whl#sha256=aa", "https://host/v.whl#sha256=aa"),
        # requests names a failed request by its path and query alone, with no scheme://.
        (
            "HTTPSConnectionPool(host='h', port=443): Max retries exceeded with url: "
            "/b/v.whl?X-Amz-Credential=AK&X-Amz-Signature=f00d&x-id=GetObject (Caused by X)",
            "HTTPSConnectionPool(host='h', port=443): Max retries exceeded with url: "
            "/b/v.whl?X-Amz-Credential=***&X-Amz-Signature=***&x-id=GetObject (Caused by X)",
        ),
        ("a/b?token=t is not a path word", "a/b?token=t is not a path word"),
    ],
)
def test_the_whole_secret_is_hidden(text: str, shown: str) -> None:
    assert redact(text) == shown
