"""``defer_keyboard_interrupt``: a Ctrl-C arriving inside the block is held and raised when
the block ends, so an optimizer step or a History row is applied whole or not at all.
``count_keyboard_interrupts``: a Ctrl-C arriving inside the block is only counted, so the
processes of a data-parallel run can agree to stop after the same step."""
from __future__ import annotations

import threading

try:  # the C functions behind ``signal``: an order of magnitude cheaper per call
    import _signal as _sig
except ImportError:  # pragma: no cover - other Python implementations
    import signal as _sig

__all__ = ["defer_keyboard_interrupt", "count_keyboard_interrupts"]


_MAIN_THREAD = threading.main_thread().ident
_SIGINT = 2
_held = [0, None, None]  # [nesting depth, the handler replaced, a SIGINT held (signum, frame)]


def _hold_sigint(signum, frame):
    _held[2] = (signum, frame)


class defer_keyboard_interrupt:
    """Context manager: a SIGINT (Ctrl-C) that arrives inside the block is held and delivered
    (the previous handler runs, by default raising KeyboardInterrupt) when the block ends, so
    an update such as ``optimizer.step()`` is never left half done. Nestable; acts on the main
    thread only (where Python runs signal handlers) and only when SIGINT has a Python
    handler that may raise (not inside ``count_keyboard_interrupts``, whose handler only
    counts); elsewhere it does nothing."""

    __slots__ = ("_on",)

    def __enter__(self):
        self._on = False
        if threading.get_ident() != _MAIN_THREAD:
            return self
        if _held[0] == 0:
            handler = _sig.getsignal(_SIGINT)
            if not callable(handler) or _counts(handler):  # (a count raises nothing)
                return self
            _held[2] = None  # before the handler is in place: it may set this at once
            _held[1] = _sig.signal(_SIGINT, _hold_sigint)
        _held[0] += 1
        self._on = True
        return self

    def __exit__(self, *exc):
        if not self._on:
            return False
        _held[0] -= 1
        if _held[0] == 0:
            old = _held[1]
            _sig.signal(_SIGINT, old)
            pending = _held[2]  # read after the restore: a SIGINT until then was held
            _held[1] = _held[2] = None
            if pending is not None:
                old(*pending)  # the default handler raises KeyboardInterrupt here
        return False


class count_keyboard_interrupts:
    """Context manager for code that runs on several processes in step (data-parallel
    training): a SIGINT that arrives inside the block raises nothing, it is counted
    (``count``), so the processes can sum their counts in a collective step and all stop
    after the same one (a rank that stopped alone would leave the others waiting in their
    next collective); ``defer_keyboard_interrupt`` blocks inside it need not hold it. A
    SIGINT never acted on is dropped when the block ends. Acts on the main thread only and
    only when SIGINT has a Python handler; elsewhere ``count`` stays 0."""

    __slots__ = ("count", "_old", "_on")

    def __init__(self):
        self.count, self._old, self._on = 0, None, False

    def _record(self, signum, frame):
        self.count += 1

    def __enter__(self):
        self.count = 0
        self._on = (threading.get_ident() == _MAIN_THREAD
                    and callable(_sig.getsignal(_SIGINT)))
        if self._on:
            self._old = _sig.signal(_SIGINT, self._record)
        return self

    def __exit__(self, *exc):
        if self._on:
            _sig.signal(_SIGINT, self._old)
            self._old, self._on = None, False
        return False


def _counts(handler) -> bool:
    """Whether ``handler`` is a ``count_keyboard_interrupts`` block's (it never raises)."""
    return isinstance(getattr(handler, "__self__", None), count_keyboard_interrupts)
