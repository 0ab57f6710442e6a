"""The one gateway to git (through GitPython), and the cache repo all pins share."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from .errors import FailedProcess, ForkError
from .files import held, write_atomic

if TYPE_CHECKING:
    import git

# Fixed identity and config, so that the same inputs give the same commit ids anywhere.
IDENTITY = ("vllm-rbln-fork", "vllm-rbln-fork@users.noreply.invalid")
CONFIG = {
    "core.autocrlf": "false",
    "core.fileMode": "true",
    "core.symlinks": "true",
    "core.abbrev": "12",
    "diff.algorithm": "myers",
    "diff.renames": "true",
    "diff.noprefix": "false",
    "diff.mnemonicPrefix": "false",
    "merge.conflictStyle": "diff3",
    "gc.auto": "0",
    # Importing a pin writes ~7,400 loose blobs; zlib is half the time of `git add`.
    # The cache trades disk (about 130 MB a pin) for a faster cold build.
    "core.looseCompression": "0",
    # Record conflict resolutions and reuse them (the project keeps them in rerere/).
    "rerere.enabled": "true",
    "rerere.autoUpdate": "true",
}
# Every git this gateway runs reads the repository's config (pinned above) and no other:
# not the system's, not the user's global one (~/.gitconfig, $XDG_CONFIG_HOME/git/config).
# format.signoff, format.thread, diff.context and the like there changed the exported
# patches, and a commit the tool makes needed the user's user.email (issue 22).
CONFIG_ENV = {"LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
# Blobs are stored exactly as the sdist has them: no eol conversion or filters from
# the sdist's own .gitattributes.
ATTRIBUTES = "* -text -eol -filter -ident\n"


@dataclass(frozen=True)
class Identity:
    name: str
    email: str
    date: str  # anything git accepts, e.g. "@1700000000 +0000" or an RFC 2822 date

    def env(self) -> dict[str, str]:
        return {
            "GIT_AUTHOR_NAME": self.name,
            "GIT_AUTHOR_EMAIL": self.email,
            "GIT_AUTHOR_DATE": self.date,
            "GIT_COMMITTER_NAME": self.name,
            "GIT_COMMITTER_EMAIL": self.email,
            "GIT_COMMITTER_DATE": self.date,
        }


def _pinned(repo: git.Repo) -> bool:
    """``repo``'s config and attributes are already ours. Read without a lock: GitPython's
    config writer takes ``config.lock`` as soon as it is opened, so opening one on every use
    made two builds sharing a cache fail on each other's lock."""
    reader = repo.config_reader("repository")
    attributes = Path(repo.git_dir) / "info" / "attributes"
    for key, value in CONFIG.items():
        section, option = key.rsplit(".", 1)
        if not reader.has_option(section, option) or reader.get(section, option) != value:
            return False
    return attributes.is_file() and attributes.read_text() == ATTRIBUTES


def _pin(repo: git.Repo) -> None:
    """Write :data:`CONFIG` and :data:`ATTRIBUTES` where they differ (under the caller's lock)."""
    writer = repo.config_writer("repository")
    try:
        for key, value in CONFIG.items():
            section, option = key.rsplit(".", 1)
            if not writer.has_option(section, option) or writer.get(section, option) != value:
                writer.set_value(section, option, value)
    finally:
        writer.release()
    write_atomic(Path(repo.git_dir) / "info" / "attributes", ATTRIBUTES, skip_if_same=True)


def _refuse_damaged(path: Path) -> None:
    """``path`` is missing or an empty directory (where a bare repo can be made), else a
    :class:`ForkError` naming it and the way out. A repo with a HEAD is not damaged: another
    process may have renamed its new repo into place since the caller looked for HEAD."""
    if path.is_dir() and not any(path.iterdir()):
        return
    if (path / "HEAD").exists():
        return
    if path.exists() or path.is_symlink():
        raise ForkError(
            f"{path} is there but is not a git repository (no HEAD): a damaged cache repo (a "
            f"deletion stopped half way, or files put there by hand). It is only a cache, made "
            f"again from the sources: remove it ('rm -rf {path}') and run the same command again."
        )


def _init(path: Path, bare: bool) -> None:
    import git

    path.parent.mkdir(parents=True, exist_ok=True)
    if not bare:
        path.mkdir(exist_ok=True)
        git.Repo.init(path, bare=False, initial_branch="main")
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        _pin(git.Repo.init(aside, bare=True, initial_branch="main"))
        aside.chmod(0o755)  # mkdtemp makes it 0700; the cache is readable as before
        _refuse_damaged(path)
        aside.rename(path)  # over an empty directory too
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise


def sweep_unfinished_packs(git_dir: Path) -> list[Path]:
    """Remove the temporary packs (``objects/pack/tmp_*``) in ``git_dir`` that a process
    killed outright (SIGKILL, OOM, a lost machine: :meth:`Repo.feed` had no chance to) left,
    however young, and return them. Only for the cache repo under the build lock: every
    process of ours that writes a pack there (the import's ``fast-import``) runs under it, so
    no writer is live. A glob, no git: cheap enough for every cache hit."""
    swept = []
    for path in sorted((git_dir / "objects" / "pack").glob("tmp_*")):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        swept.append(path)
    return swept


