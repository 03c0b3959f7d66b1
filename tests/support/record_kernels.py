"""pytest plugin that records the list ``python -m kernels.precompile`` compiles from.

    NUMBA_CACHE_DIR=$(mktemp -d) python -m pytest -q -p record_kernels tests

(an empty cache, so that every kernel version is compiled and timed) writes, at the end of
the session, every compiled version of every kernel of the ``kernels`` package to
kernels/precompile.txt (``BLASNET_KERNEL_LIST`` names another file), with the seconds numba
spent compiling it (its outermost "numba:compile" events; 0 for a version loaded from the
cache or compiled inside another kernel). The lines are in the order the tests first
compiled them (versions compiled only inside another kernel last), so that
``kernels.precompile``, run beside the tests, compiles what they reach first first.
"""
from __future__ import annotations

import os
import sys
import time

_seconds: dict = {}


def _listen():
    from numba.core import event

    class Recorder(event.Listener):
        def __init__(self):
            self.open = []

        def on_start(self, ev):
            self.open.append(time.perf_counter())

        def on_end(self, ev):
            seconds = time.perf_counter() - self.open.pop()
            data = ev.data if isinstance(ev.data, dict) else {}
            disp, args = data.get("dispatcher"), data.get("args")
            if not self.open and disp is not None:
                key = (id(disp), str(args))
                _seconds[key] = _seconds.get(key, 0.0) + seconds

    event.register("numba:compile", Recorder())


_listen()


def pytest_sessionfinish(session):
    from numba.core.dispatcher import Dispatcher
    import kernels
    first = {key: i for i, key in enumerate(_seconds)}  # dicts keep insertion: compile order
    lines, seen = [], set()
    for name, mod in sorted(sys.modules.items()):
        if mod is None or name.split(".")[0] != "kernels":
            continue
        for attr, obj in sorted(vars(mod).items()):
            if not isinstance(obj, Dispatcher) or id(obj) in seen or obj.py_func.__module__ != name:
                continue
            seen.add(id(obj))
            for sig in obj.signatures:
                text = str(sig)
                lines.append((first.get((id(obj), text), len(first)),
                              f"{name}\t{attr}\t{text}\t{_seconds.get((id(obj), text), 0.0):.3f}"))
    lines = [line for _, line in sorted(lines, key=lambda item: item[0])]  # stable
    path = os.environ.get("BLASNET_KERNEL_LIST",
                          os.path.join(os.path.dirname(kernels.__file__), "precompile.txt"))
    with open(path, "w") as f:
        f.write("# module\tkernel\targument types\tseconds to compile (recorded by "
                "tests/support/record_kernels.py)\n")
        f.writelines(line + "\n" for line in lines)
