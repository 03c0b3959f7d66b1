"""MPI worker (run by tests/test_distributed.py under ``mpiexec -n K``): K ranks on a global
batch against one process on that batch, computed here on every rank with a second copy of
each model (the single-process run is the oracle). Rank 0 prints one JSON line.

Checks, all float64 unless named:
- FFN, GMLP, FFNSublayer, MLP with AdamW, 5 steps of global batches some of which do not
  divide by K: plain data parallel and ZeRO-1 (parameter groups included), relative error
  against one process, and whether the ranks' parameters are the same bits after every step;
- FFN in float32;
- fit(comm=...) against fit(): shuffled batches that do not divide by K, classification
  (accuracy), validation, a per-step learning-rate schedule, gradient clipping; plain and
  ZeRO-1; the same with batches smaller than the ranks (ranks without rows in a step); and
  fit on a world of one rank (COMM_SELF);
- the GPT and gMLP language models (float64, a last batch of one window), plain and ZeRO-1
  (distributed.zero1 over their AdamW and schedule);
- optimizer memory per rank, AdamW against ShardedAdamW (tracemalloc);
- ShardedAdamW checkpoints: saved by rank 0 through engine.distributed.save, loaded into a
  plain AdamW (one process) and back into a ShardedAdamW;
- rank_rng: dropout masks differ across ranks.
"""
import json
import os
import sys
import tempfile
import tracemalloc
import zlib

import numpy as np

from engine import FFN, GMLP, MLP, AdamW, CrossEntropyLoss, FFNSublayer, MSELoss, fit, load
from engine.optim.lr_scheduler import CosineAnnealingLR
from engine import distributed as D

comm = D.mpi().COMM_WORLD
K, RANK = comm.Get_size(), comm.Get_rank()
STEPS = 5
BATCHES = [7, 8, 9, 10, 11]  # global batch sizes: some divide by 2 or 3, some do not


def build(kind, dtype):
    if kind == "FFN":
        return FFN(6, 12, "gelu", dtype=dtype, rng=3)
    if kind == "GMLP":
        return GMLP(6, 5, 8, 6, dtype=dtype, rng=3)  # W_gate, W_proj are Fortran-ordered
    if kind == "FFNSublayer":
        return FFNSublayer(6, 12, "relu", norm="pre", dtype=dtype, rng=3)
    return MLP([6, 9, 7, 6], ["tanh", "relu", None], dtype=dtype, rng=3)


def groups(model):
    named = model.named_parameters()
    return [{"params": [p for n, p in named if p.data.ndim > 1]},
            {"params": [p for n, p in named if p.data.ndim == 1], "weight_decay": 0.0}]


def crc(model):
    return zlib.crc32(memoryview(np.ascontiguousarray(model.flat_params())).cast("B"))


def rel_err(model, ref):
    worst = 0.0
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        scale = np.max(np.abs(q.data))
        worst = max(worst, float(np.max(np.abs(p.data - q.data)) / scale))
    return worst


def same_on_all_ranks(model):
    return len(set(comm.allgather(crc(model)))) == 1


def train_steps(kind, dtype, sharded, grouped):
    rng = np.random.default_rng(11)
    total = sum(BATCHES)
    X = rng.standard_normal((total, 6)).astype(dtype)
    Y = rng.standard_normal((total, 6)).astype(dtype)
    ref, model = build(kind, dtype), build(kind, dtype)
    params = groups(ref) if grouped else ref.parameters()
    ref_opt = AdamW(params, lr=1e-2, weight_decay=0.1)
    params = groups(model) if grouped else model.parameters()
    opt = (D.ShardedAdamW(params, comm, lr=1e-2, weight_decay=0.1) if sharded
           else AdamW(params, lr=1e-2, weight_decay=0.1))
    dp = D.DataParallel(model, opt, comm)
    loss_ref, loss = MSELoss(), MSELoss()
    identical = True
    s = 0
    for b in BATCHES[:STEPS]:
        xb, yb = X[s:s + b], Y[s:s + b]
        loss_ref.forward(ref.forward(xb), yb)
        ref.backward(loss_ref.backward())
        ref_opt.step()
        ref.zero_grad()
        lo, hi = dp.share(s, s + b)
        loss.forward(model.forward(X[lo:hi]), Y[lo:hi])
        model.backward(loss.backward())
        dp.step((hi - lo) / b)
        identical = identical and same_on_all_ranks(model)
        s += b
    return {"rel_err": rel_err(model, ref), "identical": identical}


