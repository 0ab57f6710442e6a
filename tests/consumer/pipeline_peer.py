"""The last stage of a two-stage pipeline for `runner_harness.first_of_two_pipeline_stages`:
joins vLLM's process groups as stage RANK of SIZE (``pipeline_peer.py PORT SIZE RANK``), waits
until its standard input closes, and leaves them. It runs no model: it only makes the groups
two processes, so that the runner under test is a non-last stage."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "scheduler"), str(HERE.parent / "support")]  # runner_harness's imports

import runner_harness  # noqa: E402


def main(port: str, size: str, rank: str) -> None:
    from vllm.config import VllmConfig

    runner_harness.join_process_groups(int(port), int(size), int(rank), VllmConfig())
    sys.stdin.read()
    runner_harness.leave_process_groups()


if __name__ == "__main__":
    main(*sys.argv[1:])
