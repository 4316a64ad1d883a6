"""No import cycle among the package's modules: every import a module runs, at its top or inside a function
(a lazy import still ties the two modules together), with `from X import Y` counting X.Y where Y is a module.
Imports under `if TYPE_CHECKING:` do not run and are left out: they name types only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edge", "kvcache", "graph_opt", "models", "devices", "apps")


def _name(pkg: str, f: Path) -> str:
    parts = list(f.relative_to(ROOT / pkg).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["edge"] + ([] if pkg == "edge" else [pkg]) + parts)


def _modules() -> dict[str, Path]:
    return {_name(pkg, f): f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")}


def _typing_only(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for child in node.body for n in ast.walk(child)}
    return out


def _imports(f: Path, known: set[str]) -> set[str]:
    tree = ast.parse(f.read_text(), str(f))
    skip = _typing_only(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            names = {a.name for a in node.names}
            if len(subs) < len(names) and node.module in known:  # some name is defined in the module itself
                out.add(node.module)
            out |= subs
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles() -> None:
    mods = _modules()
    graph = {m: _imports(f, set(mods)) - {m} for m, f in mods.items()}
    assert sum(map(len, graph.values())) > 200  # the walk sees the imports
    assert not _cycles(graph), "\n".join(" <-> ".join(c) for c in _cycles(graph))


def test_the_walk_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
