"""The commands the README and docs/distributed.md show work as written: the environment is
activated before the first one, the `mpiexec` line runs from a shell whose PATH knows nothing
of the project, and every list flag takes one syntax (space-separated values). The bench
commands of docs/performance.md and bench/README.md take minutes each, so they are not run:
the docs say so, and the tests here check that every script, module, Makefile target and flag
they show exists (`python -m engine info`, cheap, is run)."""
import argparse
import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from engine.cli import build_parser, main

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = pathlib.Path(sys.executable).parent
ACTIVATE = VENV_BIN / "activate"


def _fenced_lines(path) -> list:
    """The lines of the fenced code blocks of a Markdown file, in order."""
    out, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            out.append(line.strip())
    return out


def _is_command(line: str) -> bool:
    return bool(re.match(r"(\S+=\S+ )*(blasnet|python -m engine|mpiexec|python )", line))


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md", "docs/lm.md", "docs/distributed.md",
                                 "docs/threads-and-kernels.md"])
def test_the_environment_is_activated_before_the_first_command(doc):
    # Check that `. .venv/bin/activate` comes before the first shell command that needs the
    # environment (blasnet, python -m engine, mpiexec) in the doc's code blocks.
    lines = _fenced_lines(ROOT / doc)
    commands = [i for i, ln in enumerate(lines) if _is_command(ln)]
    activate = [i for i, ln in enumerate(lines) if ln.startswith(". .venv/bin/activate")]
    assert commands and activate and activate[0] < commands[0], (doc, lines[commands[0]])


def _mpiexec_lines() -> list:
    return [ln for ln in _fenced_lines(ROOT / "docs/distributed.md")
            if re.match(r"(\S+=\S+ )*mpiexec -n \d+ python -m engine", ln)]


@pytest.mark.slow
@pytest.mark.skipif(not (VENV_BIN / "mpiexec").exists() or not ACTIVATE.exists(),
                    reason="the optional extra 'mpi' (mpi4py, mpiexec in the venv) is not "
                           "installed")
def test_the_distributed_doc_mpiexec_line_runs_as_written(tmp_path):
    # Check that docs/distributed.md's first mpiexec line, run after `. .venv/bin/activate`
    # from a shell whose PATH has neither the venv nor mpiexec, trains on 2 ranks (2 epochs
    # appended, to keep it short; the rest is the line as written).
    pytest.importorskip("mpi4py")
    line = _mpiexec_lines()[0]
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path))}
    script = f". {ACTIVATE} && {line} --epochs 2"
    r = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (script, r.stdout[-2000:], r.stderr[-2000:])
    assert "2 ranks" in r.stdout.splitlines()[0], r.stdout[:2000]
    assert re.search(r"epoch +2/2", r.stdout), r.stdout[-2000:]


def test_the_distributed_doc_shows_an_mpiexec_line():
    assert _mpiexec_lines()


def _subparsers():
    for a in build_parser()._actions:
        if isinstance(a, argparse._SubParsersAction):
            yield from a.choices.items()


def test_every_list_flag_takes_space_separated_values():
    # Check that each flag taking several values uses nargs (`--hidden 64 32`,
    # `--y-cols a b`), none a comma-separated string, and that its help does not teach commas.
    found = []
    for name, sub in _subparsers():
        for a in sub._actions:
            if not a.option_strings:
                continue
            several = a.nargs not in (None, 0, 1, "?") or isinstance(a.default, (list, tuple))
            if several:
                found.append(f"{name} {a.option_strings[0]}")
                assert a.nargs == "+", (name, a.option_strings)
                assert "comma" not in (a.help or ""), (name, a.option_strings, a.help)
    assert {"train --hidden", "train --y-cols", "train --x-cols"} <= set(found)


def test_list_flags_parse_alike():
    p = build_parser()
    a = p.parse_args(["train", "--hidden", "64", "32", "--y-cols", "a", "b",
                      "--x-cols", "c", "d"])
    assert a.hidden == [64, 32] and a.y_cols == ["a", "b"] and a.x_cols == ["c", "d"]
    assert p.parse_args(["train", "--hidden", "64,32"]).hidden == [64, 32]  # older spelling


