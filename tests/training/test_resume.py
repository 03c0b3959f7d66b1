"""fit(..., resume_from=path): a run continued from a checkpoint written by a fit run (by
ModelCheckpoint or an interrupt) equals the uninterrupted run bit for bit on one thread,
with shuffling, dropout, a warmup + cosine schedule, validation and early stopping; epoch
numbers continue; a checkpoint that does not fit the run is refused before anything
changes."""
import os
import signal

import numpy as np
import pytest

import kernels
from engine import (FFN, SGD, AdamW, EarlyStopping, Linear, ModelCheckpoint, Module, MSELoss,
                    Sequential, fit, save)
from engine.optim import lr_scheduler as lrs
from engine.training.history import TrainingInterrupted

EPOCHS, BATCH = 20, 16


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


def _data():
    # Noise targets: the validation loss falls, then rises as the model fits the noise, so
    # early stopping has something to stop.
    r = np.random.default_rng(0)
    X, Y = r.standard_normal((50, 4)), r.standard_normal((50, 2))
    return X, Y, (r.standard_normal((12, 4)), r.standard_normal((12, 2)))


def _build(dropout=0.2):
    m = Sequential(Linear(4, 32, rng=1, dtype=np.float64),
                   FFN(32, 64, dropout=dropout, rng=2, dtype=np.float64),
                   Linear(32, 2, rng=3, dtype=np.float64))
    opt = AdamW(m.parameters(), lr=1e-2)
    total = EPOCHS * -(-50 // BATCH)
    warm = lrs.LinearLR(opt, start_factor=0.1, total_iters=8)
    sched = lrs.SequentialLR(opt, [warm, lrs.CosineAnnealingLR(opt, T_max=total - 8)], [8])
    return m, opt, sched


def _fit(m, opt, sched, epochs, callbacks=(), **kw):
    X, Y, val = _data()
    return fit(m, MSELoss(), opt, X, Y, epochs=epochs, batch_size=BATCH, rng=7,
               validation=val, scheduler=sched, scheduler_interval="step", progress=False,
               callbacks=list(callbacks), **kw)


def _same_run(a, b) -> None:
    (ma, oa, ha), (mb, ob, hb) = a, b
    for p, q in zip(ma.parameters(), mb.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["steps"] == sb["steps"]
    for i in sa["state"]:
        for k in sa["state"][i]:
            np.testing.assert_array_equal(sa["state"][i][k], sb["state"][i][k])
    assert ha == hb  # every per-epoch figure (timings aside), steps and samples
    assert oa.param_groups[0]["lr"] == ob.param_groups[0]["lr"]


def test_ten_plus_ten_epochs_equal_twenty_with_early_stopping_counting_on(tmp_path):
    # Check that a run checkpointed by ModelCheckpoint after epoch k and resumed to 20 equals
    # the uninterrupted run bit for bit: parameters, AdamW moments, History, the learning
    # rate, and the epoch early stopping stops at, k being an epoch where its patience
    # counter is already running (so the counter must continue, not restart).
    stop = EarlyStopping(patience=4, restore_best_weights=True)
    m, opt, sched = _build()
    h = _fit(m, opt, sched, EPOCHS, [stop])
    assert 0 < stop.best_epoch < stop.stopped_epoch < EPOCHS  # it does stop early
    k = stop.best_epoch + 2  # two epochs into its patience
    full = (m, opt, h)

    m1, opt1, sched1 = _build()
    ck = ModelCheckpoint(str(tmp_path / "ck-{epoch:02d}.npz"), save_best_only=False)
    _fit(m1, opt1, sched1, k, [ck, EarlyStopping(patience=4, restore_best_weights=True)])
    m2, opt2, sched2 = _build(dropout=0.2)
    m2.parameters()[0].data[...] = 123.0  # loaded over
    stop2 = EarlyStopping(patience=4, restore_best_weights=True)
    h2 = _fit(m2, opt2, sched2, EPOCHS, [stop2], resume_from=tmp_path / f"ck-{k:02d}.npz")
    assert (stop2.stopped_epoch, stop2.best_epoch) == (stop.stopped_epoch, stop.best_epoch)
    _same_run((m2, opt2, h2), full)


def test_ten_plus_ten_epochs_equal_twenty_and_epoch_numbers_continue(tmp_path):
    # Check that after resuming from a checkpoint of epoch 10, the callbacks see epochs
    # 11..20, the History holds all 20, ModelCheckpoint("ck-{epoch:02d}") writes ck-11
    # to ck-20 (not ck-01 again), and the run equals 20 uninterrupted epochs bit for bit.
    m, opt, sched = _build()
    _fit(m, opt, sched, 10, [ModelCheckpoint(str(tmp_path / "a-{epoch:02d}.npz"),
                                             monitor="loss", save_best_only=False)])
    seen = []

    class Probe:
        def on_epoch_end(self, epoch, history):
            seen.append((epoch, len(history)))

    m2, opt2, sched2 = _build()
    ck = ModelCheckpoint(str(tmp_path / "ck-{epoch:02d}.npz"), monitor="loss",
                         save_best_only=False)
    h = _fit(m2, opt2, sched2, 20, [Probe(), ck], resume_from=str(tmp_path / "a-10.npz"))
    assert seen == [(e, e) for e in range(11, 21)]
    assert len(h) == 20 and h.columns()["epoch"] == list(range(1, 21))
    written = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ck-"))
    assert written == [f"ck-{e:02d}.npz" for e in range(11, 21)]
    m3, opt3, sched3 = _build()
    _same_run((m2, opt2, h), (m3, opt3, _fit(m3, opt3, sched3, 20)))


class _CtrlCAtForward(Module):
    """Wraps a model; its ``at``-th forward raises a SIGINT (a Ctrl-C mid-step). ``at`` is
    kept under another name, so the wrapper has no configuration: the resumed run's
    wrapper (at=0) is not another architecture."""

    def __init__(self, inner, at):
        super().__init__(np.float64)
        self.inner, self.signal_at, self.calls = inner, at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.signal_at:
            signal.raise_signal(signal.SIGINT)
        return self.inner.forward(x)

    def backward(self, dy):
        return self.inner.backward(dy)

    def named_generators(self):
        return self.inner.named_generators()


# Forward calls of an epoch: 4 steps, then the validation pass. (forward, steps done, step)
@pytest.mark.parametrize("at, steps, step", [(1, 1, 1), (5, 4, 0), (6, 5, 1), (8, 7, 3)])
def test_a_ctrl_c_mid_epoch_saves_a_checkpoint_that_resumes_exactly(tmp_path, at, steps, step):
    # Check that a Ctrl-C during a step stops fit at the end of that step (applied whole),
    # that the exception's save() writes a checkpoint, and that resuming from it (in the
    # middle of the epoch: its order, running loss and dropout draws) equals the
    # uninterrupted run bit for bit.
    m, opt, sched = _build()
    full = (m, opt, _fit(m, opt, sched, 6))
    m1, opt1, sched1 = _build()
    with pytest.raises(TrainingInterrupted) as err:
        _fit(_CtrlCAtForward(m1, at), opt1, sched1, 6)
    assert (opt1.steps, err.value.step) == (steps, step)
    assert "exception's .history" in str(err.value) and err.value.resumable
    err.value.save(tmp_path / "int.npz")
    m2, opt2, sched2 = _build()
    h2 = _fit(_CtrlCAtForward(m2, 0), opt2, sched2, 6, resume_from=tmp_path / "int.npz")
    _same_run((m2, opt2, h2), full)


def _unchanged(m, opt):
    return [p.data.copy() for p in m.parameters()], opt.steps


@pytest.mark.parametrize("case", ["architecture", "optimizer", "no scheduler", "epochs done",
                                  "plain save", "mid-epoch batch size"])
def test_a_checkpoint_that_does_not_fit_the_run_is_refused_and_nothing_changes(tmp_path, case):
    # Check each mismatch raises a ValueError naming resume_from and what differs, with the
    # model's parameters and the optimizer untouched.
    m, opt, sched = _build()
    _fit(m, opt, sched, 3, [ModelCheckpoint(str(tmp_path / "ck.npz"), monitor="loss",
                                            save_best_only=False)])
    path, kw, match = tmp_path / "ck.npz", {}, None
    m2, opt2, sched2 = _build()
    if case == "architecture":
        m2 = Sequential(Linear(4, 32, rng=1, dtype=np.float64),
                        FFN(32, 48, dropout=0.2, rng=2, dtype=np.float64),
                        Linear(32, 2, rng=3, dtype=np.float64))
        opt2, sched2, match = AdamW(m2.parameters()), None, "architecture"
    elif case == "optimizer":
        opt2 = SGD(m2.parameters(), lr=0.1)
        sched2, match = lrs.StepLR(opt2, 5), "optimizer"
    elif case == "no scheduler":
        sched2, match = None, "scheduler"
    elif case == "epochs done":
        kw["epochs"], match = 3, "epochs=3 is the run's total"
    elif case == "plain save":
        save(tmp_path / "plain.npz", m, opt, sched)
        path, match = tmp_path / "plain.npz", "no training state"
    elif case == "mid-epoch batch size":
        m3, opt3, sched3 = _build()
        with pytest.raises(TrainingInterrupted) as err:
            _fit(_CtrlCAtForward(m3, 2), opt3, sched3, 3)
        err.value.save(tmp_path / "mid.npz")
        path, kw["batch_size"], match = tmp_path / "mid.npz", 10, "batch_size=16"
        m2 = _CtrlCAtForward(m2, 0)
    before = _unchanged(m2, opt2)
    X, Y, val = _data()
    options = dict(epochs=6, batch_size=BATCH, rng=7, validation=val, scheduler=sched2,
                   scheduler_interval="step", progress=False)
    options.update(kw)
    with pytest.raises(ValueError, match="resume_from") as err:
        fit(m2, MSELoss(), opt2, X, Y, resume_from=path, **options)
    assert match in str(err.value)
    after = _unchanged(m2, opt2)
    assert after[1] == before[1] == 0
    assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0]))


