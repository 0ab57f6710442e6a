"""pip's configuration, read one way for everything that needs it: build.py's bootstrap
(which hands pip's indexes to uv) and the sdist fetch (``index_client.configured_index_url``).

Standard library only: build.py imports it before any package is installed."""

from __future__ import annotations

import subprocess
import sys


def pip_settings(pip_config: str) -> dict[str, str]:
    """pip's settings from ``pip config list``'s output, which has the environment's
    ``PIP_*`` variables (as ``:env:.``) beside the files' ``global.`` and ``install.``
    settings; the environment wins, then ``install``, then ``global``, as for pip. pip
    prints each value as a Python literal (``%r``), so a value written over several lines
    in pip.conf comes as one line with ``\\n`` in it."""
    import ast

    rank = {":env:": 0, "install": 1, "global": 2}
    found: dict[str, tuple[int, str]] = {}
    for line in pip_config.splitlines():
        key, sep, text = line.partition("=")
        scope, _, name = key.rpartition(".")
        if sep and scope in rank and (name not in found or rank[scope] < found[name][0]):
            try:
                value = str(ast.literal_eval(text.strip()))
            except (ValueError, SyntaxError):
                value = text.strip()
            found[name] = (rank[scope], value)
    return {name: value for name, (_, value) in found.items()}


def configured_pip_settings(python: str = sys.executable) -> dict[str, str]:
    """:func:`pip_settings` of ``python -m pip config list`` (empty if pip cannot say)."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    return pip_settings(listed.stdout)
