"""fit / predict / evaluate: batching, shuffling, History, progress output, the non-finite
loss stop, and convergence on the synthetic tasks (xor, spiral, sine, gMLP regression)."""
import io
import sys

import numpy as np
import pytest

import kernels
from engine import (GMLP, MLP, SGD, AdamW, CrossEntropyLoss, Linear, Module, MSELoss,
                    NonFiniteLossError, data, evaluate, fit, predict)
from engine.training.metrics import mean_absolute_error, r2_score


@pytest.fixture(autouse=True)
def one_thread():
    # Small GEMMs gain nothing from threads (and lose a lot on a loaded machine); one thread
    # also makes every run bit-reproducible. The context manager restores the limits.
    with kernels.num_threads(1):
        yield


class Spy(Module):
    """Wraps a module and records every batch it sees (a copy of the input)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.seen = []

    def forward(self, x):
        self.seen.append(np.array(x, copy=True))
        return self.inner.forward(x)

    def backward(self, dy):
        return self.inner.backward(dy)


def _linear_task(n=17, dtype=np.float64):
    rng = np.random.default_rng(0)
    X = np.arange(n * 3, dtype=dtype).reshape(n, 3) / (n * 3)  # distinct rows
    Y = (X @ rng.standard_normal((3, 2)) + 0.1).astype(dtype)
    return X, Y


# ----------------------------------------------------------------------------- batching
def test_last_partial_batch_is_kept():
    # Check that 17 samples in batches of 5 give steps of 5, 5, 5, 2 in every epoch, and that
    # each epoch visits every sample exactly once.
    X, Y = _linear_task()
    spy = Spy(Linear(3, 2, dtype=np.float64, rng=0))
    h = fit(spy, MSELoss(), SGD(spy.parameters(), lr=0.01), X, Y, epochs=2, batch_size=5,
            progress=False)
    assert [b.shape[0] for b in spy.seen] == [5, 5, 5, 2] * 2
    assert h.steps == 8 and h.samples == 34
    for epoch in range(2):
        rows = np.concatenate(spy.seen[4 * epoch:4 * epoch + 4])
        np.testing.assert_array_equal(rows[np.argsort(rows[:, 0])], X)


def test_shuffle_reorders_each_epoch_and_off_keeps_order():
    # Check that with shuffle the two epochs see different orders (not the data order), and
    # without shuffle the batches are the consecutive slices of X.
    X, Y = _linear_task()
    spy = Spy(Linear(3, 2, dtype=np.float64, rng=0))
    fit(spy, MSELoss(), SGD(spy.parameters(), lr=0.0), X, Y, epochs=2, batch_size=5, progress=False)
    e1, e2 = np.concatenate(spy.seen[:4]), np.concatenate(spy.seen[4:])
    assert not np.array_equal(e1, e2)
    assert not np.array_equal(e1, X)

    spy = Spy(Linear(3, 2, dtype=np.float64, rng=0))
    fit(spy, MSELoss(), SGD(spy.parameters(), lr=0.0), X, Y, epochs=1, batch_size=5, shuffle=False,
        progress=False)
    for i, b in enumerate(spy.seen):
        np.testing.assert_array_equal(b, X[5 * i:5 * i + 5])


def test_same_seed_same_history_other_seed_differs():
    # Check that two runs with the same seed give the same History (and parameters), and a
    # different shuffling seed a different one.
    X, Y = data.sine(64, dtype=np.float64)

    def run(seed):
        m = MLP([1, 8, 1], dtype=np.float64, rng=0)
        h = fit(m, MSELoss(), AdamW(m.parameters(), lr=1e-2), X, Y, epochs=5, batch_size=10, rng=seed,
                progress=False)
        return h, m.state_dict()

    (h1, s1), (h2, s2), (h3, _) = run(7), run(7), run(8)
    assert h1 == h2
    assert h1.loss == h2.loss and len(h1.loss) == 5
    for k in s1:
        np.testing.assert_array_equal(s1[k], s2[k])
    assert h1.loss != h3.loss


def test_epoch_loss_is_the_mean_over_samples():
    # Check that with lr 0 the epoch loss over batches 5, 5, 5, 2 is the MSE over all 17
    # samples (batch losses weighted by their sizes), computed here with NumPy.
    X, Y = _linear_task()
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    want = np.mean((X @ lin.W.data + lin.b.data - Y) ** 2)
    h = fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.0), X, Y, epochs=1, batch_size=5,
            progress=False)
    assert h.loss[0] == pytest.approx(want, rel=1e-12)


def test_full_batch_first_loss_is_the_initial_loss():
    # Check that the first epoch's loss (full batch) is the loss before any update, and that
    # the second epoch's is lower.
    X, Y = _linear_task()
    lin = Linear(3, 2, dtype=np.float64, rng=1)
    want = np.mean((X @ lin.W.data + lin.b.data - Y) ** 2)
    h = fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y, epochs=2, progress=False)
    assert h.loss[0] == pytest.approx(want, rel=1e-12)
    assert h.loss[1] < h.loss[0]


# ----------------------------------------------------------------------------- non-finite
class NaNInSecondBatch(Spy):
    """Spy whose second forward sees a NaN in sample 7 (fit rejects NaN data up front, so
    the NaN must arise inside the model, as an overflow would)."""

    def forward(self, x):
        if len(self.seen) == 1:
            x = x.copy()
            x[2, 1] = np.nan  # row 2 of the second batch of 5 is sample 7
        return super().forward(x)


def test_non_finite_loss_stops_with_epoch_and_step_and_keeps_last_good_step():
    # Check that a NaN in sample 7 (second batch of 5, no shuffle) stops training at epoch 1,
    # step 2 with NonFiniteLossError, and the parameters are those after step 1 (computed
    # here with a hand-written step on the first batch).
    X, Y = _linear_task()
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    ref = Linear(3, 2, dtype=np.float64, rng=0)
    opt = AdamW(lin.parameters(), lr=0.1)
    with pytest.raises(NonFiniteLossError, match=r"epoch 1/3, step 2/4") as err:
        fit(NaNInSecondBatch(lin), MSELoss(), opt, X, Y, epochs=3, batch_size=5, shuffle=False,
            progress=False)
    assert (err.value.epoch, err.value.step) == (1, 2)
    assert np.isnan(err.value.loss)
    ref_opt, loss = AdamW(ref.parameters(), lr=0.1), MSELoss()
    loss.forward(ref.forward(X[:5]), Y[:5])
    ref.backward(loss.backward())
    ref_opt.step()
    np.testing.assert_array_equal(lin.W.data, ref.W.data)
    np.testing.assert_array_equal(lin.b.data, ref.b.data)
    assert opt.steps == 1


def test_diverging_training_stops_with_error():
    # Check that an absurd learning rate ends in NonFiniteLossError (not silent NaN training).
    X, Y = data.sine(32, dtype=np.float64)
    m = MLP([1, 8, 1], dtype=np.float64, rng=0)
    with pytest.raises(NonFiniteLossError, match="non-finite loss"):
        fit(m, MSELoss(), SGD(m.parameters(), lr=1e12), X, Y, epochs=50, progress=False)


# ----------------------------------------------------------------------------- predict
def test_predict_eval_mode_new_array_and_batching():
    # Check that predict returns a new array equal to forward's output, the same for any
    # batch size, in eval mode, restoring the module's mode.
    X, _ = _linear_task()
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    want = X @ lin.W.data + lin.b.data
    out = predict(lin, X)
    np.testing.assert_allclose(out, want, rtol=1e-13)
    again = predict(lin, X[:4])
    assert not np.shares_memory(out, again)
    np.testing.assert_allclose(predict(lin, X, batch_size=4), want, rtol=1e-13)
    assert lin.training
    lin.eval()
    predict(lin, X)
    assert not lin.training


def test_predict_uses_eval_mode():
    # Check that dropout is off in predict (eval mode): two calls agree, and so does a
    # deterministic forward in eval mode.
    from engine import FFN
    X = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    f = FFN(4, 8, dropout=0.5, rng=0)
    a, b = predict(f, X), predict(f, X)
    np.testing.assert_array_equal(a, b)
    f.eval()
    np.testing.assert_array_equal(a, f.forward(X))


def test_validation_and_accuracy_in_history():
    # Check that History holds a validation loss and accuracy per epoch for classification,
    # that the last ones equal evaluate() after training, and that accuracy is empty for MSE.
    X, y = data.spiral(200, dtype=np.float64, rng=0)
    Xv, yv = data.spiral(100, dtype=np.float64, rng=1)
    m = MLP([2, 16, 2], dtype=np.float64, rng=0)
    loss = CrossEntropyLoss()
    h = fit(m, loss, AdamW(m.parameters(), lr=1e-2), X, y, epochs=3, batch_size=50,
            validation=(Xv, yv), progress=False)
    assert len(h.loss) == len(h.accuracy) == len(h.val_loss) == len(h.val_accuracy) == 3
    vl, va = evaluate(m, loss, Xv, yv, batch_size=50)  # fit evaluates in its batch size
    assert h.val_loss[-1] == vl and h.val_accuracy[-1] == va
    logits = predict(m, Xv)
    assert va == np.mean(logits.argmax(axis=1) == yv)
    assert all(0.0 <= a <= 1.0 for a in h.accuracy)

    Xs, Ys = data.sine(32, dtype=np.float64)
    lin = Linear(1, 1, dtype=np.float64, rng=0)
    h = fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), Xs, Ys, epochs=2, progress=False)
    assert h.accuracy == [] and h.val_loss == []


# ----------------------------------------------------------------------------- progress
def _small_fit(progress, epochs=4):
    X, Y = _linear_task()
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y, epochs=epochs, batch_size=5,
        progress=progress)


def test_progress_false_prints_nothing(capsys):
    # Check that progress=False writes nothing.
    _small_fit(False)
    assert capsys.readouterr().out == ""


def test_progress_plain_lines_when_not_a_terminal(capsys):
    # Check that off a terminal progress=True prints one plain line per 10% of the epochs,
    # with epoch, loss and samples/s, and an int prints every k epochs.
    _small_fit(True, epochs=20)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("epoch  2/20") and "loss" in lines[0] and "samples/s" in lines[0]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]
    _small_fit(3, epochs=7)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in lines] == ["3/7", "6/7", "7/7"]
    assert "\r" not in "".join(lines)


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_updates_one_line_on_a_terminal(monkeypatch):
    # Check that on a terminal the progress is one line redrawn with carriage returns and
    # ended by a single newline.
    fake = _TTY()
    monkeypatch.setattr(sys, "stdout", fake)
    _small_fit(True, epochs=5)
    out = fake.getvalue()
    assert out.count("\n") == 1 and out.endswith("\n")
    assert out.startswith("\r") and "epoch 5/5" in out


# ----------------------------------------------------------------------------- arguments
def test_bad_arguments():
    # Check the errors for mismatched X/Y, a bad epoch count or batch size, and a non-optimizer.
    X, Y = _linear_task()
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    opt = SGD(lin.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Y: expected 17 samples"):
        fit(lin, MSELoss(), opt, X, Y[:5], epochs=1)
    with pytest.raises(ValueError, match="epochs"):
        fit(lin, MSELoss(), opt, X, Y, epochs=-1)
    with pytest.raises(ValueError, match="batch_size"):
        fit(lin, MSELoss(), opt, X, Y, epochs=1, batch_size=0)
    with pytest.raises(TypeError, match="optimizer"):
        fit(lin, MSELoss(), object(), X, Y, epochs=1)
    with pytest.raises(TypeError, match="validation"):
        fit(lin, MSELoss(), opt, X, Y, epochs=1, validation=X)


def test_metrics_against_hand_computed_values():
    # Check r2_score and mean_absolute_error on a small hand-computed example.
    y = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 3.0]])
    p = np.array([[1.0, 1.0], [2.5, 0.0], [2.5, 3.0]])
    # column 0: SS_res = 0.5, SS_tot = 2 -> 0.75; column 1: SS_res = 1, SS_tot = 6 -> 5/6
    np.testing.assert_allclose(r2_score(y, p), [0.75, 5 / 6], rtol=1e-15)
    np.testing.assert_allclose(mean_absolute_error(y, p), [1 / 3, 1 / 3], rtol=1e-15)


# ----------------------------------------------------------------------------- convergence
def test_xor_is_learned():
    # Check that MLP([2, 8, 2]) with softmax + cross-entropy learns XOR: predictions [0, 1, 1, 0].
    X, y = data.xor()
    m = MLP([2, 8, 2], rng=0)
    h = fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=0.05), X, y, epochs=300, progress=False)
    np.testing.assert_array_equal(predict(m, X).argmax(axis=1), [0, 1, 1, 0])
    assert h.accuracy[-1] == 1.0


def test_two_spirals_reach_85_percent():
    # Check that MLP([2, 64, 32, 2]) separates the two spirals (> 0.85 accuracy; a linear
    # model gets about 0.65 on this data).
    X, y = data.spiral(1000, rng=0)
    m = MLP([2, 64, 32, 2], rng=0)
    loss = CrossEntropyLoss()
    fit(m, loss, AdamW(m.parameters(), lr=1e-2), X, y, epochs=60, batch_size=32, progress=False)
    _, acc = evaluate(m, loss, X, y)
    assert acc > 0.85


def test_sine_regression_mse_below_0_1():
    # Check that MLP([1, 32, 16, 1]) fits sin(x) on [-pi, pi] to MSE < 0.1 (sin's variance
    # is 0.5).
    X, Y = data.sine(256, rng=0)
    m = MLP([1, 32, 16, 1], rng=0)
    fit(m, MSELoss(), AdamW(m.parameters(), lr=1e-2), X, Y, epochs=300, progress=False)
    mse, _ = evaluate(m, MSELoss(), X, Y)
    assert mse < 0.1


def test_gmlp_regression_r2_above_0_9_on_every_output():
    # Check that a gMLP fits all four regression targets (R^2 > 0.9 each on the training set)
    # and generalises to fresh samples (held-out R^2 > 0.7 each).
    X, Y = data.regression(512, rng=0)
    m = GMLP(16, 32, 64, 4, rng=0)
    fit(m, MSELoss(), AdamW(m.parameters(), lr=1e-2), X, Y, epochs=200, progress=False)
    r2 = r2_score(Y, predict(m, X))
    assert np.all(r2 > 0.9), r2
    Xt, Yt = data.regression(2048, rng=1)
    held = r2_score(Yt, predict(m, Xt))
    assert np.all(held > 0.7), held


def test_regression_targets_are_the_documented_functions():
    # Check the regression task against its documented formulas, and its input range.
    X, Y = data.regression(100, dtype=np.float64, rng=3)
    x = X
    assert X.shape == (100, 16) and Y.shape == (100, 4)
    assert X.min() >= -3.0 and X.max() <= 3.0
    np.testing.assert_allclose(Y[:, 0], np.sin(0.3 * (x[:, 0] + x[:, 1] + x[:, 2])))
    np.testing.assert_allclose(Y[:, 1], np.tanh(0.25 * (x[:, 0] - x[:, 3] + x[:, 4] - x[:, 5] + x[:, 6])))
    np.testing.assert_allclose(Y[:, 2], 0.1 * (x[:, 7] + x[:, 8]) ** 2 - 0.6)
    np.testing.assert_allclose(Y[:, 3], 0.1 * x[:, 9] * x[:, 10] + 0.2 * x[:, 11])
    X32, Y32 = data.regression(100, rng=3)
    assert X32.dtype == Y32.dtype == np.float32 and X32.flags.c_contiguous
    np.testing.assert_array_equal(X32, X.astype(np.float32))
