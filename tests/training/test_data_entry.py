"""Data entry of fit, evaluate and predict: any real-valued array-like (float64 for a float32
model, a column slice, a list, a (N,) regression target, whole-number float class ids, an
object with ``__array__``) is converted once on entry and trains exactly as the converted
array would; what holds no real numbers is refused naming the argument, changing nothing;
the modules themselves stay strict."""
import numpy as np
import pytest

import kernels
from engine import (MLP, AdamW, CrossEntropyLoss, Embedding, Linear, MSELoss, Sequential,
                    evaluate, fit, predict)


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


def _data(n=24, d=4, k=2, seed=0):
    g = np.random.default_rng(seed)
    return g.standard_normal((n, d)), g.standard_normal((n, k))  # float64, as NumPy makes them


def _train(X, Y, loss=None, out=2, dtype=np.float32, **kw):
    """Parameters and History of a 3-epoch fit of a fresh (seeded) MLP on ``(X, Y)``."""
    model = MLP([4, 8, out], dtype=dtype, rng=0)
    opt = AdamW(model.parameters(), lr=0.01)
    h = fit(model, loss or MSELoss(), opt, X, Y, epochs=3, batch_size=5, rng=1, progress=False,
            **kw)
    return [p.data.copy() for p in model.parameters()], h


def _assert_same_run(a, b):
    (pa, ha), (pb, hb) = a, b
    for x, y in zip(pa, pb):
        np.testing.assert_array_equal(x, y)
    assert ha.loss == hb.loss


class FrameLike:
    """What pandas' DataFrame offers NumPy: ``__array__`` (no ndarray subclass)."""

    def __init__(self, values):
        self._values = values

    def __array__(self, dtype=None, copy=None):
        return self._values if dtype is None else self._values.astype(dtype)


# ----------------------------------------------------------------------------- what is converted
@pytest.mark.parametrize("form", ["float64", "column slice", "list", "__array__", "F-order"])
def test_fit_trains_on_an_array_like_as_on_the_converted_array(form):
    # Check that each form of X and Y trains bit for bit as its float32 C-contiguous copy.
    X, Y = _data()
    ref = _train(X.astype(np.float32), Y.astype(np.float32))
    if form == "column slice":  # X[:, :4] of a wider table: strided rows
        wide = np.concatenate([X, np.ones((X.shape[0], 3))], axis=1)
        X, Y = wide[:, :4], np.concatenate([Y, X], axis=1)[:, :2]
        assert not X.flags.c_contiguous and not Y.flags.c_contiguous
    elif form == "list":
        X, Y = X.tolist(), Y.tolist()
    elif form == "__array__":
        X, Y = FrameLike(X), FrameLike(Y)
    elif form == "F-order":
        X, Y = np.asfortranarray(X), np.asfortranarray(Y)
    _assert_same_run(ref, _train(X, Y))


def test_fit_takes_a_1d_regression_target_for_a_one_output_model():
    # Check that Y of shape (N,) trains as (N, 1) when the model has one output column.
    X, Y = _data(k=1)
    ref = _train(X.astype(np.float32), Y.astype(np.float32), out=1)
    _assert_same_run(ref, _train(X, Y[:, 0], out=1))
    _assert_same_run(ref, _train(X, Y[:, 0].tolist(), out=1))


def test_a_1d_target_for_a_model_of_two_outputs_is_still_refused():
    # Check that (N,) is not broadcast or guessed into 2 columns: a ValueError naming Y.
    X, Y = _data()
    with pytest.raises(ValueError, match=r"Y: expected shape \(24, 2\)"):
        _train(X, Y[:, 0])


def test_integer_regression_targets_become_floats():
    # Check that integer targets (prices in whole units) are values for MSELoss, not labels.
    X, _ = _data(k=1)
    Y = np.arange(24, dtype=np.int64) % 7
    ref = _train(X.astype(np.float32), Y.astype(np.float32)[:, None], out=1)
    _assert_same_run(ref, _train(X, Y, out=1))


@pytest.mark.parametrize("form", ["int32", "float whole numbers", "list", "bool", "column"])
def test_class_ids_stay_1d_labels_for_cross_entropy(form):
    # Check that class ids in any whole-number form train as int64 labels (N,) with
    # CrossEntropyLoss (not as (N, 1) values, not as probabilities).
    X, _ = _data()
    y = np.arange(24) % 2
    ref = _train(X.astype(np.float32), y.astype(np.int64), CrossEntropyLoss())
    conv = {"int32": y.astype(np.int32), "float whole numbers": y.astype(np.float64),
            "list": y.tolist(), "bool": y.astype(bool), "column": y[:, None]}[form]
    _assert_same_run(ref, _train(X, conv, CrossEntropyLoss()))


