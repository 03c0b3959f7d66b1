"""Reliability of fit / evaluate / predict: every argument and the whole data set are checked
before anything changes (a rejected call leaves parameters, gradients, optimizer state and
the model's mode as they were); an optimizer of another model is refused; one copy policy
(C-contiguous arrays, in every batching mode); a model is used by one thread at a time."""
import threading

import numpy as np
import pytest

import kernels
from engine import (MLP, SGD, AdamW, CrossEntropyLoss, Linear, MSELoss, evaluate, fit, predict,
                    save)


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


def _classify(n=20, dtype=np.float64):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 3)).astype(dtype)
    y = (np.arange(n) % 3).astype(np.int64)
    model = MLP([3, 6, 3], dtype=dtype, rng=0)
    return X, y, model, AdamW(model.parameters(), lr=0.05)


def _regress(n=20, dtype=np.float64):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((n, 3)).astype(dtype)
    Y = rng.standard_normal((n, 2)).astype(dtype)
    model = Linear(3, 2, dtype=dtype, rng=0)
    return X, Y, model, AdamW(model.parameters(), lr=0.05)


def _prime(model, opt, X, Y, loss):
    """One real step (so the optimizer has state), then gradients set to a known value and
    the model put in eval mode: a call that touches any of them is caught."""
    fit(model, loss, opt, X, Y, epochs=1, progress=False)
    for p in model.parameters():
        p.grad[...] = 0.5
    model.eval()


def _snapshot(model, opt):
    sd = opt.state_dict()
    return ([p.data.copy() for p in model.parameters()],
            [p.grad.copy() for p in model.parameters()],
            sd["steps"], {i: {k: v.copy() for k, v in st.items()} for i, st in sd["state"].items()},
            model.training)


def _assert_unchanged(before, model, opt):
    params, grads, steps, state, training = before
    now = _snapshot(model, opt)
    for a, b in zip(params, now[0]):
        np.testing.assert_array_equal(a, b, err_msg="a parameter changed")
    for a, b in zip(grads, now[1]):
        np.testing.assert_array_equal(a, b, err_msg="a gradient changed")
    assert now[2] == steps, "the optimizer's step count changed"
    for i in state:
        for k in state[i]:
            np.testing.assert_array_equal(state[i][k], now[3][i][k], err_msg=f"state {i} {k}")
    assert now[4] == training, "the model's mode changed"


# ----------------------------------------------------------------------------- labels
@pytest.mark.parametrize("label", [3, -1])
def test_fit_rejects_a_bad_label_in_the_last_batch_before_any_step(label):
    # Check that a label outside [0, 3) in the last batch (no shuffle, batches of 5) raises
    # ValueError naming Y and the class range before the first step: nothing changes.
    X, y, model, opt = _classify()
    _prime(model, opt, X, y, CrossEntropyLoss())
    y[-1] = label
    before = _snapshot(model, opt)
    with pytest.raises(ValueError, match=r"Y: .*\[0, 3\)"):
        fit(model, CrossEntropyLoss(), opt, X, y, epochs=2, batch_size=5, shuffle=False,
            progress=False)
    _assert_unchanged(before, model, opt)


@pytest.mark.parametrize("case", ["float64 X", "label out of range", "NaN in X"])
def test_fit_rejects_a_bad_validation_set_before_any_step(case):
    # Check that a validation set the model cannot score (float64 inputs for a float32
    # model, a label outside the classes, a NaN) is rejected before epoch 1, naming the
    # validation argument, instead of after the first epoch's steps.
    X, y, model, opt = _classify(dtype=np.float32)
    _prime(model, opt, X, y, CrossEntropyLoss())
    Xv, yv = X.copy(), y.copy()
    if case == "float64 X":
        Xv = Xv.astype(np.float64)
    elif case == "label out of range":
        yv[0] = 7
    else:
        Xv[4, 2] = np.nan
    before = _snapshot(model, opt)
    with pytest.raises((TypeError, ValueError), match="validation"):
        fit(model, CrossEntropyLoss(), opt, X, y, epochs=2, batch_size=5, validation=(Xv, yv),
            progress=False)
    _assert_unchanged(before, model, opt)


