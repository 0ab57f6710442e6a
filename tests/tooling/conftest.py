"""A tiny synthetic upstream: a fake ``vllm`` with versions 1.0 / 1.1 / 1.2 as sdists
in a PEP 503 folder served on 127.0.0.1, and a fork project in a temp dir.

1.0  the base the series is exported against
1.1  upstream edits near the patched lines (context drift: a 3-way carry)
1.2  upstream has merged the backport itself (the build must drop it)
1.3  upstream rewrote the very line the backport changes (a conflict)
"""

from __future__ import annotations

import contextvars
import hashlib
import http.server
import io
import os
import shutil
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

# The suite has no packages (--import-mode=importlib): shared test kits live in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from checks import recorder  # noqa: F401 (a fixture)
from indexkit import served
from synthetic_upstream import GATE_1_0

from vllm_rbln_fork.gitrepo import Repo
from vllm_rbln_fork.pins import Pin
from vllm_rbln_fork.project import Project
from vllm_rbln_fork.series import render_series
from vllm_rbln_fork.source import SourceSpec

SETUP_PY = """\
import os
from setuptools import setup
setup(name="vllm", version=os.environ["VLLM_VERSION_OVERRIDE"], packages=["vllm", "vllm.core"])
"""
PYPROJECT = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'

# 1.1: upstream rewrote the docstring and added a function above: context drift.
GATE_1_1 = '''\
import math


def admit(prompt_tokens: int, free_slots: int) -> bool:
    """Admit a request only if its whole prompt fits in the free slots."""
    reserve = 0
    needed = prompt_tokens
    return needed <= free_slots


def padding() -> int:
    return 0
'''
# 1.2: upstream contains the backport (the line the series changes).
GATE_1_2 = GATE_1_1.replace("needed = prompt_tokens\n", "needed = prompt_tokens + 1\n")
# 1.3: upstream changed the backport's own line another way.
GATE_1_3 = GATE_1_1.replace("needed = prompt_tokens\n", "needed = 2 * prompt_tokens\n")

FILES: dict[str, dict[str, str]] = {
    "1.0": {"vllm/core/gate.py": GATE_1_0},
    "1.1": {"vllm/core/gate.py": GATE_1_1},
    "1.2": {"vllm/core/gate.py": GATE_1_2},
    "1.3": {"vllm/core/gate.py": GATE_1_3},
}

# The review family (``python build.py --pin X --review``): 2.x repeats 1.0-1.3 and adds
# a block-accounting module that later releases change under the series. Only the
# ``review_index`` fixture of test_review.py publishes these.
BLOCKS_2_0 = '''\
"""Block accounting."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    """How many blocks hold num_tokens."""
    return (num_tokens + block_size - 1) // block_size


def free_blocks(total: int, used: int) -> int:
    return total - used


class Pool:
    def __init__(self, total: int, block_size: int) -> None:
        self.total = total
        self.block_size = block_size
        self.used = 0

    def can_fit(self, num_tokens: int) -> bool:
        need = blocks_for(num_tokens, self.block_size)
        return need <= free_blocks(self.total, self.used)

    def take(self, num_tokens: int) -> None:
        self.used += blocks_for(num_tokens, self.block_size)
'''
# 2.4: the body of blocks_for changes (the lookahead backport calls it); no conflict.
BLOCKS_2_4 = BLOCKS_2_0.replace(
    "    return (num_tokens + block_size - 1) // block_size\n", "    return -(-num_tokens // block_size)\n"
)
# 2.5: compatible signature change of free_blocks (called by the RBLN pool) and a
# changed signature of Pool.take (which the RBLN pool overrides).
BLOCKS_2_5 = BLOCKS_2_0.replace(
    "def free_blocks(total: int, used: int) -> int:\n    return total - used\n",
    "def free_blocks(total: int, used: int, reserved: int = 0) -> int:\n    return total - used - reserved\n",
).replace(
    "    def take(self, num_tokens: int) -> None:",
    "    def take(self, num_tokens: int, *, pinned: bool = False) -> None:",
)
# 2.6: free_blocks renames the parameter the RBLN pool passes by keyword (breaking).
BLOCKS_2_6 = BLOCKS_2_0.replace(
    "def free_blocks(total: int, used: int) -> int:\n    return total - used\n",
    "def free_blocks(total: int, in_use: int) -> int:\n    return total - in_use\n",
)
# 2.7: upstream made half of the lookahead backport (the attribute), not the other half.
BLOCKS_2_7 = BLOCKS_2_0.replace(
    "        self.used = 0\n", "        self.used = 0\n        self.lookahead = 1\n"
)

