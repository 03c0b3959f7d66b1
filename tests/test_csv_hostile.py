"""Your own CSV as pandas and spreadsheets write it: an unnamed index column is refused with
the way out, a directory given as the file says so, a missing value (an empty cell, NA, ...)
names its line and column and says missing values are not supported, and a regression on
targets of ~1e5 (house prices) trains with its defaults' target scaling."""
import re

import numpy as np
import pytest

from engine import data
from engine.cli.app import main


def _write(path, text):
    path.write_text(text)
    return str(path)


def _house(path, n=200, index=False, seed=0):
    rng = np.random.default_rng(seed)
    sqft, age = rng.uniform(500, 3500, n), rng.uniform(0, 80, n)
    price = 50_000 + 120 * sqft - 700 * age + rng.normal(0, 5_000, n)
    lines = [("," if index else "") + "sqft,age,price"]
    lines += [(f"{i}," if index else "") + f"{s:.1f},{a:.2f},{p:.2f}"
              for i, (s, a, p) in enumerate(zip(sqft, age, price))]
    return _write(path, "\n".join(lines) + "\n")


@pytest.mark.parametrize("header", [",a,y", "a,,y", "a, ,y"])
def test_an_unnamed_column_is_not_silently_an_input(tmp_path, header):
    # Check that an unnamed column (pandas' index first) is refused with the ways out.
    p = _write(tmp_path / "d.csv", header + "\n0,1.5,2\n1,2.5,3\n")
    with pytest.raises(ValueError, match=r"column \d has no name.*index=False.*--x-cols"):
        data.load(p, y="y")
    with pytest.raises(ValueError, match="has no name"):
        data.load_inputs(p)


def test_naming_the_inputs_reads_a_file_with_a_pandas_index(tmp_path):
    # Check the way out the message names: x= picks the named columns only.
    p = _house(tmp_path / "h.csv", n=5, index=True)
    X, Y = data.load(p, x=["sqft", "age"], y="price")
    assert X.shape == (5, 2) and Y.shape == (5, 1)


def test_cli_refuses_a_pandas_index_column_in_one_line(tmp_path, capsys):
    # Check the CLI's form of it: exit 2, one line, the hint.
    p = _house(tmp_path / "h.csv", n=20, index=True)
    capsys.readouterr()
    assert main(["train", "--data", p, "--y-cols", "price", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "column 1 has no name" in err and "index=False" in err


def test_a_directory_as_data_says_it_is_a_directory(tmp_path, capsys):
    # Check train, predict and data.load on a directory name it as one.
    capsys.readouterr()
    assert main(["train", "--data", str(tmp_path), "--y-cols", "y", "--epochs", "1"]) == 2
    assert "is a directory" in capsys.readouterr().err
    for call in (lambda: data.load(tmp_path, y="y"), lambda: data.load_inputs(tmp_path)):
        with pytest.raises(ValueError, match="is a directory"):
            call()


@pytest.mark.parametrize("cell", ["", " ", "NA", "nan", "NaN", "N/A", "null", "None", "?",
                                  "#N/A"])
def test_a_missing_value_names_its_place_and_says_it_is_missing(tmp_path, cell):
    # Check every spelling of a missing value: line, column, and "not supported".
    p = _write(tmp_path / "d.csv", f"a,b,y\n1,2,3\n4,{cell},5\n")
    with pytest.raises(ValueError, match=re.escape(f"line 3, column 2 ('b'): a missing value "
                                                   f"({cell!r}); missing values are not "
                                                   f"supported")):
        data.load(p, y="y")


@pytest.mark.parametrize("cell", ["inf", "-inf", "abc"])
def test_a_value_that_is_not_missing_is_still_not_a_number(tmp_path, cell):
    # Check that the missing-value message is not given to other bad values.
    p = _write(tmp_path / "d.csv", f"a,b,y\n1,2,3\n4,{cell},5\n")
    with pytest.raises(ValueError, match=r"line 3, column 2 \('b'\): expected a finite number"):
        data.load(p, y="y")


def _r2(out: str) -> float:
    row = next(line for line in out.splitlines() if line.startswith("y0 "))
    return float(row.split()[2])


def test_a_house_price_regression_is_learnt_in_standardised_units(tmp_path, capsys):
    # Check that targets ~1e5 train to a good fit (R^2 > 0.9, the report in price units),
    # and that the stored target scaling is the training split's mean and std of the price.
    p = _house(tmp_path / "h.csv")
    ck = tmp_path / "h.npz"
    capsys.readouterr()
    assert main(["train", "--data", p, "--y-cols", "price", "--model", "mlp", "--hidden", "16",
                 "--standardize", "--epochs", "300", "--lr", "1e-2", "--val-fraction", "0",
                 "--save", str(ck)]) == 0
    out = capsys.readouterr().out
    assert _r2(out) > 0.9 and "targets standardised" in out
    import engine
    ts = engine.load_model(ck).target_standardizer
    price = np.loadtxt(p, delimiter=",", skiprows=1)[:, 2].astype(np.float32)
    np.testing.assert_allclose(ts.mean, [price.mean()], rtol=1e-5)
    np.testing.assert_allclose(ts.scale, [price.std()], rtol=1e-4)


def test_large_unscaled_inputs_get_a_note(tmp_path, capsys):
    # Check the banner's note naming the large input column when --standardize is off.
    p = _house(tmp_path / "h.csv", n=20)
    capsys.readouterr()
    assert main(["train", "--data", p, "--y-cols", "price", "--model", "mlp", "--hidden", "4",
                 "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^note      input sqft reaches .* give --standardize", out, re.M)


def test_column_names_reach_the_terminal_escaped(tmp_path, capsys):
    # Check that a CSV header holding ESC/BEL is printed escaped by train's report.
    p = _write(tmp_path / "d.csv", "a,\x1b]0;x\x07y\n" + "".join(f"{i},{2 * i + 1}\n"
                                                               for i in range(10)))
    capsys.readouterr()
    assert main(["train", "--data", p, "--y-cols", "\x1b]0;x\x07y", "--model", "mlp",
                 "--hidden", "4", "--epochs", "1", "--task", "regression"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;x\\x07y" in out
