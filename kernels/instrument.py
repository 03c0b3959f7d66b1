"""Instrumentation: record, and optionally time, every kernel call the engine makes.

``with record() as rec: step()`` replaces each entry of ``kernels.ops`` by a recorder for the
length of the block (calling thread only; calls from pool threads run straight through).
``rec.calls`` lists ``Call(name, args, seconds)`` in order; ``args`` is the full positional
tuple (keywords and defaults filled in), so ``getattr(ops, name)(*args)`` replays the call.
With ``timed=True`` seconds are exclusive (a recorded call inside another is not counted
twice). bench's GEMM floor replays
the recorded ``gemm`` calls; its step profile sums the times by name.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import time
from typing import NamedTuple

import numpy as np

from . import ops

__all__ = ["Call", "Recording", "record", "replay"]


class Call(NamedTuple):
    name: str
    args: tuple
    seconds: float


class Recording:
    """What ``record`` saw: ``calls`` in order, and per-name totals."""

    def __init__(self):
        self.calls: list = []

    def names(self) -> list:
        return [c.name for c in self.calls]

    def of(self, name: str) -> list:
        return [c for c in self.calls if c.name == name]

    def seconds(self) -> dict:
        out: dict = {}
        for c in self.calls:
            out[c.name] = out.get(c.name, 0.0) + c.seconds
        return out

    def counts(self) -> dict:
        out: dict = {}
        for c in self.calls:
            out[c.name] = out.get(c.name, 0) + 1
        return out


_lock = threading.Lock()
_active = [False]


@contextlib.contextmanager
def record(names=None, timed: bool = False):
    """Record the calls of ``kernels.ops`` entries (all, or those in ``names``: one name or a
    sequence) made on this thread inside the block; yields a ``Recording``. Not reentrant: a nested ``record``
    raises RuntimeError."""
    wanted = ops.NAMES if names is None else (names,) if isinstance(names, str) else tuple(names)
    unknown = [n for n in wanted if n not in ops.NAMES]
    if unknown:
        raise ValueError(f"names: unknown kernels {unknown}; expected names from {ops.NAMES}")
    with _lock:
        if _active[0]:
            raise RuntimeError("record: already recording (record blocks do not nest)")
        _active[0] = True
    rec = Recording()
    owner = threading.get_ident()
    stack: list = []
    clock = time.perf_counter
    saved = {n: getattr(ops, n) for n in wanted}

    def wrap(name, fn):
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # no introspectable signature: record as passed
            sig = None
        npos = 0 if sig is None else sum(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in sig.parameters.values())

        def full(args, kwargs):  # every positional argument, as the kernel sees it
            if sig is not None and (kwargs or len(args) < npos):
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                return bound.args
            return args

        def call(*args, **kwargs):
            if threading.get_ident() != owner:
                return fn(*args, **kwargs)
            if not timed:
                rec.calls.append(Call(name, full(args, kwargs), 0.0))
                return fn(*args, **kwargs)
            seen = full(args, kwargs)
            inner = [0.0]
            stack.append(inner)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                stack.pop()
                rec.calls.append(Call(name, seen, dt - inner[0]))
                if stack:
                    stack[-1][0] += dt
        call.__wrapped__ = fn
        return call

    try:
        for n, fn in saved.items():
            setattr(ops, n, wrap(n, fn))
        yield rec
    finally:
        for n, fn in saved.items():
            setattr(ops, n, fn)
        with _lock:
            _active[0] = False


def replay(fn, name: str = "gemm"):
    """A callable replaying the ``kernels.ops.<name>`` calls one ``fn()`` makes (``fn`` runs
    once here, recorded) with the same arguments and arrays. ``run.calls`` holds the
    recorded argument tuples; ``run.restore()`` copies back into every call's output (its
    first argument) what the recorded calls left there: replays of calls that read each
    other's outputs compound (into overflow or denormals) unless restored between them.
    Raises RuntimeError if ``fn`` made no such call."""
    with record(name) as rec:
        fn()
    calls = tuple(c.args for c in rec.calls)
    if not calls:
        raise RuntimeError(f"replay: the function made no call through kernels.ops.{name}")
    kernel = getattr(ops, name)  # the real kernel again, outside the record block
    outputs: dict = {}
    for args in calls:  # one snapshot per output array (an array may be written twice)
        outputs.setdefault(id(args[0]), args[0])
    saved = tuple((out, out.copy()) for out in outputs.values())

    def run():
        for args in calls:
            kernel(*args)

    def restore():
        for out, values in saved:
            np.copyto(out, values)
    run.calls = calls
    run.restore = restore
    return run