# 2.8: blocks_for's block_size becomes keyword-only; the lookahead backport passes it by position.
BLOCKS_2_8 = BLOCKS_2_0.replace(
    "def blocks_for(num_tokens: int, block_size: int) -> int:",
    "def blocks_for(num_tokens: int, *, block_size: int) -> int:",
)
# 2.9: free_blocks becomes positional-only; the RBLN pool passes ``used=`` by keyword.
BLOCKS_2_9 = BLOCKS_2_0.replace(
    "def free_blocks(total: int, used: int) -> int:", "def free_blocks(total: int, used: int, /) -> int:"
)

REVIEW_FILES: dict[str, dict[str, str]] = {
    "2.0": {"vllm/core/gate.py": GATE_1_0, "vllm/core/blocks.py": BLOCKS_2_0},
    "2.1": {"vllm/core/gate.py": GATE_1_1, "vllm/core/blocks.py": BLOCKS_2_0},
    "2.2": {"vllm/core/gate.py": GATE_1_2, "vllm/core/blocks.py": BLOCKS_2_0},
    "2.3": {"vllm/core/gate.py": GATE_1_3, "vllm/core/blocks.py": BLOCKS_2_0},
    "2.4": {"vllm/core/gate.py": GATE_1_1, "vllm/core/blocks.py": BLOCKS_2_4},
    "2.5": {"vllm/core/gate.py": GATE_1_1, "vllm/core/blocks.py": BLOCKS_2_5},
    "2.6": {"vllm/core/gate.py": GATE_1_1, "vllm/core/blocks.py": BLOCKS_2_6},
    "2.7": {"vllm/core/gate.py": GATE_1_1, "vllm/core/blocks.py": BLOCKS_2_7},
    "2.8": {"vllm/core/gate.py": GATE_1_1, "vllm/core/blocks.py": BLOCKS_2_8},
    "2.9": {"vllm/core/gate.py": GATE_1_1, "vllm/core/blocks.py": BLOCKS_2_9},
}


def make_sdist(
    version: str, dest: Path, extra: dict[str, str] | None = None, files_of: str | None = None
) -> Path:
    """The sdist of ``version``, with the files of ``files_of`` (default: of ``version``): a
    post-release or a mirror's local build (``1.1.post1``, ``1.1+cpu``) of a synthetic release."""
    files = {
        "setup.py": SETUP_PY,
        "pyproject.toml": PYPROJECT,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        "vllm/__init__.py": f'__version__ = "{version}"\n',
        "vllm/core/__init__.py": "",
        ".gitignore": "vllm/core/\n",  # the importer must not honour ignore rules
        **{**FILES, **REVIEW_FILES}[files_of or version],
        **(extra or {}),
    }
    path = dest / f"vllm-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            mtime = 1_700_000_000 + int(float(files_of or version) * 10)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


@dataclass
class SyntheticIndex:
    root: Path
    url: str

    def publish(self, sdist: Path) -> None:
        """(Re)write the PEP 503 page for vllm with every sdist in the folder."""
        project = self.root / "simple" / "vllm"
        project.mkdir(parents=True, exist_ok=True)
        if sdist.parent != project:
            sdist.replace(project / sdist.name)
        links = []
        for f in sorted(project.glob("*.tar.gz")):
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            links.append(f'<a href="{f.name}#sha256={digest}">{f.name}</a><br/>')
        (project / "index.html").write_text("<html><body>" + "\n".join(links) + "</body></html>")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _serving(root: Path) -> Iterator[SyntheticIndex]:
    handler = lambda *a, **k: _QuietHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    with served(server):
        yield SyntheticIndex(root, f"http://127.0.0.1:{server.server_address[1]}/simple/")


