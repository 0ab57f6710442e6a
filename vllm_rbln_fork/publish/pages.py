"""The index pages, as text: PEP 503 HTML and PEP 691 JSON (with PEP 592, 658/714 and 700
fields), rendered from the published files. Deterministic: the same files give the same bytes."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from packaging.utils import NormalizedName

from .wheelfacts import WheelFacts

API_VERSION = "1.1"  # PEP 691 JSON with PEP 700's versions/size/upload-time
JSON_CONTENT_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_CONTENT_TYPE = "application/vnd.pypi.simple.v1+html"
FILES_DIR = "files"


@dataclass(frozen=True)
class FileEntry:
    """One file on a project page: the wheel's facts plus its sidecar."""

    facts: WheelFacts
    upload_time: datetime
    yanked: bool
    yanked_reason: str


def format_time(moment: datetime) -> str:
    """PEP 700's ``yyyy-mm-ddThh:mm:ss.ffffffZ``, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def file_href(filename: str) -> str:
    """From ``simple/<name>/``: the file in ``files/``, percent-encoded (``+`` is ``%2B``)."""
    return f"../../{FILES_DIR}/{quote(filename, safe='')}"


def render_root_html(names: list[NormalizedName]) -> str:
    links = "".join(f'    <a href="{quote(n)}/">{html.escape(n)}</a><br>\n' for n in names)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        f'    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
        "    <title>Simple index</title>\n  </head>\n  <body>\n"
        f"{links}  </body>\n</html>\n"
    )


def render_root_json(names: list[NormalizedName]) -> str:
    data = {"meta": {"api-version": API_VERSION}, "projects": [{"name": n} for n in names]}
    return json.dumps(data, indent=2) + "\n"


def render_project_html(name: NormalizedName, entries: list[FileEntry]) -> str:
    lines = []
    for e in entries:
        f = e.facts
        attrs = [f'href="{file_href(f.filename)}#sha256={f.sha256}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python, quote=True)}"')
        attrs.append(f'data-core-metadata="sha256={f.metadata_sha256}"')
        attrs.append(f'data-dist-info-metadata="sha256={f.metadata_sha256}"')
        if e.yanked:
            attrs.append(f'data-yanked="{html.escape(e.yanked_reason, quote=True)}"')
        lines.append(f"    <a {' '.join(attrs)}>{html.escape(f.filename)}</a><br>\n")
    title = f"Links for {html.escape(name)}"
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        f'    <meta name="pypi:repository-version" content="{API_VERSION}">\n'
        f"    <title>{title}</title>\n  </head>\n  <body>\n    <h1>{title}</h1>\n"
        f"{''.join(lines)}  </body>\n</html>\n"
    )


def render_project_json(name: NormalizedName, entries: list[FileEntry]) -> str:
    files = []
    for e in entries:
        f = e.facts
        item: dict[str, object] = {
            "filename": f.filename,
            "url": file_href(f.filename),
            "hashes": {"sha256": f.sha256},
        }
        if f.requires_python:
            item["requires-python"] = f.requires_python
        item["core-metadata"] = {"sha256": f.metadata_sha256}
        item["dist-info-metadata"] = {"sha256": f.metadata_sha256}
        item["size"] = f.size
        item["upload-time"] = format_time(e.upload_time)
        item["yanked"] = (e.yanked_reason or True) if e.yanked else False
        files.append(item)
    versions = sorted({e.facts.version for e in entries})
    data = {
        "meta": {"api-version": API_VERSION},
        "name": name,
        "versions": [str(v) for v in versions],
        "files": files,
    }
    return json.dumps(data, indent=2) + "\n"