def test_a_resume_with_generators_laid_out_differently_is_refused(tmp_path):
    # Check that a model whose dropout draws from another arrangement of Generators (here:
    # the shuffle's own Generator) is refused: its random numbers would not continue.
    m, opt, sched = _build()
    _fit(m, opt, sched, 2, [ModelCheckpoint(str(tmp_path / "ck.npz"), monitor="loss",
                                            save_best_only=False)])
    gen = np.random.default_rng(7)
    m2 = Sequential(Linear(4, 32, rng=1, dtype=np.float64),
                    FFN(32, 64, dropout=0.2, rng=gen, dtype=np.float64),
                    Linear(32, 2, rng=3, dtype=np.float64))
    opt2 = AdamW(m2.parameters(), lr=1e-2)
    sched2 = lrs.SequentialLR(opt2, [lrs.LinearLR(opt2, start_factor=0.1, total_iters=8),
                                     lrs.CosineAnnealingLR(opt2, T_max=72)], [8])
    X, Y, val = _data()
    with pytest.raises(ValueError, match="Generators differ"):
        fit(m2, MSELoss(), opt2, X, Y, epochs=4, batch_size=BATCH, rng=gen, progress=False,
            scheduler=sched2, scheduler_interval="step", resume_from=tmp_path / "ck.npz")
    assert opt2.steps == 0