# Each test gets its synthetic index, build cache and fork project as copies of ones made once
# per test session (per xdist worker): made for each test, they were a fifth of the tooling
# tier's time (a checkout, two commits and an export a test). The copies are the same files
# the fixtures made; no path, port or URL of the template is in them (the checkout's own
# work tree, which names the template's cache, is not copied: no test uses it).
TEMPLATE_KINDS = ("index", "fork", "review")


def _make_template(root: Path, kind: str, index_template: Path | None) -> None:
    index_root = root / "index"
    if index_template is None:
        index_root.mkdir(parents=True)
    else:
        shutil.copytree(index_template / "index", index_root)
    with _serving(index_root) as index, pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_RBLN_FORK_CACHE", str(root / "cache"))
        if kind == "index":
            for version in FILES:
                index.publish(make_sdist(version, root))
            return
        project = Project(root / "project")
        project.root.mkdir()
        if kind == "review":
            for version in REVIEW_FILES:
                index.publish(make_sdist(version, root))
            author_series(project, index, root, base="2.0", more=_review_series_more)
        else:
            author_series(project, index, root)


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The template of a kind (``TEMPLATE_KINDS``), made on first use."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            base = None if kind == "index" else get("index")
            root = tmp_path_factory.mktemp(f"template-{kind}")
            # In a context of its own: what its build logs goes to no test's recorder.
            contextvars.copy_context().run(_make_template, root, kind, base)
            made[kind] = root
        return made[kind]

    return get


def _copy_template(root: Path, tmp_path: Path) -> None:
    for part in ("index", "cache", "project"):
        if (root / part).exists():
            shutil.copytree(root / part, tmp_path / part, dirs_exist_ok=True)


@pytest.fixture
def index_server(tmp_path: Path, template: Callable[[str], Path]) -> Iterator[SyntheticIndex]:
    _copy_template(template("index"), tmp_path)
    with _serving(tmp_path / "index") as index:
        yield index


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(cache))
    return cache


BACKPORT_MSG = """\
Count one more slot at admission

Upstream admits a request when its prompt fits, but the first decode step needs
one slot more; without it the request is admitted and then preempted.

Origin: backport, example/vllm#1
"""
RBLN_MSG = """\
Add RBLN padding

RBLN NPUs need requests padded to a multiple of the block; upstream has no
such notion, so the fork carries it.

Origin: rbln
"""


@dataclass
class Fork:
    project: Project
    index: SyntheticIndex

    def spec(self) -> SourceSpec:
        return SourceSpec("index", self.index.url)


def author_series(
    project: Project,
    index: SyntheticIndex,
    tmp_path: Path,
    base: str = "1.0",
    more: Callable[[Path, Callable[[str], None]], None] | None = None,
) -> None:
    """Write the two-patch series on ``base`` the way a developer would: checkout, commit,
    export. ``more(tree, commit)`` may add commits (``commit(message)`` commits all changes)."""
    from vllm_rbln_fork.workflow import checkout, export

    project.patches_dir.mkdir(parents=True, exist_ok=True)
    project.series_file.write_text(render_series(Pin.parse(base), []))
    tree = checkout(Pin.parse(base), SourceSpec("index", index.url), project, tmp_path / "edit")
    repo = Repo(tree, bare=False)
    env = {
        "GIT_AUTHOR_NAME": "Dev",
        "GIT_AUTHOR_EMAIL": "dev@example.invalid",
        "GIT_AUTHOR_DATE": "@1700000000 +0000",
        "GIT_COMMITTER_NAME": "Dev",
        "GIT_COMMITTER_EMAIL": "dev@example.invalid",
        "GIT_COMMITTER_DATE": "@1700000000 +0000",
    }
    gate = tree / "vllm/core/gate.py"
    gate.write_text(gate.read_text().replace("needed = prompt_tokens\n", "needed = prompt_tokens + 1\n"))
    repo.run("commit", "-q", "-a", "-m", BACKPORT_MSG, env=env, in_work_tree=True, cwd=tree)
    gate.write_text(gate.read_text().replace("    return 0\n", "    return 16\n"))
    repo.run("commit", "-q", "-a", "-m", RBLN_MSG, env=env, in_work_tree=True, cwd=tree)
    if more is not None:

        def commit(message: str) -> None:
            repo.run("add", "-A", "-f", env=env, in_work_tree=True, cwd=tree)
            repo.run("commit", "-q", "-m", message, env=env, in_work_tree=True, cwd=tree)

        more(tree, commit)
    export(tree, project)


