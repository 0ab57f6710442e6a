"""URLs as they may be shown: without the password (or token) a user put in them."""

from __future__ import annotations

import re

# ``scheme://user:secret@host``: what a printed URL must not show. The user name stays (it
# tells which account); the secret becomes ``***``. A token given as the user name alone
# (``https://TOKEN@host``) is hidden too: nothing tells it from a name, so it goes as well.
# The user info runs to the authority's last ``@`` (greedy, as urllib.parse and requests
# split it): a password holding a raw ``@`` (``user:p@ss@host``) is hidden whole.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]+)@")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``."""

    def hide(match: re.Match[str]) -> str:
        user, sep, _secret = match["userinfo"].partition(":")
        shown = f"{user}:***" if sep else "***"
        return f"{match['scheme']}{shown}@"

    return _USERINFO.sub(hide, text)
