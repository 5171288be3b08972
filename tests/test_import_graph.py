"""No import cycles between the project's modules, counting imports inside functions too.

A function-level import that closes a cycle is still a cycle: it hides the dependency from a reader and
breaks as soon as someone hoists it. The graph is built with ``ast`` from every module of the packages
(imports under ``if TYPE_CHECKING:`` are for annotations only and are left out). The only cycles allowed
are the deliberate lazy registry loads in ``ALLOWED_EDGES``: each one names the import that closes it.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oracle", "searchers", "raytune_primus", "hardware", "experiments")

ALLOWED_EDGES: dict[tuple[str, str], str] = {
    # (importer, imported): why the cycle closed by this function-level import is deliberate
    ("searchers.base", "searchers.baselines"): "make_searcher loads the bundled searchers' registrations",
    ("searchers.base", "searchers.seed_llm"): "make_searcher loads the bundled searchers' registrations",
    ("oracle.model_card", "oracle.hf_import"): "the card registry's path loader reads a HF config.json",
}
# The pipeline schedule registry (oracle.pipeline.schedules) imports its modules with importlib on load,
# so a schedule is one module; that load is not a static import and needs no entry here.


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every module of the packages: the .py files, and the C extensions built from a .c source of the same
    name (setup.py: ``oracle/pipeline/_native.c``), which import none of the project's modules."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
        for path in sorted((ROOT / pkg).rglob("*.c")):
            out[_module_name(path)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    if path.suffix == ".c":
        return set()  # a C extension: it imports no project module
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := resolve(alias.name)) is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_pkg else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in known else resolve(base)
                if target is not None:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its body)."""
    mods = _modules()
    return {name: _imports(path, name, set(mods)) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_function_level_imports_and_finds_cycles():
    g = import_graph()
    assert "oracle.errors" in g["oracle.config"]
    assert "oracle.projector" in g["searchers.evaluator"]  # imported inside OracleEvaluator.score
    assert "oracle.config" not in g["oracle.legality"]  # annotation-only import under TYPE_CHECKING
    assert "oracle.pipeline._native" in g["oracle.pipeline._jit"]  # the C extension, a module of its own
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_but_the_listed_lazy_registry_loads():
    g = import_graph()
    for a, b in ALLOWED_EDGES:
        g[a].discard(b)
    found = cycles(g)
    assert not found, "import cycles (modules that import each other, directly or through others):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_allowed_edges_exist():
    g = import_graph()
    stale = [e for e in ALLOWED_EDGES if e[1] not in g.get(e[0], set())]
    assert not stale, f"allow-listed imports that no longer exist (remove them): {stale}"
