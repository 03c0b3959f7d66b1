"""WarmupCosineLR: nanoGPT's get_lr as a scheduler."""
import math

import numpy as np
import pytest

from engine.nn.layers import Linear
from engine.optim.lr_scheduler import WarmupCosineLR
from engine.optim.optimizers import AdamW


def get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    # nanoGPT's train.py, written out here as the reference.
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def _opt(lr=1e-3):
    return AdamW(Linear(2, 2, rng=0).parameters(), lr=lr)


@pytest.mark.parametrize("warmup,decay,min_lr", [(100, 2000, 1e-4), (0, 10, 0.0), (3, 4, 5e-4)])
def test_rates_are_nanogpts_get_lr(warmup, decay, min_lr):
    # Check the rate before each optimizer step `it` (construction sets it = 0) equals
    # get_lr(it) through the warmup, the cosine and past lr_decay_iters.
    opt = _opt()
    s = WarmupCosineLR(opt, warmup, decay, min_lr)
    for it in range(decay + 20):
        np.testing.assert_allclose(opt.param_groups[0]["lr"],
                                   get_lr(it, 1e-3, warmup, decay, min_lr), rtol=1e-12)
        s.step()


def test_state_dict_round_trip_continues_the_rates():
    opt = _opt()
    s = WarmupCosineLR(opt, 5, 50, 1e-4)
    for _ in range(17):
        s.step()
    opt2 = _opt()
    t = WarmupCosineLR(opt2, 5, 50, 1e-4)
    t.load_state_dict(s.state_dict())
    s.step()
    t.step()
    assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]


@pytest.mark.parametrize("args,msg", [((10, 10, 0.0), "lr_decay_iters"),
                                      ((0, 10, 2e-3), "min_lr"),
                                      ((-1, 10, 0.0), "warmup_iters")])
def test_bad_schedules_are_refused(args, msg):
    # Check a cosine of no length, a min_lr above the rate and a negative warmup are refused,
    # and the optimizer's rate is left as it was.
    opt = _opt()
    with pytest.raises(ValueError, match=msg):
        WarmupCosineLR(opt, *args)
    assert opt.param_groups[0]["lr"] == 1e-3
