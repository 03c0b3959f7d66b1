"""Size limits of engine/: no file over 500 lines, no function over 60 lines, none with more
than 8 positional parameters, and no name starting with "_" imported or read across engine
files (engine/_checks.py and the documented shared helpers aside). What is still over a
limit is listed here by name, so the list can only shrink: a new file or function over a
limit fails."""
import ast
import functools
import pathlib
import sys

import pytest

ENGINE = pathlib.Path(__file__).resolve().parents[1] / "engine"
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_POSITIONAL = 500, 60, 8

# Still over a limit (each one to be split).
FILES_OVER = set()
FUNCTIONS_OVER = set()


def _files():
    return sorted(p for p in ENGINE.rglob("*.py") if "__pycache__" not in p.parts)


def _name(p) -> str:
    return p.relative_to(ENGINE).as_posix()


@functools.lru_cache(maxsize=1)  # the tree does not change during a run
def measure():
    """``(file lines, function lines, positional counts, private imports)`` of engine/."""
    files, functions, positional, private = {}, {}, {}, []
    for p in _files():
        text = p.read_text()
        files[_name(p)] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{_name(p)}:{node.name}"
                functions[key] = max(functions.get(key, 0), node.end_lineno - node.lineno + 1)
                args = node.args.posonlyargs + node.args.args
                k = len(args) - (1 if args and args[0].arg in ("self", "cls") else 0)
                positional[key] = max(positional.get(key, 0), k)
            elif isinstance(node, ast.ImportFrom) and node.level and node.module != "_checks" \
                    and not (node.module or "").endswith("._checks"):
                private += [f"{_name(p)}: {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    return files, functions, positional, private


def test_no_new_file_over_500_lines():
    # Check every file over the limit is a listed one (and every listed one is still over:
    # a file brought under the limit leaves the list).
    files = measure()[0]
    over = {f for f, n in files.items() if n > MAX_FILE_LINES}
    assert over <= FILES_OVER, sorted(over - FILES_OVER)
    assert FILES_OVER <= over, f"now within the limit, drop from FILES_OVER: {FILES_OVER - over}"


def test_no_new_function_over_60_lines():
    functions = measure()[1]
    over = {f for f, n in functions.items() if n > MAX_FUNCTION_LINES}
    assert over <= FUNCTIONS_OVER, sorted(over - FUNCTIONS_OVER)
    assert FUNCTIONS_OVER <= over, f"drop from FUNCTIONS_OVER: {FUNCTIONS_OVER - over}"


def test_no_function_takes_more_than_8_positional_parameters():
    positional = measure()[2]
    assert max(positional.values()) <= MAX_POSITIONAL, sorted(
        (n, f) for f, n in positional.items() if n > MAX_POSITIONAL)


def test_no_dataclass_takes_more_than_8_positional_fields():
    # A dataclass's generated __init__ is a function too (the AST walk cannot see it).
    import dataclasses
    import importlib
    import inspect

    over = []
    for p in _files():
        name = "engine." + _name(p)[:-3].replace("/", ".").removesuffix(".__init__")
        mod = importlib.import_module(name.removesuffix(".__init__"))
        for cls in vars(mod).values():
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls) \
                    and cls.__module__ == mod.__name__:
                params = list(inspect.signature(cls).parameters.values())
                k = sum(q.kind == q.POSITIONAL_OR_KEYWORD for q in params)
                if k > MAX_POSITIONAL:
                    over.append((k, f"{name}.{cls.__name__}"))
    assert not over, sorted(over)


def test_no_private_name_is_imported_across_engine_files():
    # Check `from .x import _y` appears nowhere in engine/ (engine/_checks.py is the
    # shared exception).
    assert measure()[3] == []


# The private names that are read across engine/ files on purpose, by the file that defines
# them. Each is documented as shared where it is defined; nothing else may cross.
SHARED_PRIVATE = {
    # Module's protocol for subclasses (the Module docstring lists them): layers and blocks
    # in every file of engine/nn/ and engine/models/ build on them.
    "nn/module.py": {"_ws", "_views", "_make_views", "_start_forward", "_start_backward",
                     "_saved", "_calls", "_dy_rows", "_no_forward", "_no_overlap",
                     "_set_plain", "_set_adjacent", "_params_moved"},
    # Optimizer's hooks for subclasses (its docstring): ShardedAdamW in engine/distributed/.
    "optim/optimizers.py": {"_all_params", "_check_groups"},
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(tree) -> set:
    """Names a file defines itself: functions, classes, and everything it assigns or binds
    (attributes included), so a read of one of them is not a read across files."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            own.add(node.arg)  # self.__dict__.update(_name=...)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            own.add(node.value)  # __slots__ entries, getattr/setattr names
    return own


def private_crossings() -> list:
    """``file:line: what`` for each private name of another engine file that a file imports
    (``from .x import _y``) or reads as an attribute (``obj._y``, ``self._y`` of a base class
    in another file), less the documented ``SHARED_PRIVATE`` ones. A private name no engine
    file defines (a library's, such as argparse's) is not engine's to police."""
    trees = {_name(p): ast.parse(p.read_text()) for p in _files()}
    own = {f: _own_names(tree) for f, tree in trees.items()}
    shared = set().union(*SHARED_PRIVATE.values())
    found = []
    for f, tree in trees.items():
        elsewhere = set().union(*(names for g, names in own.items() if g != f))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or
                                                     (node.module or "").startswith("engine")):
                if (node.module or "").endswith("_checks"):
                    continue  # the one module of shared checks
                found += [f"{f}:{node.lineno}: imports {a.name}" for a in node.names
                          if _private(a.name) and a.name not in shared]
            elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                name = node.attr
                if (_private(name) and name not in own[f] and name in elsewhere
                        and name not in shared):
                    found.append(f"{f}:{node.lineno}: reads {ast.unparse(node)}")
    return found


