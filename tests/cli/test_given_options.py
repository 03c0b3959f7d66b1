"""One parse of the command line: the train parser records which options were given
(``args.given``), and the language models build their configs from that record, with their
own defaults for the rest."""
import pytest
from probes import capture_config

from engine.cli import build_parser, main
from engine.cli import lm as lm_cli
from engine.training import gpt_lm, lm


def test_given_records_exactly_the_options_on_the_command_line():
    # Check an option given equal to its default is recorded, one not given is not, and the
    # values of the ones not given are the parser's defaults.
    args = build_parser().parse_args(["train", "--epochs", "1000", "--quiet", "--hidden", "8"])
    assert args.given == {"epochs": "--epochs", "quiet": "--quiet", "hidden": "--hidden"}
    assert (args.epochs, args.lr, args.log_every, args.quiet, args.hidden) == \
        (1000, 1e-3, None, True, [8])
    assert build_parser().parse_args(["train"]).given == {}


@pytest.mark.parametrize("spec,config", [(lm_cli.GMLP_LM, lm.LMConfig),
                                         (lm_cli.GPT, gpt_lm.GPTConfig)])
def test_language_model_config_takes_its_own_defaults_and_the_given_options(spec, config):
    # Check the generic defaults (--epochs 1000, --lr 1e-3, --d-hidden 128) never reach a
    # language model's config, while a given option does, under the config's field name.
    args = build_parser().parse_args(["train", "--model", spec.name, "--task", "text",
                                      "--d-hidden", "24", "--warmup", "0"])
    c = lm_cli.config_of(args, spec)
    want = config()
    assert (c.d_model, c.warmup) == (24, 0)
    assert (c.epochs, c.lr, c.batch_size, c.seed) == (want.epochs, want.lr, want.batch_size,
                                                       want.seed)
    assert want.epochs != 1000 and want.lr != 1e-3  # the test would prove nothing otherwise


def test_the_language_model_reads_the_parsed_arguments_not_sys_argv(monkeypatch):
    # Check main(argv) runs from its own argv even when sys.argv says something else (the
    # command line is parsed once, never re-read).
    monkeypatch.setattr("sys.argv", ["blasnet", "train", "--model", "gmlp-lm", "--epochs", "7"])
    assert capture_config(monkeypatch, lm, ["--model", "gmlp-lm", "--epochs", "3"]).epochs == 3


@pytest.mark.parametrize("argv,msg", [
    (["--model", "gpt", "--quiet"], "unrecognized arguments: --quiet"),
    (["--model", "gpt", "--batch-size", "0"], "--batch-size: expected an integer >= 1, got 0"),
    (["--model", "gmlp-lm", "--lr", "-1"], "--lr: expected a finite number >= 0"),
    (["--model", "gmlp-lm", "--d-ff", "1"], "--d-ff: expected an integer >= 2, got 1"),
    (["--model", "gpt", "--task", "regression"], "the text task trains the gpt model"),
])
def test_language_model_options_are_checked_before_anything_runs(argv, msg, capsys):
    # Check exit status 2 and a message naming the option for what a language model cannot
    # take: an option it does not read, a number below its least value, another task.
    assert main(["train", *argv]) == 2
    assert msg in capsys.readouterr().err
