"""The consumer tier's venv: vllm-rbln 0.12.0's model runner over a pin's RBLN wheel.

Made like the parity tier's reference venv (``parity.py``), from hashed locks with uv:

* the pin's vLLM test lock (``pins.toml``'s ``test-lock``), then the pin's wheel in place of
  its vllm (``install_wheel``, checked against the lock);
* ``requirements/consumer.lock``: numba (and its llvmlite), which vllm-rbln's worker and ngram
  proposer import and our pure wheel does not bring;
* ``vllm-rbln==0.12.0`` from ``requirements/vllm-rbln.lock``, hash-pinned, ``--no-deps`` (its
  own pins name the RBLN device stack, which the tier stubs: ``tests/consumer/rbln_sdk_stubs.py``);
* the adoption patches (``adopting/vllm-rbln-0.12.0``) the pin takes (its ``series`` gates the
  0.31.0 port on ``vllm>=0.31.0``) applied to what pip unpacked into site-packages
  (``adopting.apply_adoption_patches``).

Made once per locks, applied patches and Python; another pin's wheel is swapped in (held exclusively,
as the scheduler tier's venv is), with no dependency check afterwards: vllm-rbln's own
requirements (the device stack) are not installed on purpose.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import log
from ..adopting import adoption_patches, apply_adoption_patches
from ..files import made_and_held, sha256_of
from ..paths import PROJECT_ROOT, cache_root
from ..pins import Pin
from .parity import VLLM_RBLN_LOCK
from .runner import install_lock, install_wheel, make_locked_venv

CONSUMER_LOCK = PROJECT_ROOT / "requirements" / "consumer.lock"
KEY_FORMAT = "consumer-1"  # bump when the way the venv is made changes


def site_packages(python: Path) -> Path:
    """The venv's site-packages (``python`` is its interpreter)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return python.parent.parent / "lib" / version / "site-packages"


def consumer_venv_dir(test_lock: Path, pin: Pin) -> Path:
    digest = hashlib.sha256()
    for part in (
        KEY_FORMAT,
        sha256_of(test_lock),
        sha256_of(CONSUMER_LOCK),
        sha256_of(VLLM_RBLN_LOCK),
        adoption_patches(pin=pin).fingerprint,
        sys.version,
        sysconfig.get_platform(),
    ):
        digest.update(part.encode() + b"\0")
    return cache_root() / "venvs" / f"consumer-{digest.hexdigest()[:16]}"


@contextmanager
def consumer_venv(wheel: Path, test_lock: Path, pin: Pin) -> Iterator[Path]:
    """The tier's venv (the module's docstring) with ``wheel`` (of ``pin``) installed; its
    Python, held for the ``with`` block alone."""
    patches = adoption_patches(pin=pin)
    env_dir = consumer_venv_dir(test_lock, pin)
    python = env_dir / "bin" / "python"

    def make(env_dir: Path) -> None:
        with log.phase(f"make the consumer tier's venv {env_dir}"):
            make_locked_venv(env_dir, test_lock)
            install_wheel(python, wheel, test_lock)  # checks the lock satisfies the wheel
            install_lock(python, CONSUMER_LOCK)
            install_lock(python, VLLM_RBLN_LOCK, no_deps=True)
            for name, gate in patches.gated_off:
                log.info(f"not applied at {pin}: {name} (its series line says {gate})")
            apply_adoption_patches(site_packages(python), patches)
            (env_dir / ".wheel-sha256").write_text(sha256_of(wheel))

    with made_and_held(env_dir, make, exclusive=True):
        installed = env_dir / ".wheel-sha256"
        digest = sha256_of(wheel)
        if installed.read_text() != digest:
            with log.phase(f"install {wheel.name} into the consumer venv"):
                install_wheel(python, wheel, test_lock, check=False)
                installed.write_text(digest)
        yield python