def test_the_predict_x_cols_flag_takes_several_names(tmp_path, capsys):
    # Check the same syntax through a real run: train on two named inputs, predict with them.
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,c,y\n" + "".join(f"{i % 5},{i % 3},{i % 7},{(i % 5) * 0.5}\n"
                                         for i in range(40)))
    ck = tmp_path / "m.npz"
    assert main(["train", "--data", str(csv), "--x-cols", "a", "b", "--y-cols", "y",
                 "--model", "mlp", "--hidden", "8", "8", "--epochs", "2", "--quiet",
                 "--save", str(ck)]) == 0
    out = tmp_path / "p.csv"
    assert main(["predict", str(ck), "--data", str(csv), "--x-cols", "a", "b",
                 "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 41


PERF_DOCS = ["docs/performance.md", "bench/README.md"]


def _shown_commands(doc) -> list:
    """``(program, args)`` of each command line in the doc's fenced blocks, with ``env -u NAME``
    and ``NAME=value`` prefixes dropped and a ``<placeholder>`` path read as a word."""
    out = []
    for line in _fenced_lines(ROOT / doc):
        words = shlex.split(re.sub(r"<[^>]*>", "VENV", line))
        while words and (words[0] == "env" or re.fullmatch(r"\w+=\S*", words[0])):
            words = words[1:]
            while words[:1] == ["-u"]:  # env -u NAME
                words = words[2:]
        if words:
            out.append((words[0], words[1:]))
    return out


def _flags(args) -> list:
    return [a for a in args if a.startswith("-") and not re.fullmatch(r"-?\d+", a)]


def _check_python(args) -> None:
    """The script or module exists and declares every flag passed to it."""
    if args[0] == "-m":
        mod, rest = args[1], args[2:]
        if mod == "engine":
            build_parser().parse_args(rest)  # SystemExit on an unknown subcommand or flag
            return
        if not mod.startswith(("bench", "kernels")):
            assert importlib.util.find_spec(mod) is not None, mod
            return
        path = ROOT / (mod.replace(".", "/") + ".py")
    else:
        path, rest = ROOT / args[0], args[1:]
    assert path.is_file(), path
    source = path.read_text()
    missing = [f for f in _flags(rest) if f'"{f}"' not in source]
    assert not missing, (path.name, missing)


def _check_make(args) -> None:
    """The Makefile has the target and reads every VAR=value passed."""
    makefile = (ROOT / "Makefile").read_text()
    for a in args:
        if "=" in a:
            assert f"$({a.split('=')[0]})" in makefile, a
        else:
            assert re.search(rf"^{re.escape(a)}:", makefile, re.M), a


@pytest.mark.parametrize("doc", PERF_DOCS)
def test_the_performance_docs_commands_name_what_exists(doc):
    # Check that every command the doc shows (not run: minutes each) names an existing script,
    # module or Makefile target and only flags that script declares; pip lines install only.
    commands = _shown_commands(doc)
    assert commands, doc
    for program, args in commands:
        if program.endswith("python"):
            _check_python(args)
        elif program == "make":
            _check_make(args)
        else:
            assert program.endswith("pip") and args[0] == "install", (doc, program, args)


def test_the_performance_docs_say_their_commands_are_not_run_in_tests():
    # Check that each doc with bench commands says they are not run, and names this test.
    for doc in PERF_DOCS:
        text = " ".join((ROOT / doc).read_text().split())
        assert "None of these runs in the tests" in text or "Not run in tests" in text, doc
        assert "tests/cli/test_docs_commands.py" in text, doc


def test_engine_info_as_the_performance_doc_shows_it(capsys):
    # Check that `python -m engine info`, shown in docs/performance.md, runs and says which
    # BLAS kernel runs and the verdict the doc explains.
    assert ("python", ["-m", "engine", "info"]) in _shown_commands("docs/performance.md")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "kernel" in out and "verdict" in out, out[:2000]
