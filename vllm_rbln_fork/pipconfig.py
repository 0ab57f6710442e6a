"""pip's configuration, read one way for everything that needs it: build.py's bootstrap
(which hands pip's indexes to uv) and the sdist fetch (``index_client.configured_index_url``).

Standard library only: build.py imports it before any package is installed."""

from __future__ import annotations

import os
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


# pip's index settings, and the variables that give them to uv: in its environment, not on
# its command line, where any user's ``ps`` would show a token in an index URL.
UV_INDEX_VARIABLES = {
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "find-links": "UV_FIND_LINKS",
}
UV_SEPARATOR = {"UV_INDEX_URL": " ", "UV_EXTRA_INDEX_URL": " ", "UV_FIND_LINKS": ","}
# Every variable by which uv (0.13, bootstrap.lock) takes an index from its environment:
# none is inherited, so pip's settings are the only ones (a user's UV_DEFAULT_INDEX naming
# an index out of reach failed the install, as uv asks every index it is given).
UV_INHERITED_INDEX_VARIABLES = (*UV_INDEX_VARIABLES.values(), "UV_DEFAULT_INDEX", "UV_INDEX", "UV_NO_INDEX")


def uv_environment(environ: dict[str, str], index_env: dict[str, str]) -> dict[str, str]:
    """uv's environment: ours (``environ``) without any index of uv's own, plus pip's
    (``index_env``, from :func:`uv_options`)."""
    return {k: v for k, v in environ.items() if k not in UV_INHERITED_INDEX_VARIABLES} | index_env


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for the indexes pip is configured with: uv does not read
    pip's configuration, and is told to read none of its own (``--no-config``), so pip's
    settings are the only ones, as for pip. uv's default ``first-index`` strategy takes a
    package only from the first index that has it; pip takes the best match from all of
    them, and so is uv told to (the locks' hashes pin every file). The URLs go in the
    environment (``UV_INDEX_URL``, ...), which only the user and root can read.

    pip's ``constraint`` files are not given to uv, on purpose: every uv install of ours is of
    a lock, ``--require-hashes``, and uv refuses in that mode any constraint not pinned with
    ``==`` (``torch<=2.14.1`` fails the install), where the lock already pins every package to
    one file by its hash: a constraint could only refuse the lock, never choose otherwise."""
    options = ["--no-config", "--index-strategy", "unsafe-best-match"]
    no_index = settings.get("no-index", "").lower() in ("1", "true", "yes", "on")
    env: dict[str, str] = {}
    for name in ("find-links",) if no_index else tuple(UV_INDEX_VARIABLES):
        if values := settings.get(name, "").split():  # any whitespace: spaces or new lines
            variable = UV_INDEX_VARIABLES[name]
            env[variable] = UV_SEPARATOR[variable].join(values)
    return ([*options, "--no-index"] if no_index else options), env


def uv_settings(
    python: str | os.PathLike[str] = sys.executable, pip_config: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """uv's options and full environment for installing what pip (of ``python``) would: pip's
    indexes (:func:`uv_options`), in this process's environment without uv's own, and pip's CA
    bundle for uv's TLS where none is set. ``pip_config``: ``pip config list``'s output for
    ``python``, where the caller has read it already (build.py reads it while it installs uv)."""
    settings = pip_settings(pip_config) if pip_config is not None else configured_pip_settings(str(python))
    options, index_env = uv_options(settings)
    env = uv_environment(dict(os.environ), index_env)
    if settings.get("cert") and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = settings["cert"]  # pip's CA bundle serves uv too
    return options, env