def test_no_private_name_crosses_engine_files():
    # Check that no engine file imports or reads another file's private name, beyond the
    # documented SHARED_PRIVATE helpers.
    assert private_crossings() == []


def test_shared_private_names_exist_where_listed():
    # Check each allowed name is still defined by the file that lists it (a renamed or
    # removed helper leaves the list instead of allowing a name nobody defines).
    for f, names in SHARED_PRIVATE.items():
        own = _own_names(ast.parse((ENGINE / f).read_text()))
        assert names <= own, (f, sorted(names - own))


def test_the_crossing_check_sees_a_reach_in(tmp_path, monkeypatch):
    # Check the walk catches both forms on a two-file tree: a private import and a read of
    # another file's private attribute (a check that found nothing would pass above).
    (tmp_path / "a.py").write_text("class A:\n    def __init__(self):\n        self._lock = 1\n"
                                   "def _helper():\n    pass\n")
    (tmp_path / "b.py").write_text("from .a import _helper\n\ndef f(m):\n    return m._lock\n")
    monkeypatch.setattr(sys.modules[__name__], "ENGINE", tmp_path)
    assert private_crossings() == ["b.py:1: imports _helper", "b.py:4: reads m._lock"]


@pytest.mark.parametrize("limit", ["file", "function", "positional"])
def test_measure_sees_the_largest(limit, capsys):
    # Check the measurement finds something at each kind of limit (a broken walk that found
    # nothing would pass every test above).
    files, functions, positional, _ = measure()
    table = {"file": files, "function": functions, "positional": positional}[limit]
    name, value = max(table.items(), key=lambda kv: kv[1])
    print(f"largest {limit}: {name} = {value}")
    assert value > {"file": 300, "function": 30, "positional": 4}[limit]


# ----------------------------------------------------------------------------- kernels/, bench/
# The same line budget outside engine/ (as tinygrad keeps one): generated code aside, a file
# over 500 lines or a function over 60 fails unless listed here with its reason.
OTHER_TREES = ("kernels", "bench")
GENERATED = {"kernels/_activation_kernels.py"}  # written by kernels/gen_activations.py
OTHER_FUNCTIONS_OVER = {  # still over when the budget was set (each one to be split)
    "bench/distributed.py:worker_mpi", "bench/step_causes.py:measure",
    "bench/step_profile.py:profile_case", "bench/vs_torch.py:torch_module",
    "bench/misses.py:format_misses", "bench/targets.py:target_checks",
    "kernels/instrument.py:record",
}


@functools.lru_cache(maxsize=1)
def measure_other():
    """``(file lines, function lines)`` of kernels/ and bench/, generated code left out."""
    root = ENGINE.parent
    files, functions = {}, {}
    for tree in OTHER_TREES:
        for p in sorted((root / tree).rglob("*.py")):
            name = p.relative_to(root).as_posix()
            if "__pycache__" in p.parts or name in GENERATED:
                continue
            text = p.read_text()
            files[name] = len(text.splitlines())
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    key = f"{name}:{node.name}"
                    functions[key] = max(functions.get(key, 0),
                                         node.end_lineno - node.lineno + 1)
    return files, functions


def test_kernels_and_bench_files_within_500_lines():
    # Check that no file of kernels/ or bench/ (generated code aside) passes 500 lines.
    files = measure_other()[0]
    assert not {f: n for f, n in files.items() if n > MAX_FILE_LINES}


def test_kernels_and_bench_functions_within_60_lines():
    # Check that every function over 60 lines in kernels/ or bench/ is a listed exception, and
    # every listed one is still over (a function brought within the limit leaves the list).
    functions = measure_other()[1]
    over = {f for f, n in functions.items() if n > MAX_FUNCTION_LINES}
    assert over <= OTHER_FUNCTIONS_OVER, sorted(over - OTHER_FUNCTIONS_OVER)
    assert OTHER_FUNCTIONS_OVER <= over, f"drop from the list: {OTHER_FUNCTIONS_OVER - over}"