def test_resume_with_a_bad_comm_is_refused_before_anything_changes(tmp_path):
    # Check resume_from with a comm= that is no communicator is a TypeError naming comm, and
    # the model is untouched (data-parallel resuming itself: tests/test_distributed_lm.py).
    m, opt, _ = _build()
    X, Y, _ = _data()
    before = m.flat_params().copy()
    with pytest.raises(TypeError, match="comm: expected an MPI communicator"):
        fit(m, MSELoss(), opt, X, Y, epochs=2, comm=object(), resume_from=os.devnull)
    assert np.array_equal(m.flat_params(), before)


def test_a_resumed_runs_progress_lines_count_on_from_its_epoch(tmp_path, capsys):
    # Check the progress lines of a run resumed after epoch 4 of 6 are epochs 5 and 6 of 6.
    m, opt, sched = _build()
    _fit(m, opt, sched, 4, [ModelCheckpoint(str(tmp_path / "ck.npz"), monitor="loss",
                                            save_best_only=False)])
    m2, opt2, sched2 = _build()
    capsys.readouterr()
    X, Y, val = _data()
    fit(m2, MSELoss(), opt2, X, Y, epochs=6, batch_size=BATCH, rng=7, validation=val,
        scheduler=sched2, scheduler_interval="step", progress=1,
        resume_from=tmp_path / "ck.npz")
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("  ")[0] for ln in lines] == ["epoch 5/6", "epoch 6/6"]


