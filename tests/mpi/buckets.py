"""MPI worker (run by tests/test_distributed_buckets.py under ``mpiexec -n K``): gradient
buckets (reductions launched during the backward) against one reduction after it, at the
same rank count, and against one process. Rank 0 prints one JSON line.

Cases, float64, each with ``fit(comm=...)``, plain and ZeRO-1 (``ShardedAdamW``):
- a tabular MLP of 4 layers (classification, batches that do not divide by K, a batch
  smaller than the ranks, clipping), buckets of 40 elements (several per layer boundary,
  pieces split at the shards' boundaries);
- a GPT of 3 blocks, tied and untied head, and with checkpointed blocks (the hooks of the
  checkpointed backward), buckets of 500 elements.
For each: the parameters' bytes and the History of the bucketed run against the unbucketed
one, the bucketed run against one process, and whether every rank holds the same bits.
Also: DataParallel in a loop of one's own (how many buckets the backward launched), the hooks
gone after fit, a rank failing mid-backward, and ranks that choose different buckets.
"""
import json
import sys
import zlib

import numpy as np

from engine import GPT, MLP, AdamW, CrossEntropyLoss, Linear, Module, ReLU, Sequential, fit
from engine import distributed as D

comm = D.mpi().COMM_WORLD
K, RANK = comm.Get_size(), comm.Get_rank()


def crc(model):
    return zlib.crc32(memoryview(np.ascontiguousarray(model.flat_params())).cast("B"))


def rel_err(model, ref):
    a, b = model.flat_params(), ref.flat_params()
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def tabular(n, batch_size):
    X, y = np.random.default_rng(5).standard_normal((n, 6)), np.arange(n) % 3
    model = MLP([6, 10, 9, 7, 3], ["relu", "tanh", "relu", None], dtype=np.float64, rng=1)
    return model, CrossEntropyLoss(), X, y, dict(epochs=3, batch_size=batch_size,
                                                 clip_grad_norm=0.5)


def tied_siblings():
    """An MLP-like Sequential whose fourth Linear uses the second one's weight (no bias: its
    parameters are one run, inside the second's range)."""
    X, y = np.random.default_rng(5).standard_normal((31, 6)), np.arange(31) % 3
    g, f8 = np.random.default_rng(1), np.float64
    lin = [Linear(6, 8, dtype=f8, rng=g), Linear(8, 8, bias=False, dtype=f8, rng=g),
           Linear(8, 8, bias=False, dtype=f8, rng=g), Linear(8, 3, dtype=f8, rng=g)]
    lin[2].W = lin[1].W
    model = Sequential(lin[0], ReLU(dtype=f8), lin[1], ReLU(dtype=f8), lin[2], ReLU(dtype=f8), lin[3])
    return model, CrossEntropyLoss(), X, y, dict(epochs=2, batch_size=7)


def gpt(tie, checkpoint):
    ids = np.random.default_rng(0).integers(0, 11, (21, 9))
    model = GPT(11, 8, 3, 2, 16, d_ff=24, tie_weights=tie, checkpoint=checkpoint,
                dtype=np.float64, rng=0)
    return model, CrossEntropyLoss(), ids[:, :-1], ids[:, 1:], dict(epochs=2, batch_size=5)


def run(case, args, sharded, elements, c):
    """One fit of ``case(*args)``: one process (``c`` None) or over ``c`` with buckets of
    ``elements`` (0: one reduction after the backward)."""
    model, loss, X, Y, opts = case(*args)
    opt = (D.ShardedAdamW(model.parameters(), c, lr=1e-2) if sharded and c is not None
           else AdamW(model.parameters(), lr=1e-2))
    default = D.gradient_buckets()
    D.set_gradient_buckets(elements)
    try:
        h = fit(model, loss, opt, X, Y, rng=4, progress=False, comm=c, **opts)
    finally:
        D.set_gradient_buckets(default[0], poll=default[1])
    return model, h.loss + h.val_loss


def compare(case, args, elements):
    out = {}
    for mode, sharded in (("plain", False), ("zero1", True)):
        ref, _ = run(case, args, False, 0, None)
        one, h1 = run(case, args, sharded, 0, comm)
        bkt, hb = run(case, args, sharded, elements, comm)
        out[mode] = {"same_bits": bool(np.array_equal(one.flat_params(), bkt.flat_params())),
                     "same_history": h1 == hb, "rel_err": rel_err(bkt, ref),
                     "identical": len(set(comm.allgather(crc(bkt)))) == 1}
    return out


