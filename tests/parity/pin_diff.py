"""The behavioural diff of a pin move: our RBLN scheduler's parity traces at two pins, step by step.

    python tests/parity/pin_diff.py <parity-A.json> <parity-B.json>

Each file is a parity report's traces (``parity-<pin>.json``, written beside the report by
``python build.py test --tier parity --pin <pin>``). Only our side is compared: the vllm-rbln
side runs over vLLM 0.30.0 at every pin. For each workload, the first step where the two pins'
runners saw something different, and every field that differs there, then the end state
(finished, unfinished, preemptions, blocks). Exit 0 when every workload steps the same at
both pins, 1 when one differs (each difference must then be explained in the move's
``docs/rebases/v<pin>.md``). docs/patch-workflow.md, "Moving the pin".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# What a trace holds beside its steps that a pin move may change (not its CPU time).
END_STATE = ("finished", "unfinished", "reported_preemptions", "blocks_not_free", "blocks_held_by_requests")


def ours(path: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    run = json.loads(path.read_text())["ours"]
    return run["vllm"], {trace["workload"]: trace for trace in run["traces"]}


def diff_trace(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between one workload's two traces: the first differing step, then the end state."""
    if "error" in a or "error" in b:
        same = a.get("error") == b.get("error")
        return [] if same else [f"refused: {a.get('error')!r} vs {b.get('error')!r}"]
    lines: list[str] = []
    for i, (step_a, step_b) in enumerate(zip(a["steps"], b["steps"], strict=False)):
        fields = [k for k in step_a.keys() | step_b.keys() if step_a.get(k) != step_b.get(k)]
        if fields:
            lines.append(f"step {i} differs first:")
            lines += [f"  {k}: {step_a.get(k)} vs {step_b.get(k)}" for k in sorted(fields)]
            break
    if len(a["steps"]) != len(b["steps"]):
        lines.append(f"steps: {len(a['steps'])} vs {len(b['steps'])}")
    lines += [f"{k}: {a.get(k)} vs {b.get(k)}" for k in END_STATE if a.get(k) != b.get(k)]
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    (version_a, a), (version_b, b) = ours(Path(argv[1])), ours(Path(argv[2]))
    print(f"our RBLN scheduler at {version_a} (A) and at {version_b} (B), workload by workload")
    differing = 0
    for name in sorted(a.keys() | b.keys()):
        if name not in a or name not in b:
            print(f"\n{name}: only at {'A' if name in a else 'B'}")
            differing += 1
            continue
        lines = diff_trace(a[name], b[name])
        differing += bool(lines)
        print(f"\n{name}: " + ("differs\n  " + "\n  ".join(lines) if lines else "the same, step by step"))
    print(f"\n{differing} of {len(a.keys() | b.keys())} workloads differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
