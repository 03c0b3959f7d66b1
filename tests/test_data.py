"""engine.data.load (.csv and .npz), train_val_split, Standardizer and infer_task."""
import json

import numpy as np
import pytest

from engine import Linear, data, load, save

CSV = "a,b,label,t\n1,2,0,0.5\n3.5,-4,2,1e-3\n\n5,6e1,1,-2\n"


def _write(tmp_path, text, name="d.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------- csv
def test_csv_integer_target_is_labels_and_inputs_default_to_the_others(tmp_path):
    # Check that y="label" (all integers) gives int64 labels, x defaults to every other
    # column in file order, the blank line is skipped, and values parse exactly.
    X, y = data.load(_write(tmp_path, CSV), y="label")
    assert X.dtype == np.float32 and X.flags.c_contiguous
    np.testing.assert_array_equal(X, np.array([[1, 2, 0.5], [3.5, -4, 1e-3], [5, 60, -2]],
                                              np.float32))
    assert y.dtype == np.int64 and y.tolist() == [0, 2, 1]
    assert data.infer_task(y) == "classification"


def test_csv_float_or_several_targets_are_a_regression(tmp_path):
    # Check a float target (N, 1) and two targets (N, 2), with x chosen and ordered by name.
    p = _write(tmp_path, CSV)
    X, Y = data.load(p, x=["b", "a"], y="t", dtype=np.float64)
    np.testing.assert_array_equal(X, [[2, 1], [-4, 3.5], [60, 5]])
    assert Y.shape == (3, 1) and Y.dtype == np.float64 and Y[:, 0].tolist() == [0.5, 1e-3, -2]
    assert data.infer_task(Y) == "regression"
    X2, Y2 = data.load(p, y=["label", "t"])
    assert X2.shape == (3, 2) and Y2.shape == (3, 2) and Y2.dtype == np.float32


@pytest.mark.parametrize("text, match", [
    ("a,b,y\n1,2,3\n4,x,6\n", r"line 3, column 2 \('b'\).*'x'"),
    ("a,b,y\n1,2,3\n4,,6\n", r"line 3, column 2 \('b'\)"),
    ("a,b,y\n1,nan,3\n", r"line 2, column 2 \('b'\).*missing value"),
    ("a,b,y\n1,2,3\n4,5\n", r"line 3: expected 3 values"),
    ("a,a,y\n1,2,3\n", "duplicate column names"),
    ("", "line 1: expected a header"),
    ("a,b,y\n", "no data rows"),
])
def test_csv_bad_content_names_line_and_column(tmp_path, text, match):
    # Check that each bad file is a ValueError naming the file and where the problem is.
    p = _write(tmp_path, text)
    with pytest.raises(ValueError, match=match) as err:
        data.load(p, y="y")
    assert str(p) in str(err.value)


def test_csv_unknown_column_lists_the_columns(tmp_path):
    # Check that a missing target or input column names it and lists the header.
    p = _write(tmp_path, CSV)
    with pytest.raises(ValueError, match=r"y: .*no column\(s\) \['lbl'\].*\['a', 'b', 'label', 't'\]"):
        data.load(p, y="lbl")
    with pytest.raises(ValueError, match=r"x: .*\['zz'\]"):
        data.load(p, x=["a", "zz"], y="t")
    with pytest.raises(ValueError, match="also targets"):
        data.load(p, x=["a", "t"], y="t")
    with pytest.raises(ValueError, match="name the target"):
        data.load(p)


def test_other_suffix_is_rejected(tmp_path):
    # Check that a file that is neither .csv nor .npz is a ValueError naming the path.
    with pytest.raises(ValueError, match=r"\.npz or \.csv"):
        data.load(_write(tmp_path, "x", "d.txt"))


# ----------------------------------------------------------------------------- npz
def test_npz_default_and_named_arrays(tmp_path):
    # Check the default names x and y, integer (N,) targets as labels, float (N,) targets as
    # a column, 1-D inputs as one feature, and other names through x= and y=.
    p = tmp_path / "d.npz"
    feats = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.savez(p, x=feats, y=np.array([0, 1, 1, 0], np.int32), inp=feats[:, 0],
             out=np.array([0.5, 1.5, 2.5, 3.5]))
    X, y = data.load(p)
    assert X.dtype == np.float32 and X.shape == (4, 3) and y.dtype == np.int64
    np.testing.assert_array_equal(X, feats.astype(np.float32))
    X1, Y1 = data.load(p, x="inp", y="out", dtype=np.float64)
    assert X1.shape == (4, 1) and Y1.shape == (4, 1) and Y1[:, 0].tolist() == [0.5, 1.5, 2.5, 3.5]


def test_npz_errors(tmp_path):
    # Check a missing array (listing the file's arrays), mismatched sample counts and NaN.
    p = tmp_path / "d.npz"
    np.savez(p, x=np.zeros((4, 2)), y=np.zeros(3), z=np.array([[1.0, np.nan]] * 4))
    with pytest.raises(ValueError, match=r"no array 'w'.*\['x', 'y', 'z'\]"):
        data.load(p, y="w")
    with pytest.raises(ValueError, match="4 samples.*3"):
        data.load(p)
    with pytest.raises(ValueError, match=r"'z': non-finite value nan at index \(0, 1\)"):
        data.load(p, x="z", y="x")


# ----------------------------------------------------------------------------- split
def test_train_val_split_partitions_the_samples():
    # Check sizes (round(N * f) validation samples), that the two parts together hold every
    # sample once with its own target, and that the same seed gives the same split.
    X = np.arange(20.0).reshape(10, 2)
    Y = np.arange(10)
    (Xt, Yt), (Xv, Yv) = data.train_val_split(X, Y, 0.3, rng=5)
    assert Xt.shape == (7, 2) and Xv.shape == (3, 2) and Xt.flags.c_contiguous
    assert sorted(Yt.tolist() + Yv.tolist()) == list(range(10))
    np.testing.assert_array_equal(np.concatenate([Xt, Xv]), X[np.concatenate([Yt, Yv])])
    (_, Yt2), (_, Yv2) = data.train_val_split(X, Y, 0.3, rng=5)
    assert Yt2.tolist() == Yt.tolist() and Yv2.tolist() == Yv.tolist()


@pytest.mark.parametrize("f, exc", [(0.0, ValueError), (1.0, ValueError), (-0.1, ValueError),
                                    (0.01, ValueError), (0.99, ValueError), ("0.2", TypeError)])
def test_train_val_split_needs_both_parts(f, exc):
    # Check that a fraction outside (0, 1), or one that leaves a part empty, is a ValueError;
    # one that is not a number is a TypeError (the engine's one rule for wrong types).
    with pytest.raises(exc, match="val_fraction"):
        data.train_val_split(np.zeros((10, 2)), np.zeros(10), f)


# ----------------------------------------------------------------------------- standardize
def test_standardizer_uses_the_training_statistics():
    # Check fit on train: train columns get mean 0 / std 1; validation is shifted and scaled
    # by the training mean and std (computed here with numpy in float64); a constant column
    # maps to 0; the dtype is kept.
    rng = np.random.default_rng(0)
    train = (rng.standard_normal((50, 3)) * [1, 10, 0] + [0, 5, 7]).astype(np.float32)
    val = (rng.standard_normal((20, 3)) * 3).astype(np.float32)
    s = data.Standardizer().fit(train)
    z = s.transform(train)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z[:, :2].mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(z[:, :2].std(axis=0), 1, rtol=1e-5)
    assert np.all(z[:, 2] == 0)
    t64 = train.astype(np.float64)
    mean, std = t64.mean(axis=0), t64.std(axis=0)
    std[2] = 1.0
    np.testing.assert_allclose(s.transform(val), (val - mean) / std, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.inverse_transform(s.transform(val)), val, rtol=1e-5, atol=1e-5)


def test_standardizer_errors():
    # Check: transform before fit, a wrong feature count, an integer array.
    s = data.Standardizer()
    with pytest.raises(RuntimeError, match="fit"):
        s.transform(np.zeros((2, 3)))
    s.fit(np.ones((4, 3)))
    with pytest.raises(ValueError, match="3 features"):
        s.transform(np.zeros((2, 4)))
    with pytest.raises(TypeError, match="float32 or float64"):
        s.transform(np.zeros((2, 3), np.int64))


def test_standardizer_rides_in_a_checkpoint(tmp_path):
    # Check that the state dict goes through a checkpoint's metadata (JSON) and back to a
    # Standardizer that transforms identically.
    rng = np.random.default_rng(2)
    X = rng.standard_normal((30, 4)) * 7 + 3
    s = data.Standardizer().fit(X)
    m = Linear(4, 1, dtype=np.float64, rng=0)
    save(tmp_path / "m.npz", m, standardizer=s.state_dict())
    back = data.Standardizer.from_state_dict(load(tmp_path / "m.npz", m)["standardizer"])
    np.testing.assert_array_equal(back.transform(X), s.transform(X))
    json.dumps(s.state_dict())
    with pytest.raises(ValueError, match="scale"):
        data.Standardizer.from_state_dict({"mean": [0.0], "scale": [0.0]})
