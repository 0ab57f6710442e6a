"""URLs as they may be shown: without the password (or token) a user put in them."""

from __future__ import annotations

import re

# ``scheme://user:secret@host``: what a printed URL must not show. The user name stays (it
# tells which account); the secret becomes ``***``. A token given as the user name alone
# (``https://TOKEN@host``) is hidden too: nothing tells it from a name, so it goes as well.
# The user info runs to the authority's last ``@`` (greedy, as urllib.parse and requests
# split it): a password holding a raw ``@`` (``user:p@ss@host``) is hidden whole.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]+)@")

# A secret in the query string (``?token=...``, a signed URL's ``X-Amz-Signature=...``) or the
# fragment (OAuth's ``#access_token=...``): the value of a parameter whose name says it holds
# one. Other parameters stay: they tell which file or page (``#sha256=`` a file's hash). Only
# parameters of a URL (after its ``?`` or ``#`` in a ``scheme://`` word, or a word that is a
# path) count.
# The name is all of it from the ``?``, ``#`` or ``&`` before it (``auth[token]``,
# ``credentials%5Bpassword%5D``: PHP's and Rails' nested form), and a secret word anywhere in
# it makes it a secret.
_SECRET_PARAM = re.compile(
    r"(?<=[?#&])(?P<name>[^?#&=\s]*"
    r"(?:token|secret|password|passwd|pwd|sig|signature|credential|key|auth)"
    r"[^?#&=\s]*)=(?P<value>[^&#\s]*)",
    re.IGNORECASE,
)
# A URL is a ``scheme://`` word, or a path alone starting a word (``/x.whl?X-Amz-Signature=...``):
# requests' "Max retries exceeded with url: /path?query" names the request's path and query,
# with no scheme.
_URL_PARAMS = re.compile(
    r"(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*://|(?<![^\s(\[<'\"=:])/)[^?#\s]*)(?P<params>[?#]\S*)"
)


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it (user info, secret query and fragment
    values) replaced by ``***``."""

    def hide(match: re.Match[str]) -> str:
        user, sep, _secret = match["userinfo"].partition(":")
        shown = f"{user}:***" if sep else "***"
        return f"{match['scheme']}{shown}@"

    def hide_params(match: re.Match[str]) -> str:
        params = _SECRET_PARAM.sub(lambda p: f"{p['name']}=***" if p["value"] else p[0], match["params"])
        return f"{match['head']}{params}"

    return _URL_PARAMS.sub(hide_params, _USERINFO.sub(hide, text))
