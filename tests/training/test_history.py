"""History.to_csv / to_json / plot, the learning rate it records, and fit's scheduler and
clip_grad_norm options."""
import csv
import json
import math
import sys

import numpy as np
import pytest

import kernels
from engine import SGD, History, Linear, MSELoss, fit
from engine.optim.lr_scheduler import LambdaLR, StepLR


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


def _history(val=True, acc=False):
    h = History(loss=[2.0, 0.5, 1 / 3], val_loss=[2.5, 0.75, 0.1] if val else [],
                accuracy=[0.5, 0.75, 0.875] if acc else [], steps=6, samples=60,
                epoch_time=[0.5, 0.25, 0.25], lr=[0.1, 0.1, 0.01])
    return h


# ----------------------------------------------------------------------------- files
def test_to_csv_writes_one_row_per_epoch_at_full_precision(tmp_path):
    # Check the header (only the columns that have a value per epoch) and that every number
    # reads back exactly.
    _history(acc=True).to_csv(tmp_path / "h.csv")
    with open(tmp_path / "h.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["epoch", "loss", "accuracy", "val_loss", "lr", "epoch_time"]
    assert [int(r[0]) for r in rows[1:]] == [1, 2, 3]
    assert [float(r[1]) for r in rows[1:]] == [2.0, 0.5, 1 / 3]
    assert [float(r[3]) for r in rows[1:]] == [2.5, 0.75, 0.1]
    assert [float(r[4]) for r in rows[1:]] == [0.1, 0.1, 0.01]


def test_to_json_holds_totals_and_lists(tmp_path):
    # Check the JSON document: totals and per-epoch lists; a NaN loss becomes null.
    h = _history(val=False)
    h.loss[1] = float("nan")
    h.to_json(tmp_path / "h.json")
    doc = json.loads((tmp_path / "h.json").read_text())
    assert doc["epochs"] == 3 and doc["steps"] == 6 and doc["samples"] == 60
    assert doc["seconds"] == 1.0
    assert doc["epoch"] == [1, 2, 3] and doc["loss"] == [2.0, None, 1 / 3]
    assert "val_loss" not in doc and "accuracy" not in doc


# ----------------------------------------------------------------------------- plot
def test_plot_writes_a_png_of_both_curves(tmp_path):
    # Check that the PNG opens, is 640x400, is not blank, and holds pixels of both line
    # colours (matplotlib's tab:blue for loss, tab:orange for val_loss).
    image = pytest.importorskip("matplotlib.image")
    _history().plot(tmp_path / "h.png")
    img = image.imread(tmp_path / "h.png")
    assert img.shape[:2] == (400, 640)
    rgb = np.round(img[..., :3] * 255).astype(int).reshape(-1, 3)
    assert len(np.unique(rgb, axis=0)) > 20            # not a blank canvas
    for colour in ((31, 119, 180), (255, 127, 14)):    # tab:blue, tab:orange
        assert np.sum(np.all(np.abs(rgb - colour) <= 2, axis=1)) > 100, colour


def test_plot_uses_a_log_scale_only_when_losses_span_decades(tmp_path):
    # Check the y scale: 2.0 down to 0.1 spans more than 10x -> log; 1.0 to 0.5 -> linear.
    pytest.importorskip("matplotlib")
    fig = _history().plot(tmp_path / "a.png")
    assert fig.axes[0].get_yscale() == "log"
    flat = History(loss=[1.0, 0.7, 0.5], val_loss=[1.1, 0.8, 0.6])
    assert flat.plot(tmp_path / "b.png").axes[0].get_yscale() == "linear"


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    # Check that without matplotlib, plot raises ImportError naming the 'plot' extra and
    # writes nothing.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"blasnet\[plot\]"):
        _history().plot(tmp_path / "h.png")
    assert not (tmp_path / "h.png").exists()


def test_plot_of_an_empty_history_is_an_error(tmp_path):
    # Check that an empty history is a ValueError, not an empty picture.
    with pytest.raises(ValueError, match="empty"):
        History().plot(tmp_path / "h.png")


# ----------------------------------------------------------------------------- fit options
def _task():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((12, 3))
    return X, X @ rng.standard_normal((3, 2))


def test_fit_records_the_lr_of_each_epoch_with_an_epoch_scheduler():
    # Check scheduler_interval="epoch": history.lr is 0.1 * 0.5 ** floor(epoch / 2) for
    # epochs 0..5, whatever the number of steps per epoch (3 here).
    X, Y = _task()
    m = Linear(3, 2, dtype=np.float64, rng=0)
    opt = SGD(m.parameters(), lr=0.1)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    h = fit(m, MSELoss(), opt, X, Y, epochs=6, batch_size=4, scheduler=sched, progress=False)
    assert h.lr == [0.1 * 0.5 ** (e // 2) for e in range(6)]
    assert sched.last_epoch == 6 and h.steps == 18


def test_fit_steps_a_step_scheduler_after_every_update():
    # Check scheduler_interval="step": the scheduler advances once per optimizer step, and
    # each epoch starts at the rate of its first step (0.1 / (1 + step)).
    X, Y = _task()
    m = Linear(3, 2, dtype=np.float64, rng=0)
    opt = SGD(m.parameters(), lr=0.1)
    sched = LambdaLR(opt, lambda s: 1.0 / (1 + s))
    h = fit(m, MSELoss(), opt, X, Y, epochs=4, batch_size=4, scheduler=sched,
            scheduler_interval="step", progress=False)
    assert sched.last_epoch == 12
    assert h.lr == pytest.approx([0.1 / (1 + 3 * e) for e in range(4)], rel=1e-15)


def test_fit_rejects_a_scheduler_of_another_optimizer_and_a_bad_interval():
    # Check both errors, raised before any step.
    X, Y = _task()
    m = Linear(3, 2, dtype=np.float64, rng=0)
    opt = SGD(m.parameters(), lr=0.1)
    other = StepLR(SGD(m.parameters(), lr=0.1), 2)
    with pytest.raises(ValueError, match="scheduler"):
        fit(m, MSELoss(), opt, X, Y, epochs=1, scheduler=other, progress=False)
    with pytest.raises(ValueError, match="scheduler_interval"):
        fit(m, MSELoss(), opt, X, Y, epochs=1, scheduler=StepLR(opt, 2), scheduler_interval="batch",
            progress=False)
    assert opt.steps == 0


def test_fit_clips_the_gradient_norm_before_the_update():
    # Check one full-batch SGD step (lr 1) from zero weights with clip_grad_norm=0.1: the update
    # is -g * 0.1 / (|g| + 1e-6), g the MSE gradient written out here in float64.
    X, Y = _task()
    m = Linear(3, 2, init="zeros", dtype=np.float64, rng=0)
    fit(m, MSELoss(), SGD(m.parameters(), lr=1.0), X, Y, epochs=1, clip_grad_norm=0.1,
        progress=False)
    dpred = 2.0 * (0.0 - Y) / Y.size            # d mean((pred - Y)^2) / d pred at pred = 0
    gW, gb = X.T @ dpred, dpred.sum(axis=0)
    norm = math.sqrt(np.sum(gW ** 2) + np.sum(gb ** 2))
    assert norm > 0.1                            # the clip is active
    coef = 0.1 / (norm + 1e-6)
    np.testing.assert_allclose(m.W.data, -gW * coef, rtol=1e-12)
    np.testing.assert_allclose(m.b.data, -gb * coef, rtol=1e-12)


def test_fit_rejects_a_bad_clip_value():
    # Check that a non-positive max norm is a ValueError naming clip_grad_norm.
    X, Y = _task()
    m = Linear(3, 2, dtype=np.float64, rng=0)
    with pytest.raises(ValueError, match="clip_grad_norm"):
        fit(m, MSELoss(), SGD(m.parameters(), lr=0.1), X, Y, epochs=1, clip_grad_norm=0.0,
            progress=False)