def test_a_damaged_training_state_is_a_checkpoint_error(tmp_path):
    # Check that an interrupted run's checkpoint whose saved epoch order was edited (not a
    # permutation of the samples) is refused before anything changes: the gather reads
    # rows with mode="clip", so a bad index would silently train on other rows.
    import json
    import zipfile
    m1, opt1, sched1 = _build()
    with pytest.raises(TrainingInterrupted) as err:
        _fit(_CtrlCAtForward(m1, 2), opt1, sched1, 3)
    err.value.save(tmp_path / "mid.npz")
    with zipfile.ZipFile(tmp_path / "mid.npz") as z:
        members = {n: z.read(n) for n in z.namelist()}
    header = json.loads(np.load(tmp_path / "mid.npz")["__header__"][()])
    key = "train/" + header["training"]["order"]["__array__"] + ".npy"
    import io
    order = np.load(io.BytesIO(members[key]))
    order[0] = order[1]  # a repeated row
    buf = io.BytesIO()
    np.save(buf, order)
    members[key] = buf.getvalue()
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    m2, opt2, sched2 = _build()
    X, Y, val = _data()
    with pytest.raises(ValueError, match="not a permutation"):
        fit(_CtrlCAtForward(m2, 0), MSELoss(), opt2, X, Y, epochs=3, batch_size=BATCH, rng=7,
            validation=val, scheduler=sched2, scheduler_interval="step", progress=False,
            resume_from=tmp_path / "bad.npz")
    assert opt2.steps == 0


def _edited_header(src, dst, edit) -> None:
    """Copy the checkpoint ``src`` to ``dst`` with its JSON header changed by ``edit``."""
    import json
    import zipfile
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    header = json.loads(np.load(src)["__header__"][()])
    edit(header)
    import io
    buf = io.BytesIO()
    np.save(buf, np.array(json.dumps(header)))
    members["__header__.npy"] = buf.getvalue()
    with zipfile.ZipFile(dst, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)


EDITS = {
    "generator state": lambda h: h["training"]["generators"]["states"][1].update(state="x"),
    "step past the epoch": lambda h: h["training"].update(step=999),
    "epochs as text": lambda h: h["training"].update(epochs_done="3"),
    "history too short": lambda h: h["training"]["history"].update(loss=[]),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_training_state_is_refused_before_anything_changes(tmp_path, edit):
    # Check each edit of an interrupted run's training state (its checksums intact, as a
    # hand edit leaves them) is a ValueError, with the model and optimizer untouched.
    m1, opt1, sched1 = _build()
    with pytest.raises(TrainingInterrupted) as err:
        _fit(_CtrlCAtForward(m1, 7), opt1, sched1, 3)
    err.value.save(tmp_path / "mid.npz")
    _edited_header(tmp_path / "mid.npz", tmp_path / "bad.npz", EDITS[edit])
    m2, opt2, sched2 = _build()
    before = [p.data.copy() for p in m2.parameters()]
    with pytest.raises(ValueError):
        _fit(_CtrlCAtForward(m2, 0), opt2, sched2, 3, resume_from=tmp_path / "bad.npz")
    assert opt2.steps == 0
    assert all(np.array_equal(a, p.data) for a, p in zip(before, m2.parameters()))
    state = err.value  # the unedited file still resumes
    _fit(_CtrlCAtForward(m2, 0), opt2, sched2, 3, resume_from=tmp_path / "mid.npz")
    assert opt2.steps == 3 * 4 and state.resumable


# Same points as above, fit over an MPI communicator (a world of one rank: this process).
@pytest.mark.parametrize("at, steps, step", [(1, 1, 1), (5, 4, 0), (8, 7, 3)])
def test_a_ctrl_c_under_mpi_stops_at_the_agreed_step_and_resumes_exactly(tmp_path, at, steps,
                                                                         step):
    # Check that fit(comm=...) only counts a SIGINT and stops where the ranks agree: at the
    # end of the step (or epoch end) it arrived in, as on one process; the exception's
    # save() (collective, rank 0 writes) resumes to the uninterrupted run bit for bit.
    pytest.importorskip("mpi4py")
    from engine import distributed
    comm = distributed.mpi().COMM_WORLD
    m, opt, sched = _build()
    full = (m, opt, _fit(m, opt, sched, 6))
    m1, opt1, sched1 = _build()
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as err:
        _fit(_CtrlCAtForward(m1, at), opt1, sched1, 6, comm=comm)
    assert signal.getsignal(signal.SIGINT) is handler
    assert (opt1.steps, err.value.step) == (steps, step)
    err.value.save(tmp_path / "int.npz")
    m2, opt2, sched2 = _build()
    h2 = _fit(_CtrlCAtForward(m2, 0), opt2, sched2, 6, resume_from=tmp_path / "int.npz")
    _same_run((m2, opt2, h2), full)
