"""The CLI's uses of a saved model: `inspect`, `predict` and `sample` on checkpoints that
`train --save` wrote, with the model rebuilt from the checkpoint alone."""
import csv
import json

import numpy as np
import pytest

import engine
from engine.cli import main


def _csv(path, X, y, names=("a", "b", "c"), target="label"):
    with open(path, "w") as f:
        f.write(",".join([*names, target]) + "\n")
        for row, t in zip(X, y):
            f.write(",".join(repr(float(v)) for v in row) + f",{t}\n")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    d = tmp_path_factory.mktemp("cls")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 3)) * [1.0, 5.0, 0.1] + [0.0, 3.0, -1.0]
    y = (X[:, 0] + (X[:, 1] - 3) / 5 > 0).astype(int)
    _csv(d / "train.csv", X, y)
    ckpt = d / "m.npz"
    code = main(["train", "--data", str(d / "train.csv"), "--y-cols", "label", "--model", "mlp",
                 "--hidden", "8", "--epochs", "20", "--standardize", "--save", str(ckpt),
                 "--log-every", "100"])
    assert code == 0
    return d, ckpt, X


def test_inspect_prints_config_parameter_count_and_metadata(classifier, capsys):
    # Check that inspect shows the MLP's sizes, its 3*8+8+8*2+2 = 50 parameters, the metadata
    _, ckpt, _ = classifier
    capsys.readouterr()
    assert main(["inspect", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert "MLP, 50 parameters in 4 tensors" in out
    assert 'MLP(sizes=[3, 8, 2]' in out and "optimizer  AdamW, step 20" in out
    assert 'x_cols: ["a", "b", "c"]' in out
    assert main(["inspect", str(ckpt), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["parameters"] == 50 and doc["model_config"]["config"]["sizes"] == [3, 8, 2]


def test_inspect_refuses_a_file_that_is_not_a_checkpoint(tmp_path, capsys):
    # Check that a CSV given as a checkpoint is a one-line error with exit status 2
    p = tmp_path / "x.npz"
    p.write_text("a,b\n1,2\n")
    assert main(["inspect", str(p)]) == 2
    assert "not a blasnet checkpoint" in capsys.readouterr().err


def test_predict_writes_classes_and_probabilities_of_the_standardised_inputs(classifier):
    # Check predict against a model built by hand, loaded with engine.load, its inputs
    # standardised from the metadata: same class ids, probabilities that sum to one
    d, ckpt, X = classifier
    assert main(["predict", str(ckpt), "--data", str(d / "train.csv"), "--out",
                 str(d / "p.csv")]) == 0
    with open(d / "p.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["class", "p0", "p1"]
    got = np.array([[float(v) for v in r] for r in rows[1:]])
    m = engine.MLP([3, 8, 2])
    meta = engine.load(ckpt, m)
    st = engine.data.Standardizer.from_state_dict(meta["standardizer"])
    logits = engine.predict(m, st.transform(X.astype(np.float32))).astype(np.float64)
    np.testing.assert_array_equal(got[:, 0], logits.argmax(1))
    np.testing.assert_allclose(got[:, 1:].sum(1), 1.0, rtol=1e-12)
    e = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(got[:, 1:], e / e.sum(1, keepdims=True), rtol=1e-12)


def test_predict_reads_the_training_columns_by_name_without_the_target(classifier, capsys):
    # Check that a new file with its columns reordered, an extra one and no target gives
    # the same predictions as the training file
    d, ckpt, X = classifier
    with open(d / "new.csv", "w") as f:
        f.write("c,extra,b,a\n")
        for a, b, c in X[:5]:
            f.write(f"{float(c)!r},7,{float(b)!r},{float(a)!r}\n")
    capsys.readouterr()
    assert main(["predict", str(ckpt), "--data", str(d / "new.csv")]) == 0
    new = capsys.readouterr().out.splitlines()
    assert main(["predict", str(ckpt), "--data", str(d / "train.csv")]) == 0
    old = capsys.readouterr().out.splitlines()
    assert new == old[:6]


def test_predict_regression_names_the_outputs(tmp_path, capsys):
    # Check a regression saved as .safetensors: one column per target, named as trained
    pytest.importorskip("safetensors")
    rng = np.random.default_rng(1)
    X = rng.standard_normal((64, 3))
    _csv(tmp_path / "r.csv", X, 2.5 * X[:, 0] + X[:, 1], target="price")
    ckpt = tmp_path / "r.safetensors"
    assert main(["train", "--data", str(tmp_path / "r.csv"), "--y-cols", "price", "--model",
                 "ffn", "--d-hidden", "8", "--d-ff", "16", "--epochs", "3", "--save",
                 str(ckpt)]) == 0
    capsys.readouterr()
    assert main(["predict", str(ckpt), "--data", str(tmp_path / "r.csv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "price" and len(lines) == 65
    r = engine.load_model(ckpt)
    want = r.predict(X.astype(np.float32))[:, 0]  # the stored target scaling undone
    np.testing.assert_array_equal([float(v) for v in lines[1:]], want.astype(np.float64))


def test_sample_draws_from_a_saved_language_model(tmp_path, capsys):
    # Check that sample rebuilds the LM from the checkpoint alone and continues the prompt
    ckpt = tmp_path / "lm.npz"
    assert main(["train", "--model", "gmlp-lm", "--task", "text", "--d-hidden", "8", "--d-ff",
                 "8", "--epochs", "0", "--save", str(ckpt), "--sample-length", "1"]) == 0
    capsys.readouterr()
    assert main(["sample", str(ckpt), "--prompt", "def ", "--length", "25", "--seed", "3"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    assert text.startswith("def ") and len(text) == 29
    vocab = engine.load_model(ckpt).metadata["vocab"]
    assert set(text) <= set(vocab)


def test_sample_refuses_a_checkpoint_that_is_not_a_language_model(classifier, capsys):
    # Check that a classifier's checkpoint is a clear error, not a traceback
    _, ckpt, _ = classifier
    assert main(["sample", str(ckpt)]) == 2
    assert "not a language model checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("spelling", [["8", "4"], ["8,4"]])
def test_hidden_takes_space_separated_sizes_like_every_list_flag(spelling, capsys):
    # Check that --hidden 8 4 (the one documented list syntax) builds 2 -> 8 -> 4 -> 2, and
    # that the older 8,4 still means the same
    assert main(["train", "--task", "xor", "--model", "mlp", "--hidden", *spelling,
                 "--epochs", "1"]) == 0
    assert "mlp 2 -> 8 -> 4 -> 2" in capsys.readouterr().out
