"""An atomic fetch-and-add on an int64 counter, for compiled kernels whose threads share a
pass by claiming pieces of it (kernels.parallel.claimed).

A static split makes the calling thread wait for the slowest slot, and a pool thread starts
its slot only once its vCPU wakes (40-115 us on a KVM guest, docs/performance.md): with
claims the calling thread starts at once and the late thread takes what is left, so the
wake-up costs half as much and a slower core gets less. ``fetch_add(counter, v)`` adds
``v`` to ``counter[0]`` and returns the value before, as one sequentially consistent atomic
instruction (LLVM ``atomicrmw add``). With ``NUMBA_DISABLE_JIT`` the kernels run as Python
and the same call takes a lock.
"""
from __future__ import annotations

import threading

from numba import types
from numba.extending import intrinsic

from .jit import disabled

__all__ = ["fetch_add"]


@intrinsic
def _fetch_add(typingctx, counter, value):
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64
            and isinstance(value, types.Integer)):
        return None
    sig = types.int64(counter, value)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        v = context.cast(builder, args[1], signature.args[1], types.int64)
        return builder.atomic_rmw("add", ary.data, v, "seq_cst")   # element 0

    return sig, codegen


_lock = threading.Lock()


def _fetch_add_python(counter, value):
    with _lock:
        old = int(counter[0])
        counter[0] = old + value
        return old


fetch_add = _fetch_add_python if disabled() else _fetch_add