def hooks_removed():
    """After a bucketed fit the model's containers hold no hook (a later backward on one
    process reduces nothing)."""
    model, loss, X, Y, opts = tabular(20, 7)
    default = D.gradient_buckets()
    D.set_gradient_buckets(40)
    try:
        fit(model, loss, AdamW(model.parameters()), X, Y, rng=4, progress=False, comm=comm,
            **opts)
    finally:
        D.set_gradient_buckets(default[0], poll=default[1])
    return all(not getattr(m, "backward_hooks", ()) for _, m in model.named_modules())


def direct(elements, steps=3):
    """``DataParallel`` in a loop of one's own: ``begin_backward`` before each backward,
    then ``step``. Returns the parameters, and per step how many buckets the backward
    launched and how many there were."""
    model, loss, X, Y, _ = gpt(True, False)
    X, Y = np.ascontiguousarray(X), np.ascontiguousarray(Y)
    dp = D.DataParallel(model, AdamW(model.parameters(), lr=1e-2), comm, buckets=elements)
    launched = []
    for s in range(steps):
        lo, hi = dp.share(5 * s, 5 * s + 5)
        loss.forward(model.forward(X[lo:hi]), Y[lo:hi])
        dp.begin_backward(None if 5 % K == 0 else (hi - lo) / 5)
        model.backward(loss.backward(), input_grad=False)
        dp.step(None if 5 % K == 0 else (hi - lo) / 5)
        r = dp.bucket_reducer
        launched.append([r.launched_early, len(r._buckets)] if r is not None else None)
    dp.close()
    return model, launched


class RaisesOnRank1(Module):
    """Identity; its backward raises on the last rank at its ``at``-th call."""

    def __init__(self, at):
        super().__init__(np.float64)
        self.at, self.calls = at, 0

    def forward(self, x, *, residual=None):
        return x if residual is None else x + residual

    def backward(self, dy):
        self.calls += 1
        if RANK == K - 1 and self.calls == self.at:
            raise RuntimeError("deliberate failure in backward")
        return dy


def failure_mid_backward():
    """The last rank raises in the middle of a backward whose later layers' buckets are
    launched (step 3), then, in a second run, at the start of one (step 5: only the other
    ranks launch a bucket): what each rank raised, whether the world still works, and
    whether a bucketed fit after them still equals one process."""
    X, y = np.random.default_rng(5).standard_normal((32, 6)), np.arange(32) % 3
    g = np.random.default_rng(0)
    model = Sequential(Linear(6, 10, dtype=np.float64, rng=g), RaisesOnRank1(3),
                       ReLU(dtype=np.float64), Linear(10, 3, dtype=np.float64, rng=g),
                       RaisesOnRank1(5))
    default, raised = D.gradient_buckets(), []
    D.set_gradient_buckets(8)
    try:
        for _ in range(2):
            try:
                fit(model, CrossEntropyLoss(), AdamW(model.parameters()), X, y, epochs=2,
                    batch_size=8, progress=False, comm=comm)
                raised.append(None)
            except Exception as e:
                raised.append(type(e).__name__)
    finally:
        D.set_gradient_buckets(default[0], poll=default[1])
    works = comm.allreduce(1) == K
    after = compare(tabular, (20, 7), 40)["plain"]
    return {"raised": comm.allgather(raised), "world_works": works,
            "after": after["rel_err"] <= 1e-12 and after["identical"]}


def disagreeing_settings():
    """Ranks that choose different buckets, and a bad count: what each rank raised."""
    out = []
    for buckets in (100 * RANK, -1):
        model = MLP([3, 2], dtype=np.float64, rng=0)
        try:
            D.DataParallel(model, AdamW(model.parameters()), comm, buckets=buckets)
            out.append(None)
        except ValueError as e:
            out.append(str(e))
    return comm.allgather(out)


def main():
    res = {"K": K, "default": list(D.gradient_buckets())}
    res["mlp"] = compare(tabular, (53, 11), 40)
    res["mlp tiny"] = compare(tabular, (13, 2), 40)  # batches of 2 (1 at the end) over K ranks
    res["tied siblings"] = compare(tied_siblings, (), 8)
    res["gpt tied"] = compare(gpt, (True, False), 500)
    res["gpt untied"] = compare(gpt, (False, False), 500)
    res["gpt checkpointed"] = compare(gpt, (True, True), 500)
    res["hooks removed"] = hooks_removed()
    res["failure"] = failure_mid_backward()
    res["disagree"] = disagreeing_settings()
    (one, _), (bkt, launched) = direct(0), direct(500)
    res["direct"] = {"same_bits": bool(np.array_equal(one.flat_params(), bkt.flat_params())),
                     "launched": launched}
    if RANK == 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())
