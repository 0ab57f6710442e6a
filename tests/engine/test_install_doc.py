"""docs/install.md's first steps, followed as written: a newcomer serves the tiny model with
the RBLN scheduler from the binary wheel.

Block 1 (the venv and ``pip install`` of the wheel) is how the test runner made the venv
this test runs in; blocks 2-4 run here, in a temp dir, with only the port changed (8000 may
be taken) and ``rbln-vllm/`` pointing at that venv.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from engine_kit import Server, free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "install.md"


def block(name: str) -> str:
    match = re.search(rf"<!-- newcomer: {name} -->\s*```sh\n(.*?)```", DOC.read_text(), re.S)
    assert match is not None, f"docs/install.md lost its '{name}' block"
    return match.group(1)


def test_the_newcomer_path_of_docs_install(tmp_path: Path) -> None:
    venv = Path(sys.executable).parent.parent  # the venv block 1 made (python -m venv rbln-vllm)
    assert re.search(r"-m venv rbln-vllm\b", block("venv")) and venv.name == "rbln-vllm"
    (tmp_path / "rbln-vllm").symlink_to(venv)
    port = str(free_port())

    def sh(text: str) -> str:
        return subprocess.run(["bash", "-euc", text.replace("8000", port)], cwd=tmp_path, check=True,
                              capture_output=True, text=True, timeout=300).stdout  # fmt: skip

    sh(block("model"))
    assert (tmp_path / "tiny-llama" / "model.safetensors").exists()

    serve = block("serve").replace("8000", port)
    assert serve.startswith("rbln-vllm/bin/vllm serve tiny-llama")
    server = Server(["bash", "-euc", "exec " + serve], tmp_path / "serve.log", port=int(port), cwd=tmp_path)
    try:
        server.wait_ready()
        out = sh(block("ask"))
    finally:
        server.stop()
    completion, end = json.JSONDecoder().raw_decode(out)  # curl prints the JSON with no newline
    metrics = out[end:]
    assert completion["choices"][0]["finish_reason"] in ("length", "stop")
    assert completion["usage"]["completion_tokens"] >= 1
    assert re.search(r"^vllm:num_preemptions_total\{.*\} \d", metrics, re.M), metrics
    assert re.search(r"^vllm:prefix_cache_hits_total\{.*\} \d", metrics, re.M), metrics
