"""engine.training.callbacks: EarlyStopping (Keras's rules), ModelCheckpoint, your own callback, and
fit's checks of callbacks and output paths before the first step."""
import os

import numpy as np
import pytest

import kernels
from engine import (SGD, Callback, EarlyStopping, History, Linear, ModelCheckpoint, MSELoss,
                    fit, load)
from engine.training.callbacks import check_output_path


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


def _feed(cb, values, monitor="val_loss"):
    """Call cb.on_epoch_end with a history growing by ``values``; return the epoch it stopped."""
    h = History()
    for epoch, v in enumerate(values, 1):
        getattr(h, monitor).append(v)
        h.loss.append(v)
        if cb.on_epoch_end(epoch, h):
            return epoch
    return None


# ----------------------------------------------------------------------------- EarlyStopping
def test_early_stopping_waits_patience_epochs_without_improvement():
    # Check Keras's rule: with patience 2 the run stops at the 2nd epoch in a row that does not
    # beat the best (0.5 at epoch 2): 0.6 and 0.55 are misses, so epoch 4.
    cb = EarlyStopping(patience=2)
    assert _feed(cb, [1.0, 0.5, 0.6, 0.55, 0.4]) == 4
    assert (cb.best, cb.best_epoch, cb.stopped_epoch) == (0.5, 2, 4)


def test_early_stopping_improvement_resets_the_count():
    # Check that an improvement between misses starts the count again (never 2 in a row here).
    assert _feed(EarlyStopping(patience=2), [1.0, 1.1, 0.9, 0.95, 0.8, 0.85, 0.7]) is None


def test_early_stopping_patience_zero_stops_at_first_miss():
    # Check patience 0 (Keras's default): the first epoch that does not improve stops.
    assert _feed(EarlyStopping(), [3.0, 2.0, 2.5]) == 3


def test_early_stopping_min_delta_requires_a_margin():
    # Check that an improvement smaller than min_delta counts as a miss: 0.95 is not below
    # 1.0 - 0.1, so with patience 1 the run stops at epoch 2.
    assert _feed(EarlyStopping(patience=1, min_delta=0.1), [1.0, 0.95, 0.5]) == 2


def test_early_stopping_on_accuracy_maximises():
    # Check that mode "auto" maximises an accuracy: 0.8 -> 0.9 improves, 0.85 then 0.9 miss.
    cb = EarlyStopping(monitor="val_accuracy", patience=2)
    assert _feed(cb, [0.8, 0.9, 0.85, 0.9], monitor="val_accuracy") == 4
    assert cb.best == 0.9 and cb.best_epoch == 2