# ----------------------------------------------------------------------------- bad calls
def _bad_fit_calls():
    """(label, kind, what the message names, function of (X, Y, model, opt) -> fit call)."""
    mse = MSELoss()

    def nan_x(X, Y, m, o):
        X = X.copy()
        X[3, 1] = np.nan
        fit(m, mse, o, X, Y, epochs=1, batch_size=5, progress=False)

    def inf_y(X, Y, m, o):
        Y = Y.copy()
        Y[-1, 0] = np.inf
        fit(m, mse, o, X, Y, epochs=1, batch_size=5, progress=False)

    return [
        ("X float32", TypeError, "X: expected dtype float64",
         lambda X, Y, m, o: fit(m, mse, o, X.astype(np.float32), Y, epochs=1, progress=False)),
        ("X features", ValueError, r"X: expected shape \(N, 3\)",
         lambda X, Y, m, o: fit(m, mse, o, X[:, :2].copy(), Y, epochs=1, progress=False)),
        ("Y width", ValueError, r"Y: expected shape \(20, 2\)",
         lambda X, Y, m, o: fit(m, mse, o, X, Y[:, :1].copy(), epochs=1, progress=False)),
        ("Y float32", TypeError, "Y: expected dtype float64",
         lambda X, Y, m, o: fit(m, mse, o, X, Y.astype(np.float32), epochs=1, progress=False)),
        ("NaN in X", ValueError, "X: expected finite values", nan_x),
        ("inf in Y", ValueError, "Y: expected finite values", inf_y),
        ("loss None", TypeError, "loss:",
         lambda X, Y, m, o: fit(m, None, o, X, Y, epochs=1, progress=False)),
        ("model None", TypeError, "model:",
         lambda X, Y, m, o: fit(None, mse, o, X, Y, epochs=1, progress=False)),
        ("optimizer str", TypeError, "optimizer:",
         lambda X, Y, m, o: fit(m, mse, "x", X, Y, epochs=1, progress=False)),
        ("shuffle str", TypeError, "shuffle:",
         lambda X, Y, m, o: fit(m, mse, o, X, Y, epochs=1, batch_size=5, shuffle="no",
                                progress=False)),
        ("progress", ValueError, "progress",
         lambda X, Y, m, o: fit(m, mse, o, X, Y, epochs=1, progress=-3)),
        ("rng", ValueError, "rng",
         lambda X, Y, m, o: fit(m, mse, o, X, Y, epochs=1, rng=-1, progress=False)),
    ]


@pytest.mark.parametrize("label, kind, names, call", _bad_fit_calls(),
                         ids=[c[0] for c in _bad_fit_calls()])
def test_a_rejected_fit_changes_nothing(label, kind, names, call):
    # Check that each bad argument raises TypeError/ValueError naming it, and that the
    # gradients, parameters, optimizer state and the model's eval mode are untouched.
    X, Y, model, opt = _regress()
    _prime(model, opt, X, Y, MSELoss())
    before = _snapshot(model, opt)
    with pytest.raises(kind, match=names):
        call(X, Y, model, opt)
    _assert_unchanged(before, model, opt)


def test_fit_rejects_labels_of_the_wrong_shape_before_any_step():
    # Check that (N, 1) labels for (N, C) logits are a ValueError naming Y, nothing changed.
    X, y, model, opt = _classify()
    _prime(model, opt, X, y, CrossEntropyLoss())
    before = _snapshot(model, opt)
    with pytest.raises(ValueError, match=r"Y: expected integer labels of shape \(20,\)"):
        fit(model, CrossEntropyLoss(), opt, X, y.reshape(-1, 1).copy(), epochs=1, progress=False)
    _assert_unchanged(before, model, opt)


# ----------------------------------------------------------------------------- optimizer
def test_fit_and_save_reject_an_optimizer_of_another_model(tmp_path):
    # Check that an optimizer built on another model's parameters (it would update those and
    # train nothing) is a ValueError naming the optimizer in fit and in save; nothing changes
    # and no file is written.
    X, Y, model, _ = _regress()
    other = Linear(3, 2, dtype=np.float64, rng=1)
    opt = AdamW(other.parameters(), lr=0.05)
    before = _snapshot(model, opt)
    other_before = [p.data.copy() for p in other.parameters()]
    with pytest.raises(ValueError, match="optimizer: 2 of its 2 parameters"):
        fit(model, MSELoss(), opt, X, Y, epochs=1, progress=False)
    _assert_unchanged(before, model, opt)
    for a, p in zip(other_before, other.parameters()):
        np.testing.assert_array_equal(a, p.data)
    with pytest.raises(ValueError, match="optimizer: .* not parameters of the Linear model"):
        save(tmp_path / "ck.npz", model, opt)
    assert list(tmp_path.iterdir()) == []


