"""fit's plan: options are keyword-only after epochs, checked once into a frozen FitPlan; one
process trains through SingleProcess, whose collective steps are the identity."""
import dataclasses
import inspect

import numpy as np
import pytest

from engine import SGD, Linear, MSELoss, fit
from engine.training.parallel import SingleProcess
from engine.training.plan import FitPlan, plan_fit


def _problem():
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    X = np.random.default_rng(1).standard_normal((10, 3))
    return lin, X, X @ np.ones((3, 2))


def test_epochs_and_every_option_are_keyword_only():
    # Check fit's signature: (model, loss, optimizer, X, Y, *, epochs, ...), and that epochs
    # (or anything else) given positionally is refused before anything changes. epochs
    # defaults to None only so that an iteration-based run (sampler=, steps=) can leave it
    # out: with (X, Y) a missing epochs is still a TypeError naming it (below).
    params = list(inspect.signature(fit).parameters.values())
    assert [p.name for p in params[:5]] == ["model", "loss", "optimizer", "X", "Y"]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[5:])
    assert params[5].name == "epochs" and params[5].default is None
    lin, X, Y = _problem()
    before = lin.state_dict()
    with pytest.raises(TypeError):
        fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y, 1)
    with pytest.raises(TypeError):
        fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y, 1, 5)
    with pytest.raises(TypeError, match="epochs"):
        fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y)
    with pytest.raises(TypeError, match="batchsize"):
        fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y, epochs=1, batchsize=5)
    assert all(np.array_equal(before[k], v) for k, v in lin.state_dict().items())


def test_plan_is_frozen_and_holds_the_checked_options():
    # Check plan_fit resolves the options (batch_size capped at N, a Generator from the seed,
    # classify from the loss) and the plan cannot be changed afterwards.
    lin, X, Y = _problem()
    plan = plan_fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.1), X, Y, epochs=2,
                    batch_size=100, rng=3, progress=False)
    assert isinstance(plan, FitPlan)
    assert (plan.epochs, plan.batch_size, plan.classify, plan.val_batch_size) == (2, 10, False,
                                                                                  None)
    assert plan.rng.integers(1 << 30) == np.random.default_rng(3).integers(1 << 30)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.epochs = 3


def test_single_process_collectives_are_the_identity():
    # Check the one-process data-parallel object returns its inputs and clips like
    # engine.clip_grad_norm on the model's parameters.
    lin, X, Y = _problem()
    dp = SingleProcess().start(lin, None, X, Y, None)
    assert (dp.rank, dp.size) == (0, 1)
    assert dp.share(3, 7) == (3, 7) and dp.batch_loss(1.5, 4) == (1.5, 4)
    assert dp.allsum(2, 5) == (2, 5)
    for p in lin.parameters():
        p.grad[...] = 3.0
    norm = dp.clip_grad_norm(1.0)
    assert norm == pytest.approx(3.0 * np.sqrt(3 * 2 + 2))
    total = np.sqrt(sum(float((p.grad ** 2).sum()) for p in lin.parameters()))
    assert total == pytest.approx(1.0, rel=1e-6)
