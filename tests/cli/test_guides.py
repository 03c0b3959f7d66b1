"""The README and the guides in docs/ run as written: their Python examples (every ```python
block, in order, in one directory), their shell commands (in order, in one directory; the
language-model runs at tiny sizes appended: the command line's last value wins), and the
README's order of guides. The CSV walkthrough of docs/cli.md runs in
tests/cli/test_readme_walkthrough.py, docs/lm.md in tests/cli/test_lm_docs.py, the mpiexec
line of docs/distributed.md in tests/cli/test_docs_commands.py."""
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from engine.cli import build_parser, main

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = ["docs/training.md", "docs/cli.md", "docs/lm.md", "docs/distributed.md",
          "docs/writing-a-block.md", "docs/threads-and-kernels.md", "docs/guarantees.md"]
RUN_HERE = ["README.md", "docs/training.md", "docs/cli.md", "docs/threads-and-kernels.md",
            "docs/guarantees.md"]  # the files whose examples this test runs
PYTHON_DOCS = ["README.md", "docs/training.md", "docs/threads-and-kernels.md",
               "docs/guarantees.md"]
TINY_LM = ["--n-layer", "1", "--n-head", "2", "--n-embd", "8", "--d-ff", "16",
           "--block-size", "16", "--max-iters", "3", "--eval-iters", "1",
           "--eval-interval", "3", "--warmup-iters", "0", "--lr-decay-iters", "3",
           "--batch-size", "8", "--sample-length", "5", "--threads", "1"]


def _blocks(doc: str) -> list:
    """``[(language, text, is_walkthrough)]`` of a Markdown file's fenced blocks."""
    out, lang, lines, marked, walk = [], None, [], False, False
    for line in (ROOT / doc).read_text().splitlines():
        if lang is None and line.startswith("<!-- walkthrough"):
            marked = True
        elif line.startswith("```"):
            if lang is None:
                lang, lines, walk, marked = line[3:].strip(), [], marked, False
            else:
                out.append((lang, "\n".join(lines), walk))
                lang = None
        elif lang is not None:
            lines.append(line)
    return out


def _commands(doc: str, walkthrough: bool = False) -> list:
    """The shell command lines of the doc's plain or ```sh blocks, continuations joined and
    trailing ``  # comments`` cut; the walkthrough's only if asked for."""
    out = []
    for lang, text, walk in _blocks(doc):
        if lang not in ("", "sh") or (walk and not walkthrough):
            continue
        for line in text.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and line != ". .venv/bin/activate":
                out.append(line)
    return out


def test_the_readme_is_an_introduction_that_links_the_guides_in_order():
    # Check the README's length and that its "Guides" section lists every guide, in reading
    # order, and that each guide exists.
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    section = text.split("\n## Guides\n")[1].split("\n## ")[0]
    assert re.findall(r"\]\((docs/[\w-]+\.md)\)", section) == GUIDES
    for g in GUIDES:
        assert (ROOT / g).is_file(), g


def test_the_readme_shows_the_test_command_ci_runs():
    # Check that CI's command (.ci/run) is the README's `make test`, shown in a code block.
    assert "make test" in (ROOT / ".ci" / "run").read_text().splitlines()[-1]
    assert any(c.startswith("make test") for c in _commands("README.md"))


@pytest.mark.parametrize("doc", RUN_HERE + ["docs/lm.md", "docs/distributed.md"])
def test_every_relative_link_names_an_existing_file(doc):
    # Check the Markdown links to files of this repository from the README and the guides.
    base = (ROOT / doc).parent
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / doc).read_text()):
        if "://" not in target:
            assert (base / target).exists(), (doc, target)


@pytest.mark.parametrize("doc", PYTHON_DOCS)
def test_the_python_examples_run_in_order(doc, tmp_path, monkeypatch, capsys):
    # Check every ```python block of the doc, run in order in one fresh directory (a later
    # block may read the files an earlier one wrote), each in its own namespace.
    monkeypatch.chdir(tmp_path)
    blocks = [text for lang, text, _ in _blocks(doc) if lang == "python"]
    assert blocks, doc
    for i, text in enumerate(blocks):
        exec(compile(text, f"{doc} python block {i + 1}", "exec"), {"__name__": "__main__"})
    capsys.readouterr()


