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
from enum import StrEnum

MODULE = "<module>"

# Names too common to resolve by name alone: builtins and the methods of builtin
# containers (``self.requests.get(...)`` is not a call of some vLLM ``get``).
COMMON_NAMES = frozenset(
    name
    for owner in (builtins, dict, list, set, str, tuple, collections.deque, collections.OrderedDict)
    for name in dir(owner)
) | {"super", "self", "cls"}


class ParamKind(StrEnum):
    """Python's five parameter kinds (``inspect.Parameter.kind``), named as griffe names them."""

    POSITIONAL_ONLY = "positional-only"
    POSITIONAL_OR_KEYWORD = "positional or keyword"
    VAR_POSITIONAL = "variadic positional"
    KEYWORD_ONLY = "keyword-only"
    VAR_KEYWORD = "variadic keyword"


POSITIONAL = (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
VARIADIC = (ParamKind.VAR_POSITIONAL, ParamKind.VAR_KEYWORD)


@dataclass(frozen=True)
class Param:
    name: str
    kind: ParamKind
    default: str | None = None  # the default's source text; None: required (or variadic)

    @property
    def required(self) -> bool:
        return self.default is None and self.kind not in VARIADIC


class SymbolKind(StrEnum):
    FUNCTION = "function"
    CLASS = "class"
    MODULE = "module"


@dataclass(frozen=True)
class Symbol:
    qualname: str
    kind: SymbolKind
    start: int  # first line (decorators included), 1-based
    end: int  # last line, inclusive
    signature: str  # "(a, b: int = 0) -> bool" for a function; "(Base)" for a class
    params: tuple[Param, ...]  # a function's parameters, in order
    text: str  # what is compared between versions (see the module docstring)
    bound: bool = False  # a method that gets its first parameter (self, cls) from the call

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def takes(self, kind: ParamKind) -> bool:
        return any(p.kind is kind for p in self.params)


@dataclass(frozen=True)
class CallSite:
    name: str  # the called name: ``f`` of ``f(...)`` or ``obj.f(...)``
    keywords: tuple[str, ...]
    line: int
    receiver: str = ""  # ``coordinator`` of ``self.coordinator.f(...)``, ``self`` of ``self.f()``
    positional: int = 0  # how many positional arguments it passes (``*xs`` not counted)
    star_args: bool = False  # it passes ``*xs``: how many is unknown
    star_kwargs: bool = False  # it passes ``**kw``: which names is unknown


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


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[Param, ...]:
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [
        Param(
            p.arg,
            ParamKind.POSITIONAL_ONLY if i < len(a.posonlyargs) else ParamKind.POSITIONAL_OR_KEYWORD,
            None if d is None else ast.unparse(d),
        )
        for i, (p, d) in enumerate(zip(positional, defaults, strict=True))
    ]
    if a.vararg:
        params.append(Param(a.vararg.arg, ParamKind.VAR_POSITIONAL))
    params += [
        Param(p.arg, ParamKind.KEYWORD_ONLY, None if d is None else ast.unparse(d))
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
    ]
    if a.kwarg:
        params.append(Param(a.kwarg.arg, ParamKind.VAR_KEYWORD))
    return tuple(params)


def _bound(node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> bool:
    """A method called as ``obj.m(...)`` or ``cls.m(...)`` gets its first parameter implicitly."""
    names = {d.id if isinstance(d, ast.Name) else "" for d in node.decorator_list}
    return in_class and "staticmethod" not in names


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
        MODULE: Symbol(MODULE, SymbolKind.MODULE, 1, max(len(lines), 1), "", (), _header(lines, tree))
    }

    def visit(body: Iterable[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + node.name
                start, end = _first_line(node), node.end_lineno or node.lineno
                found[name] = Symbol(
                    name,
                    SymbolKind.FUNCTION,
                    start,
                    end,
                    _signature(node),
                    _params(node),
                    _segment(lines, start, end),
                    bound=_bound(node, in_class=bool(prefix)),
                )
            elif isinstance(node, ast.ClassDef):
                name = prefix + node.name
                bases = ", ".join(ast.unparse(b) for b in node.bases)
                start, end = _first_line(node), node.end_lineno or node.lineno
                found[name] = Symbol(
                    name, SymbolKind.CLASS, start, end, f"({bases})", (), _header(lines, node)
                )
                visit(node.body, name + ".")

    visit(tree.body, "")
    return found


def enclosing(syms: dict[str, Symbol], line: int) -> str:
    """The innermost function containing ``line``; else the innermost class; else the module."""
    best: Symbol | None = None
    for sym in syms.values():
        if sym.kind is SymbolKind.MODULE or not sym.start <= line <= sym.end:
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
            positional = sum(1 for arg in node.args if not isinstance(arg, ast.Starred))
            star_args = any(isinstance(arg, ast.Starred) for arg in node.args)
            star_kwargs = any(k.arg is None for k in node.keywords)
            sites.append(CallSite(name, keywords, node.lineno, receiver, positional, star_args, star_kwargs))
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
