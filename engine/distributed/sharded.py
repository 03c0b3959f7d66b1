"""``ShardedAdamW``: AdamW sharded over the ranks, ZeRO stage 1 (Rajbhandari et al. 2020);
``sharded_like`` and ``zero1``: an AdamW someone else built (with its schedule) sharded for
one run."""
from __future__ import annotations

import contextlib

import numpy as np

from kernels import ops
from kernels.memory import aligned_empty
from kernels.optim import adamw_consts

from ..nn.arena import LAYOUT_VERSION
from ..nn.module import runs
from ..optim.optimizers import AdamW, defer_keyboard_interrupt
from .runtime import agree, communicator, mpi

__all__ = ["ShardedAdamW", "sharded_like", "zero1"]


# ----------------------------------------------------------------------------- ZeRO-1
class ShardedAdamW(AdamW):
    """AdamW sharded over ``comm``'s ranks, ZeRO stage 1 (Rajbhandari et al. 2020): the
    flat gradient vector is summed with one ``Reduce_scatter``, each rank updates its 1/K
    slice of the parameter arena and keeps the moments of that slice only, and one
    ``Allgatherv`` gives every rank the updated parameters. Same arguments as ``AdamW``
    (parameter groups included), same results.

    ``params`` must cover one contiguous range of one arena (a model's ``parameters()``).
    ``step()`` and ``state_dict()`` are collective: every rank calls them. After a step the
    local gradient vector holds intermediate sums: ``zero_grad()`` before the next backward
    (``fit`` and ``DataParallel.step`` do). ``state_dict()`` gathers the full moments and is
    an ``AdamW`` state dict, so checkpoints move freely between sharded and plain runs.
    """

    _state_keys = ()  # AdamW's full-size moments are not allocated: this rank's slice only
    _optional_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, comm=None, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        comm = communicator(comm)
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self._find_range()
        n, k = self._n, self.size
        # Shards start on 64-byte boundaries of the arena: the kernel's blocks stay aligned.
        align = max(1, 64 // self._dtype.itemsize)
        per = -(-n // k)
        per = -(-per // align) * align
        bounds = [min(r * per, n) for r in range(k + 1)]
        self._counts = [bounds[r + 1] - bounds[r] for r in range(k)]
        self._displs = bounds[:k]
        self._s0, self._s1 = bounds[self.rank], bounds[self.rank + 1]
        c = self._s1 - self._s0
        self._m = aligned_empty(c, self._dtype)  # (shard,) exp_avg of this rank's slice
        self._v = aligned_empty(c, self._dtype)  # (shard,) exp_avg_sq of this rank's slice
        self._m.fill(0.0)
        self._v.fill(0.0)
        self._reduced = False
        self._at = 0  # where this rank's reduced slice starts in its gradient vector
        self._pieces, self._pieces_key = None, None

    def _find_range(self) -> None:
        ranges = []
        for p in self._all_params():
            a, lo, hi, _, _ = runs([p])[0]
            ranges.append((lo, hi, a))
        arenas = {id(a) for _, _, a in ranges}
        ranges.sort(key=lambda t: t[0])
        gaps = any(ranges[i][1] != ranges[i + 1][0] for i in range(len(ranges) - 1))
        if len(arenas) != 1 or gaps:
            raise ValueError("params: a ShardedAdamW needs parameters that fill one contiguous "
                             "range of one arena (pass model.parameters(), grouped as you like)")
        self._arena = ranges[0][2]
        self._lo, self._n = ranges[0][0], ranges[-1][1] - ranges[0][0]
        self._dtype = self._arena.dtype
        self._range_gen = LAYOUT_VERSION[0]

    def flat_range(self):
        """``(id(arena), lo, hi)``: the flat parameter range this optimizer shards."""
        if self._range_gen != LAYOUT_VERSION[0]:
            self._find_range()
        return (id(self._arena), self._lo, self._lo + self._n)

    def shards(self) -> tuple:
        """``(counts, displs)``: every rank's slice of the flat parameter vector."""
        return list(self._counts), list(self._displs)

    def shard(self) -> tuple:
        """``(start, stop)``: this rank's slice of the flat parameter vector."""
        return self._s0, self._s1

    def state_nbytes(self) -> int:
        """Bytes of optimizer state held by this rank (the moments of its slice)."""
        return self._m.nbytes + self._v.nbytes

    def _flats(self):
        lo, hi = self.flat_range()[1:]
        return self._arena.data[lo:hi], self._arena.grad[lo:hi]

    def _shard_plan(self) -> list:
        """Per group: ``(data, grad, m, v)`` views of each run of its parameters inside this
        rank's shard; the reduced gradient of arena element ``lo + s0 + i`` is ``grad[at + i]``
        (``at``: 0 after ``reduce_gradients``, ``s0`` after ``take_reduced``)."""
        key = (LAYOUT_VERSION[0], self._at)
        if self._pieces_key == key:
            return self._pieces
        self.flat_range()
        a, lo0, s0, s1 = self._arena, self._lo, self._s0, self._s1
        at = lo0 + self._at  # the reduced slice: at the vector's start, or at its own place
        plan = []
        for g in self.param_groups:
            pieces = []
            for _, lo, hi, _, _ in runs(g["params"]):
                x0, x1 = max(lo - lo0, s0), min(hi - lo0, s1)
                if x0 < x1:
                    i0, i1 = x0 - s0, x1 - s0
                    pieces.append((a.data[lo0 + x0:lo0 + x1], a.grad[at + i0:at + i1],
                                   self._m[i0:i1], self._v[i0:i1]))
            plan.append(pieces)
        self._pieces, self._pieces_key = plan, key
        return plan

    def reduce_gradients(self, weight=None) -> None:
        """Sum the ranks' gradient vectors with one ``Reduce_scatter`` (in place: this rank's
        shard of the sum lands at the start of its gradient vector), weighted as in
        ``DataParallel.reduce_gradients``."""
        _, g = self._flats()
        if weight is not None:
            g *= weight
        if self.size > 1:
            self.comm.Reduce_scatter(mpi().IN_PLACE, g, self._counts, op=mpi().SUM)
        if weight is None and self.size > 1:
            g[:self._s1 - self._s0] *= 1.0 / self.size
        self._reduced, self._at = True, 0

    def take_reduced(self, weight=None) -> None:
        """Take this rank's slice of the sum from its own place of the gradient vector, where
        reductions per slice (``GradientBuckets``) leave it, instead of its start; scaled by
        1/K when ``weight`` is None, as ``reduce_gradients``."""
        if weight is None and self.size > 1:
            self._flats()[1][self._s0:self._s1] *= 1.0 / self.size
        self._reduced, self._at = True, self._s0

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the reduced gradient so that the global gradient's L2 norm is at most
        ``max_norm``; return the norm before clipping (collective; as ``engine.clip_grad_norm``
        on the whole averaged gradient: each rank sums its slice's squares in double)."""
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float, np.integer,
                                                                    np.floating)):
            raise TypeError(f"max_norm: expected a real number, got {max_norm!r}")
        if not float(max_norm) > 0.0:
            raise ValueError(f"max_norm: expected a number > 0, got {max_norm!r}")
        if not self._reduced:
            self.reduce_gradients()
        g = self._flats()[1][self._at:self._at + self._s1 - self._s0]  # this rank's reduced slice
        (total_sq,) = agree(self.comm, payload=(float(np.dot(g, g)),))[:1]
        total = float(np.sqrt(total_sq))
        if np.isfinite(total):
            coef = float(max_norm) / (total + 1e-6)
            if coef < 1.0:
                g *= coef
        return total

    def step(self, zero_grad: bool = False) -> None:
        """Reduce the gradients (unless ``reduce_gradients`` did), ``update_shard()``,
        ``gather_parameters()`` (collective). ``zero_grad=True`` then zeroes the local
        gradient vector. Options are checked first (every rank holds the same ones); a Ctrl-C
        during the step is delivered after it, as for ``AdamW``."""
        with defer_keyboard_interrupt():
            self._check_groups()
            if not self._reduced:
                self.reduce_gradients()
            self.update_shard()
            self.gather_parameters()
            if zero_grad:
                self._flats()[1].fill(0.0)

    def update_shard(self) -> None:
        """AdamW on this rank's slice of the parameters from its reduced gradient (one
        kernel call over the slice's runs, one per parameter group); counts the step. The
        other ranks' slices are stale until ``gather_parameters()``."""
        t = self.steps + 1
        items = []
        for g, pieces in zip(self.param_groups, self._shard_plan()):
            if pieces:
                lr, (b1, b2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
                c = adamw_consts(self._dtype, t, lr, b1, b2, eps, wd)
                items.extend((piece, c) for piece in pieces)
        if items:
            ops.adamw(items)
        self._reduced = False
        self.steps = t

    def gather_parameters(self) -> None:
        """Every rank's updated slice to every rank: one in-place ``Allgatherv``."""
        if self.size > 1:
            data = self._flats()[0]
            self.comm.Allgatherv(mpi().IN_PLACE, [data, (self._counts, self._displs)])

    # -- checkpoints: the full AdamW state, gathered ----------------------------------------
    def _param_spans(self):
        """Per parameter (optimizer order): ``(param, lo, hi, order)`` in flat-vector
        coordinates and its memory order."""
        out = []
        for p in self._all_params():
            _, lo, hi, _, _ = runs([p])[0]
            d = p.data
            order = "F" if d.ndim > 1 and d.flags.f_contiguous and not d.flags.c_contiguous else "C"
            out.append((p, lo - self._lo, hi - self._lo, order))
        return out

    def state_dict(self) -> dict:
        """The state of the equivalent ``AdamW`` (collective: every rank gathers the
        moments of every slice and gets the same dict)."""
        self.flat_range()
        full = {}
        for key, mine in (("exp_avg", self._m), ("exp_avg_sq", self._v)):
            f = np.empty(self._n, self._dtype)  # (n,) every rank's slice, in flat order
            if self.size > 1:
                self.comm.Allgatherv(mine, [f, (self._counts, self._displs)])
            else:
                f[:] = mine
            full[key] = f
        state = {}
        for i, (p, lo, hi, order) in enumerate(self._param_spans()):
            state[i] = {k: f[lo:hi].reshape(p.shape, order=order).copy() for k, f in full.items()}
        sd = super().state_dict()  # options and groups; its state is empty here
        sd["type"], sd["state"] = "AdamW", state
        return sd

    def validate_state_dict(self, sd):
        if isinstance(sd, dict) and sd.get("type") == "AdamW":
            sd = dict(sd, type=type(self).__name__)  # AdamW checkpoints load as they are
        return super().validate_state_dict(sd)

    def apply_state(self, checked) -> None:
        steps, options, state = checked
        for group, opts in zip(self.param_groups, options):
            group.update(opts)
        self.flat_range()
        s0, s1 = self._s0, self._s1
        for (p, lo, hi, order), st in zip(self._param_spans(), state):
            x0, x1 = max(lo, s0), min(hi, s1)
            if x0 >= x1:
                continue
            for key, mine in (("exp_avg", self._m), ("exp_avg_sq", self._v)):
                v = st.get(key)
                if v is None:
                    mine[x0 - s0:x1 - s0] = 0.0
                else:
                    mine[x0 - s0:x1 - s0] = np.ravel(v, order=order)[x0 - lo:x1 - lo]
        self.steps = steps


# ----------------------------------------------------------------------------- an AdamW, sharded
def sharded_like(optimizer, comm=None) -> ShardedAdamW:
    """A ``ShardedAdamW`` on ``comm`` in place of ``optimizer`` (an ``AdamW`` that has not
    stepped): the same parameter groups and options. It holds ``optimizer``'s own group
    dicts, so a learning-rate schedule built on ``optimizer`` sets its rates."""
    if type(optimizer) is not AdamW:
        raise TypeError(f"optimizer: expected an AdamW to shard, got {type(optimizer).__name__}")
    if optimizer.steps:
        raise ValueError(f"optimizer: shard an AdamW before its first step (it has taken "
                         f"{optimizer.steps})")
    sharded = ShardedAdamW([dict(g) for g in optimizer.param_groups], comm)
    sharded.param_groups = optimizer.param_groups  # the same dicts: the schedule's rates
    return sharded


@contextlib.contextmanager
def zero1(holder, comm):
    """Within the block ``holder.optimizer`` (an ``AdamW``, e.g. a language model's
    ``LMSetup``) is ``sharded_like`` it on ``comm``, and ``holder.scheduler`` (if any) drives
    it; after the block (collective) the AdamW is back, holding the gathered moments and step
    count, for a checkpoint rank 0 writes alone. ``comm`` None or of one rank: no change."""
    if comm is None or comm.Get_size() == 1:
        yield holder.optimizer
        return
    plain = holder.optimizer
    sched = getattr(holder, "scheduler", None)
    holder.optimizer = sharded = sharded_like(plain, comm)
    if sched is not None:  # (it writes the rates into the group dicts both optimizers hold)
        sched.optimizer = sharded
    try:
        yield sharded
    finally:
        holder.optimizer = plain
        if sched is not None:
            sched.optimizer = plain
    plain.load_state_dict(sharded.state_dict())  # (not after an error: no collective then)
