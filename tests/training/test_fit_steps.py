"""fit's iteration-based runs (nanoGPT's loop): fit(..., sampler=, steps=, eval_every=) draws
every step's batch from a sampler, and each period of eval_every steps ends as an epoch does."""
import numpy as np
import pytest

from engine.nn.embedding import Embedding
from engine.nn.containers import Sequential
from engine.nn.layers import Linear
from engine.nn.losses import CrossEntropyLoss
from engine.optim.optimizers import AdamW
from engine.training.loop import fit
from engine.training.samplers import RandomWindows

V, T, B = 11, 6, 4
IDS = np.random.default_rng(0).integers(0, V, 400)


def _model(seed=0):
    rng = np.random.default_rng(seed)
    return Sequential(Embedding(V, 8, dtype=np.float64, rng=rng),
                      Linear(8, V, dtype=np.float64, rng=rng))


def _run(seed, steps=12, **options):
    m = _model()
    h = fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), progress=False,
            sampler=RandomWindows(IDS, T, B, rng=seed), steps=steps, **options)
    return m, h


def test_a_run_takes_the_sampler_batches_a_hand_written_loop_takes():
    # Check fit's steps on sampler batches equal forward, loss, backward, AdamW step, zero_grad
    # written out on the same batches (same Generator seed): the same weights bit for bit.
    got, h = _run(5, steps=9)
    m = _model()
    loss, opt = CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2)
    twin = RandomWindows(IDS, T, B, rng=5)
    for _ in range(9):
        xb, yb = twin.sample()
        loss.forward(m.forward(xb), yb)
        m.backward(loss.backward())
        opt.step()
        m.zero_grad()
    for (name, a), (_, b) in zip(got.state_dict().items(), m.state_dict().items()):
        assert np.array_equal(a, b), name
    assert h.steps == 9 and h.samples == 9 * B


def test_same_seed_same_weights_another_seed_other_weights():
    # Check determinism: the same sampler seed gives bit-identical weights, another differs.
    a, _ = _run(1)
    b, _ = _run(1)
    c, _ = _run(2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not all(np.array_equal(sa[k], sc[k]) for k in sa)


def test_each_period_of_eval_every_steps_is_a_history_row_with_validation():
    # Check 25 steps at eval_every=10: 3 rows (10, 10, 5 steps), each with a validation loss
    # equal to evaluating the model then (the last one: the final model's).
    from engine.training.loop import evaluate
    Xv, Yv = RandomWindows(IDS, T, 8, rng=9).example()
    m, h = _run(3, steps=25, eval_every=10, validation=(Xv, Yv))
    assert len(h.loss) == len(h.val_loss) == 3 and h.steps == 25
    assert h.val_loss[-1] == evaluate(m, CrossEntropyLoss(), Xv, Yv, B)[0]


def test_the_period_loss_is_the_mean_of_its_batch_losses():
    # Check a History row's loss is the mean of the batch losses of its steps, each measured
    # before its update (recomputed here by replaying the run one step at a time).
    _, h = _run(4, steps=6, eval_every=3)
    m = _model()
    loss, opt = CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2)
    twin, values = RandomWindows(IDS, T, B, rng=4), []
    for _ in range(6):
        xb, yb = twin.sample()
        values.append(loss.forward(m.forward(xb), yb))
        m.backward(loss.backward())
        opt.step()
        m.zero_grad()
    np.testing.assert_allclose(h.loss, [np.mean(values[:3]), np.mean(values[3:])], rtol=1e-12)


def test_an_iterator_is_a_sampler_too():
    # Check a plain iterator of (X, Y) batches trains (each batch checked as data), and one
    # that ends before the run does is a ValueError saying so.
    src = RandomWindows(IDS, T, B, rng=0)
    batches = [tuple(a.copy() for a in src.sample()) for _ in range(3)]
    m = _model()
    h = fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), sampler=iter(batches),
            steps=3, progress=False)
    assert h.steps == 3
    with pytest.raises(ValueError, match="iterator ended after 3"):
        fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), sampler=iter(batches * 1),
            steps=4, progress=False)


def test_log_every_prints_a_line_every_n_steps(capsys):
    # Check log_every=4 over 10 steps prints the lines of steps 4 and 8, each with the mean
    # loss of its 4 steps, the rate and the time per step.
    m = _model()
    fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), progress=True, log_every=4,
        sampler=RandomWindows(IDS, T, B, rng=0), steps=10, eval_every=5)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("iter ")]
    assert [ln.split(":")[0] for ln in lines] == ["iter 4", "iter 8"]
    assert all("loss " in ln and "lr 0.01" in ln and "ms/step" in ln for ln in lines)


def test_progress_lines_count_steps(capsys):
    m = _model()
    fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), progress=True,
        sampler=RandomWindows(IDS, T, B, rng=0), steps=7, eval_every=3)
    out = capsys.readouterr().out
    assert "step 3/7" in out and "step 6/7" in out and "step 7/7" in out


@pytest.mark.parametrize("kwargs,err,msg", [
    (dict(epochs=2), ValueError, "epochs: an iteration-based run"),
    (dict(X=np.zeros((2, T), np.int64), Y=np.zeros((2, T), np.int64)), ValueError, "pass no X"),
    (dict(steps=None), TypeError, "steps"),
    (dict(eval_every=0), ValueError, "eval_every"),
    (dict(comm=object()), TypeError, "comm: expected an MPI communicator"),
    (dict(sampler=[1, 2]), TypeError, "sampler"),
])
def test_bad_iteration_based_calls_change_nothing(kwargs, err, msg):
    # Check each bad combination raises before any change to the parameters.
    m = _model()
    before = {k: v.copy() for k, v in m.state_dict().items()}
    options = {**dict(sampler=RandomWindows(IDS, T, B, rng=0), steps=3, progress=False),
               **kwargs}
    with pytest.raises(err, match=msg):
        fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), **options)
    assert all(np.array_equal(before[k], v) for k, v in m.state_dict().items())


def test_steps_without_a_sampler_is_refused():
    m = _model()
    X = np.zeros((4, T), np.int64)
    with pytest.raises(ValueError, match="steps: only with sampler"):
        fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), X, X, epochs=1, steps=3)


def test_ids_beyond_the_model_are_found_before_training():
    # Check the sampler's example batch (its largest id) is checked against the model first.
    m = _model()
    ids = IDS.copy()
    ids[200] = V  # one past the embedding
    with pytest.raises(ValueError):
        fit(m, CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-2), progress=False,
            sampler=RandomWindows(ids, T, B, rng=0), steps=2)
    assert m.training
