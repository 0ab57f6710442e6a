"""The watcher's cage itself (vllm_rbln_fork/cage.py; docs/building.md, "The watcher's cage"):
what a caged command can read and write, and the probe that stops a run on a machine whose
kernel keeps bwrap from its namespaces. The attacks through the watcher are in test_watch.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from vllm_rbln_fork import cage
from vllm_rbln_fork.errors import ForkError


def _in_cage(script: str, **given: list[Path]) -> subprocess.CompletedProcess[str]:
    argv = cage.caged(["sh", "-c", script], cwd=Path("/"), env={"PATH": "/usr/bin:/bin"}, **given)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_the_cage_shows_of_home_only_the_folders_it_is_given_and_those_read_only(home_folder: Path) -> None:
    """$HOME is hidden; a folder under it given as ``readable`` is seen, read-only; a folder
    given as ``writable`` inside that one is writable (the binds go parents first); beside
    them, nothing of $HOME is seen, and nothing can be written in it."""
    (home_folder / "token").write_text("kept-52\n")
    given, inner = home_folder / "given", home_folder / "given" / "inner"
    inner.mkdir(parents=True)
    (given / "seen").write_text("seen-52\n")
    done = _in_cage(
        f"cat {given}/seen; cat {home_folder}/token; echo x > {given}/new; echo y > {inner}/made; "
        f"echo z > {home_folder}/new; ls -A {Path.home()} | grep -c cage-test; true",
        readable=[given],
        writable=[inner],
    )
    assert "seen-52" in done.stdout and "kept-52" not in done.stdout, done
    assert (inner / "made").read_text() == "y\n"
    assert not (given / "new").exists() and not (home_folder / "new").exists()
    assert "Read-only file system" in done.stderr, done.stderr
    assert done.stdout.splitlines()[-1] == "1"  # of $HOME only the folder holding the given ones


def test_the_cage_hides_run_and_home_and_still_runs_its_python() -> None:
    """/run (docker's socket, the buses) and /home are empty in the cage; the running Python
    (``sys.base_prefix``, which may live under $HOME: ~/.pyenv) runs there."""
    import sys

    done = _in_cage(f"ls -A /run /home | grep -v '^/' | grep -c . ; {sys.executable} -c 'print(40 + 2)'")
    assert done.stdout.split() == ["0", "42"], done


def test_a_bwrap_that_cannot_make_its_cage_stops_the_run_naming_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap found but refused its namespaces (Ubuntu 24.04's AppArmor default, a container
    without userns): the probe stops the run before any tier, naming what bwrap said, the
    cause and the way out, instead of each caged run failing later inside a test. The bwrap
    here is a stub on PATH that fails as a refused bwrap does."""
    stub = tmp_path / "bin" / "bwrap"  # a stub of bwrap: exits 1 as bwrap does without userns
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    restricted = tmp_path / "apparmor_restrict_unprivileged_userns"
    restricted.write_text("1\n")
    monkeypatch.setattr(cage, "APPARMOR_USERNS", restricted, raising=False)  # the setting it reads
    for call in (cage.bwrap, cage.install_for_tests):
        with pytest.raises(ForkError) as refused:
            call()
        said = str(refused.value)
        assert f"`{stub} {' '.join(cage.PROBE)}` exited 1" in said
        assert "setting up uid map: Permission denied" in said
        assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in said and "--no-tier" in said
    restricted.write_text("0\n")
    with pytest.raises(ForkError, match=r"needs user namespaces .*--no-tier"):
        cage.bwrap()


def test_a_bwrap_that_makes_namespaces_but_no_proc_is_refused_by_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container that allows user namespaces and masks /proc (Docker's default): bwrap then
    starts a bare namespace and fails each cage at its fresh /proc. The probe makes the cage's
    own kinds of mount, so it refuses that machine before any tier (review: the probe had
    `--ro-bind / / --unshare-all` only, which passes there). The bwrap here is a stub on PATH
    that fails as such a bwrap does when asked for a /proc, and runs the command otherwise."""
    stub = tmp_path / "bin" / "bwrap"  # a stub of bwrap: no /proc to be had, else the command runs
    stub.parent.mkdir()
    stub.write_text(
        "#!/bin/sh\ncase \" $* \" in *' --proc '*)\n"
        '  echo "bwrap: Can\'t mount proc on /newroot/proc: Operation not permitted" >&2; exit 1;;\nesac\n'
        'while [ "$1" != true ]; do shift; done\nexec "$@"\n'
    )
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ForkError, match="Can't mount proc on /newroot/proc") as refused:
        cage.bwrap()
    assert "--no-tier" in str(refused.value)


def test_the_real_bwrap_passes_the_probe() -> None:
    """This machine's bwrap makes its cage (the tiers that drive the watcher run here)."""
    assert cage.bwrap() == shutil.which("bwrap")


def test_the_hidden_folders_are_home_and_run_as_their_links_resolve(tmp_path: Path) -> None:
    """$HOME is hidden wherever it is, as its link resolves (a tmpfs over the link would
    leave the folder itself in sight); not once more under /tmp; never / itself."""
    from vllm_rbln_fork.paths import PROJECT_ROOT

    base = cage.hidden("")
    assert Path("/run") in base and Path("/tmp") not in base
    assert cage.hidden("/") == base and cage.hidden(str(tmp_path)) == base  # /tmp is the cage's own
    home = PROJECT_ROOT / "work" / f"home-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # outside /tmp
    home.mkdir(parents=True)
    try:
        (tmp_path / "home-link").symlink_to(home)
        assert cage.hidden(str(tmp_path / "home-link")) == [*base, home]
    finally:
        home.rmdir()