class Repo:
    """A git repository driven through GitPython, with reproducible settings."""

    def __init__(self, path: Path, *, bare: bool = True) -> None:
        import git  # GitPython takes a tenth of a second to import: not on a cache hit's path

        self.path = path
        if not (path / "HEAD").exists() and not (path / ".git").exists():
            if bare:
                # Checked before the lock too: a bare repo of ours appears whole (below), so a
                # non-empty one without HEAD is damaged, not one being made.
                _refuse_damaged(path)
            # Two builds sharing a cache may both find it missing: one makes it, and a bare
            # repo appears whole (made aside, configured, renamed into place).
            with held(path.parent / f".{path.name}.init.lock", f"another process is making {path}"):
                if not (path / "HEAD").exists() and not (path / ".git").exists():
                    _init(path, bare)
        self.repo = git.Repo(path)
        self.git_dir = Path(self.repo.git_dir)
        if not _pinned(self.repo):
            common = Path(self.repo.common_dir)  # a linked work tree's config is the common one
            with held(common / "rbln-config.lock", f"another process is writing {common / 'config'}"):
                _pin(self.repo)

    def run(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        ok_codes: tuple[int, ...] = (0,),
        cwd: Path | None = None,
        strip: bool = True,
        in_work_tree: bool = False,
    ) -> tuple[int, str]:
        """Run ``git <args>`` in this repo; return (status, stdout); raise on other statuses.

        ``in_work_tree``: run in ``cwd``, a linked work tree, letting git find its own git dir.
        """
        full_env = {**os.environ, **CONFIG_ENV, **(env or {})}
        if in_work_tree:
            for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
                full_env.pop(var, None)
        else:
            full_env.setdefault("GIT_DIR", str(self.git_dir))
        import git  # already imported by __init__: a dictionary lookup

        runner = git.Git(str(cwd)) if cwd else self.repo.git
        status, out, err = runner.execute(
            ["git", *args],
            env=full_env,
            with_extended_output=True,
            with_exceptions=False,
            strip_newline_in_stdout=strip,
        )
        if status not in ok_codes:
            raise FailedProcess(["git", *args], status, f"{out}\n{err}")
        return status, (out if status == 0 else f"{out}\n{err}".strip())

    def _env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **CONFIG_ENV, "GIT_DIR": str(self.git_dir), **(env or {})}

    @contextmanager
    def feed(self, *args: str) -> Iterator[IO[bytes]]:
        """Run ``git <args>`` in this repo with a pipe to its stdin, for streams too big to
        hold (``fast-import``). The command must finish by itself when the pipe is closed
        after the block. If the block raises, git is killed and the error goes on, unless
        git had already stopped by itself with an error: then that error, with git's output,
        is raised instead (a broken pipe is only its symptom). A pack that git was writing
        when it stopped is removed with it: an interrupted import must not leave a pack-sized
        temporary file in the cache."""
        before = self._unfinished_packs()

        def remove_unfinished_packs() -> None:
            for path in self._unfinished_packs() - before:
                path.unlink(missing_ok=True)

        with tempfile.TemporaryFile() as output:
            process = subprocess.Popen(
                ["git", *args],
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=self._env(),
            )
            assert process.stdin is not None
            try:
                yield process.stdin
                process.stdin.close()
            except BaseException as error:
                stopped = process.poll()
                process.kill()
                process.wait()
                remove_unfinished_packs()
                if stopped and not isinstance(error, KeyboardInterrupt):  # ^C stops git too
                    output.seek(0)
                    raise FailedProcess(
                        ["git", *args], stopped, output.read().decode(errors="replace")
                    ) from None
                raise
            status = process.wait()
            if status != 0:
                remove_unfinished_packs()
                output.seek(0)
                raise FailedProcess(["git", *args], status, output.read().decode(errors="replace"))

    def _unfinished_packs(self) -> set[Path]:
        """The packs git is writing, or was when it stopped (``objects/pack/tmp_*``)."""
        return set((self.git_dir / "objects" / "pack").glob("tmp_*"))

    def read_blob(self, sha: str) -> bytes:
        """The bytes of blob ``sha``."""
        done = subprocess.run(
            ["git", "cat-file", "blob", sha], env=self._env(), capture_output=True, check=False
        )
        if done.returncode != 0:
            raise FailedProcess(["git", "cat-file", "blob", sha], done.returncode, done.stderr.decode())
        return done.stdout

    def out(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        return self.run(*args, env=env)[1]

    def resolve(self, ref: str) -> str | None:
        status, out = self.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", ok_codes=(0, 1))
        return out.strip() if status == 0 else None

    def commit_tree(self, tree: str, parents: list[str], message: str, identity: Identity) -> str:
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        args += ["-m", message]
        return self.out(*args, env=identity.env()).strip()

    def tree_of(self, commit: str) -> str:
        return self.out("rev-parse", f"{commit}^{{tree}}").strip()