def _argv_and_env(line: str):
    """(program words, environment changes) of a command line: ``NAME=value`` and
    ``env -u NAME`` prefixes become changes of the environment."""
    words, env = shlex.split(line), {}
    while words and (words[0] == "env" or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
        if words[0] == "env":
            words = words[1:]
            while words[:1] == ["-u"]:
                env[words[1]] = None
                words = words[2:]
        else:
            name, value = words[0].split("=", 1)
            env[name] = value
            words = words[1:]
    return words, env


def _engine_args(words: list) -> list:
    """The arguments after ``blasnet`` or ``python -m engine``, or None for another program."""
    if words[:1] == ["blasnet"]:
        return words[1:]
    if words[:3] == ["python", "-m", "engine"]:
        return words[3:]
    return None


def _is_lm_train(args: list) -> bool:
    return args[:1] == ["train"] and "--model" in args and \
        args[args.index("--model") + 1] in ("gpt", "gmlp-lm")


def _run_command(line: str, where: pathlib.Path, capsys) -> None:
    words, env = _argv_and_env(line)
    args = _engine_args(words)
    if words[0] == "make":  # installs and runs minutes: the target must exist
        makefile = (ROOT / "Makefile").read_text()
        assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), line
        return
    if args is not None and not env:  # in-process: as fast as the import allows
        if _is_lm_train(args):
            args = [*args, *TINY_LM]
        try:
            code = main(args)
        except SystemExit as e:  # --help and --version exit through argparse
            code = e.code
        out = capsys.readouterr()
        assert code == 0, (line, out.out[-2000:], out.err[-2000:])
        return
    # A python -c line (with its redirection) or a command with environment variables: a
    # shell, with this interpreter's directory first on the PATH as an activated venv has.
    full = {**os.environ, "PYTHONPATH": str(ROOT),
            "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    for name, value in env.items():
        full.pop(name, None) if value is None else full.__setitem__(name, value)
    shell = line if args is None else shlex.join([sys.executable, "-m", "engine", *args])
    assert words[0] == "python" or args is not None, line
    r = subprocess.run(["bash", "-c", shell], cwd=where, env=full, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md", "docs/threads-and-kernels.md"])
def test_the_shell_commands_run_in_order(doc, tmp_path, monkeypatch, capsys):
    # Check every shell command of the doc (the walkthrough aside), in order in one
    # directory; a language model's train command at tiny sizes; `make` targets exist.
    monkeypatch.chdir(tmp_path)
    cmds = _commands(doc)
    assert cmds, doc
    for line in cmds:
        _run_command(line, tmp_path, capsys)


def test_the_readme_gpt_commands_train_then_sample(tmp_path, monkeypatch, capsys):
    # Check the README's GPT example end to end: the corpus file is Python's help texts, the
    # checkpoint train writes is a GPT that sample reads, and sample prints the prompt.
    monkeypatch.chdir(tmp_path)
    cmds = _commands("README.md")
    train = next(c for c in cmds if c.startswith("blasnet train"))
    sample = next(c for c in cmds if c.startswith("blasnet sample"))
    for line in cmds[:cmds.index(train) + 1]:
        _run_command(line, tmp_path, capsys)
    from engine import GPT, load_model
    from engine.models.lm import corpus
    assert (tmp_path / "input.txt").read_text() == corpus()
    assert isinstance(load_model("gpt.npz").model, GPT)
    args = _engine_args(shlex.split(sample))
    assert main(args) == 0
    out = capsys.readouterr().out
    prompt = args[args.index("--prompt") + 1]
    assert out.startswith(prompt) and out.count("---------------") == 1  # 2 samples


def test_the_cli_guide_writes_the_walkthrough_csv(tmp_path, capsys):
    # Check that docs/cli.md's python -c line writes the CSV its walkthrough reads: the
    # two-spiral set of docs/training.md, 600 rows of x0,x1,label.
    line = next(c for c in _commands("docs/cli.md") if c.startswith("python -c"))
    _run_command(line, tmp_path, capsys)
    from engine import data
    X, y = data.load(str(tmp_path / "spiral.csv"), y="label")
    X0, y0 = data.spiral(600, rng=0)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)


def test_every_guide_command_parses(capsys):
    # Check that every blasnet command the README and the guides show, the walkthrough's
    # included, names a real subcommand and only options it has.
    parser = build_parser()
    seen = 0
    for doc in RUN_HERE:
        for line in _commands(doc, walkthrough=True):
            args = _engine_args(_argv_and_env(line)[0])
            if args is None or {"--help", "--version"} & set(args):
                continue
            parser.parse_args(args)  # SystemExit on an unknown subcommand or option
            seen += 1
    assert seen >= 10


def test_the_readme_tabular_commands_run(tmp_path, monkeypatch, capsys):
    # Check the README's one-line train and predict on a table of your own (in its prose),
    # on a small CSV with a label column; 2 epochs appended to keep it short.
    monkeypatch.chdir(tmp_path)
    spans = re.findall(r"`(blasnet (?:train|predict) [^`]*table\.csv[^`]*)`",
                       " ".join(README.read_text().split()))  # spans may wrap
    assert [s.split()[1] for s in spans] == ["train", "predict"], spans
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3))
    rows = "".join(f"{a:.4f},{b:.4f},{c:.4f},{int(a + b > 0)}\n" for a, b, c in X)
    (tmp_path / "table.csv").write_text("a,b,c,label\n" + rows)
    assert main([*shlex.split(spans[0])[1:], "--epochs", "2", "--quiet"]) == 0
    assert main(shlex.split(spans[1])[1:]) == 0
    lines = (tmp_path / "preds.csv").read_text().splitlines()
    assert lines[0] == "class,p0,p1" and len(lines) == 61
