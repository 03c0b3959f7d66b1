"""The CLI infers classification only for a small label set; other integer targets are
refused with the flags that say what was meant, and the banner names the task."""
import numpy as np
import pytest

from engine.cli import main
from engine.cli.task_rule import MAX_INFERRED_CLASSES


def _csv(tmp_path, ys, name="d.csv"):
    p = tmp_path / name
    rng = np.random.default_rng(0)
    p.write_text("a,b,y\n" + "".join(f"{rng.standard_normal():.6f},{rng.standard_normal():.6f},"
                                     f"{y}\n" for y in ys))
    return str(p)


def _train(capsys, *argv):
    code = main(["train", "--model", "mlp", "--hidden", "4", "--epochs", "1", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_integer_prices_are_refused_with_the_two_ways_out(tmp_path, capsys):
    # Check that a house-price-like integer column is not 550,152 classes: exit 2, the
    # message names the column, the class count and both --task spellings
    p = _csv(tmp_path, [120_000 + 7919 * i % 430_151 for i in range(60)] + [550_151])
    code, out, err = _train(capsys, "--data", p, "--y-cols", "y")
    assert code == 2
    assert "'y' holds integers from" in err and "550152 classes" in err
    assert "--task regression" in err and "--task classification" in err
    assert "model" not in out  # refused before anything was built


def test_integer_prices_train_as_regression_when_told(tmp_path, capsys):
    # Check that --task regression takes the same file, and the banner says it was given
    p = _csv(tmp_path, [120_000 + 7919 * i % 430_151 for i in range(60)])
    code, out, err = _train(capsys, "--data", p, "--y-cols", "y", "--task", "regression")
    assert code == 0, err
    assert "(regression, given; 1 output(s))" in out


def test_a_small_label_set_is_inferred_and_named_in_the_banner(tmp_path, capsys):
    # Check that labels 0..2 over 30 rows are classes, and the banner says it was inferred
    p = _csv(tmp_path, [i % 3 for i in range(30)])
    code, out, err = _train(capsys, "--data", p, "--y-cols", "y")
    assert code == 0, err
    assert "(classification, inferred: integer targets are class labels; 3 classes)" in out


@pytest.mark.parametrize("ys, why", [
    ([i % (MAX_INFERRED_CLASSES + 1) for i in range(1000)], f"{MAX_INFERRED_CLASSES + 1} classes"),
    ([i % 10 for i in range(12)], "10 classes"),          # fewer than 2 samples per class
    ([-1, 0, 1, 0, 1, 0], "negative class labels"),
])
def test_label_sets_outside_the_rule_are_refused(tmp_path, capsys, ys, why):
    # Check each side of the stated rule: K <= 100, K <= N / 2, labels >= 0
    code, out, err = _train(capsys, "--data", _csv(tmp_path, ys), "--y-cols", "y")
    assert code == 2 and why in err


def test_many_classes_train_when_asked_for(tmp_path, capsys):
    # Check that --task classification overrides the rule (a deliberate 150-class model)
    p = _csv(tmp_path, [i % 150 for i in range(300)])
    code, out, err = _train(capsys, "--data", p, "--y-cols", "y", "--task", "classification")
    assert code == 0, err
    assert "150 classes" in out


def test_quiet_prints_nothing_and_verbose_adds_the_gemm_ratio(tmp_path, capsys):
    # Check that --quiet prints nothing (and still saves), that the default time line has
    # no GEMM ratio, and that --verbose adds it
    ck = tmp_path / "q.npz"
    code = main(["train", "--samples", "64", "--epochs", "3", "--quiet", "--save", str(ck)])
    out = capsys.readouterr()
    assert code == 0 and out.out == "" and out.err == "" and ck.stat().st_size > 0
    assert main(["train", "--samples", "64", "--epochs", "3"]) == 0
    plain = capsys.readouterr().out
    assert "epoch" in plain and "GEMMs" not in plain
    assert main(["train", "--samples", "64", "--epochs", "3", "--verbose"]) == 0
    assert "x its 9 GEMMs" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # one or the other
        main(["train", "--quiet", "--verbose"])


def test_quiet_language_model_prints_nothing(capsys):
    # Check that --quiet reaches the language model's own options too
    assert main(["train", "--model", "gmlp-lm", "--task", "text", "--d-hidden", "8", "--d-ff",
                 "8", "--epochs", "0", "--sample-length", "3", "--quiet"]) == 0
    assert capsys.readouterr().out == ""
