"""What a Python file defines and calls, by ``ast``: the review's view of code.

A *symbol* is a function or method (its whole text), a class (its header: decorators,
``class`` line and the statements of its body that are not definitions) or the module
(its top-level statements that are not definitions). Qualified names are dotted:
``Scheduler.schedule``, ``KVCacheManager.allocate_slots``, ``<module>``.
"""

from __future__ import annotations

import ast
import builtins
import collections
from collections.abc import Iterable
from dataclasses import dataclass

MODULE = "<module>"

# Names too common to resolve by name alone: builtins and the methods of builtin
# containers (``self.requests.get(...)`` is not a call of some vLLM ``get``).
COMMON_NAMES = frozenset(
    name
    for owner in (builtins, dict, list, set, str, tuple, collections.deque, collections.OrderedDict)
    for name in dir(owner)
) | {"super", "self", "cls"}


@dataclass(frozen=True)
class Symbol:
    qualname: str
    kind: str  # "function", "class" or "module"
    start: int  # first line (decorators included), 1-based
    end: int  # last line, inclusive
    signature: str  # "(a, b: int = 0) -> bool" for a function; "(Base)" for a class
    params: tuple[str, ...]  # parameter names of a function, in order
    var_keyword: bool  # the function takes **kwargs
    required: tuple[str, ...]  # parameters without a default
    text: str  # what is compared between versions (see the module docstring)

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class CallSite:
    name: str  # the called name: ``f`` of ``f(...)`` or ``obj.f(...)``
    keywords: tuple[str, ...]
    line: int
    receiver: str = ""  # ``coordinator`` of ``self.coordinator.f(...)``, ``self`` of ``self.f()``


@dataclass(frozen=True)
class NewMethod:
    """A method defined on a class, with the class's base names (for override checks)."""

    cls: str
    name: str
    bases: tuple[str, ...]
    line: int


def parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None  # e.g. a file with conflict markers: nothing to say by AST


def _segment(lines: list[str], start: int, end: int) -> str:
    return "".join(lines[start - 1 : end])


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])  # type: ignore[attr-defined]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    text = f"({ast.unparse(node.args)})"
    if node.returns is not None:
        text += f" -> {ast.unparse(node.returns)}"
    return ("async " if isinstance(node, ast.AsyncFunctionDef) else "") + text


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return tuple(names)


def _required(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    without = positional[: len(positional) - len(a.defaults)]
    kw = [p for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    return tuple(p.arg for p in (*without, *kw))


def _header(lines: list[str], node: ast.ClassDef | ast.Module) -> str:
    """A class's or module's own text: everything but the definitions in its body."""
    parts = []
    if isinstance(node, ast.ClassDef):
        body_start = node.body[0].lineno if node.body else node.end_lineno or node.lineno
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
            body_start = first.lineno  # keep the docstring with the header
        parts.append(_segment(lines, _first_line(node), body_start - 1))
    for stmt in node.body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            parts.append(_segment(lines, _first_line(stmt), stmt.end_lineno or stmt.lineno))
    return "".join(parts)


def symbols(source: str) -> dict[str, Symbol]:
    """Every function, method and class of ``source`` by qualified name, and the module."""
    tree = parse(source)
    if tree is None:
        return {}
    lines = source.splitlines(keepends=True)
    found: dict[str, Symbol] = {
        MODULE: Symbol(MODULE, "module", 1, max(len(lines), 1), "", (), False, (), _header(lines, tree))
    }

    def visit(body: Iterable[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + node.name
                start, end = _first_line(node), node.end_lineno or node.lineno
                found[name] = Symbol(
                    name,
                    "function",
                    start,
                    end,
                    _signature(node),
                    _params(node),
                    node.args.kwarg is not None,
                    _required(node),
                    _segment(lines, start, end),
                )
            elif isinstance(node, ast.ClassDef):
                name = prefix + node.name
                bases = ", ".join(ast.unparse(b) for b in node.bases)
                start, end = _first_line(node), node.end_lineno or node.lineno
                found[name] = Symbol(
                    name, "class", start, end, f"({bases})", (), False, (), _header(lines, node)
                )
                visit(node.body, name + ".")

    visit(tree.body, "")
    return found


def enclosing(syms: dict[str, Symbol], line: int) -> str:
    """The innermost function containing ``line``; else the innermost class; else the module."""
    best: Symbol | None = None
    for sym in syms.values():
        if sym.kind == "module" or not sym.start <= line <= sym.end:
            continue
        if best is None or (sym.kind, -(sym.end - sym.start)) > (best.kind, -(best.end - best.start)):
            best = sym  # "function" > "class"; then the narrowest
    return best.qualname if best else MODULE


def calls(source: str, lines: set[int]) -> list[CallSite]:
    """The calls on ``lines`` of ``source`` (a call spanning several lines counts if any is one)."""
    tree = parse(source)
    if tree is None or not lines:
        return []
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if not span & lines:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name and name not in COMMON_NAMES and not name.startswith("__"):
            keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
            receiver = ""
            if isinstance(func, ast.Attribute):
                value = func.value
                receiver = (
                    value.attr
                    if isinstance(value, ast.Attribute)
                    else value.id
                    if isinstance(value, ast.Name)
                    else ""
                )
            sites.append(CallSite(name, keywords, node.lineno, receiver))
    return sorted(sites, key=lambda s: (s.line, s.name))


def new_methods(source: str, lines: set[int]) -> list[NewMethod]:
    """Methods whose ``def`` line is in ``lines``, with their class's base names."""
    tree = parse(source)
    if tree is None:
        return []
    found = []

    def visit(body: Iterable[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                bases = tuple(
                    b.attr if isinstance(b, ast.Attribute) else b.id
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                )
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.lineno in lines:
                        found.append(NewMethod(prefix + node.name, item.name, bases, item.lineno))
                visit(node.body, prefix + node.name + ".")

    visit(tree.body, "")
    return found


def vllm_imports(source: str) -> list[str]:
    """Absolute ``vllm.*`` modules ``source`` imports (``from m import x`` also offers ``m.x``)."""
    tree = parse(source)
    if tree is None:
        return []
    modules: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "vllm":
                modules.append(node.module)
                modules += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules += [a.name for a in node.names if a.name.split(".")[0] == "vllm"]
    return list(dict.fromkeys(modules))


def module_files(module: str) -> tuple[str, str]:
    """The two paths a module may live at."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def compatible(old: Symbol, new: Symbol) -> bool:
    """Whether every call that worked against ``old`` still binds against ``new``:
    nothing removed or reordered, and whatever is new has a default."""
    kept = [p for p in new.params if p in old.params]
    added = [p for p in new.params if p not in old.params]
    return (
        all(p in new.params for p in old.params)
        and kept == list(old.params)
        and not any(p in new.required for p in added)
        and not any(p in new.required and p not in old.required for p in kept)
    )


def describe_signature_change(old: Symbol, new: Symbol) -> str:
    """One line: what a reader must know about ``old`` -> ``new``."""
    removed = [p for p in old.params if p not in new.params]
    added = [p for p in new.params if p not in old.params]
    parts = []
    if removed:
        parts.append("removed " + ", ".join(f"`{p}`" for p in removed))
    if added:
        parts.append("added " + ", ".join(f"`{p}`" for p in added))
    if not parts:
        kept = [p for p in old.params if p in new.params]
        if kept != [p for p in new.params if p in old.params]:
            parts.append("parameters reordered")
        else:
            parts.append("annotations, defaults or return type changed")
    return "; ".join(parts)