def _diverging_run():
    """A Linear (zero init) trained on y = 2x whose validation target is 0: its validation
    loss, mean(pred^2), grows every epoch as the weights grow from zero."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((32, 2))
    Y = np.concatenate([2 * X[:, :1], 2 * X[:, 1:]], axis=1)
    val = (X.copy(), np.zeros_like(Y))
    return X, Y, val


def _model():
    m = Linear(2, 2, init="zeros", dtype=np.float64, rng=0)
    return m, SGD(m.parameters(), lr=0.05)


def test_fit_stops_early_and_restores_the_best_weights():
    # Check with fit: the validation loss is best after epoch 1, so patience 3 stops after
    # epoch 4, and restore_best_weights leaves the parameters of a 1-epoch run.
    X, Y, val = _diverging_run()
    m, opt = _model()
    cb = EarlyStopping(patience=3, restore_best_weights=True)
    h = fit(m, MSELoss(), opt, X, Y, epochs=50, validation=val, callbacks=[cb], progress=False)
    assert len(h) == 4 and cb.stopped_epoch == 4 and cb.best_epoch == 1
    assert all(b > a for a, b in zip(h.val_loss, h.val_loss[1:]))
    ref, ref_opt = _model()
    fit(ref, MSELoss(), ref_opt, X, Y, epochs=1, progress=False)
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)


def test_fit_without_restore_keeps_the_last_weights():
    # Check that without restore_best_weights the model keeps the weights of the last epoch run.
    X, Y, val = _diverging_run()
    m, opt = _model()
    fit(m, MSELoss(), opt, X, Y, epochs=50, validation=val, callbacks=[EarlyStopping(patience=3)],
        progress=False)
    ref, ref_opt = _model()
    fit(ref, MSELoss(), ref_opt, X, Y, epochs=4, progress=False)
    np.testing.assert_array_equal(m.W.data, ref.W.data)


def test_fit_rejects_a_monitor_it_does_not_record_before_training():
    # Check that EarlyStopping on val_loss without validation data is a ValueError raised
    # before the first step: the parameters are unchanged.
    X, Y, _ = _diverging_run()
    m, opt = _model()
    with pytest.raises(ValueError, match=r"callbacks\[0\].*val_loss.*validation"):
        fit(m, MSELoss(), opt, X, Y, epochs=3, callbacks=[EarlyStopping()], progress=False)
    assert not np.any(m.W.data) and opt.steps == 0


def test_fit_rejects_an_object_without_on_epoch_end():
    # Check that a callback without on_epoch_end is a TypeError naming its index.
    X, Y, _ = _diverging_run()
    m, opt = _model()
    with pytest.raises(TypeError, match=r"callbacks\[1\]"):
        fit(m, MSELoss(), opt, X, Y, epochs=1, callbacks=[Callback(), object()], progress=False)


# ----------------------------------------------------------------------------- your own
def test_your_own_callback_is_any_object_with_on_epoch_end():
    # Check the documented protocol: a plain object whose on_epoch_end returns True when the
    # training loss drops below a target stops fit after that epoch, and sees every epoch.
    class StopAtLoss:
        def __init__(self, target):
            self.target, self.seen = target, []

        def on_epoch_end(self, epoch, history):
            self.seen.append((epoch, len(history)))
            return history.loss[-1] < self.target

    X, Y, _ = _diverging_run()
    m, opt = _model()
    cb = StopAtLoss(1.0)
    h = fit(m, MSELoss(), opt, X, Y, epochs=100, callbacks=[cb], progress=False)
    assert h.loss[-1] < 1.0 and all(v >= 1.0 for v in h.loss[:-1])
    assert cb.seen == [(e, e) for e in range(1, len(h) + 1)]


def test_every_callback_sees_the_epoch_a_callback_stops_at():
    # Check that when one callback stops, the others still get that epoch (as Keras).
    class Count:
        def __init__(self):
            self.epochs = []

        def on_epoch_end(self, epoch, history):
            self.epochs.append(epoch)
            return epoch == 2

    X, Y, _ = _diverging_run()
    m, opt = _model()
    a, b = Count(), Count()
    h = fit(m, MSELoss(), opt, X, Y, epochs=10, callbacks=[a, b], progress=False)
    assert len(h) == 2 and a.epochs == [1, 2] and b.epochs == [1, 2]


# ----------------------------------------------------------------------------- ModelCheckpoint
def test_model_checkpoint_saves_only_improving_epochs(tmp_path):
    # Check save_best_only: with validation losses 1.0, 0.8, 0.9, 0.7 files are written for
    # epochs 1, 2 and 4, each holding that epoch's figures in its metadata.
    m, opt = _model()
    cb = ModelCheckpoint(tmp_path / "ck-{epoch}.npz")
    cb.on_train_begin(m, opt, None)
    _feed(cb, [1.0, 0.8, 0.9, 0.7])
    assert sorted(os.listdir(tmp_path)) == ["ck-1.npz", "ck-2.npz", "ck-4.npz"]
    meta = load(tmp_path / "ck-4.npz", Linear(2, 2, dtype=np.float64, rng=1),
                SGD(Linear(2, 2, dtype=np.float64).parameters(), lr=0.05))
    assert meta["epoch"] == 4 and meta["val_loss"] == 0.7


def test_model_checkpoint_every_epoch_overwrites_one_file(tmp_path):
    # Check save_best_only=False: one file, rewritten each epoch; it holds the last epoch.
    m, opt = _model()
    cb = ModelCheckpoint(tmp_path / "last.npz", save_best_only=False)
    cb.on_train_begin(m, opt, None)
    _feed(cb, [1.0, 0.8, 0.9])
    assert os.listdir(tmp_path) == ["last.npz"] and len(cb.saved) == 3
    assert load(tmp_path / "last.npz", Linear(2, 2, dtype=np.float64))["epoch"] == 3


def test_model_checkpoint_in_fit_holds_the_best_epochs_weights(tmp_path):
    # Check with fit: the best validation epoch of the diverging run is 1, so the file holds
    # the weights after one epoch.
    X, Y, val = _diverging_run()
    m, opt = _model()
    fit(m, MSELoss(), opt, X, Y, epochs=5, validation=val,
        callbacks=[ModelCheckpoint(tmp_path / "best.npz")], progress=False)
    got = Linear(2, 2, dtype=np.float64, rng=3)
    assert load(tmp_path / "best.npz", got)["epoch"] == 1
    ref, ref_opt = _model()
    fit(ref, MSELoss(), ref_opt, X, Y, epochs=1, progress=False)
    np.testing.assert_array_equal(got.W.data, ref.W.data)


def test_model_checkpoint_bad_directory_fails_before_the_first_step(tmp_path):
    # Check that a checkpoint path in a missing directory is a ValueError from fit before
    # any step (the model is unchanged).
    X, Y, val = _diverging_run()
    m, opt = _model()
    with pytest.raises(ValueError, match="does not exist"):
        fit(m, MSELoss(), opt, X, Y, epochs=3, validation=val,
            callbacks=[ModelCheckpoint(tmp_path / "missing" / "c.npz")], progress=False)
    assert not np.any(m.W.data) and opt.steps == 0


# ----------------------------------------------------------------------------- output paths
def test_check_output_path_accepts_a_writable_path_and_leaves_nothing(tmp_path):
    # Check that a good path passes and no probe file remains.
    assert check_output_path(tmp_path / "out.csv", "--history", (".csv",)) == str(tmp_path / "out.csv")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("case, match", [
    ("missing_dir", "does not exist"),
    ("is_dir", "is a directory"),
    ("suffix", "ending in .npz"),
    ("too_long", "bytes long"),
    ("unwritable_dir", "cannot write"),
])
def test_check_output_path_rejects(tmp_path, case, match):
    # Check each rejected path: a ValueError naming the flag.
    if case == "missing_dir":
        p = tmp_path / "nope" / "x.npz"
    elif case == "is_dir":
        (tmp_path / "d.npz").mkdir()
        p = tmp_path / "d.npz"
    elif case == "suffix":
        p = tmp_path / "x.txt"
    elif case == "too_long":
        p = tmp_path / ("a" * 252 + ".npz")  # 256 bytes: over the usual 255
    else:
        # /proc takes no new files, even from root (who passes every permission bit check).
        if not os.path.isdir("/proc/self"):
            pytest.skip("needs Linux's /proc")
        p = "/proc/x.npz"
    with pytest.raises(ValueError, match=f"--save: .*(?:{match})"):
        check_output_path(p, "--save", (".npz", ".safetensors"))
