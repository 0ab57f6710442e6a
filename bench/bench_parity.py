"""Benchmark: our RBLN scheduler against vllm-rbln 0.12.0's, as ratios measured in one run.

    python build.py test --tier parity --pin 0.31.0     # once: makes both sides' venvs
    <tool env>/bin/python bench/bench_parity.py [--pin 0.31.0] [--steps 300]

Sets up both sides as the parity tier does (docs/parity.md; cache hits after a tier run), runs
``tests/parity/drive.py`` in each side's venv and prints ours / vllm-rbln for:

* steps per output token on the P/D decode side (workload ``pd-decode-side``; lower is better);
* steps on a roomy async workload (``async-roomy``, two batches in flight; lower is better);
* sub-block hit tokens per admission (``sub-block-shared-prefix`` and ``sub-block-siblings``;
  higher is better);
* the CPU time of one ``schedule()`` + ``update_from_output()`` with 32 requests decoding
  (the mean over ``--steps`` steps; lower is better). The two sides run one after the other,
  each in its own process, so they do not share the two cores.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "parity"))

import figures as fig  # noqa: E402
from workloads import BY_NAME  # noqa: E402

from vllm_rbln_fork.gitrepo import Repo  # noqa: E402
from vllm_rbln_fork.paths import upstream_repo_dir  # noqa: E402
from vllm_rbln_fork.pins import Pin  # noqa: E402
from vllm_rbln_fork.pipeline import build  # noqa: E402
from vllm_rbln_fork.project import Project  # noqa: E402
from vllm_rbln_fork.source import SourceSpec  # noqa: E402
from vllm_rbln_fork.testing import parity  # noqa: E402
from vllm_rbln_fork.testing.runner import HF_FIXTURES, _test_lock, source_tree, vllm_venv  # noqa: E402

DRIVE = ROOT / "tests" / "parity" / "drive.py"
WORKLOADS = ("pd-decode-side", "async-roomy", "sub-block-shared-prefix", "sub-block-siblings")


def _drive(python: Path, side: str, tree: Path, args: list[str], out: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        VLLM_PLUGINS="none",
        VLLM_TARGET_DEVICE="cpu",
        HF_HOME=str(HF_FIXTURES),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    subprocess.run([str(python), str(DRIVE), side, str(tree), str(out), *args], check=True, env=env)
    result: dict[str, object] = json.loads(out.read_text())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pin", default="0.31.0")
    parser.add_argument("--steps", type=int, default=300, help="steps timed at 32 decodes")
    args = parser.parse_args()
    project = Project.default()
    pin = Pin.parse(args.pin)
    result = build(pin, SourceSpec.parse(None, None), project)
    patched = source_tree(Repo(upstream_repo_dir()), result.manifest.patched_commit, "patched")
    with (
        vllm_venv(result.wheel, _test_lock(pin, project)) as ours_python,
        parity.reference_venv(parity.reference_build(project)) as reference,
        tempfile.TemporaryDirectory() as tmp,
    ):
        sides = {"ours": (ours_python, patched), "vllm-rbln": (reference.python, reference.tree)}
        traces = {
            side: {
                t["workload"]: t
                for t in _drive(python, side, tree, list(WORKLOADS), Path(tmp) / f"{side}.json")["traces"]
            }  # type: ignore[index]
            for side, (python, tree) in sides.items()
        }
        cpu = {
            side: float(
                _drive(
                    python, side, tree, ["--time-decodes", str(args.steps)], Path(tmp) / f"{side}-cpu.json"
                )["cpu_seconds_per_step"]
            )  # type: ignore[arg-type]
            for side, (python, tree) in sides.items()
        }

    def figure(name: str, side: str) -> fig.Figures:
        return fig.figures_of(traces[side][name], BY_NAME[name])

    rows = [
        ("steps per output token, P/D decode side", "pd-decode-side", "steps_per_token", "lower"),
        ("steps, roomy async (2 batches in flight)", "async-roomy", "steps", "lower"),
        ("sub-block hit tokens per admission", "sub-block-shared-prefix", "hit_tokens", "higher"),
        ("sub-block hit tokens per admission, siblings", "sub-block-siblings", "hit_tokens", "higher"),
    ]
    print(f"ours (vllm {pin}) / vllm-rbln 0.12.0 (vllm 0.30.0), one run:\n")
    print(f"{'figure':<58}{'ours':>10}{'vllm-rbln':>12}{'ratio':>9}  better")
    for label, name, attr, better in rows:
        ours, theirs = getattr(figure(name, "ours"), attr), getattr(figure(name, "vllm-rbln"), attr)
        ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else "-"
        print(f"{label:<58}{fig._num(ours):>10}{fig._num(theirs):>12}{ratio:>9}  {better}")
    ours_us, theirs_us = cpu["ours"] * 1e6, cpu["vllm-rbln"] * 1e6
    label = "CPU us per schedule()+update_from_output(), 32 decodes"
    print(f"{label:<58}{ours_us:>10.0f}{theirs_us:>12.0f}{ours_us / theirs_us:>9.2f}  lower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