@pytest.fixture
def fork(tmp_path: Path, index_server: SyntheticIndex, template: Callable[[str], Path]) -> Fork:
    """A project whose series (two patches on 1.0) was written by ``author_series``, with the
    build cache that left."""
    _copy_template(template("fork"), tmp_path)
    return Fork(Project(tmp_path / "project"), index_server)


# The review family's series: the fork's two patches on 2.0, and two more (test_review.py).
LOOKAHEAD_MSG = """\
Reserve a lookahead block in the pool

A request that fits exactly is admitted and then cannot take its first
decode step; reserving one lookahead block at admission avoids that.

Origin: backport, example/vllm#2
"""
POOL_MSG = """\
Add the RBLN pool

RBLN NPUs account for blocks in a pool of their own that checks it never
goes below zero, as a subclass of upstream's Pool.

Origin: rbln
"""
RBLN_POOL = """\
from vllm.core.blocks import Pool, free_blocks


class RBLNPool(Pool):
    def take(self, num_tokens: int) -> None:
        super().take(num_tokens)
        assert free_blocks(self.total, used=self.used) >= 0
"""


def _review_series_more(tree: Path, commit: Callable[[str], None]) -> None:
    blocks = tree / "vllm/core/blocks.py"
    text = blocks.read_text()
    text = text.replace("        self.used = 0\n", "        self.used = 0\n        self.lookahead = 1\n")
    text = text.replace(
        "        need = blocks_for(num_tokens, self.block_size)\n",
        "        need = blocks_for(num_tokens, self.block_size) + self.lookahead\n",
    )
    blocks.write_text(text)
    commit(LOOKAHEAD_MSG)
    (tree / "vllm/core/rbln_pool.py").write_text(RBLN_POOL)
    commit(POOL_MSG)


@pytest.fixture
def review_fork(tmp_path: Path, index_server: SyntheticIndex, template: Callable[[str], Path]) -> Fork:
    """The index with the 2.x releases too, and a project whose series (four patches on 2.0)
    was written by ``author_series``, with the build cache that left."""
    _copy_template(template("review"), tmp_path)
    return Fork(Project(tmp_path / "project"), index_server)


@pytest.fixture
def sdist_of() -> Callable[..., Path]:
    """:func:`make_sdist`, for a test that makes a post-release or a local build of a release."""
    return make_sdist


@pytest.fixture
def publish_release(index_server: SyntheticIndex, tmp_path: Path) -> Callable[[str], None]:
    """Publish one more synthetic release (any version of FILES or REVIEW_FILES)."""
    return lambda version: index_server.publish(make_sdist(version, tmp_path))


@pytest.fixture
def home_folder() -> Iterator[Path]:
    """A folder of the test's own under ``$HOME``, removed afterwards: the cage hides ``$HOME``
    (the runner's tokens and keys), and the cage's ``/tmp`` is a tmpfs of its own, so an attack
    on a file under the host's ``/tmp`` shows nothing about the rest of the file system
    (review finding 4)."""
    folder = Path.home() / f".cage-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o700)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
