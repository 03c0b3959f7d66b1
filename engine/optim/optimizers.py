"""Optimizers: ``AdamW`` (Loshchilov & Hutter 2019) and ``SGD`` with PyTorch's semantics and
defaults, and ``clip_grad_norm``.

Each class is bookkeeping over a functional kernel (``kernels.optim``), as PyTorch's
``optim.AdamW.step`` is over its functional ``adamw``: the class holds parameter groups,
moment buffers and the step count; the kernels update in place. Parameters live in flat
arenas (``engine.nn.module``) and the optimizer's buffers are flat too, laid out like them, so
a step is one kernel call over a few long runs of memory (one run for a whole model in one
parameter group), at most one parallel region.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from kernels import ops
from kernels import optim as _kopt
from kernels.memory import aligned_empty

from .._checks import check_array_like, check_bool, check_int, check_real
from ..nn.arena import LAYOUT_VERSION
from ..nn.module import Module, Parameter, runs, shaped_like
from .interrupt import defer_keyboard_interrupt

__all__ = ["Optimizer", "AdamW", "SGD", "clip_grad_norm", "defer_keyboard_interrupt",
           "check_optimizer_of"]

_adamw_consts = _kopt.adamw_consts


# ----------------------------------------------------------------------------- validation
def _number(where: str, value, low: float = 0.0, high: float | None = None,
            high_open: bool = False, low_open: bool = False) -> float:
    """``value`` as a finite float in [low, high] (open ends with ``low_open``/``high_open``)."""
    return check_real(where, value, low, math.inf if high is None else high, low_open, high_open)


def _collect_params(where: str, params) -> list:
    if isinstance(params, (Parameter, np.ndarray, dict)):
        raise TypeError(f"{where}: expected an iterable of Parameters, got a single "
                        f"{type(params).__name__} (wrap it in a list)")
    if isinstance(params, Module):
        raise TypeError(f"{where}: expected an iterable of Parameters, got a "
                        f"{type(params).__name__} module (pass model.parameters())")
    try:
        plist = list(params)
    except TypeError:
        raise TypeError(f"{where}: expected an iterable of Parameters, got "
                        f"{type(params).__name__}") from None
    for i, p in enumerate(plist):
        if not isinstance(p, Parameter):
            raise TypeError(f"{where}[{i}]: expected a Parameter, got {type(p).__name__}")
    return plist


# ----------------------------------------------------------------------------- base class
class Optimizer:
    """Parameter groups, per-parameter state and the step count; subclasses define
    ``defaults``, ``_check_options`` and ``step``.

    ``param_groups`` is a list of dicts ``{"params": [Parameter, ...], <option>: value}`` as in
    PyTorch; options may be changed between steps (e.g. a learning-rate schedule writes
    ``group["lr"]``). ``state[i]`` is the dict of buffers of the i-th parameter, counting
    through the groups in order. ``steps`` counts the calls of ``step()``.

    Shared with subclasses, in any file: ``_all_params`` (every parameter, group order) and
    ``_check_groups`` (the options' checks before a step).
    """

    _state_keys: tuple = ()      # buffers every parameter has (allocated at construction)
    _optional_keys: tuple = ()   # buffers created on first use
    _float_options: dict = {}    # option -> (lowest value, exclusive?): plain float checks

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        items = _collect_params("params", params) if not _is_group_list(params) else None
        groups = [{"params": items}] if items is not None else list(params)
        if not groups:
            raise ValueError("params: got an empty list of parameter groups")
        self.param_groups = []
        seen: set = set()
        for gi, g in enumerate(groups):
            where = f"params[{gi}]"
            if not isinstance(g, dict):
                raise TypeError(f"{where}: expected a parameter group dict, got {type(g).__name__}")
            if "params" not in g:
                raise ValueError(f"{where}: a parameter group needs a 'params' entry")
            unknown = sorted(set(g) - {"params"} - set(self.defaults))
            if unknown:
                raise ValueError(f"{where}: unknown option(s) {unknown}; {type(self).__name__} "
                                 f"takes {sorted(self.defaults)}")
            plist = _collect_params(f"{where}['params']", g["params"])
            for p in plist:
                if id(p) in seen:
                    raise ValueError(f"{where}: parameter {p.name or p!r} appears more than once "
                                     f"in the optimizer's parameter groups")
                seen.add(id(p))
            group = {"params": plist}
            for k, default in self.defaults.items():
                group[k] = g.get(k, default)
            self._check_options(group, f"param group {gi}" if len(groups) > 1 else "")
            self.param_groups.append(group)
        if not seen:
            raise ValueError("params: the optimizer got an empty parameter list")
        params = self._all_params()
        # Per state key and dtype, one flat zeroed buffer laid out like the parameters in
        # the optimizer's order; state[i][key] are views of it (allocated on first use).
        self._offsets = []      # element offset of each parameter in its dtype's buffers
        self._totals: dict = {}
        for p in params:
            self._offsets.append(self._totals.get(p.dtype, 0))
            self._totals[p.dtype] = self._offsets[-1] + p.size
        self._flat: dict = {}   # key -> {dtype: (total,) buffer}
        self.state = [{} for _ in params]
        for k in self._state_keys:
            self._buffer(k)
        self._plan = None       # cached runs, rebuilt when parameters move (LAYOUT_VERSION)
        self._plan_gen = -1
        # Per group, the option values last checked: step() checks again only what changed.
        self._checked = [tuple(g[k] for k in self.defaults) for g in self.param_groups]
        self.steps = 0

    # -- subclass hooks -------------------------------------------------------------------
    def _check_options(self, group: dict, where: str) -> None:
        """Validate (and normalise to Python floats) the options of ``group`` in place."""
        raise NotImplementedError

    def _buffer(self, key: str) -> dict:
        """The flat buffers of state ``key`` (zeros, created on first use) and each
        parameter's view of them in ``state[i][key]``, shaped and ordered like the parameter."""
        bufs = self._flat.get(key)
        if bufs is None:
            bufs = self._flat[key] = {}
            for dt, total in self._totals.items():
                bufs[dt] = aligned_empty(total, dt)
                bufs[dt].fill(0.0)
            if key in self._state_keys:  # optional buffers join state[i] when first used
                for i, st in enumerate(self.state):
                    st[key] = self._flat_view_of(key, i)
        return bufs

    def _runs(self) -> list:
        """Per group: ``(first, stop, data, grad, state_offset, dtype)`` for each maximal run
        of its parameters that lies back to back in one arena (cached until parameters move)."""
        if self._plan_gen != LAYOUT_VERSION[0]:
            plan, i = [], 0
            for g in self.param_groups:
                plist = g["params"]
                group = []
                for a, lo, hi, first, stop in runs(plist):
                    group.append((i + first, i + stop, a.data[lo:hi], a.grad[lo:hi],
                                  self._offsets[i + first], a.dtype))
                plan.append(group)
                i += len(plist)
            self._plan, self._plan_gen = plan, LAYOUT_VERSION[0]
        return self._plan

    def step(self) -> None:
        raise NotImplementedError

    def _check_groups(self) -> None:
        """Check the options of every group that changed since they were last checked (a
        schedule or the caller may write ``group["lr"]`` between steps): a NaN or a string
        raises here, naming the option, before anything is updated."""
        keys, multi = tuple(self.defaults), len(self.param_groups) > 1
        floats = self._float_options
        for gi, g in enumerate(self.param_groups):
            last = self._checked[gi]
            if all(g.get(k, _checked_missing) is v for k, v in zip(keys, last)):
                continue
            # A schedule writes a new float lr every step: a float in range needs no more.
            if all(new is v or (type(new) is float and k in floats and new < math.inf
                                and (new > floats[k][0] if floats[k][1] else new >= floats[k][0]))
                   for k, v, new in ((k, v, g.get(k, _checked_missing))
                                     for k, v in zip(keys, last))):
                self._checked[gi] = tuple(g[k] for k in keys)
                continue
            where = f"param group {gi}" if multi else ""
            missing = [k for k in keys if k not in g]
            if missing:
                raise ValueError(f"{_prefix(where)}options {missing} missing from the group")
            self._check_options(g, where)
            self._checked[gi] = tuple(g[k] for k in keys)

    # -- common API -----------------------------------------------------------------------
    def _all_params(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self) -> None:
        """Set the gradient of every parameter of the optimizer to zero."""
        for g in self.param_groups:
            for p in g["params"]:
                p.grad.fill(0.0)

    def _flat_view_of(self, key: str, idx: int):
        p, off = self._all_params()[idx], self._offsets[idx]
        flat = self._flat[key][p.dtype][off:off + p.size]
        return shaped_like(flat, p)

    def state_dict(self) -> dict:
        """``{"type", "steps", "param_groups", "state"}`` as in PyTorch: groups hold their
        options and the indices of their parameters; ``state[i]`` maps buffer names to copies."""
        groups, i = [], 0
        for g in self.param_groups:
            entry = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
            entry["params"] = list(range(i, i + len(g["params"])))
            i += len(g["params"])
            groups.append(entry)
        state = {i: {k: np.array(v, copy=True) for k, v in st.items()}
                 for i, st in enumerate(self.state) if st}
        return {"type": type(self).__name__, "steps": self.steps, "param_groups": groups,
                "state": state}

    def load_state_dict(self, state_dict) -> None:
        """Restore options, buffers and step count from ``state_dict``. Strict: the optimizer
        type, the group structure, every buffer's name, shape and dtype must match, and the
        options must be valid; if any check fails nothing is changed."""
        self.apply_state(self.validate_state_dict(state_dict))

    def validate_state_dict(self, sd):
        """Validate ``sd`` against this optimizer; return what ``apply_state`` needs."""
        name = type(self).__name__
        if not isinstance(sd, dict):
            raise TypeError(f"state_dict: expected a dict, got {type(sd).__name__}")
        missing = [k for k in ("type", "steps", "param_groups", "state") if k not in sd]
        if missing:
            raise KeyError(f"{name}.load_state_dict: missing keys {missing}")
        if sd["type"] != name:
            raise ValueError(f"{name}.load_state_dict: the state is of a {sd['type']} optimizer")
        steps = sd["steps"]
        check_int(f"{name}.load_state_dict: steps", steps, 0)
        groups = sd["param_groups"]
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.param_groups):
            got = len(groups) if isinstance(groups, (list, tuple)) else type(groups).__name__
            raise ValueError(f"{name}.load_state_dict: expected {len(self.param_groups)} parameter "
                             f"group(s), got {got}")
        new_options = self._checked_groups(name, groups)
        state = sd["state"]
        if not isinstance(state, dict):
            raise TypeError(f"{name}.load_state_dict: state: expected a dict, got {type(state).__name__}")
        params = self._all_params()
        bad = sorted(str(k) for k in state if not (isinstance(k, numbers.Integral)
                                                  and 0 <= k < len(params)))
        if bad:
            raise KeyError(f"{name}.load_state_dict: state: unexpected parameter indices {bad} "
                           f"(the optimizer has {len(params)} parameters)")
        new_state = [self._checked_buffers(name, idx, p, state.get(idx, {}))
                     for idx, p in enumerate(params)]
        return int(steps), new_options, new_state

    def _checked_groups(self, name: str, groups) -> list:
        """Each saved group's options, checked against this optimizer's groups."""
        new_options, i = [], 0
        for gi, (own, g) in enumerate(zip(self.param_groups, groups)):
            if not isinstance(g, dict):
                raise TypeError(f"{name}.load_state_dict: param_groups[{gi}]: expected a dict, "
                                f"got {type(g).__name__}")
            want = list(range(i, i + len(own["params"])))
            i += len(own["params"])
            if list(g.get("params", ())) != want:
                raise ValueError(f"{name}.load_state_dict: param_groups[{gi}] holds parameters "
                                 f"{list(g.get('params', ()))}, expected {want}")
            keys = set(g) - {"params"}
            if keys != set(self.defaults):
                raise KeyError(f"{name}.load_state_dict: param_groups[{gi}]: missing options "
                               f"{sorted(set(self.defaults) - keys)}, unexpected "
                               f"{sorted(keys - set(self.defaults))}")
            opts = {k: g[k] for k in self.defaults}
            self._check_options(opts, f"{name}.load_state_dict: param_groups[{gi}]")
            new_options.append(opts)
        return new_options

    def _checked_buffers(self, name: str, idx: int, p, st) -> dict:
        """The saved buffers of parameter ``idx`` (``p``), checked: names, shapes, dtypes."""
        if not isinstance(st, dict):
            raise TypeError(f"{name}.load_state_dict: state[{idx}]: expected a dict, "
                            f"got {type(st).__name__}")
        keys = set(st)
        need, allowed = set(self._state_keys), set(self._state_keys) | set(self._optional_keys)
        if not need <= keys <= allowed:
            raise KeyError(f"{name}.load_state_dict: state[{idx}] ({p.name}): missing buffers "
                           f"{sorted(need - keys)}, unexpected {sorted(keys - allowed)}")
        for k in keys:
            check_array_like(f"{name}.load_state_dict: state[{idx}][{k!r}] ({p.name})", st[k],
                             p.data)
        return st

    def apply_state(self, checked) -> None:
        """Install a state validated by ``validate_state_dict`` (cannot fail)."""
        steps, options, state = checked
        for group, opts in zip(self.param_groups, options):
            group.update(opts)
        for idx, (p, st) in enumerate(zip(self._all_params(), state)):
            own = self.state[idx]
            for k in list(own):
                if k not in st:      # an optional buffer the saved state did not have yet
                    del own[k]
            for k, v in st.items():
                if k not in own:
                    self._buffer(k)
                    own[k] = self._flat_view_of(k, idx)
                own[k][...] = v      # copy into our buffer: keeps its memory order
        self.steps = steps

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} (step {self.steps})"]
        for gi, g in enumerate(self.param_groups):
            opts = ", ".join(f"{k}={g[k]}" for k in self.defaults)
            n = sum(p.size for p in g["params"])
            lines.append(f"  group {gi}: {len(g['params'])} parameters ({n:,} values), {opts}")
        return "\n".join(lines)


