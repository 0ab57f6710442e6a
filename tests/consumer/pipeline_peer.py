"""The last stage of a two-stage pipeline for `runner_harness.first_of_two_pipeline_stages`.

One process serves every pipeline a test run makes (importing vLLM is most of its cost): it
reads commands from its standard input, one a line, and answers each on the file descriptor
given as its argument (vLLM logs to stdout):

* ``join PORT``: join vLLM's process groups as stage 1 of 2 (the runner under test is stage 0);
  answers ``joined`` once the groups are made;
* ``leave``: leave them; answers ``left``.

It exits when its standard input closes. It runs no model: it only makes the groups two
processes, so that the runner under test is a non-last stage."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "scheduler"), str(HERE.parent / "support")]  # runner_harness's imports

import runner_harness  # noqa: E402


def main(answer_fd: str) -> None:
    from vllm.config import VllmConfig

    config = VllmConfig()
    with os.fdopen(int(answer_fd), "w", buffering=1) as answers:
        for line in sys.stdin:
            command, *args = line.split()
            if command == "join":
                runner_harness.join_process_groups(int(args[0]), 2, 1, config)
                answers.write("joined\n")
            elif command == "leave":
                runner_harness.leave_process_groups()
                answers.write("left\n")
            else:
                raise SystemExit(f"pipeline_peer: unknown command {line!r}")
    # The groups are left: nothing to tear down. Python's own shutdown (torch's and vLLM's exit
    # hooks) took 10-13 s here, once a run.
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
