"""Learning-rate schedules with PyTorch's names and semantics (``torch.optim.lr_scheduler``):
``LambdaLR``, ``StepLR``, ``LinearLR``, ``CosineAnnealingLR`` and ``SequentialLR``; and
nanoGPT's schedule as one scheduler, ``WarmupCosineLR`` (its ``get_lr``).

A scheduler acts on every parameter group of an optimizer (anything with ``param_groups``, a
list of dicts with an ``"lr"``). Construction applies the epoch-0 rate; each ``step()``
advances one epoch (or one optimizer step: the caller decides what a step is) and writes the
new rate into the groups. The rates are PyTorch's closed forms of ``last_epoch`` and each
group's initial rate, so a run resumed from ``state_dict()`` continues with the same rates.
"""
from __future__ import annotations

import bisect
import math
import numbers
import weakref

from .._checks import check_int, check_real

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "LinearLR", "CosineAnnealingLR", "SequentialLR",
           "WarmupCosineLR", "check_warmup"]

# Each optimizer's initial rates, recorded by the first scheduler built on it (PyTorch keeps
# them as group["initial_lr"]; blasnet's optimizers accept only their own options in a group).
# SequentialLR's children are built one after another on one optimizer: the later ones must
# start from the rates the optimizer had before the first one changed them, as in PyTorch.
_INITIAL_LRS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _int(where: str, v, low: int) -> int:
    return check_int(where, v, low)


def check_warmup(warmup, total_steps, what: str = "warmup") -> int:
    """``warmup`` if the run of ``total_steps`` optimizer steps has at least one step after a
    linear warmup of that many steps (a warmup of 0, or a run of no step, always fits), else
    ValueError naming
    ``what``: the one rule for every schedule, so no run trains at a fraction of its rate
    for lack of steps and no warmup is silently shortened."""
    w = _int(what, warmup, 0)
    total = _int("total_steps", total_steps, 0)
    if 0 < total <= w:
        raise ValueError(f"{what} {w}: the run has {total} optimizer step(s); the warmup must "
                         f"leave at least one at the full learning rate (use at most "
                         f"{max(total - 1, 0)})")
    return w


def _real(where: str, v, low: float, high: float | None = None, low_open: bool = False) -> float:
    return check_real(where, v, low, math.inf if high is None else high, low_open)


def _groups(optimizer) -> list:
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not groups or not all(
            isinstance(g, dict) and "lr" in g for g in groups):
        raise TypeError(f"optimizer: expected an optimizer with param_groups (a list of dicts "
                        f"with an 'lr'), got {type(optimizer).__name__}")
    return groups