def test_fit_accepts_an_optimizer_of_part_of_the_model():
    # Check that an optimizer of a subset of the model's parameters is fine: only that part
    # changes (fine-tuning one layer).
    X, y, model, _ = _classify()
    first = [p.data.copy() for p in model[0].parameters()]
    last = [p.data.copy() for p in model[1].parameters()]
    fit(model, CrossEntropyLoss(), SGD(model[1].parameters(), lr=0.1), X, y, epochs=2,
        progress=False)
    for a, p in zip(first, model[0].parameters()):
        np.testing.assert_array_equal(a, p.data)
    assert any(not np.array_equal(a, p.data) for a, p in zip(last, model[1].parameters()))


# ----------------------------------------------------------------------------- copy policy
@pytest.mark.parametrize("batch_size", [None, 5])
@pytest.mark.parametrize("layout", ["F-order", "negative strides"])
@pytest.mark.parametrize("which", ["X", "Y"])
def test_fit_takes_only_c_contiguous_arrays_in_every_batching_mode(batch_size, layout, which):
    # Check one policy for full batches and mini-batches alike: a non-C-contiguous X or Y is
    # a ValueError naming it (never a silent copy), and nothing changes.
    X, Y, model, opt = _regress()
    before = _snapshot(model, opt)
    a = X if which == "X" else Y
    a = np.asfortranarray(a) if layout == "F-order" else a[::-1]
    X, Y = (a, Y) if which == "X" else (X, a)
    with pytest.raises(ValueError, match=f"{which}: expected a C-contiguous array"):
        fit(model, MSELoss(), opt, X, Y, epochs=1, batch_size=batch_size, progress=False)
    _assert_unchanged(before, model, opt)


def test_predict_and_evaluate_take_only_c_contiguous_inputs():
    # Check that predict and evaluate apply the same policy, naming X.
    X, Y, model, _ = _regress()
    with pytest.raises(ValueError, match="X: expected a C-contiguous array"):
        predict(model, np.asfortranarray(X), batch_size=5)
    with pytest.raises(ValueError, match="X: expected a C-contiguous array"):
        evaluate(model, MSELoss(), X[::-1], Y, batch_size=5)


# ----------------------------------------------------------------------------- evaluate, predict
@pytest.mark.parametrize("call, kind, names", [
    (lambda m, X, Y: predict(None, X), TypeError, "model:"),
    (lambda m, X, Y: evaluate(None, MSELoss(), X, Y), TypeError, "model:"),
    (lambda m, X, Y: evaluate(m, None, X, Y), TypeError, "loss:"),
    (lambda m, X, Y: predict(m, X.astype(np.float32)), TypeError, "X: expected dtype float64"),
    (lambda m, X, Y: evaluate(m, MSELoss(), X, Y[:, :1].copy()), ValueError, "Y: expected shape"),
], ids=["predict model", "evaluate model", "evaluate loss", "predict dtype", "evaluate Y"])
def test_predict_and_evaluate_check_their_arguments_first(call, kind, names):
    # Check that a bad model, loss or array is a TypeError/ValueError naming it, raised
    # before the model is switched to eval mode.
    X, Y, model, _ = _regress()
    with pytest.raises(kind, match=names):
        call(model, X, Y)
    assert model.training


# ----------------------------------------------------------------------------- threads
def test_predict_from_another_thread_while_fit_runs_is_refused():
    # Check that a predict on the same model from a second thread, while fit trains it (here
    # from a callback, between two epochs), raises RuntimeError and does not switch the
    # model to eval mode under the running loop; fit completes.
    X, Y, model, opt = _regress()
    seen = {}

    class Probe:
        def on_epoch_end(self, epoch, history):
            def other():
                try:
                    predict(model, X)
                except RuntimeError as e:
                    seen["error"] = str(e)
            t = threading.Thread(target=other)
            t.start()
            t.join(30)
            seen["training"] = model.training

    h = fit(model, MSELoss(), opt, X, Y, epochs=2, callbacks=[Probe()], progress=False)
    assert "in use by another thread" in seen["error"]
    assert seen["training"] is True and len(h) == 2
