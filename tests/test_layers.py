"""Imports point one way: kvcache, graph_opt <- models <- devices <- edge <- apps (docs/architecture.md).

Every layer installs under the one import root `edge` (edge.models is the folder models/, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANK = {"kvcache": 0, "graph_opt": 0, "models": 1, "devices": 2, "edge": 3, "apps": 4}
LAYERS = set(RANK) - {"edge"}  # folders installed as edge.<folder>
# The typed errors are a leaf module every layer may raise (edge/errors.py imports nothing of ours).
ALLOWED = {"edge.errors"}


def _layer(module: str) -> str | None:
    """The layer (folder) a module name belongs to; None: not edge's."""
    parts = module.split(".")
    if parts[0] != "edge":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "edge"


BACKEND_SDKS = {"openvino", "onnxruntime", "llama_cpp", "coremltools"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at_top_level) for each import in a file."""
    tree = ast.parse(path.read_text(), str(path))
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "edge" and node.level == 0:
            out += [(f"edge.{a.name}", id(node) in top) for a in node.names]  # from edge import graph_opt
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, id(node) in top))
    return out


def _files() -> list[tuple[str, Path]]:
    return [(pkg, f) for pkg in RANK for f in sorted((ROOT / pkg).rglob("*.py"))]


def test_no_upward_imports() -> None:
    bad = []
    for pkg, f in _files():
        for mod, _ in _imports(f):
            layer = _layer(mod)
            if layer is not None and RANK[layer] > RANK[pkg] and mod not in ALLOWED:
                bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)
    assert len(_files()) > 10


def test_errors_module_is_a_leaf() -> None:
    mods = [m for m, _ in _imports(ROOT / "edge" / "errors.py")]
    assert all(_layer(m) is None for m in mods), mods


def test_backend_sdks_imported_lazily() -> None:
    bad = [
        f"{f.relative_to(ROOT)} imports {mod} at module level"
        for _, f in _files()
        for mod, top in _imports(f)
        if top and mod.split(".")[0] in BACKEND_SDKS
    ]
    assert not bad, "\n".join(bad)


def test_the_runtime_imports_no_graph_builder() -> None:
    """`edge run` on a graph already built needs none of the graph passes' libraries (onnx_ir, onnxscript,
    sympy: ~0.6 s of a one-shot run on 2 cores); graph_opt loads them when a graph is built or converted."""
    import subprocess
    import sys

    code = (
        "import sys, edge.api, edge.cli, edge.model, edge.devices.graph_decoder, edge.devices.planned\n"
        "heavy = [m for m in ('onnx_ir', 'onnxscript', 'sympy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import edge.graph_opt.pipeline, edge.graph_opt.attention  # submodules named like the passes, first\n"
        "import edge.graph_opt as g\n"
        "assert 'attention' in g.PASSES and callable(g.attention) and callable(g.pipeline)\n"
        "assert callable(g.optimize) and callable(g.fold) and g.PASSES['fold'].fn is g.fold\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
