"""Run one job of a GitHub Actions workflow here: its ``run:`` steps in order, in bash, as the
runner runs them (``bash --noprofile --norc -eo pipefail``), with ``env:`` and ``if:`` evaluated,
``$GITHUB_OUTPUT`` / ``$GITHUB_ENV`` / ``$GITHUB_STEP_SUMMARY`` as files, ``$RUNNER_TEMP`` a folder
of the job's (empty at its start, as the runner empties it), and the outputs a step writes given
to the later steps; a job's own ``if:`` and ``outputs:`` (a later job gets them as
``needs.<job>.outputs``, passed in its contexts). ``uses:`` steps are the forge's own actions (checkout,
setup-python, cache, upload-artifact): they are listed as not run, never imitated.

Expressions: the subset the project's workflows use in ``env:`` and ``if:``: contexts
(``matrix.pin``, ``steps.watch.outputs.outcome``, ``needs.watch.outputs.branch``, ``vars.X``,
``secrets.X``, ``inputs.X``, ...), string and
number literals, ``==``, ``!=``, ``&&``, ``||``, ``!``, parentheses, and ``success()``,
``failure()``, ``always()``, ``cancelled()``; a step's ``if:`` with none of these four is
``success() && (...)``, as the runner reads it. Anything else is an error, not a guess.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TOKEN = re.compile(
    r"\s*(?:('(?:[^']|'')*')|(\d+(?:\.\d+)?)|(==|!=|&&|\|\||!|\(|\))|([A-Za-z_][\w.\-]*(?:\(\))?))"
)


class Expr:
    """A recursive-descent evaluator of the subset above."""

    def __init__(self, text: str, contexts: dict[str, Any], failed: bool) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"cannot read the expression {text!r} at {text[pos:]!r}")
            kind = ("str", "num", "op", "name")[[g is not None for g in m.groups()].index(True)]
            self.tokens.append((kind, m.group(m.lastindex or 0)))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.at, self.contexts, self.failed = 0, contexts, failed

    def value(self) -> Any:
        result = self._or()
        if self.at != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.at][1]!r}")
        return result

    def _peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def _or(self) -> Any:
        left = self._and()
        while self._peek() == "||":
            self.at += 1
            right = self._and()
            left = left if _truthy(left) else right
        return left

    def _and(self) -> Any:
        left = self._cmp()
        while self._peek() == "&&":
            self.at += 1
            right = self._cmp()
            left = right if _truthy(left) else left
        return left

    def _cmp(self) -> Any:
        left = self._unary()
        if self._peek() in ("==", "!="):
            op = self.tokens[self.at][1]
            self.at += 1
            right = self._unary()
            same = str(left).lower() == str(right).lower() if left != right else True
            return same if op == "==" else not same
        return left

    def _unary(self) -> Any:
        if self._peek() == "!":
            self.at += 1
            return not _truthy(self._unary())
        if self._peek() == "(":
            self.at += 1
            inner = self._or()
            if self._peek() != ")":
                raise ValueError("missing )")
            self.at += 1
            return inner
        kind, text = self.tokens[self.at]
        self.at += 1
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text) if "." in text else int(text)
        if text.endswith("()"):
            calls = {
                "success()": not self.failed,
                "failure()": self.failed,
                "always()": True,
                "cancelled()": False,
            }
            if text not in calls:
                raise ValueError(f"the function {text} is not supported here")
            return calls[text]
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        value: Any = self.contexts
        for part in text.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value


def _truthy(value: Any) -> bool:
    return value not in (None, False, "", 0)


def evaluate(text: str, contexts: dict[str, Any], failed: bool = False) -> Any:
    """``text`` with each ``${{ ... }}`` evaluated; a whole-expression text gives the value."""
    whole = re.fullmatch(r"\s*\$\{\{(.*)\}\}\s*", text, re.S)
    if whole:
        return Expr(whole.group(1), contexts, failed).value()
    return re.sub(
        r"\$\{\{(.*?)\}\}", lambda m: _text(Expr(m.group(1), contexts, failed).value()), text, flags=re.S
    )


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class StepResult:
    name: str
    ran: bool
    why_not: str = ""  # a uses: step (the forge's action), or its if: was false
    status: int = 0
    output: str = ""


@dataclass
class JobRun:
    steps: list[StepResult] = field(default_factory=list)
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # step id -> its outputs
    summary: str = ""
    ran: bool = True  # False: the job's if: was false
    job_outputs: dict[str, str] = field(default_factory=dict)  # the job's outputs: (for needs.<job>)

    def step(self, name: str) -> StepResult:
        (found,) = [s for s in self.steps if s.name == name]
        return found


def _read_pairs(path: Path) -> dict[str, str]:
    """``name=value`` lines and ``name<<EOF`` blocks, as the runner reads $GITHUB_OUTPUT."""
    pairs: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, marker = line.split("<<", 1)
            end = lines.index(marker, i + 1)
            pairs[key] = "\n".join(lines[i + 1 : end])
            i = end + 1
            continue
        key, _, value = line.partition("=")
        if key:
            pairs[key] = value
        i += 1
    return pairs


def run_job(
    workflow: Path, job: str, workspace: Path, contexts: dict[str, Any], env: dict[str, str], scratch: Path
) -> JobRun:
    """Run ``job``'s steps in ``workspace`` (a fresh clone) with the machine environment ``env``."""
    data = yaml.safe_load(workflow.read_text())
    spec = data["jobs"][job]
    shell = data.get("defaults", {}).get("run", {}).get("shell", "bash")
    assert shell == "bash", f"{workflow.name}: only bash steps are run here"
    contexts = {
        "vars": {},
        "secrets": {},
        "matrix": {},
        "github": {},
        "runner": {},
        "inputs": {},
        "needs": {},
        **contexts,
        "steps": {},
    }
    env = dict(env)
    run = JobRun()
    if "if" in spec:
        condition = str(spec["if"])
        if not _truthy(evaluate(condition if "${{" in condition else "${{ " + condition + " }}", contexts)):
            run.ran = False
            return run
    failed = False
    scratch.mkdir(parents=True, exist_ok=True)
    runner_temp = scratch / "runner-temp"
    shutil.rmtree(runner_temp, ignore_errors=True)
    runner_temp.mkdir()
    for number, step in enumerate(spec["steps"]):
        name = step.get("name") or step.get("uses") or f"step {number}"
        if "uses" in step:
            run.steps.append(StepResult(name, False, f"the forge's action {step['uses']}"))
            continue
        condition = str(step.get("if", "success()")).strip()
        condition = condition.removeprefix("${{").removesuffix("}}")
        if not re.search(r"\b(success|failure|always|cancelled)\(\)", condition):
            condition = f"success() && ({condition})"  # as the runner reads an if: without one
        condition = "${{ " + condition + " }}"
        if not _truthy(evaluate(condition, {**contexts, "env": env}, failed)):
            run.steps.append(StepResult(name, False, f"if: {step.get('if')} is false"))
            continue
        files = {k: scratch / f"{number}-{k.lower()}" for k in ("GITHUB_OUTPUT", "GITHUB_ENV")}
        for path in files.values():
            path.write_text("")
        summary = scratch / "step-summary.md"
        step_env = {
            **env,
            **{k: _text(evaluate(str(v), {**contexts, "env": env})) for k, v in step.get("env", {}).items()},
            **{k: str(v) for k, v in files.items()},
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_WORKSPACE": str(workspace),
            "RUNNER_TEMP": str(runner_temp),
            "CI": "true",
        }
        script = scratch / f"{number}.sh"
        script.write_text(step["run"])
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace / step.get("working-directory", "."),
            env=step_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        run.steps.append(StepResult(name, True, status=done.returncode, output=done.stdout))
        if "id" in step:
            outputs = _read_pairs(files["GITHUB_OUTPUT"])
            run.outputs[step["id"]] = outputs
            contexts["steps"][step["id"]] = {
                "outputs": outputs,
                "outcome": "success" if done.returncode == 0 else "failure",
            }
        env.update(_read_pairs(files["GITHUB_ENV"]))
        failed = failed or done.returncode != 0
        run.summary = summary.read_text() if summary.exists() else ""
    run.job_outputs = {k: _text(evaluate(str(v), contexts)) for k, v in spec.get("outputs", {}).items()}
    return run


def fresh_clone(source: Path, dest: Path) -> Path:
    """A clone of ``source``'s working state (tracked and new files, not ignored ones), as the
    forge's checkout would give a job: the files are committed in an ``origin`` repository
    first, then cloned (so ``git fetch origin`` works in the job)."""
    origin = dest / "origin"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        path = source / name
        if path.is_file():
            target = origin / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
            target.chmod(path.stat().st_mode)
    who = {
        "GIT_AUTHOR_NAME": "ci",
        "GIT_AUTHOR_EMAIL": "ci@example.invalid",
        "GIT_COMMITTER_NAME": "ci",
        "GIT_COMMITTER_EMAIL": "ci@example.invalid",
    }
    git_env = {**os.environ, **who}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "the project"]):
        subprocess.run(["git", *args], cwd=origin, check=True, env=git_env, capture_output=True)
    clone = dest / "workspace"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True, capture_output=True)
    return clone
