"""Run a PEP 517 hook as pyproject_hooks' ``_in_process`` script runs it, with setuptools'
file copies made hard links.

``python hook_runner.py [--link-copies] <_in_process.py> <hook> <control dir>`` is what
:func:`vllm_rbln_fork.wheel.build_wheel` runs where pyproject_hooks would run
``python <_in_process.py> <hook> <control dir>``: the same script, arguments, ``sys.path``
and environment. With ``--link-copies`` (a setuptools backend), each file setuptools copies
(``build_py`` into ``build/lib``, then ``install_lib`` from there into the wheel's staging
folder: some 3,000 files of vLLM, twice) is hard-linked to its source instead, as distutils'
own ``copy_file(link="hard")`` does, falling back to a copy where a link cannot be made. The
files' bytes are the same; their modes do not reach the wheel we ship
(:func:`vllm_rbln_fork.wheel.repack_pure` writes every entry 0644). A build directory is
never written in place, so the links never change the tree they point into (a scratch copy,
removed after the build).

Standard library only, and nothing imported from beside this file: its folder is the tool's
package, whose ``wheel`` module would shadow the ``wheel`` package setuptools needs (so
``sys.path[0]`` is set, before any import of setuptools, to the script's folder, as
``python <script>`` sets it).
"""

from __future__ import annotations

import os
import runpy
import sys


def link_copies() -> None:
    """Make distutils' ``copy_file`` (through which setuptools' ``Command.copy_file`` and
    ``copy_tree`` copy) hard-link where its caller did not ask for a link of its own."""
    from setuptools._distutils import file_util

    copy_file = file_util.copy_file

    def linking_copy_file(  # the signature of distutils' copy_file
        src: str,
        dst: str,
        preserve_mode: bool = True,
        preserve_times: bool = True,
        update: bool = False,
        link: str | None = None,
        verbose: bool = True,
        dry_run: bool = False,
    ) -> tuple[str, bool]:
        return copy_file(src, dst, preserve_mode, preserve_times, update, link or "hard", verbose, dry_run)  # type: ignore[no-any-return]

    file_util.copy_file = linking_copy_file  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    link = argv[:1] == ["--link-copies"]
    script, *args = argv[1:] if link else argv
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if link:
        link_copies()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
