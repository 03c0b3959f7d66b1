"""CSV reading through NumPy's parser: the same arrays and labels as the value-at-a-time
reader gave, the same line-and-column errors, the delimiter found in the header line (or
given), a byte-order mark read."""
import numpy as np
import pytest

from engine import data
from engine.cli import main


def _write(tmp_path, text, name="d.csv", bom=False):
    p = tmp_path / name
    p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return str(p)


@pytest.mark.parametrize("delim", [",", ";", "\t", "|"])
def test_delimiter_is_found_in_the_header_line(tmp_path, delim):
    # Check that each of , ; tab | is detected and the values land in their columns
    rows = [["a", "b", "y"], ["1.5", "-2", "0"], ["3", "4e-1", "1"], ["-0.25", "7", "1"]]
    p = _write(tmp_path, "\n".join(delim.join(r) for r in rows) + "\n")
    X, y = data.load(p, y="y")
    np.testing.assert_array_equal(X, np.array([[1.5, -2], [3, 0.4], [-0.25, 7]], np.float32))
    assert y.dtype == np.int64 and y.tolist() == [0, 1, 1]


def test_given_delimiter_wins_and_a_bad_one_is_named(tmp_path):
    # Check that delimiter=";" reads a file whose header also holds commas in names, and
    # that a two-character delimiter is a ValueError naming the argument
    p = _write(tmp_path, "w,1;w,2;t\n1;2;3.5\n4;5;6.5\n")
    X, y = data.load(p, y="t", delimiter=";")
    assert X.tolist() == [[1, 2], [4, 5]] and y[:, 0].tolist() == [3.5, 6.5]
    with pytest.raises(ValueError, match="delimiter: expected one character"):
        data.load(p, y="t", delimiter=";;")


def test_bom_and_crlf_are_read(tmp_path):
    # Check that Excel's "CSV UTF-8" (a BOM, CRLF line ends, semicolons) reads cleanly
    p = _write(tmp_path, "x;y\r\n1;2\r\n3;4\r\n", bom=True)
    X, y = data.load(p, y="y")
    assert X[:, 0].tolist() == [1, 3] and y.tolist() == [2, 4]


def test_errors_keep_their_line_and_column_with_any_delimiter(tmp_path):
    # Check that a bad value in a semicolon file names its line and column, as with commas
    p = _write(tmp_path, "a;b;y\n1;2;3\n\n4;oops;6\n")
    with pytest.raises(ValueError, match=r"line 4, column 2 \('b'\): expected a finite number, "
                                         r"got 'oops'"):
        data.load(p, y="y")
    p = _write(tmp_path, "a,b,y\n1,2,3\n4,5\n", name="r.csv")
    with pytest.raises(ValueError, match=r"line 3: expected 3 values"):
        data.load(p, y="y")
    p = _write(tmp_path, "a,b,y\n1,2,3\n4,nan,6\n", name="n.csv")
    with pytest.raises(ValueError, match=r"line 3, column 2 \('b'\): a missing value"):
        data.load(p, y="y")


def test_labels_stay_exact_and_floats_that_look_integral_stay_regression(tmp_path):
    # Check that integer text is labels read exactly (beyond float64's 2**53), and that a
    # column written as 1.0, 2.0 is a regression target, as before
    big = 2 ** 62 + 1
    p = _write(tmp_path, f"a,y\n1,{big}\n2,-3\n")
    _, y = data.load(p, y="y")
    assert y.tolist() == [big, -3]
    p = _write(tmp_path, "a,y\n1,1.0\n2,2.0\n", name="f.csv")
    _, y = data.load(p, y="y")
    assert y.dtype == np.float32 and y.shape == (2, 1)


def test_text_columns_not_used_are_still_skipped(tmp_path):
    # Check that a text column outside --x-cols/--y-cols does not stop the reading
    p = _write(tmp_path, "name,a,y\nfoo,1.5,0\n\"bar, baz\",2.5,1\n")
    X, y = data.load(p, x="a", y="y")
    assert X[:, 0].tolist() == [1.5, 2.5] and y.tolist() == [0, 1]


def test_large_file_matches_values_written(tmp_path):
    # Check 2000 x 6 random values round-trip through repr exactly (float64)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2000, 6))
    lines = ["c0,c1,c2,c3,c4,t"] + [",".join(repr(float(v)) for v in r) for r in A]
    p = _write(tmp_path, "\n".join(lines) + "\n")
    X, Y = data.load(p, y="t", dtype=np.float64)
    np.testing.assert_array_equal(X, A[:, :5])
    np.testing.assert_array_equal(Y[:, 0], A[:, 5])


def test_cli_delimiter_flag(tmp_path, capsys):
    # Check --delimiter tab (spelled \t on a command line) trains on a tab-separated file
    p = _write(tmp_path, "a\tb\ty\n" + "".join(f"{i}\t{i % 3}\t{i % 2}\n" for i in range(40)),
               name="t.csv")
    assert main(["train", "--data", p, "--y-cols", "y", "--delimiter", "\\t", "--model", "mlp",
                 "--hidden", "4", "--epochs", "1"]) == 0
    assert "2 inputs" in capsys.readouterr().out


def test_semicolon_file_trains_and_predicts_by_column_name(tmp_path, capsys):
    # Check that the column names saved by train are split as the data was (semicolons),
    # so predict finds them again in a file with the columns in another order
    rows = "".join(f"{i / 7:.4f};{(i * 3) % 5};{i % 2}\n" for i in range(40))
    p = _write(tmp_path, "a;b;y\n" + rows, name="s.csv")
    ck = str(tmp_path / "s.npz")
    assert main(["train", "--data", p, "--y-cols", "y", "--model", "mlp", "--hidden", "4",
                 "--epochs", "1", "--save", ck]) == 0
    from engine.training import checkpoint
    assert checkpoint.read_header(ck)["metadata"]["x_cols"] == ["a", "b"]
    q = _write(tmp_path, "b;a\n" + "".join(f"{(i * 3) % 5};{i / 7:.4f}\n" for i in range(40)),
               name="q.csv")
    capsys.readouterr()
    assert main(["predict", ck, "--data", q]) == 0
    by_name = capsys.readouterr().out
    assert main(["predict", ck, "--data", p]) == 0
    assert capsys.readouterr().out == by_name
