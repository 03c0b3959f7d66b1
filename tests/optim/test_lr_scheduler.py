"""engine.optim.lr_scheduler: PyTorch's schedules, each compared over 100 steps with its closed form
written out here, on two parameter groups; state dicts; exact resume through a checkpoint."""
import json
import math

import numpy as np
import pytest

import kernels
from engine import SGD, AdamW, Linear, MSELoss, fit, load, save
from engine.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR, StepLR

BASES = (0.1, 0.02)  # one rate per parameter group
STEPS = 100


def _opt(bases=BASES, cls=SGD):
    m = Linear(3, 2, dtype=np.float64, rng=0)
    groups = [{"params": [m.W], "lr": bases[0]}, {"params": [m.b], "lr": bases[1]}]
    return cls(groups, lr=bases[0])


def _sequence(opt, sched, n=STEPS):
    """The rates of each group at steps 0..n-1 (the rate a step uses, then sched.step())."""
    out = []
    for _ in range(n):
        out.append([g["lr"] for g in opt.param_groups])
        assert sched.get_last_lr() == out[-1]
        sched.step()
    return np.array(out)  # (n, groups)


def _expected(formula, bases=BASES, n=STEPS):
    return np.array([[formula(b, e) for b in bases] for e in range(n)])


# ----------------------------------------------------------------------------- closed forms
def test_lambda_lr_follows_its_function():
    # Check that LambdaLR gives base * f(epoch) for every group.
    opt = _opt()
    got = _sequence(opt, LambdaLR(opt, lambda e: 0.97 ** e))
    np.testing.assert_allclose(got, _expected(lambda b, e: b * 0.97 ** e), rtol=1e-13)