def test_fractional_float_class_ids_are_refused_naming_y():
    X, _ = _data()
    y = (np.arange(24) % 2).astype(np.float64)
    y[5] = 0.5
    with pytest.raises(ValueError, match=r"Y: .*whole-number class ids.*0\.5 at index \(5,\)"):
        _train(X, y, CrossEntropyLoss())


def test_probability_targets_are_cast_to_the_model_dtype():
    # Check that float64 probabilities (N, C) are CE targets of the model's dtype.
    X, _ = _data()
    P = np.eye(2)[np.arange(24) % 2] * 0.8 + 0.1
    ref = _train(X.astype(np.float32), P.astype(np.float32), CrossEntropyLoss())
    _assert_same_run(ref, _train(X, P, CrossEntropyLoss()))


def test_validation_pair_is_converted_like_the_training_set():
    X, Y = _data()
    ref = _train(X.astype(np.float32), Y.astype(np.float32),
                 validation=(X[:6].astype(np.float32), Y[:6].astype(np.float32)))
    got = _train(X, Y, validation=(X[:6].tolist(), Y[:6]))
    _assert_same_run(ref, got)
    assert ref[1].val_loss == got[1].val_loss


def test_float64_model_keeps_float64_data_without_a_copy():
    # Check that data already in the model's form is used as is (no copy of the data set).
    X, Y = _data()
    model = Linear(4, 2, dtype=np.float64, rng=0)
    seen = []
    spy = _Spy(model, seen)
    fit(spy, MSELoss(), AdamW(spy.parameters()), X, Y, epochs=2, batch_size=None,
        progress=False)
    assert seen and all(x is X for x in seen)


# ----------------------------------------------------------------------------- converted once
class _Spy(Sequential):
    """A one-child Sequential that records every input its forward receives."""

    def __init__(self, child, seen):
        super().__init__(child)
        object.__setattr__(self, "_seen", seen)

    def check_input(self, x, name="x"):
        return super().check_input(x, name)

    def forward(self, x, **kw):
        self._seen.append(x)
        return super().forward(x, **kw)


@pytest.mark.parametrize("shuffle", [False, True])
def test_fit_converts_the_data_set_once_not_per_step(shuffle):
    # Check that every batch of every epoch is a view of one array made on entry: never the
    # caller's float64 array, never a fresh per-step conversion.
    X, Y = _data(n=23)
    seen = []
    model = _Spy(MLP([4, 8, 2], rng=0), seen)
    fit(model, MSELoss(), AdamW(model.parameters()), X, Y, epochs=3, batch_size=5,
        shuffle=shuffle, progress=False)
    assert len(seen) == 3 * 5
    bases = {id(x.base) for x in seen}
    assert len(bases) == 1 and seen[0].base is not None
    assert all(x.dtype == np.float32 and not np.shares_memory(x, X) for x in seen)
    if not shuffle:  # the rows in order: the batches tile one converted array
        base = seen[0].base
        assert base.shape == X.shape and base.dtype == np.float32
        np.testing.assert_array_equal(base, X.astype(np.float32))


def test_evaluate_and_predict_convert_like_fit():
    X, Y = _data()
    model = MLP([4, 8, 2], rng=0)
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    assert evaluate(model, MSELoss(), X.tolist(), Y, batch_size=7) == \
        evaluate(model, MSELoss(), X32, Y32, batch_size=7)
    np.testing.assert_array_equal(predict(model, X[:, :4], batch_size=7),
                                  predict(model, X32, batch_size=7))
    np.testing.assert_array_equal(predict(model, FrameLike(X)), predict(model, X32))
    one = MLP([4, 3, 1], rng=0)
    assert evaluate(one, MSELoss(), X, Y[:, 0]) == evaluate(one, MSELoss(), X32, Y32[:, :1])


