"""``blasnet predict`` and ``LoadedModel.predict``: an ``--out`` that cannot be written is one
line naming it (exit 1) and leaves a read-only file alone; Python and the CLI give the same
predictions, in the target's units, with the stored input and target standardisation
applied; a ``--task`` other than the model's is refused; names from the file are escaped."""
import csv
import json
import os

import numpy as np
import pytest

import engine
from engine.cli.app import main


def _house(path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    sqft, age = rng.uniform(500, 3500, n), rng.uniform(0, 80, n)
    price = 50_000 + 120 * sqft - 700 * age + rng.normal(0, 5_000, n)
    with open(path, "w") as f:
        f.write("sqft,age,price\n")
        for row in zip(sqft, age, price):
            f.write(",".join(f"{v:.2f}" for v in row) + "\n")
    return np.stack([sqft, age], axis=1), price


@pytest.fixture(scope="module")
def house(tmp_path_factory):
    """A regression model trained with --standardize on prices ~1e5, and its data."""
    d = tmp_path_factory.mktemp("house")
    _house(d / "h.csv")
    table = np.loadtxt(d / "h.csv", delimiter=",", skiprows=1)  # as written (rounded)
    X, price = table[:, :2], table[:, 2]
    ck = d / "h.npz"
    assert main(["train", "--data", str(d / "h.csv"), "--y-cols", "price", "--model", "mlp",
                 "--hidden", "8", "--epochs", "30", "--standardize", "--save", str(ck),
                 "--quiet"]) == 0
    return d, ck, X, price


def _one_line_error(capsys, code, status, *words):
    assert code == status
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("where", ["missing_dir", "directory", "proc"])
def test_predict_to_an_unwritable_out_is_one_line_naming_it(house, tmp_path, capsys, where):
    # Check that every kind of unwritable --out is exit 1 with one line naming --out.
    d, ck, _, _ = house
    out = {"missing_dir": str(tmp_path / "nope" / "p.csv"), "directory": str(tmp_path),
           "proc": "/proc/version"}[where]
    if where == "proc" and not os.path.exists(out):
        pytest.skip("no /proc here")
    capsys.readouterr()
    code = main(["predict", str(ck), "--data", str(d / "h.csv"), "--out", out])
    _one_line_error(capsys, code, 1, "--out")


def test_predict_does_not_overwrite_a_read_only_file(house, tmp_path, capsys):
    # Check that a read-only --out is refused (also for root) and keeps its contents.
    d, ck, _, _ = house
    out = tmp_path / "p.csv"
    out.write_text("keep\n")
    out.chmod(0o444)
    capsys.readouterr()
    code = main(["predict", str(ck), "--data", str(d / "h.csv"), "--out", str(out)])
    _one_line_error(capsys, code, 1, "--out", "read-only")
    assert out.read_text() == "keep\n"


def test_python_and_the_cli_give_the_same_predictions_in_the_targets_units(house, tmp_path,
                                                                          capsys):
    # Check LoadedModel.predict against the CLI's output and against the stored scalings
    # applied by hand around engine.predict.
    d, ck, X, price = house
    r = engine.load_model(ck)
    py = r.predict(X.astype(np.float32))
    assert main(["predict", str(ck), "--data", str(d / "h.csv"), "--out",
                 str(tmp_path / "p.csv")]) == 0
    with open(tmp_path / "p.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["price"]
    cli = np.array([[float(v) for v in row] for row in rows[1:]])
    np.testing.assert_array_equal(cli, py.astype(np.float64))
    meta = r.metadata
    xs, ys = meta["standardizer"], meta["target_standardizer"]
    z = (X.astype(np.float32) - np.float32(xs["mean"])) / np.float32(xs["scale"])
    by_hand = engine.predict(r.model, z.astype(np.float32)) * ys["scale"][0] + ys["mean"][0]
    np.testing.assert_allclose(py, by_hand, rtol=1e-5)
    # in the target's units: the mean prediction near the mean price, not near 0
    assert abs(py.mean() - price.mean()) < 0.5 * price.std()


def test_a_bare_model_predicts_standardised_units(house):
    # Check that engine.predict on the bare model is what the docs say: no scaling applied.
    d, ck, X, price = house
    r = engine.load_model(ck)
    bare = engine.predict(r.model, X.astype(np.float32))
    assert not np.allclose(bare, r.predict(X.astype(np.float32)))


@pytest.mark.parametrize("asked", ["classification"])
def test_predict_refuses_a_task_other_than_the_models(house, capsys, asked):
    # Check that --task classification on a regression model is exit 2 naming both.
    d, ck, _, _ = house
    capsys.readouterr()
    code = main(["predict", str(ck), "--data", str(d / "h.csv"), "--task", asked])
    _one_line_error(capsys, code, 2, "--task classification", "regression")


def test_predict_refuses_regression_on_a_classifier(tmp_path, capsys):
    # Check the converse: a classifier's logits are not regression outputs.
    ck = tmp_path / "c.npz"
    assert main(["train", "--task", "xor", "--model", "mlp", "--hidden", "4", "--epochs", "2",
                 "--save", str(ck), "--quiet"]) == 0
    np.savez(tmp_path / "x.npz", x=np.zeros((3, 2), np.float32))
    capsys.readouterr()
    code = main(["predict", str(ck), "--data", str(tmp_path / "x.npz"), "--task",
                 "regression"])
    _one_line_error(capsys, code, 2, "--task regression", "classification")


def test_predict_escapes_output_names_read_from_the_file(house, tmp_path, capsys):
    # Check that a y_cols name holding ESC/BEL reaches standard output escaped.
    d, ck, _, _ = house
    with np.load(ck) as z:
        arrays = {k: z[k] for k in z.files}
    h = json.loads(str(arrays["__header__"][()]))
    h["metadata"]["y_cols"] = ["\x1b]0;x\x07"]
    arrays["__header__"] = np.array(json.dumps(h))
    np.savez(tmp_path / "e.npz", **arrays)
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "e.npz"), "--data", str(d / "h.csv")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and out.startswith("\\x1b]0;x\\x07\n")
