"""Gradient buckets: a data-parallel step's gradient reduction started during the backward,
one non-blocking collective per bucket of parameters adjacent in the arena, launched as soon
as the backward has finished them (the gradient buckets of PyTorch DDP, Li et al. 2020).

The buckets are fixed ranges of the flat gradient vector, cut at parameter boundaries from
its end (the backward finishes the last layers first): every rank launches the same
collectives in the same order, a rank without rows included (it launches them all at the
end). They run on a duplicate of the run's communicator, so they are ordered among
themselves only, not with the agreement steps on the run's communicator.
"""
from __future__ import annotations

import numpy as np

from ..nn.arena import LAYOUT_VERSION, runs
from .runtime import mpi

__all__ = ["GradientBuckets", "set_gradient_buckets", "gradient_buckets"]

# The process default: buckets of 2^19 elements (2 MiB of float32), tested between layers;
# never slower than one reduction after the backward on 2 ranks, faster where ranks wait on
# each other (docs/distributed.md).
DEFAULT_ELEMENTS = 1 << 19
_SETTING = {"elements": DEFAULT_ELEMENTS, "poll": True}


def set_gradient_buckets(elements: int = DEFAULT_ELEMENTS, *, poll: bool = True) -> None:
    """The default of every later ``DataParallel`` of this process: ``elements`` > 0 reduces
    the gradients in buckets of at least that many elements, started during the backward
    (``fit`` and ``DataParallel.begin_backward``); 0 reduces them in one call after it (the
    way before buckets). Every rank must choose the same (checked when the run starts).
    ``poll`` tests the launched reductions after each finished layer (MPICH progresses a
    non-blocking collective only inside MPI calls)."""
    if isinstance(elements, bool) or not isinstance(elements, (int, np.integer)) or elements < 0:
        raise ValueError(f"elements: expected an int >= 0, got {elements!r}")
    _SETTING.update(elements=int(elements), poll=bool(poll))


def gradient_buckets() -> tuple:
    """``(elements, poll)``: this process's default (``set_gradient_buckets``)."""
    return _SETTING["elements"], _SETTING["poll"]


def _shared_parameters(model) -> set:
    """The ids of parameters that more than one module holds as its own (a weight tied
    across siblings): the hook after one of them comes before the other adds its gradient."""
    count = {}
    for _, m in model.named_modules():
        inner = {id(p) for c in m.children() for p in c.parameters()}
        for p in m.parameters():
            if id(p) not in inner:
                count[id(p)] = count.get(id(p), 0) + 1
    return {k for k, n in count.items() if n > 1}