def _is_group_list(params) -> bool:
    """True if ``params`` is a list/tuple whose first element is a parameter-group dict."""
    return isinstance(params, (list, tuple)) and len(params) > 0 and isinstance(params[0], dict)


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


_checked_missing = object()  # an option deleted from a group: never "unchanged"


# ----------------------------------------------------------------------------- AdamW
class AdamW(Optimizer):
    """AdamW (Loshchilov & Hutter), PyTorch's algorithm and defaults: decoupled weight decay
    ``p *= 1 - lr * wd``, then bias-corrected moments with ``eps`` outside the square root.

    ``params``: a list of Parameters, or of groups ``{"params": [...], "weight_decay": 0.0}``
    whose options override the defaults (e.g. to exclude biases and norms from decay).
    """

    _state_keys = ("exp_avg", "exp_avg_sq")
    _float_options = {"lr": (0.0, False), "eps": (0.0, True), "weight_decay": (0.0, False)}

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _check_options(self, group: dict, where: str) -> None:
        pre = _prefix(where)
        group["lr"] = _number(pre + "lr", group["lr"])
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"{pre}betas: expected a pair (beta1, beta2), got {betas!r}")
        group["betas"] = (_number(pre + "betas[0]", betas[0], 0.0, 1.0, high_open=True),
                          _number(pre + "betas[1]", betas[1], 0.0, 1.0, high_open=True))
        # eps > 0: with eps = 0 a parameter whose gradients were all zero gets 0/0 = NaN.
        group["eps"] = _number(pre + "eps", group["eps"], low_open=True)
        group["weight_decay"] = _number(pre + "weight_decay", group["weight_decay"])

    def step(self, zero_grad: bool = False) -> None:
        """One AdamW update of every parameter from its current ``grad``: one kernel call over
        the runs of the parameter arenas (one run per group for a whole model), i.e. one pass
        over their concatenated elements and at most one parallel region. ``zero_grad=True``
        also sets the gradients to zero (as ``zero_grad()`` after the step would), in the
        same pass while each block is in cache.

        The options are checked first (a rejected step changes nothing), and a Ctrl-C during
        the update is delivered after it: the step is applied whole or not at all."""
        with defer_keyboard_interrupt():
            self._check_groups()
            t = self.steps + 1  # the kernel's bias correction counts steps from 1
            m_bufs, v_bufs = self._flat["exp_avg"], self._flat["exp_avg_sq"]
            items = []
            for g, group_runs in zip(self.param_groups, self._runs()):
                lr, (b1, b2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
                consts = {}  # per dtype, once per group and step (hyper-parameters may change)
                for _, _, data, grad, off, dt in group_runs:
                    c = consts.get(dt)
                    if c is None:
                        c = consts[dt] = _adamw_consts(dt, t, lr, b1, b2, eps, wd)
                    n = data.shape[0]
                    items.append(((data, grad, m_bufs[dt][off:off + n],
                                   v_bufs[dt][off:off + n]), c))
            ops.adamw(items, bool(zero_grad))
            self.steps = t


# ----------------------------------------------------------------------------- SGD
class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov momentum and
    (coupled, L2) weight decay, as ``torch.optim.SGD``: ``g = grad + wd * p``; with momentum,
    ``buf = g`` on the first step, then ``buf = momentum * buf + (1 - dampening) * g``."""

    _optional_keys = ("momentum_buffer",)
    # Not momentum or dampening: the nesterov rule depends on them.
    _float_options = {"lr": (0.0, False), "weight_decay": (0.0, False)}

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      dampening=dampening, nesterov=nesterov))

    def _check_options(self, group: dict, where: str) -> None:
        pre = _prefix(where)
        group["lr"] = _number(pre + "lr", group["lr"])
        group["momentum"] = _number(pre + "momentum", group["momentum"])
        group["weight_decay"] = _number(pre + "weight_decay", group["weight_decay"])
        group["dampening"] = _number(pre + "dampening", group["dampening"])
        group["nesterov"] = check_bool(pre + "nesterov", group["nesterov"])
        if group["nesterov"] and (group["momentum"] <= 0.0 or group["dampening"] != 0.0):
            raise ValueError(f"{pre}nesterov: Nesterov momentum needs momentum > 0 and "
                             f"dampening == 0, got momentum={group['momentum']}, "
                             f"dampening={group['dampening']}")

    def step(self, zero_grad: bool = False) -> None:
        """One SGD update of every parameter from its current ``grad``, one kernel call per
        run of the parameter arenas. ``zero_grad=True`` also sets the gradients to zero, in
        the same pass. Options are checked first; a Ctrl-C during the update is delivered
        after it."""
        with defer_keyboard_interrupt():
            self._check_groups()
            state, zero = self.state, bool(zero_grad)
            for g, group_runs in zip(self.param_groups, self._runs()):
                lr, mom, wd, damp, nest = (g["lr"], g["momentum"], g["weight_decay"],
                                           g["dampening"], g["nesterov"])
                for first, stop, data, grad, off, dt in group_runs:
                    if mom != 0.0:
                        # As in PyTorch the buffer is created on first use (then set to g).
                        new = "momentum_buffer" not in state[first]
                        bufs = self._buffer("momentum_buffer")
                        for i in range(first, stop):
                            if "momentum_buffer" not in state[i]:
                                state[i]["momentum_buffer"] = self._flat_view_of(
                                    "momentum_buffer", i)
                        buf = bufs[dt][off:off + data.shape[0]]
                        ops.sgd(data, grad, buf, lr, mom, wd, damp, nest, new, zero)
                    else:
                        ops.sgd(data, grad, None, lr, 0.0, wd, damp, False, False, zero)
            self.steps += 1


# ----------------------------------------------------------------------------- ownership
def check_optimizer_of(optimizer, model) -> None:
    """Raise ValueError unless every parameter ``optimizer`` updates is one of ``model``'s: an
    optimizer built on another model's parameters would update those and train nothing."""
    own = {id(p) for p in model.parameters()}
    params = optimizer._all_params()
    foreign = [p for p in params if id(p) not in own]
    if foreign:
        first = foreign[0]
        raise ValueError(f"optimizer: {len(foreign)} of its {len(params)} parameters (e.g. "
                         f"{first.name or 'unnamed'} of shape {first.shape}) are not parameters "
                         f"of the {type(model).__name__} model, so it would train nothing of "
                         f"it; build it on model.parameters()")


# ----------------------------------------------------------------------------- clipping
def clip_grad_norm(params, max_norm: float, error_if_nonfinite: bool = False) -> float:
    """Scale the gradients of ``params`` in place so that their global L2 norm is at most
    ``max_norm``; return the norm before clipping (as ``torch.nn.utils.clip_grad_norm_``).

    The norm and the scaling are compiled passes over the flat gradient arenas
    (``kernels.optim.sum_of_squares`` and ``scale_``): no temporaries, and the norm's bits do
    not depend on the thread count."""
    plist = _collect_params("params", params)
    flats = [a.grad[lo:hi] for a, lo, hi, _, _ in runs(plist)]
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real):
        raise TypeError(f"max_norm: expected a real number, got {max_norm!r}")
    if not float(max_norm) > 0.0:  # also rejects NaN; +inf means "only measure"
        raise ValueError(f"max_norm: expected a number > 0, got {max_norm!r}")
    max_norm = float(max_norm)
    total = math.sqrt(_kopt.sum_of_squares(flats))
    if not math.isfinite(total):
        if error_if_nonfinite:
            raise FloatingPointError(f"clip_grad_norm: the total gradient norm is {total}")
        return total
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        _kopt.scale_(flats, coef)
    return total
