"""The errors a user can meet. Each message names the thing and the way out.

The CLI prints these without a traceback; anything else is a bug and keeps one.
"""

from __future__ import annotations

from .urls import redact


class ForkError(Exception):
    """A build, review or publish cannot proceed; ``str()`` is the sentence to show, with
    the password of any URL in it hidden (:func:`urls.redact`)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class BadPin(ForkError):
    """The pin is not a PEP 440 version."""


class PinNotFound(ForkError):
    """The index has no sdist for the pin."""


class IndexUnreachable(ForkError):
    """The package index could not be read."""


class SourceHashMismatch(ForkError):
    """A download does not match the hash the index or pins.lock promised."""


class UnsafeSource(ForkError):
    """An sdist is corrupt or holds paths that would escape its tree."""


class SeriesError(ForkError):
    """The series file or a patch in it is malformed, missing or fails lint."""


class PatchDoesNotApply(ForkError):
    """A patch conflicts with the tree it is applied to."""


class WheelError(ForkError):
    """The wheel build failed or produced something we refuse to ship."""


class BaseWheelError(ForkError):
    """A --base-wheel cannot be used: not a vLLM build of the pin, or its Python differs."""


class IndexConflict(ForkError):
    """Publishing would overwrite a published file with different bytes."""


class WouldRecord(ForkError):
    """``--locked``: the build would add to ``pins.lock`` or ``fork-releases.toml``."""


class FailedProcess(ForkError):
    """A subprocess exited non-zero; the message carries its command and output."""

    def __init__(self, cmd: list[str], returncode: int, output: str, hint: str = "") -> None:
        self.cmd = cmd
        self.returncode = returncode
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-40:])
        text = f"command failed (exit {returncode}): {' '.join(cmd)}"
        if tail:
            text += f"\n--- last lines of its output ---\n{tail}"
        if hint:
            text += f"\n{hint}"
        super().__init__(text)
