"""Parsing patches and the series file, and the lint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_rbln_fork.errors import SeriesError
from vllm_rbln_fork.paths import PROJECT_ROOT
from vllm_rbln_fork.series import lint, parse_patch, read_series
from vllm_rbln_fork.workflow import slug

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: Dev <dev@example.invalid>
Date: Tue, 14 Nov 2023 22:13:20 +0000
Subject: Cover the first decode step in the
 admission gate

The gate counts only the prompt, so a request can be admitted and then
preempted by its own first decode step.

Origin: backport, vllm-project/vllm#63288
Applied-Upstream: 0.34.0

diff --git a/a.py b/a.py
index 000000000000..111111111111 100644
--- a/a.py
+++ b/a.py
@@ -1 +1 @@
-x = 1
+x = 2
"""


def test_parse_reads_subject_trailers_and_description() -> None:
    patch = parse_patch("p.patch", PATCH.encode())
    assert patch.subject == "Cover the first decode step in the admission gate"
    assert patch.origin_kind == "backport"
    assert patch.origin_ref == "vllm-project/vllm#63288"
    assert str(patch.applied_upstream) == "0.34.0"
    assert patch.description.startswith("The gate counts only the prompt")
    assert lint(patch) == []


def test_reading_a_patch_leaves_its_mail_header_until_it_is_asked_for() -> None:
    """A cache hit reads every patch (the cache key, the lint) but none of their mail
    headers: the email parser, a tenth of a hit's time, is imported only once the subject,
    author or date is asked for, and decodes them as before (RFC 2047, folded lines). In a
    fresh interpreter: this one has imported the email package already."""
    text = PATCH.replace("From: Dev <", "From: =?UTF-8?q?Ren=C3=A9_Dev?= <")
    # The key of a hit names the homes of its shared patches (pipeline.home_parts): their
    # Exported-Against line is read without the parser too.
    text = text.replace("\n\n", "\nExported-Against: vllm 0.31.0\n\n", 1)
    code = (
        "import sys\n"
        "import vllm_rbln_fork.cli, vllm_rbln_fork.pipeline\n"
        "from vllm_rbln_fork.series import lint, parse_patch\n"
        f"patch = parse_patch('p.patch', {text.encode()!r})\n"
        "assert lint(patch) == []\n"
        "assert str(patch.exported_against) == '0.31.0'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'email'))\n"
        "print(patch.subject)\n"
        "print(patch.author)\n"
        "print(patch.date)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [
        "[]",
        "Cover the first decode step in the admission gate",
        "René Dev <dev@example.invalid>",
        "Tue, 14 Nov 2023 22:13:20 +0000",
    ]


def test_an_exported_against_line_that_names_no_pin_is_a_clear_error() -> None:
    patch = parse_patch("p.patch", PATCH.replace("\n\n", "\nExported-Against: vllm 0.31.x\n\n", 1).encode())
    with pytest.raises(SeriesError, match=r"Exported-Against: vllm 0\.31\.x.*'vllm <version>'.*export again"):
        _ = patch.exported_against
    assert parse_patch("p.patch", PATCH.encode()).exported_against is None


def test_not_a_patch_file() -> None:
    with pytest.raises(SeriesError, match="not a git format-patch file"):
        parse_patch("x.patch", b"just text\n")


