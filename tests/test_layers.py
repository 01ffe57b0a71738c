"""The layer rule, read from the imports of every module in ``lit_amp/``.

Layers, lowest first (README, "Layout"):

0. torch-only: ``amp``, ``metrics``, ``thor`` (THOR's optimizer), ``serialization`` (the
   checkpoint format) and the shared ``_validation``, ``_io``, ``_lazy``, ``_runtime``,
   ``_signals``, ``_sparse`` import no Lightning;
1. Lightning adapters: ``callbacks``, ``plugins``, ``boost`` import no facade and no CLI;
2. facades: ``model``, ``rec`` and ``thor.convert`` (``ThorModel`` builds a ``Model``; a module
   whose layer is not its package's is listed in ``MODULE_LAYER``): ``model`` imports nothing
   of ``rec``; none imports the CLI;
3. the application: ``cli``; ``demos`` (example nets and data) is used only by the CLI,
   examples, benchmarks and tests.

No subpackage imports a private (``_``-prefixed) module or name of another subpackage; the
top-level ``lit_amp._validation``, ``_io``, ``_lazy``, ``_runtime``, ``_signals`` and
``_sparse`` are the package's shared infrastructure. Imports form no circle between files,
function-local imports included (a local import only hides a circle). A name imported from a
package counts as an import of the module its lazy ``_EXPORTS`` table names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lit_amp"

LAYER = {
    "amp": 0, "metrics": 0, "thor": 0, "serialization": 0,
    "_validation": 0, "_io": 0, "_lazy": 0, "_runtime": 0, "_sparse": 0, "_pages": 0,
    "_signals": 0,
    "callbacks": 1, "plugins": 1, "boost": 1,
    "model": 2, "rec": 2,
    "cli": 3, "demos": 3, "__main__": 3,
    "__init__": 3,
}
#: modules whose layer is not their package's (relative to ``lit_amp``)
#: rec's row-increment format is read by ``serialization.load_checkpoint`` (torch only)
MODULE_LAYER = {"thor.convert": 2, "rec.state.increments": 0}
SHARED = {"_validation", "_io", "_lazy", "_runtime", "_sparse", "_pages", "_signals"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, *, module_level_only: bool = False) -> list[tuple[str, list[str], int]]:
    """``(module, names, lineno)`` for every ``lit_amp`` / ``lightning`` import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            out.append((mod, [a.name for a in node.names], node.lineno))
    return out


def _top(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "lit_amp":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
    """The layer of a ``lit_amp`` module: its (or its package's) MODULE_LAYER entry, else LAYER."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULE_LAYER:
            return MODULE_LAYER[".".join(parts[:n])]
    return LAYER[_top(module)]


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {_module_name(p) for p in FILES}


def _lazy_table(package: str) -> dict[str, str]:
    """A package's ``_EXPORTS`` table ``{name: module}`` (empty when it has none)."""
    init = ROOT.parent.joinpath(*package.split("."), "__init__.py")
    if package not in MODULES or not init.is_file():
        return {}
    for node in ast.parse(init.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "_EXPORTS":
            return ast.literal_eval(node.value)
    return {}


def _targets(mod: str, names: list[str]) -> set[str]:
    """The modules an import of ``names`` from ``mod`` loads: a submodule, the module a
    package's lazy table names, else ``mod`` itself."""
    out = set()
    for name in names or [""]:
        if f"{mod}.{name}" in MODULES:
            out.add(f"{mod}.{name}")
        else:
            out.add(_lazy_table(mod).get(name, mod))
    return out


def test_every_top_level_name_has_a_layer() -> None:
    tops = {_top(_module_name(p)) for p in FILES}
    assert tops <= set(LAYER), f"classify these in LAYER: {sorted(tops - set(LAYER))}"
    stale = {m for m in MODULE_LAYER if f"lit_amp.{m}" not in MODULES}
    assert not stale, f"MODULE_LAYER names modules that do not exist: {sorted(stale)}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_layer_rule(path: Path) -> None:
    module = _module_name(path)
    me, my_layer = _top(module), _layer(module)
    problems = []
    for mod, names, line in _imports(path):
        if my_layer == 0 and me not in ("__init__", "__main__") and (
                mod == "lightning" or mod.startswith(("lightning.", "pytorch_lightning"))):
            problems.append(f"line {line}: torch-only layer imports {mod}")
        other = _top(mod)
        if other is None or me in ("__init__", "__main__"):
            continue
        for target in sorted(_targets(mod, names)):
            if _top(target) not in SHARED and _layer(target) > my_layer:
                problems.append(f"line {line}: layer {my_layer} ({module}) imports {target} "
                                f"(layer {_layer(target)})")
        if other == me:
            continue
        if me == "model" and other == "rec":
            problems.append(f"line {line}: model imports rec ({mod})")
        if other == "demos" and me != "cli":
            problems.append(f"line {line}: {me} imports the demos ({mod})")
        if other not in SHARED:
            private = [p for p in mod.split(".")[1:] if p.startswith("_") and p != "__init__"]
            private += [n for n in names if n.startswith("_")]
            if private:
                problems.append(f"line {line}: private name(s) {private} of {mod}")
    assert not problems, "\n".join(problems)


def _import_graph() -> dict[str, set[str]]:
    """``{module: the lit_amp modules it imports}``, function-local imports included."""
    graph: dict[str, set[str]] = {}
    for p in FILES:
        me = _module_name(p)
        deps = set()
        for mod, imported, _line in _imports(p):
            if not mod.startswith("lit_amp"):
                continue
            for target in _targets(mod, imported):
                while target not in MODULES and "." in target:
                    target = target.rpartition(".")[0]
                # a module importing its own package's __init__ (or vice versa) is how
                # packages re-export; only circles between distinct modules count
                if target != me and not me.startswith(target + ".") and \
                        not target.startswith(me + "."):
                    deps.add(target)
        graph[me] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    circles = _circles(_import_graph())
    assert not circles, "import circles (function-local imports count):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


#: a function longer than this does more than one thing (a module is as long as its concern)
MAX_FUNCTION_CODE_LINES = 80


def _code_lines(node: ast.AST, source: list[str]) -> int:
    """Lines of ``node`` that are code: no docstring, blank or comment-only lines."""
    body = getattr(node, "body", [])
    skip: set[int] = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                             ast.Constant) \
            and isinstance(body[0].value.value, str):
        skip = set(range(body[0].lineno, body[0].end_lineno + 1))
    count = 0
    for n in range(node.lineno, node.end_lineno + 1):
        text = source[n - 1].strip()
        if n not in skip and text and not text.startswith("#"):
            count += 1
    return count


def test_function_sizes() -> None:
    too_long = []
    for p in FILES:
        text = p.read_text()
        source = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(node, source)
                if n > MAX_FUNCTION_CODE_LINES:
                    too_long.append(f"{p.relative_to(ROOT.parent)}:{node.name}: {n} lines of code")
    assert not too_long, "\n".join(too_long)