def test_lambda_lr_takes_one_function_per_group():
    # Check that a list of functions gives each group its own factor.
    opt = _opt()
    got = _sequence(opt, LambdaLR(opt, [lambda e: 1.0 / (1 + e), lambda e: 2.0]))
    want = np.array([[0.1 / (1 + e), 0.02 * 2.0] for e in range(STEPS)])
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_step_lr_decays_every_step_size():
    # Check StepLR: base * gamma ** floor(epoch / step_size).
    opt = _opt()
    got = _sequence(opt, StepLR(opt, step_size=7, gamma=0.5))
    np.testing.assert_allclose(got, _expected(lambda b, e: b * 0.5 ** (e // 7)), rtol=1e-13)


def test_linear_lr_ramps_then_holds():
    # Check LinearLR: base * (s + (e_f - s) * min(epoch, T) / T), constant after T.
    opt = _opt()
    got = _sequence(opt, LinearLR(opt, start_factor=0.25, end_factor=0.9, total_iters=20))
    np.testing.assert_allclose(
        got, _expected(lambda b, e: b * (0.25 + (0.9 - 0.25) * min(e, 20) / 20)), rtol=1e-13)


def test_linear_lr_defaults_are_pytorchs():
    # Check LinearLR's defaults (start 1/3, end 1, 5 iterations), as PyTorch's.
    opt = _opt()
    got = _sequence(opt, LinearLR(opt))
    np.testing.assert_allclose(
        got, _expected(lambda b, e: b * (1 / 3 + (1 - 1 / 3) * min(e, 5) / 5)), rtol=1e-13)


def test_cosine_annealing_lr_is_the_closed_form():
    # Check CosineAnnealingLR: eta_min + (base - eta_min)(1 + cos(pi e / T_max)) / 2, including
    # past T_max (PyTorch's closed form rises again).
    opt = _opt()
    got = _sequence(opt, CosineAnnealingLR(opt, T_max=60, eta_min=0.001))
    np.testing.assert_allclose(
        got, _expected(lambda b, e: 0.001 + (b - 0.001) * (1 + math.cos(math.pi * e / 60)) / 2),
        rtol=1e-12, atol=1e-15)


def test_sequential_lr_warmup_then_cosine():
    # Check SequentialLR([LinearLR warmup of 10, cosine over 90], milestones=[10]): the warmup
    # ramp for steps 0..9, then the cosine from its epoch 0 at step 10.
    opt = _opt()
    warm = LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=10)
    cos = CosineAnnealingLR(opt, T_max=90)
    got = _sequence(opt, SequentialLR(opt, [warm, cos], milestones=[10]))

    def want(b, e):
        if e < 10:
            return b * (0.1 + 0.9 * e / 10)
        return b * (1 + math.cos(math.pi * (e - 10) / 90)) / 2
    np.testing.assert_allclose(got, _expected(want), rtol=1e-12, atol=1e-15)


def test_sequential_lr_with_three_phases():
    # Check two milestones: constant 1x, then StepLR from its epoch 0, then LinearLR.
    opt = _opt()
    a = LambdaLR(opt, lambda e: 1.0)
    b = StepLR(opt, step_size=5, gamma=0.5)
    c = LinearLR(opt, start_factor=0.5, end_factor=0.1, total_iters=40)
    got = _sequence(opt, SequentialLR(opt, [a, b, c], milestones=[20, 50]))

    def want(base, e):
        if e < 20:
            return base
        if e < 50:
            return base * 0.5 ** ((e - 20) // 5)
        return base * (0.5 + (0.1 - 0.5) * min(e - 50, 40) / 40)
    np.testing.assert_allclose(got, _expected(want), rtol=1e-13)


def test_torch_gives_the_same_rates():
    # Check against PyTorch itself (skipped without torch): the same five schedules, 100 steps.
    torch = pytest.importorskip("torch")
    tl = torch.optim.lr_scheduler

    def make(lib, opt):
        if lib is tl:
            return [lambda: lib.LambdaLR(opt, lambda e: 0.97 ** e),
                    lambda: lib.StepLR(opt, 7, 0.5),
                    lambda: lib.LinearLR(opt, 0.25, 0.9, 20),
                    lambda: lib.CosineAnnealingLR(opt, 60, 0.001),
                    lambda: lib.SequentialLR(opt, [lib.LinearLR(opt, 0.1, 1.0, 10),
                                                   lib.CosineAnnealingLR(opt, 90)], [10])]
        return [lambda: LambdaLR(opt, lambda e: 0.97 ** e), lambda: StepLR(opt, 7, 0.5),
                lambda: LinearLR(opt, 0.25, 0.9, 20), lambda: CosineAnnealingLR(opt, 60, 0.001),
                lambda: SequentialLR(opt, [LinearLR(opt, 0.1, 1.0, 10),
                                           CosineAnnealingLR(opt, 90)], [10])]
    for k in range(5):
        p = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
        topt = torch.optim.SGD([{"params": [p[0]], "lr": BASES[0]},
                                {"params": [p[1]], "lr": BASES[1]}], lr=BASES[0])
        tsched = make(tl, topt)[k]()
        want = []
        for _ in range(STEPS):
            want.append([g["lr"] for g in topt.param_groups])
            topt.step()
            tsched.step()
        opt = _opt()
        got = _sequence(opt, make(None, opt)[k]())
        np.testing.assert_allclose(got, np.array(want), rtol=1e-9, atol=1e-15)


# ----------------------------------------------------------------------------- state
@pytest.mark.parametrize("kind", ["step", "cosine", "sequential", "lambda"])
def test_state_dict_resumes_the_same_rates(kind):
    # Check that a scheduler rebuilt on a fresh optimizer and loaded from a state dict (via
    # JSON, as in a checkpoint) continues with exactly the rates of an uninterrupted run.
    def build(opt):
        if kind == "step":
            return StepLR(opt, 9, 0.3)
        if kind == "cosine":
            return CosineAnnealingLR(opt, 70, 0.002)
        if kind == "lambda":
            return LambdaLR(opt, lambda e: 1.0 / (1.0 + 0.1 * e))
        return SequentialLR(opt, [LinearLR(opt, 0.2, 1.0, 15), CosineAnnealingLR(opt, 85)], [15])
    opt = _opt()
    whole = _sequence(opt, build(opt))
    opt1 = _opt()
    first = build(opt1)
    _sequence(opt1, first, 37)
    state = json.loads(json.dumps(first.state_dict()))
    opt2 = _opt()
    second = build(opt2)
    second.load_state_dict(state)
    assert [g["lr"] for g in opt2.param_groups] == whole[37].tolist()
    np.testing.assert_array_equal(_sequence(opt2, second, STEPS - 37), whole[37:])


def test_load_state_dict_rejects_other_hyperparameters_and_changes_nothing():
    # Check that a state saved with another T_max is a ValueError naming the options, and that
    # the scheduler and the optimizer's rates stay as they were.
    opt = _opt()
    a = CosineAnnealingLR(opt, 50)
    a.step()
    other = CosineAnnealingLR(_opt(), 40)
    before = (other.last_epoch, other.get_last_lr(), [g["lr"] for g in other.optimizer.param_groups])
    with pytest.raises(ValueError, match="options"):
        other.load_state_dict(a.state_dict())
    assert (other.last_epoch, other.get_last_lr(),
            [g["lr"] for g in other.optimizer.param_groups]) == before


def test_load_state_dict_rejects_another_type_and_group_count():
    # Check the type and the number of parameter groups are checked.
    with pytest.raises(ValueError, match="StepLR"):
        CosineAnnealingLR(_opt(), 50).load_state_dict(StepLR(_opt(), 3).state_dict())
    one = SGD(Linear(2, 2, rng=0).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="one per parameter group"):
        StepLR(one, 3).load_state_dict(StepLR(_opt(), 3).state_dict())


def test_resume_through_a_checkpoint_equals_an_uninterrupted_run(tmp_path):
    # Check the whole chain: fit 10 steps with AdamW and a warmup+cosine schedule stepped per
    # step, save model, optimizer and scheduler, load all three into fresh objects (another
    # init seed), fit 10 more steps: the parameters equal those of 20 uninterrupted steps.
    rng = np.random.default_rng(3)
    X = rng.standard_normal((16, 3))
    Y = X @ rng.standard_normal((3, 2))

    def build(seed):
        m = Linear(3, 2, dtype=np.float64, rng=seed)
        opt = AdamW(m.parameters(), lr=0.05)
        sched = SequentialLR(opt, [LinearLR(opt, 0.1, 1.0, 5), CosineAnnealingLR(opt, 15)], [5])
        return m, opt, sched

    def train(m, opt, sched, epochs):
        fit(m, MSELoss(), opt, X, Y, epochs=epochs, scheduler=sched, scheduler_interval="step",
            progress=False)

    with kernels.num_threads(1):
        m, opt, sched = build(0)
        train(m, opt, sched, 20)
        a, o1, s1 = build(0)
        train(a, o1, s1, 10)
        save(tmp_path / "ckpt.npz", a, o1, scheduler=s1, epoch=10)
        b, o2, s2 = build(1)
        assert load(tmp_path / "ckpt.npz", b, o2, s2)["epoch"] == 10
        assert s2.last_epoch == 10 and o2.steps == 10
        train(b, o2, s2, 10)
    for (name, p), (_, q) in zip(m.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(q.data, p.data, err_msg=name)
    assert s2.get_last_lr() == sched.get_last_lr()


def test_checkpoint_without_scheduler_state_is_a_clear_error(tmp_path):
    # Check that loading a scheduler from a checkpoint saved without one raises
    # CheckpointError and leaves the model unchanged.
    from engine import CheckpointError
    m = Linear(3, 2, rng=0)
    opt = SGD(m.parameters(), lr=0.1)
    save(tmp_path / "c.npz", m, opt)
    fresh = Linear(3, 2, rng=1)
    before = fresh.state_dict()
    with pytest.raises(CheckpointError, match="no scheduler state"):
        load(tmp_path / "c.npz", fresh, SGD(fresh.parameters(), lr=0.1),
             StepLR(SGD(fresh.parameters(), lr=0.1), 2))
    for k, v in fresh.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


# ----------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("make, exc, match", [
    (lambda o: StepLR(o, 0), ValueError, "step_size"),
    (lambda o: StepLR(o, 2.5), TypeError, "step_size"),
    (lambda o: LinearLR(o, start_factor=0.0), ValueError, "start_factor"),
    (lambda o: LinearLR(o, end_factor=1.5), ValueError, "end_factor"),
    (lambda o: CosineAnnealingLR(o, 0), ValueError, "T_max"),
    (lambda o: CosineAnnealingLR(o, 10, eta_min=-1.0), ValueError, "eta_min"),
    (lambda o: LambdaLR(o, 3.0), TypeError, "lr_lambda"),
    (lambda o: LambdaLR(o, [lambda e: 1.0]), ValueError, "one per parameter group"),
    (lambda o: SequentialLR(o, [StepLR(o, 2), StepLR(o, 3)], [5, 6]), ValueError, "milestones"),
    (lambda o: SequentialLR(o, [StepLR(o, 2), StepLR(_opt(), 3)], [5]), ValueError,
     r"schedulers\[1\]"),
    (lambda o: StepLR(object(), 2), TypeError, "param_groups"),
])
def test_bad_arguments_name_the_argument(make, exc, match):
    # Check that each bad argument raises the right error naming it.
    with pytest.raises(exc, match=match):
        make(_opt())


def test_a_rejected_lambda_changes_no_rate():
    # Check that an lr_lambda returning a bad factor raises ValueError and leaves the rates.
    opt = _opt()
    s = LambdaLR(opt, lambda e: 1.0 if e < 3 else float("nan"))
    s.step()
    s.step()
    with pytest.raises(ValueError, match="lr_lambda"):
        s.step()
    assert s.last_epoch == 2 and [g["lr"] for g in opt.param_groups] == list(BASES)