class GradientBuckets:
    """The bucketed reduction of ``model``'s flat gradient vector over ``comm`` (the first
    ``begin`` is collective: it duplicates ``comm``). ``shards`` (ZeRO-1: ``(counts,
    displs)`` of the ranks' slices) reduces each bucket's piece of a slice to the rank that
    owns it (``Ireduce``: the sum lands at the slice's own place of its owner's vector), else
    every bucket is summed on every rank (``Iallreduce``, in place). ``begin(weight)`` before
    the backward, ``finish()`` after it; ``close()`` removes the hooks and frees the
    communicator.
    ``launched_early``: how many of the last step's buckets the backward launched."""

    def __init__(self, model, comm, elements: int, poll: bool = True, shards=None):
        self.model, self.elements, self.poll, self.shards = model, elements, poll, shards
        self.rank, self._parent, self.comm = comm.Get_rank(), comm, None
        self._hosts = []
        self._hook = self._done  # one bound method: added and removed by identity
        self._gen = -1
        self.armed, self._weight = False, None
        self._requests = []
        self.launched_early = 0  # buckets of the last step launched during its backward

    def _start(self) -> None:
        """The duplicate communicator and the hooks, at the first ``begin`` (collective: every
        rank begins every step), so a loop that never begins a backward holds neither."""
        self.comm = self._parent.Dup()
        self._hosts = [m for _, m in self.model.named_modules()
                       if hasattr(m, "add_backward_hook")]
        for m in self._hosts:
            m.add_backward_hook(self._hook)

    # -- the plan: bucket ranges and the modules' ranges, per arena layout -------------------
    def _plan(self) -> None:
        if self._gen == LAYOUT_VERSION[0]:
            return
        self._g = self.model.flat_grads()
        params = self.model.parameters()
        offsets = np.cumsum([0] + [p.size for p in params])
        cuts, end = [], int(offsets[-1])
        for i in range(len(params) - 1, -1, -1):  # from the end: the last layers first
            if end - offsets[i] >= self.elements or i == 0:
                cuts.append((int(offsets[i]), end))
                end = int(offsets[i])
        self._buckets = [p for lo, hi in cuts for p in self._pieces(lo, hi)]
        self._shared = _shared_parameters(self.model)
        self._arena, self._base = runs(params)[0][:2]
        self._ranges = {}
        self._gen = LAYOUT_VERSION[0]

    def _pieces(self, lo, hi) -> list:
        """``(lo, hi, root)``: the bucket ``[lo, hi)`` (root None), or its pieces in each
        rank's slice (ZeRO-1), from the end."""
        if self.shards is None:
            return [(lo, hi, None)]
        counts, displs = self.shards
        out = []
        for r in range(len(counts) - 1, -1, -1):
            a, b = max(lo, displs[r]), min(hi, displs[r] + counts[r])
            if a < b:
                out.append((a, b, r))
        return out

    def _range_of(self, module) -> tuple:
        """``[lo, hi)`` of ``module``'s parameters in the flat vector; empty when they are
        not one run or one of them is shared with a module outside it (a tied weight may
        get more gradient later)."""
        params = module.parameters()
        r = runs(params) if params else []
        if len(r) != 1 or r[0][0] is not self._arena or any(id(p) in self._shared
                                                             for p in params):
            return (0, 0)
        return (r[0][1] - self._base, r[0][2] - self._base)

    # -- a step ---------------------------------------------------------------------------
    def begin(self, weight=None) -> None:
        """Arm the hooks for the coming backward: each bucket is scaled by ``weight`` (None:
        1) and its reduction launched once the backward has finished it."""
        if self.comm is None:
            self._start()
        self._plan()
        self.armed, self._weight = True, weight
        self._frontier, self._next = self._g.size, 0

    def _done(self, module) -> None:
        """A container's hook: ``module``'s gradients are complete."""
        if not self.armed:
            return
        key = id(module)
        r = self._ranges.get(key)
        if r is None:
            r = self._ranges[key] = self._range_of(module)
        lo, hi = r
        if lo < hi and hi >= self._frontier > lo:  # adjacent to what is complete: extend it
            self._frontier = lo
            while self._next < len(self._buckets) and self._buckets[self._next][0] >= lo:
                self._launch(*self._buckets[self._next])
                self._next += 1
        if self.poll and self._requests:  # move them on (MPICH progresses inside MPI calls)
            mpi().Request.Testall(self._requests)

    def _launch(self, lo, hi, root) -> None:
        MPI = mpi()
        g = self._g[lo:hi]
        if self._weight is not None:
            g *= self._weight
        if root is None:
            req = self.comm.Iallreduce(MPI.IN_PLACE, g, op=MPI.SUM)
        elif root == self.rank:
            req = self.comm.Ireduce(MPI.IN_PLACE, g, op=MPI.SUM, root=root)
        else:
            req = self.comm.Ireduce(g, None, op=MPI.SUM, root=root)
        self._requests.append(req)

    def finish(self, weight=None) -> None:
        """Launch the buckets not launched yet (all of them unless ``begin`` armed the hooks:
        scaled by ``weight`` then) and wait for every one."""
        if not self.armed:
            self.begin(weight)
        self.launched_early = self._next
        try:
            while self._next < len(self._buckets):
                self._launch(*self._buckets[self._next])
                self._next += 1
            mpi().Request.Waitall(self._requests)
        finally:
            self._requests.clear()
            self.armed = False

    def close(self) -> None:
        """Remove the hooks; free the duplicate communicator (unless reductions are pending:
        after a failure on some rank they never complete)."""
        for m in self._hosts:
            if self._hook in m.backward_hooks:
                m.remove_backward_hook(self._hook)
        self._hosts = []
        if self.comm is not None and not self._requests:
            self.comm.Free()
        self.comm = None
