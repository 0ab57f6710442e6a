"""The parity tier's reference side: vllm-rbln 0.12.0's scheduler over vLLM 0.30.0.

vllm-rbln 0.12.0 pins ``vllm==0.30.0+cpu``. Its scheduler, KV cache manager and config import
only vLLM and ``vllm_rbln`` itself, so they run over an **unpatched empty-device build of vLLM
0.30.0's sdist** (the sdist hash-checked against ``pins.lock``, the wheel built by the same
``wheel.build_wheel`` as ours, with no series), in a venv of their own:

* vLLM 0.30.0's runtime dependencies from ``requirements/vllm-test-0.30.lock`` (0.31.0's but
  for ``openai-harmony``; ``uv pip check`` after the wheel's install says they satisfy it);
* that wheel, with no dependencies of its own (``install_wheel``);
* ``vllm-rbln==0.12.0`` from ``requirements/vllm-rbln.lock`` (hash-pinned, ``--no-deps``).

This side is vLLM 0.30.0 **unpatched**, not the fork's 0.30.0 RBLN wheel (0.30.0 is also a supported
pin, whose own tiers test that wheel): vllm-rbln 0.12.0 as it runs today. Its sdist's
``tests/`` is the reference side's harness (``tests/v1/core/utils.py``). Both are made once per
content (sdist, tool code, Python, build lock; the locks for the venv) under the cache.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, log
from ..files import made_and_held, made_once, sha256_of
from ..manifest import BuildManifest
from ..paths import PROJECT_ROOT, cache_root
from ..pins import Pin, PinsLock
from ..pipeline import BUILD_LOCK, tool_fingerprint
from ..project import Project
from ..source import SourceSpec, fetch_sdist, unpack_sdist

REFERENCE_PIN = Pin.parse("0.30.0")
VLLM_LOCK = PROJECT_ROOT / "requirements" / "vllm-test-0.30.lock"
VLLM_RBLN_LOCK = PROJECT_ROOT / "requirements" / "vllm-rbln.lock"
KEY_FORMAT = "parity-reference-1"  # bump when the way the reference side is made changes


@dataclass(frozen=True)
class ReferenceBuild:
    tree: Path  # vLLM 0.30.0's unpacked sdist: its tests/ is the reference side's harness
    wheel: Path  # its empty-device wheel, unpatched


@dataclass(frozen=True)
class Reference:
    python: Path  # the reference venv's interpreter
    tree: Path


def _key(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in (KEY_FORMAT, *parts):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def reference_build(project: Project) -> ReferenceBuild:
    """vLLM 0.30.0's sdist (hash-checked against ``pins.lock``), unpacked and built with
    ``VLLM_TARGET_DEVICE=empty`` and no patch; made once per sdist, tool code, Python and
    build lock."""
    from ..wheel import build_wheel

    pin = REFERENCE_PIN
    lock = PinsLock(project.pins_lock)
    sdist, sha256 = fetch_sdist(pin, SourceSpec.parse(None, None), lock)
    key = _key(sha256, tool_fingerprint(), platform.python_version(), sha256_of(BUILD_LOCK))
    directory = cache_root() / "parity" / f"vllm-{pin}-{key}"

    def make(directory: Path) -> None:
        with log.phase(f"build the unpatched empty-device wheel of vllm {pin} (parity tier)"):
            directory.mkdir(parents=True)
            tree, epoch = unpack_sdist(sdist, directory / "src", pin=pin)
            manifest = BuildManifest(
                pin=str(pin),
                wheel_version=str(pin),
                fork_release=0,
                source_kind="index",
                source_file=sdist.name,
                source_sha256=sha256,
                upstream_commit="",
                patched_commit="",
                patched_tree="",
                series_exported_against="",
                source_date_epoch=epoch,
                tool_version=__version__,
                applied=(),
                dropped=(),
            )
            wheels = directory / "wheel"
            wheels.mkdir()
            build_wheel(tree, str(pin), epoch, manifest, wheels)

    made_once(directory, make)
    lock.commit()  # the sdist unpacked cleanly (now or when the folder was made): its hash may be recorded
    (tree,) = [p for p in (directory / "src").iterdir() if p.is_dir()]
    (wheel,) = sorted((directory / "wheel").glob("*.whl"))
    return ReferenceBuild(tree, wheel)


@contextmanager
def reference_venv(build: ReferenceBuild) -> Iterator[Reference]:
    """The reference venv (see the module's docstring), made once per wheel and locks, held
    shared for the ``with`` block: nothing is swapped into it once made."""
    from .runner import install_lock, install_wheel, make_locked_venv

    key = _key(sha256_of(build.wheel), sha256_of(VLLM_LOCK), sha256_of(VLLM_RBLN_LOCK), sys.version)
    env_dir = cache_root() / "venvs" / f"parity-reference-{key}"
    python = env_dir / "bin" / "python"

    def make(env_dir: Path) -> None:
        with log.phase(f"make the parity tier's reference venv {env_dir}"):
            make_locked_venv(env_dir, VLLM_LOCK)
            install_wheel(python, build.wheel, VLLM_LOCK)  # checks the lock satisfies 0.30.0
            install_lock(python, VLLM_RBLN_LOCK, no_deps=True)

    with made_and_held(env_dir, make):
        yield Reference(python, build.tree)
