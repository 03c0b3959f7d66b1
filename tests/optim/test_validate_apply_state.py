"""The two-phase state load of optimizers and schedulers that checkpoint.load uses:
``validate_state_dict`` checks everything and changes nothing, ``apply_state`` installs what
it returned; together they are ``load_state_dict``."""
import numpy as np
import pytest

from engine import AdamW, Linear, SGD
from engine.optim.lr_scheduler import LinearLR, SequentialLR, StepLR


@pytest.mark.parametrize("make", [lambda p: AdamW(p, lr=0.5), lambda p: SGD(p, lr=0.5,
                                                                              momentum=0.9)])
def test_optimizer_validate_changes_nothing_and_apply_installs(make):
    # Check validate_state_dict leaves the optimizer as it was, and apply_state of its result
    # gives the same state as load_state_dict.
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    src = make(lin.parameters())
    for p in lin.parameters():
        p.grad[...] = 0.5
    src.step()
    fresh = make(lin.parameters())
    before = fresh.state_dict()
    token = fresh.validate_state_dict(src.state_dict())
    after = fresh.state_dict()
    assert before["steps"] == after["steps"] == 0
    fresh.apply_state(token)
    assert fresh.state_dict()["steps"] == src.state_dict()["steps"] == 1
    with pytest.raises((TypeError, ValueError, KeyError)):
        fresh.validate_state_dict({"type": "nonsense"})


def test_scheduler_validate_changes_nothing_and_apply_installs():
    # Check the same two phases on a SequentialLR (whose children are validated first).
    def build():
        opt = SGD(Linear(2, 1).parameters(), lr=1.0)
        return opt, SequentialLR(opt, [LinearLR(opt, 0.5, 1.0, 2), StepLR(opt, 1, 0.5)], [2])
    opt, sched = build()
    for _ in range(3):
        sched.step()
    opt2, sched2 = build()
    lr_before = opt2.param_groups[0]["lr"]
    token = sched2.validate_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == lr_before and sched2.last_epoch == 0
    sched2.apply_state(token)
    assert sched2.last_epoch == sched.last_epoch == 3
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
