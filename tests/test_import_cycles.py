"""engine/ has no import cycles and its folders are layered: the module-level ``from .x
import`` / ``import engine.x`` edges between its modules, read from the source (AST, no
import), form no cycle (a cycle makes the result of an import depend on which module a user
happens to import first), and no import, lazy ones included, runs from a folder to one above
it (nn < optim < data < models < training < distributed < cli)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"

# engine's folders, lowest first: a module may import from its own folder or one below.
LAYERS = ("nn", "optim", "data", "models", "training", "distributed", "cli")

# Edges a cycle may still run through, each with why it is not removed yet.
KNOWN = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").is_file()


def _exists(name: str) -> bool:
    return _is_package(name) or (ROOT / (name.replace(".", "/") + ".py")).is_file()


def _top_level_imports(tree, lazy: bool = False):
    """Import statements executed when the module is imported: the module body and the
    if/try blocks in it, not function or class bodies nor ``if TYPE_CHECKING:``; with
    ``lazy``, every import statement of the file."""
    if lazy:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        return
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                stack += handler.body


def _edges_of(path: Path, lazy: bool = False) -> set:
    """The engine modules ``path`` imports at module level (with ``lazy``: anywhere)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _top_level_imports(ast.parse(path.read_text(), str(path)), lazy):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            if node.level == 0:
                base = node.module
            elif node.module:
                base = f"{base}.{node.module}"
            # `from pkg import sub` imports the sub-module; `from pkg import name` the package
            targets = [f"{base}.{a.name}" if _exists(f"{base}.{a.name}") else base
                       for a in node.names]
        out |= {t for t in targets if t.split(".")[0] == "engine" and t != name and _exists(t)}
    return out


def import_graph(lazy: bool = False) -> dict:
    """Module name -> the engine modules it imports at module level (``lazy``: anywhere)."""
    return {_module_name(p): _edges_of(p, lazy) for p in sorted(ENGINE.rglob("*.py"))}


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    # Check the walk sees real edges (an empty graph would pass the cycle test vacuously).
    graph = import_graph()
    assert "engine.nn.module" in graph["engine.nn.layers"]
    assert "engine.nn.layers" in graph["engine.nn.containers"]
    assert "engine.training.checkpoint" in graph["engine.training.callbacks"]


def test_the_cycle_finder_finds_a_cycle():
    # Check cycles() reports a three-module loop and ignores a tail hanging off it.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_engine_has_no_import_cycle():
    # Check no cycle runs through engine's module-level imports, the known edges aside.
    graph = import_graph()
    for a, b in KNOWN:
        assert b in graph[a], f"known edge {a} -> {b} is gone: drop it from KNOWN"
        graph[a] = graph[a] - {b}
    assert cycles(graph) == []


def _layer(module: str):
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_import_runs_up_the_layers():
    # Check every import between two of engine's folders, lazy ones included, goes to the
    # same folder or one below.
    upward = {(a, b) for a, targets in import_graph(lazy=True).items() for b in targets
              if None not in (_layer(a), _layer(b)) and _layer(b) > _layer(a)}
    assert upward == set()