def test_token_ids_stay_integers_for_an_embedding_model():
    # Check that integer ids (a list, int32) go to an Embedding as integers, not floats.
    model = Sequential(Embedding(10, 4, rng=0), Linear(4, 3, rng=0))
    ids = [[1, 2, 3], [4, 5, 9]]
    ref = predict(model, np.array(ids, np.int64))
    np.testing.assert_array_equal(predict(model, ids), ref)
    np.testing.assert_array_equal(predict(model, np.array(ids, np.int32)[:, ::1]), ref)
    with pytest.raises(TypeError, match="integer"):  # float ids are still refused
        predict(model, np.array(ids, np.float64))


# ----------------------------------------------------------------------------- refused
def _snapshot(model, opt):
    return [p.data.copy() for p in model.parameters()], opt.state_dict()["steps"]


@pytest.mark.parametrize("which, value, kind, text", [
    ("X", lambda X: X.astype(np.complex128), TypeError, r"X: expected real numbers, got "
                                                       r"dtype complex128"),
    ("X", lambda X: X.astype(str), TypeError, r"X: expected real numbers, got dtype <U"),
    ("X", lambda X: [[1.0, "a", 2.0, 3.0]] * 24, TypeError, r"X: expected real numbers"),
    ("X", lambda X: [[1.0, None, 2.0, 3.0]] * 24, TypeError, r"X: expected real numbers, got "
                                                            r"dtype object"),
    ("X", lambda X: [[1.0, 2.0]] * 23 + [[1.0]], ValueError, r"X: .*not a rectangular array"),
    ("X", lambda X: "data.csv", TypeError, r"X: expected an array-like of real numbers .*, got "
                                           r"str"),
    ("X", lambda X: {"a": 1}, TypeError, r"X: expected an array-like .* got dict"),
    ("Y", lambda Y: Y.astype(np.complex64), TypeError, r"Y: expected real numbers"),
    ("X", lambda X: np.where(np.arange(4) == 2, 1e300, X), ValueError,
     r"X: the value 1e\+300 at index \(0, 2\) overflows float32"),
])
def test_what_holds_no_real_numbers_is_refused_naming_it(which, value, kind, text):
    # Check that a value that cannot be made real numbers of the model's dtype is a
    # TypeError/ValueError naming the argument, expected vs got, and nothing changes.
    X, Y = _data()
    model = MLP([4, 8, 2], rng=0)
    opt = AdamW(model.parameters())
    fit(model, MSELoss(), opt, X, Y, epochs=1, progress=False)
    before = _snapshot(model, opt)
    X, Y = (value(X), Y) if which == "X" else (X, value(Y))
    with pytest.raises(kind, match=text):
        fit(model, MSELoss(), opt, X, Y, epochs=1, progress=False)
    after = _snapshot(model, opt)
    for a, b in zip(before[0], after[0]):
        np.testing.assert_array_equal(a, b)
    assert before[1] == after[1]


def test_nan_keeps_its_meaning_fit_refuses_evaluate_and_predict_pass_it_on():
    # Check that conversion does not hide a NaN: fit still refuses it (naming X and where),
    # evaluate gives a NaN loss and predict a NaN row, as for exact arrays.
    X, Y = _data()
    X[3, 1] = np.nan
    model = MLP([4, 8, 2], rng=0)
    with pytest.raises(ValueError, match=r"X: expected finite values, got nan at index \(3, 1\)"):
        fit(model, MSELoss(), AdamW(model.parameters()), X, Y, epochs=1, progress=False)
    assert np.isnan(evaluate(model, MSELoss(), X, Y)[0])
    out = predict(model, X.tolist())
    assert np.isnan(out[3]).all() and np.isfinite(np.delete(out, 3, axis=0)).all()


def test_the_caller_arrays_are_not_modified():
    X, Y = _data()
    X0, Y0 = X.copy(), Y.copy()
    _train(X, Y)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(Y, Y0)


# ----------------------------------------------------------------------------- modules stay strict
def test_module_forward_still_refuses_float64_into_a_float32_model():
    # Check that the conversion lives at fit/evaluate/predict only: a module's forward keeps
    # refusing another dtype, a list and a column slice (nothing is copied silently inside).
    X, _ = _data()
    lin = Linear(4, 2, rng=0)
    with pytest.raises(TypeError, match="float32"):
        lin.forward(X)
    with pytest.raises(TypeError, match="ndarray"):
        lin.forward(X.astype(np.float32).tolist())
    wide = np.ones((5, 8), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        lin.forward(wide[:, :4])
    with pytest.raises(TypeError, match="float32"):
        MSELoss(dtype=np.float32).forward(np.ones((2, 2)), np.ones((2, 2)))