class LRScheduler:
    """Base class: ``base_lrs`` (each group's initial rate), ``last_epoch`` (steps taken;
    0 after construction), ``step()``, ``get_last_lr()``, ``state_dict()`` and
    ``load_state_dict()``. Subclasses define ``_lr(base_lr, epoch)`` (the closed form) and
    ``_options()`` (their hyperparameters, saved and checked by the state dict)."""

    def __init__(self, optimizer):
        groups = _groups(optimizer)
        self.optimizer = optimizer
        initial = _INITIAL_LRS.get(optimizer)
        if initial is None or len(initial) != len(groups):
            initial = [_real(f"optimizer.param_groups[{i}]['lr']", g["lr"], 0.0)
                       for i, g in enumerate(groups)]
        self.base_lrs = list(initial)
        self.last_epoch = -1
        self._last_lr = list(self.base_lrs)
        self.step()
        _INITIAL_LRS.setdefault(optimizer, initial)  # once the first step succeeded

    # -- the schedule -----------------------------------------------------------------------
    def _lr(self, base_lr: float, epoch: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _options(self) -> dict:
        return {}

    def _lrs(self, epoch: int) -> list:
        return [self._lr(b, epoch) for b in self.base_lrs]

    def _set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` and write its rates into the optimizer's groups."""
        lrs = self._lrs(epoch)  # first: a failing lr_lambda changes nothing
        self.last_epoch = epoch
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = lrs

    def step(self) -> None:
        """Advance one step and set every group's learning rate for the next one."""
        self._set_epoch(self.last_epoch + 1)

    def get_last_lr(self) -> list:
        """The learning rate of each parameter group, as last set by this scheduler."""
        return list(self._last_lr)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """A JSON-serialisable dict: the type, ``last_epoch``, ``base_lrs``, the last rates and
        the hyperparameters (a ``LambdaLR``'s functions are not saved: pass the same ones)."""
        return {"type": type(self).__name__, "last_epoch": self.last_epoch,
                "base_lrs": list(self.base_lrs), "last_lr": list(self._last_lr),
                "options": self._options()}

    def load_state_dict(self, state_dict) -> None:
        """Restore ``last_epoch`` and the rates from ``state_dict`` and write the last rates into
        the optimizer's groups (so they agree even if the optimizer's own state is not
        loaded). Strict: the type, the number of groups and the hyperparameters must match;
        if any check fails nothing is changed."""
        self.apply_state(self.validate_state_dict(state_dict))

    def validate_state_dict(self, sd, where: str = ""):
        """Validate ``sd``; return what ``apply_state`` installs (nothing is changed here)."""
        name = where or f"{type(self).__name__}.load_state_dict"
        if not isinstance(sd, dict):
            raise TypeError(f"{name}: expected a dict, got {type(sd).__name__}")
        missing = [k for k in ("type", "last_epoch", "base_lrs", "last_lr", "options") if k not in sd]
        if missing:
            raise KeyError(f"{name}: missing keys {missing}")
        if sd["type"] != type(self).__name__:
            raise ValueError(f"{name}: the state is of a {sd['type']}, this is a "
                             f"{type(self).__name__}")
        epoch = _int(f"{name}: last_epoch", sd["last_epoch"], 0)
        n = len(self.base_lrs)
        lists = []
        for key in ("base_lrs", "last_lr"):
            v = sd[key]
            if not isinstance(v, (list, tuple)) or len(v) != n:
                got = len(v) if isinstance(v, (list, tuple)) else type(v).__name__
                raise ValueError(f"{name}: {key}: expected {n} value(s), one per parameter "
                                 f"group, got {got}")
            lists.append([_real(f"{name}: {key}[{i}]", x, 0.0) for i, x in enumerate(v)])
        own = self._options()
        if sd["options"] != own:
            raise ValueError(f"{name}: options: the state was saved with {sd['options']}, this "
                             f"scheduler has {own}")
        return epoch, lists[0], lists[1]

    def apply_state(self, checked) -> None:
        epoch, base_lrs, last_lr = checked
        self.last_epoch, self.base_lrs, self._last_lr = epoch, base_lrs, last_lr
        for g, lr in zip(self.optimizer.param_groups, last_lr):
            g["lr"] = lr

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self._options().items())
        return f"{type(self).__name__}({opts}{', ' if opts else ''}last_epoch={self.last_epoch})"


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``; ``lr_lambda`` is one function, or a list with one
    per parameter group."""

    def __init__(self, optimizer, lr_lambda):
        n = len(_groups(optimizer))
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"lr_lambda: expected {n} functions (one per parameter group), "
                                 f"got {len(lr_lambda)}")
            fns = list(lr_lambda)
        else:
            fns = [lr_lambda] * n
        for i, f in enumerate(fns):
            if not callable(f):
                raise TypeError(f"lr_lambda: expected a function of the epoch, got "
                                f"{type(f).__name__}" + (f" at [{i}]" if n > 1 else ""))
        self.lr_lambdas = fns
        super().__init__(optimizer)

    def _lrs(self, epoch: int) -> list:
        lrs = []
        for base, fn in zip(self.base_lrs, self.lr_lambdas):
            factor = fn(epoch)
            if (isinstance(factor, bool) or not isinstance(factor, numbers.Real)
                    or not math.isfinite(factor) or factor < 0):
                raise ValueError(f"lr_lambda({epoch}): expected a finite factor >= 0, got {factor!r}")
            lrs.append(base * float(factor))
        return lrs


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (epoch // step_size)``: decays by ``gamma`` every
    ``step_size`` steps."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1):
        self.step_size = _int("step_size", step_size, 1)
        self.gamma = _real("gamma", gamma, 0.0)
        super().__init__(optimizer)

    def _lr(self, base_lr, epoch):
        return base_lr * self.gamma ** (epoch // self.step_size)

    def _options(self):
        return {"step_size": self.step_size, "gamma": self.gamma}


class LinearLR(LRScheduler):
    """``lr = base_lr * (start_factor + (end_factor - start_factor) * min(epoch, total_iters)
    / total_iters)``: a linear ramp over ``total_iters`` steps, then constant (a warmup with
    the defaults)."""

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        # PyTorch's ranges: a start factor of 0 would make the first rate 0.
        self.start_factor = _real("start_factor", start_factor, 0.0, 1.0, low_open=True)
        self.end_factor = _real("end_factor", end_factor, 0.0, 1.0)
        self.total_iters = _int("total_iters", total_iters, 1)
        super().__init__(optimizer)

    def _lr(self, base_lr, epoch):
        s, e, t = self.start_factor, self.end_factor, self.total_iters
        return base_lr * (s + (e - s) * min(epoch, t) / t)

    def _options(self):
        return {"start_factor": self.start_factor, "end_factor": self.end_factor,
                "total_iters": self.total_iters}


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2`` (Loshchilov &
    Hutter 2017, SGDR without restarts): from ``base_lr`` down to ``eta_min`` at ``T_max``
    (and back up beyond it, as PyTorch's closed form)."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0):
        self.T_max = _int("T_max", T_max, 1)
        self.eta_min = _real("eta_min", eta_min, 0.0)
        super().__init__(optimizer)

    def _lr(self, base_lr, epoch):
        return self.eta_min + (base_lr - self.eta_min) * (1.0 + math.cos(math.pi * epoch / self.T_max)) / 2.0

    def _options(self):
        return {"T_max": self.T_max, "eta_min": self.eta_min}


class WarmupCosineLR(LRScheduler):
    """nanoGPT's ``get_lr`` (Karpathy, train.py): ``base_lr * (it + 1) / (warmup_iters + 1)``
    for the first ``warmup_iters`` steps, then a cosine from ``base_lr`` at ``warmup_iters``
    down to ``min_lr`` at ``lr_decay_iters``, then ``min_lr``. ``min_lr`` is a rate (not a
    factor), at most every group's ``base_lr``."""

    def __init__(self, optimizer, warmup_iters: int, lr_decay_iters: int, min_lr: float = 0.0):
        self.warmup_iters = _int("warmup_iters", warmup_iters, 0)
        self.lr_decay_iters = _int("lr_decay_iters", lr_decay_iters, 1)
        if self.lr_decay_iters <= self.warmup_iters:
            raise ValueError(f"lr_decay_iters: expected more than warmup_iters = "
                             f"{self.warmup_iters} (the cosine runs between them), got "
                             f"{self.lr_decay_iters}")
        self.min_lr = _real("min_lr", min_lr, 0.0)
        for i, g in enumerate(_groups(optimizer)):
            if self.min_lr > g["lr"]:
                raise ValueError(f"min_lr: expected at most the learning rate "
                                 f"{g['lr']} (param_groups[{i}]), got {self.min_lr}")
        super().__init__(optimizer)

    def _lr(self, base_lr, epoch):
        w, d, low = self.warmup_iters, self.lr_decay_iters, self.min_lr
        if epoch < w:
            return base_lr * (epoch + 1) / (w + 1)
        if epoch > d:
            return low
        coeff = 0.5 * (1.0 + math.cos(math.pi * (epoch - w) / (d - w)))
        return low + coeff * (base_lr - low)

    def _options(self):
        return {"warmup_iters": self.warmup_iters, "lr_decay_iters": self.lr_decay_iters,
                "min_lr": self.min_lr}


class SequentialLR(LRScheduler):
    """Runs ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` from its epoch 0,
    and so on (e.g. ``LinearLR`` warmup, then ``CosineAnnealingLR``). All the schedulers
    must drive the same optimizer; ``milestones`` are strictly increasing step counts."""

    def __init__(self, optimizer, schedulers, milestones):
        groups = _groups(optimizer)
        if not isinstance(schedulers, (list, tuple)) or not schedulers:
            raise ValueError(f"schedulers: expected a non-empty list of schedulers, got {schedulers!r}")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler) or isinstance(s, SequentialLR):
                raise TypeError(f"schedulers[{i}]: expected a scheduler of "
                                f"engine.optim.lr_scheduler (not a SequentialLR), got {type(s).__name__}")
            if s.optimizer is not optimizer:
                raise ValueError(f"schedulers[{i}]: drives another optimizer than the one given")
        if not isinstance(milestones, (list, tuple)) or len(milestones) != len(schedulers) - 1:
            raise ValueError(f"milestones: expected {len(schedulers) - 1} step count(s) (one "
                             f"fewer than the schedulers), got {milestones!r}")
        ms = [_int(f"milestones[{i}]", m, 1) for i, m in enumerate(milestones)]
        if any(b <= a for a, b in zip(ms, ms[1:])):
            raise ValueError(f"milestones: expected strictly increasing step counts, got {ms}")
        self._schedulers = list(schedulers)
        self._milestones = ms
        # As PyTorch: start from the optimizer's initial rates and the first child's epoch 0.
        self.optimizer = optimizer
        self.base_lrs = list(self._schedulers[0].base_lrs)
        for g, lr in zip(groups, self.base_lrs):
            g["lr"] = lr
        self.last_epoch = 0
        self._schedulers[0]._set_epoch(0)
        self._last_lr = self._schedulers[0].get_last_lr()

    def _set_epoch(self, epoch: int) -> None:
        self.last_epoch = epoch
        idx = bisect.bisect_right(self._milestones, epoch)
        child = self._schedulers[idx]
        start = self._milestones[idx - 1] if idx > 0 else 0
        child._set_epoch(epoch - start)
        self._last_lr = child.get_last_lr()

    def _options(self):
        return {"milestones": list(self._milestones),
                "schedulers": [type(s).__name__ for s in self._schedulers]}

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["children"] = [s.state_dict() for s in self._schedulers]
        return sd

    def validate_state_dict(self, sd, where: str = ""):
        name = where or "SequentialLR.load_state_dict"
        own = super().validate_state_dict(sd, where)
        children = sd.get("children")
        if not isinstance(children, (list, tuple)) or len(children) != len(self._schedulers):
            raise ValueError(f"{name}: children: expected {len(self._schedulers)} scheduler "
                             f"states, got {children!r:.60}")
        kids = [s.validate_state_dict(c, f"{name}: children[{i}]")
                for i, (s, c) in enumerate(zip(self._schedulers, children))]
        return own, kids

    def apply_state(self, checked) -> None:
        own, kids = checked
        for s, k in zip(self._schedulers, kids):
            s.apply_state(k)
        super().apply_state(own)  # last: the groups get the sequence's current rates