def test_lint_rejects_unknown_origin_and_bad_version() -> None:
    text = PATCH.replace("Origin: backport, vllm-project/vllm#63288", "Origin: vendor").replace(
        "Applied-Upstream: 0.34.0", "Applied-Upstream: soon"
    )
    problems = lint(parse_patch("p.patch", text.encode()))
    assert any("'vendor' is not one of" in p for p in problems)
    assert any("'Applied-Upstream: soon' is not a version" in p for p in problems)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("p.patch\n", "Exported-Against"),
        ("# Exported-Against: vllm 0.31.0\np.patch\np.patch\n", "listed twice"),
        ("# Exported-Against: vllm 0.31.0\n../p.patch\n", "not a patch file name"),
        ("# Exported-Against: vllm 0.31.0\nbanana/p.patch\n", "not a patch file name"),
        ("# Exported-Against: vllm 0.31.0\n0.31.0/x/p.patch\n", "not a patch file name"),
        ("# Exported-Against: vllm 0.31.0\np.patch\n0.31.0/p.patch\n", "listed twice"),
        ("# Exported-Against: vllm 0.31.0\n0.32.0/p.patch\n", "does not exist"),
        ("# Exported-Against: vllm 0.31.0\np.patch -p1\n", "options are not supported"),
        ("# Exported-Against: vllm banana\n", "line 1"),
    ],
)
def test_broken_series_files(tmp_path, body, message) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches/p.patch").write_text(PATCH)
    (tmp_path / "series").write_text(body)
    with pytest.raises(SeriesError, match=message):
        read_series(tmp_path / "series", tmp_path / "patches")


def test_series_with_comments_and_blank_lines(tmp_path) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches/p.patch").write_text(PATCH)
    (tmp_path / "series").write_text("# header\n# Exported-Against: vllm 0.31.0\n\n# why\np.patch\n")
    series = read_series(tmp_path / "series", tmp_path / "patches")
    assert [p.name for p in series.patches] == ["p.patch"] and str(series.exported_against) == "0.31.0"


def test_a_pins_own_form_is_named_by_pin_and_keeps_the_patch_name(tmp_path) -> None:
    (tmp_path / "patches/0.32.0").mkdir(parents=True)
    (tmp_path / "patches/0.32.0/p.patch").write_text(PATCH)
    (tmp_path / "series").write_text("# Exported-Against: vllm 0.32.0\n0.32.0/p.patch\n")
    [patch] = read_series(tmp_path / "series", tmp_path / "patches").patches
    assert (patch.name, patch.entry) == ("p.patch", "0.32.0/p.patch")


@pytest.mark.parametrize(
    ("pins_toml", "message"),
    [
        ("[pin]\n", "lists no pins"),
        ('[pin."banana"]\ntest-lock = "x.lock"\n', "not a PEP 440 version"),
        ('[pin."0.31.0"]\n', "needs test-lock"),
        ('[pin."0.31.0"]\ntest-lock = "missing.lock"\n', "needs test-lock"),
        ("[pin\n", "not valid TOML"),
        ('[pin."0.31.0"]\ntest-lock = "x.lock"\nstatus = "gone"\n', "has status = 'gone'"),
        ('[pin."0.31.0"]\nstatus = "moving"\n', "lists no supported pin"),
        ('[pin."0.31.0"]\ntest-lock = "x.lock"\nengine-lock = "none.lock"\n', "needs engine-lock"),
    ],
)
def test_broken_pins_toml(tmp_path, pins_toml, message) -> None:
    from vllm_rbln_fork.project import Project
    from vllm_rbln_fork.supported import supported_pins

    (tmp_path / "x.lock").write_text("pytest\n")
    (tmp_path / "pins.toml").write_text(pins_toml)
    with pytest.raises(SeriesError, match=message):
        supported_pins(Project(tmp_path))


def test_slug_names_patches_from_subjects() -> None:
    assert slug("Add the RBLN scheduler") == "add-the-rbln-scheduler.patch"
    assert len(slug("x" * 200)) == 64 + len(".patch")


def test_a_non_utf8_byte_in_the_series_file_is_named_with_its_line(tmp_path) -> None:
    """The series file as the patches (issue 22, bug 12): a byte that is not UTF-8 is a
    SeriesError naming the file, the line and the way back, never a UnicodeDecodeError."""
    (tmp_path / "patches").mkdir()
    series = tmp_path / "series"
    series.write_bytes(b"# Exported-Against: vllm 1.0\n\nadd-rbln\xff.patch\n")
    with pytest.raises(SeriesError, match=r"series, line 3: byte 0xff is not UTF-8.*git checkout -- series"):
        read_series(series, tmp_path / "patches")
