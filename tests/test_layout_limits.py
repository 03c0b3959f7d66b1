"""Size limits of engine/: no file over 500 lines, no function over 60 lines, none with more
than 8 positional parameters, and no name starting with "_" imported from another engine
file (engine/_checks.py aside). What is still over a limit is listed here by name, so the
list can only shrink: a new file or function over a limit fails."""
import ast
import pathlib

import pytest

ENGINE = pathlib.Path(__file__).resolve().parents[1] / "engine"
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_POSITIONAL = 500, 60, 8

# Still over a limit (each one to be split).
FILES_OVER = {"distributed.py", "data.py"}
FUNCTIONS_OVER = {"data.py:_load_csv"}


def _files():
    return sorted(p for p in ENGINE.rglob("*.py") if "__pycache__" not in p.parts)


def _name(p) -> str:
    return p.relative_to(ENGINE).as_posix()


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


def test_no_private_name_is_imported_across_engine_files():
    # Check `from .x import _y` appears nowhere in engine/ (engine/_checks.py is the
    # shared exception).
    assert measure()[3] == []


@pytest.mark.parametrize("limit", ["file", "function", "positional"])
def test_measure_sees_the_largest(limit, capsys):
    # Check the measurement finds something at each kind of limit (a broken walk that found
    # nothing would pass every test above).
    files, functions, positional, _ = measure()
    table = {"file": files, "function": functions, "positional": positional}[limit]
    name, value = max(table.items(), key=lambda kv: kv[1])
    print(f"largest {limit}: {name} = {value}")
    assert value > {"file": 300, "function": 30, "positional": 4}[limit]