def fit_case(sharded, n=53, batch_size=11):
    X, y = np.random.default_rng(5).standard_normal((n, 6)), np.arange(n) % 3
    Xv, yv = np.random.default_rng(6).standard_normal((20, 6)), np.arange(20) % 3
    out = {}
    for name in ("ref", "dp"):
        model = MLP([6, 10, 3], ["relu", None], dtype=np.float64, rng=1)
        if name == "dp" and sharded:
            opt = D.ShardedAdamW(groups(model), comm, lr=1e-2)
        else:
            opt = AdamW(groups(model), lr=1e-2)
        sched = CosineAnnealingLR(opt, T_max=15)
        h = fit(model, CrossEntropyLoss(), opt, X, y, epochs=3, batch_size=batch_size, rng=4,
                validation=(Xv, yv), progress=False, scheduler=sched, scheduler_interval="step",
                clip_grad_norm=0.5, comm=comm if name == "dp" else None)
        out[name] = (model, h)
    (ref, hr), (model, hd) = out["ref"], out["dp"]
    hist = max(abs(a - b) / abs(b) for a, b in zip(hd.loss + hd.val_loss, hr.loss + hr.val_loss))
    return {"rel_err": rel_err(model, ref), "identical": same_on_all_ranks(model),
            "history_rel_err": hist, "accuracy_equal": hd.accuracy == hr.accuracy,
            "val_accuracy_equal": hd.val_accuracy == hr.val_accuracy,
            "steps": [hd.steps, hr.steps], "samples": [hd.samples, hr.samples]}


def lm_case(kind, sharded):
    """A character language model (engine.training.gpt_lm or lm's gMLP, float64) on a short
    text whose last batch has one window: one process against the ranks."""
    from engine.training import gpt_lm, lm
    common = dict(seq_len=8, d_model=16, epochs=1, warmup=2, dtype="float64", block=256,
                  held_out=0.2, sample_length=0)
    if kind == "gpt":
        module, c = gpt_lm, gpt_lm.GPTConfig(d_ff=32, n_layer=1, n_head=2, **common)
    else:
        module, c = lm, lm.LMConfig(d_ffn=32, blocks=1, **common)
    text = "The quick brown fox jumps over the lazy dog; pack my box. " * 30
    n = lm.corpus_data(c, text)["X"].shape[0]
    c.batch_size = next(b for b in range(4, n) if n % b == 1)
    runs = {}
    for name in ("ref", "dp"):
        s = module.setup(c, text)
        with D.zero1(s, comm if name == "dp" and sharded else None):
            runs[name] = lm.run_training(s, False, comm if name == "dp" else None)
    ref, dp = runs["ref"], runs["dp"]
    hist = max(abs(a - b) / abs(b) for a, b in zip(dp.history.loss + dp.history.val_loss,
                                                   ref.history.loss + ref.history.val_loss))
    return {"rel_err": rel_err(dp.setup.model, ref.setup.model), "history_rel_err": hist,
            "last_batch": n % c.batch_size, "steps": [dp.history.steps, ref.history.steps]}


def fit_one_rank():
    """fit(comm=COMM_SELF): a world of one rank is one process."""
    X = np.random.default_rng(5).standard_normal((30, 6))
    Y = np.random.default_rng(6).standard_normal((30, 6))
    runs = []
    for c in (None, D.mpi().COMM_SELF):
        model = build("FFN", np.float64)
        h = fit(model, MSELoss(), AdamW(model.parameters(), lr=1e-2), X, Y, epochs=2,
                batch_size=7, rng=4, progress=False, comm=c)
        runs.append((model, h))
    (a, ha), (b, hb) = runs
    return {"params_equal": bool(np.array_equal(a.flat_params(), b.flat_params())),
            "history_rel_err": max(abs(x - y) / abs(y) for x, y in zip(hb.loss, ha.loss))}


def memory():
    model = FFN(64, 256, dtype=np.float64, rng=0)
    AdamW(model.parameters()).step()  # the kernel's scratch, allocated once per thread
    tracemalloc.start()
    opt = AdamW(model.parameters())
    opt.step()
    plain = tracemalloc.get_traced_memory()[0]
    del opt
    tracemalloc.stop()
    tracemalloc.start()
    opt = D.ShardedAdamW(model.parameters(), comm)
    opt.step()
    sharded = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"plain": plain, "sharded": sharded, "params_bytes": model.flat_params().nbytes,
            "state_nbytes": opt.state_nbytes()}


def checkpoints():
    model = GMLP(6, 5, 8, 6, dtype=np.float64, rng=2)
    opt = D.ShardedAdamW(groups(model), comm, lr=1e-2)
    dp = D.DataParallel(model, opt, comm)
    X = np.random.default_rng(RANK).standard_normal((8, 6))
    loss = MSELoss()
    for _ in range(2):
        loss.forward(model.forward(X), X)
        model.backward(loss.backward())
        dp.step()
    full = opt.state_dict()
    path = comm.bcast(os.path.join(tempfile.mkdtemp(), "zero.npz") if RANK == 0 else None)
    D.save(path, model, opt, comm=comm, note="zero")
    res = {}
    if RANK == 0:  # one process, plain AdamW: the same state
        plain_model = GMLP(6, 5, 8, 6, dtype=np.float64, rng=9)
        plain = AdamW(groups(plain_model), lr=1e-2)
        meta = load(path, plain_model, plain)
        sd = plain.state_dict()
        res["plain_load"] = (meta == {"note": "zero"} and sd["steps"] == 2 and all(
            np.array_equal(sd["state"][i][k], full["state"][i][k])
            for i in full["state"] for k in ("exp_avg", "exp_avg_sq")))
    fresh = GMLP(6, 5, 8, 6, dtype=np.float64, rng=9)
    back = D.ShardedAdamW(groups(fresh), comm, lr=1e-2)
    D.load(path, fresh, back, comm=comm)
    sd = back.state_dict()
    res["sharded_reload"] = bool(comm.allreduce(int(sd["steps"] == 2 and all(
        np.array_equal(sd["state"][i][k], full["state"][i][k])
        for i in full["state"] for k in ("exp_avg", "exp_avg_sq"))), op=D.mpi().MIN))
    nonzero = any(np.any(v != 0) for st in full["state"].values() for v in st.values())
    res["state_nonzero"] = nonzero
    return res


def dropout_streams():
    g = np.random.default_rng(7)
    block = FFNSublayer(6, 12, "relu", dropout=0.5, dtype=np.float64, rng=g)
    D.rank_rng(7, comm, out=g)
    D.DataParallel(block, AdamW(block.parameters()), comm)
    y = block.forward(np.ones((4, 6))).copy()
    outs = comm.allgather(zlib.crc32(y.tobytes()))
    again = D.rank_rng(7, comm).standard_normal(3).tolist()
    return {"masks_differ": len(set(outs)) == K,
            "reproducible": again == D.rank_rng(7, comm).standard_normal(3).tolist()}


def main():
    res = {"K": K, "steps": {}}
    for kind in ("FFN", "GMLP", "FFNSublayer", "MLP"):
        for sharded in (False, True):
            key = f"{kind} {'zero1' if sharded else 'plain'}"
            res["steps"][key] = train_steps(kind, np.float64, sharded, grouped=sharded)
    res["steps"]["FFN float32 plain"] = train_steps("FFN", np.float32, False, False)
    res["steps"]["FFN float32 zero1"] = train_steps("FFN", np.float32, True, True)
    res["fit plain"] = fit_case(False)
    res["fit zero1"] = fit_case(True)
    # batches smaller than the ranks: 13 rows in 4s (a last batch of 1), 7 rows in 2s
    for mode, sharded in (("plain", False), ("zero1", True)):
        res[f"fit tiny {mode}"] = fit_case(sharded, n=13, batch_size=4)
        res[f"fit pairs {mode}"] = fit_case(sharded, n=7, batch_size=2)
        res[f"gpt {mode}"] = lm_case("gpt", sharded)
        res[f"gmlp-lm {mode}"] = lm_case("gmlp-lm", sharded)
    res["fit one rank"] = fit_one_rank()
    res["memory"] = comm.gather(memory())
    res["checkpoints"] = checkpoints()
    res["dropout"] = dropout_streams()
    if RANK == 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())
