"""Optional: blasnet against PyTorch (eager, CPU) on the blocks and shapes of `make bench`.

``python bench/vs_torch.py [--quick] [--threads 1 2]`` times the same float32 forward+backward
and full training step (MSE or cross-entropy, AdamW lr=1e-4) in both, alternating the two in
one process, and prints torch/blasnet (>1: blasnet faster). Each thread count runs in its own
process. Needs ``torch`` (not a project dependency): without it, this prints how to get it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ itself is sys.path[0]; the package is imported as "bench" instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:  # run as a script: make "bench", "kernels", "engine" importable
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench import cases, floors  # noqa: E402

INSTALL_HINT = """\
bench/vs_torch.py: PyTorch is not importable from {python}; nothing to compare.
torch is not a blasnet dependency. To measure, make a separate venv, e.g.:
    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 numpy scipy threadpoolctl
        (CPU wheel: add --index-url https://download.pytorch.org/whl/cpu where no local wheel is)
    PYTHONPATH={root} /tmp/torchvenv/bin/python bench/vs_torch.py --quick
"""

# Paired timing, measured on this machine: alternating single calls is unfair here. (1) After
# each parallel op torch's OpenMP (libgomp) workers spin ~4 ms before they sleep, holding the
# second core that OpenBLAS's next GEMM wants (OpenBLAS's own spin: ~0.1 ms); (2) each side
# evicts the other's operands from cache, and the cold start lasts several calls. Seed 001's
# FFN GEMMs at 2 threads: blasnet 3.3 ms alone, 7.6 ms alternating call by call with torch.
# A training loop runs one library back to back, so each side runs a burst: a SETTLE_S sleep
# (the other's pool parks), one untimed lead-in call (for calls under LEAD_IN_BELOW_S), then
# >= BURST_S of timed calls. With 50 ms bursts the paired ratio came within ~10% of the ratio
# of the two libraries' medians timed apart (the run-to-run noise on this shared machine).
BURST_S = 0.05
MAX_BURST = 500
SETTLE_S = 0.01
LEAD_IN_BELOW_S = 0.02


def settings(quick: bool):
    """(seconds of timed pairs per measurement, minimum pairs, warm-up calls)."""
    return (0.25, 5, 2) if quick else (1.0, 11, 5)


def have_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


# ----------------------------------------------------------------------------- torch side
def torch_module(block: str, shape):
    """The PyTorch module of ``block`` at ``shape`` (same math as the engine's) and the map
    torch parameter name -> (blasnet parameter name, transposed). nn.Linear keeps its weight
    (out, in) and computes x W^T + b; blasnet keeps W (in, out) and computes x W + b."""
    import torch
    from torch import nn

    class FFN(nn.Module):  # Linear(d, f) -> act -> Linear(f, d)
        def __init__(self, d, f, act):
            super().__init__()
            self.lin1 = nn.Linear(d, f)
            self.act = nn.GELU() if act == "gelu" else nn.ReLU()  # GELU(): exact erf form
            self.lin2 = nn.Linear(f, d)

        def forward(self, x):
            return self.lin2(self.act(self.lin1(x)))

    class GMLP(nn.Module):  # Z = GELU(X W_in), G = sigmoid(Z W_gate), P = Z W_proj, Y = (G*P) W_out
        def __init__(self, d_in, d, f, d_out):
            super().__init__()
            self.w_in = nn.Linear(d_in, d, bias=False)
            self.w_gate = nn.Linear(d, f, bias=False)
            self.w_proj = nn.Linear(d, f, bias=False)
            self.w_out = nn.Linear(f, d_out, bias=False)

        def forward(self, x):
            z = nn.functional.gelu(self.w_in(x))
            return self.w_out(torch.sigmoid(self.w_gate(z)) * self.w_proj(z))

    class PostNormFFN(nn.Module):  # LayerNorm(x + FFN(x))
        def __init__(self, d, f):
            super().__init__()
            self.ffn = FFN(d, f, "gelu")
            self.norm = nn.LayerNorm(d, eps=1e-5)

        def forward(self, x):
            return self.norm(x + self.ffn(x))

    class SwiGLU(nn.Module):  # (silu(x W_gate) * x W_up) W_down, no biases (Shazeer 2020)
        def __init__(self, d, f):
            super().__init__()
            self.w_gate = nn.Linear(d, f, bias=False)
            self.w_up = nn.Linear(d, f, bias=False)
            self.w_down = nn.Linear(f, d, bias=False)

        def forward(self, x):
            return self.w_down(nn.functional.silu(self.w_gate(x)) * self.w_up(x))

    d, f = shape.d_model, shape.d_ff
    if block == "GatedFFN-silu":
        return SwiGLU(d, f), {"w_gate.weight": ("W_gate", True), "w_up.weight": ("W_up", True),
                              "w_down.weight": ("W_down", True)}
    lin = {"lin1.weight": ("W_in", True), "lin1.bias": ("b1", False),
           "lin2.weight": ("W_out", True), "lin2.bias": ("b2", False)}
    if block.startswith("FFNSublayer"):
        pmap = {"ffn." + k: ("ffn." + b, t) for k, (b, t) in lin.items()}
        pmap.update({"norm.weight": ("norm.gamma", False), "norm.bias": ("norm.beta", False)})
        return PostNormFFN(d, f), pmap
    if block.startswith("FFN"):
        return FFN(d, f, block.split("-")[1]), lin
    if block == "GMLP":
        d_in, d_out = shape.dims.get("d_in", d), shape.dims.get("d_out", d)
        return GMLP(d_in, d, f, d_out), {"w_in.weight": ("W_in", True), "w_gate.weight": ("W_gate", True),
                            "w_proj.weight": ("W_proj", True), "w_out.weight": ("W_out", True)}
    if block == "MLP":  # Linear -> ReLU -> ... -> Linear, as engine.nn.layers.MLP with relu
        sizes, layers, pmap = shape.sizes, [], {}
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i:
                layers.append(nn.ReLU())
            pmap[f"{len(layers)}.weight"] = (f"{i}.W", True)
            pmap[f"{len(layers)}.bias"] = (f"{i}.b", False)
            layers.append(nn.Linear(a, b))
        return nn.Sequential(*layers), pmap
    raise ValueError(f"block: no torch module for {block!r}")


def copy_weights(tmod, pmap, bmod) -> None:
    """Load the blasnet module's current weights into the torch module (every parameter)."""
    import torch
    bparams = dict(bmod.named_parameters())
    tparams = dict(tmod.named_parameters())
    if set(tparams) != set(pmap) or {b for b, _ in pmap.values()} != set(bparams):
        raise RuntimeError(f"parameter map mismatch: torch {sorted(tparams)}, "
                           f"blasnet {sorted(bparams)}")
    with torch.no_grad():
        for name, (bname, transposed) in pmap.items():
            w = bparams[bname].data
            tparams[name].copy_(torch.from_numpy(np.ascontiguousarray(w.T if transposed else w)))


def torch_case(c, block: str, set_to_none: bool = True, adamw: str = "default",
               input_grad: bool = True):
    """The torch counterpart of ``cases.build_case``'s dict ``c``, weights copied from it:
    module, x (requires grad as blasnet's backward computes dx: ``input_grad``), target, dy,
    loss, opt and the ``fwd_bwd`` and ``step`` callables."""
    import torch
    tmod, pmap = torch_module(block, c["shape"])
    copy_weights(tmod, pmap, c["module"])
    x = torch.from_numpy(c["x"]).requires_grad_(input_grad)  # shares memory with blasnet's x
    dy = torch.from_numpy(c["dy"])
    if block == "MLP":
        target = torch.from_numpy(np.asarray(c["target"], np.int64))
        loss = torch.nn.CrossEntropyLoss()
    else:
        target = torch.from_numpy(c["target"])
        loss = torch.nn.MSELoss()
    kw = {} if adamw == "default" else {adamw: True}
    opt = torch.optim.AdamW(tmod.parameters(), lr=cases.LR, **kw)

    def fwd_bwd():
        x.grad = None  # blasnet writes dx afresh; torch would otherwise accumulate into x.grad
        tmod(x).backward(dy)

    def step():
        opt.zero_grad(set_to_none=set_to_none)
        x.grad = None
        loss(tmod(x), target).backward()
        opt.step()

    return dict(module=tmod, pmap=pmap, x=x, target=target, dy=dy, loss=loss, opt=opt,
                fwd_bwd=fwd_bwd, step=step)


def check_same(c, t, input_grad: bool = True) -> dict:
    """Both sides from the same weights: the loss, every parameter gradient and input gradient
    (with ``input_grad``), and the loss after one AdamW step. Leaves both with zeroed
    gradients (one step taken)."""
    bmod, tmod = c["module"], t["module"]
    bmod.zero_grad()
    t["opt"].zero_grad(set_to_none=True)
    t["x"].grad = None
    lb = c["loss"].forward(bmod.forward(c["x"]), c["target"])
    dx = bmod.backward(c["loss"].backward(), input_grad=input_grad)
    lt_t = t["loss"](tmod(t["x"]), t["target"])
    lt_t.backward()
    lt = float(lt_t.detach())
    bparams = dict(bmod.named_parameters())
    grad_err = 0.0  # max over tensors of max|g_torch - g_blasnet| / max|g_blasnet|
    pairs = [(dx, t["x"].grad.numpy())] if input_grad else []
    for name, p in tmod.named_parameters():
        bname, transposed = t["pmap"][name]
        g = p.grad.numpy()
        pairs.append((bparams[bname].grad, g.T if transposed else g))
    for ref, got in pairs:
        grad_err = max(grad_err, float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30)))
    c["opt"].step()
    bmod.zero_grad()
    t["opt"].step()
    t["opt"].zero_grad(set_to_none=True)
    t["x"].grad = None
    import torch
    with torch.no_grad():
        lt2 = float(t["loss"](tmod(t["x"]), t["target"]))
    lb2 = c["loss"].forward(bmod.forward(c["x"]), c["target"])
    bmod.backward(c["loss"].backward())  # every forward is followed by one backward
    bmod.zero_grad()
    return dict(loss_blasnet=lb, loss_torch=lt, loss_rel=abs(lt - lb) / abs(lb), grad_err=grad_err,
                loss2_blasnet=lb2, loss2_torch=lt2, loss2_rel=abs(lt2 - lb2) / abs(lb2))


def torch_floor_fn(gemms, seed: int = 0):
    """``floors.floor_fn`` in torch: the same GEMM list through torch.mm / addmm_ with out=
    buffers (transposed operands as views, beta=1 accumulations in place)."""
    import torch
    rng = np.random.default_rng(seed)
    calls = []
    for m, n, k, ta, tb, beta in gemms:
        a = torch.from_numpy((0.01 * rng.standard_normal((k, m) if ta else (m, k))).astype(np.float32))
        b = torch.from_numpy((0.01 * rng.standard_normal((n, k) if tb else (k, n))).astype(np.float32))
        calls.append((torch.zeros(m, n), a.t() if ta else a, b.t() if tb else b, beta))
    mm = torch.mm

    def run():
        for out, a, b, beta in calls:
            if beta:
                out.addmm_(a, b)
            else:
                mm(a, b, out=out)
    run.calls = calls  # (out, op(a), op(b), beta) per GEMM, for the tests
    return run


# ----------------------------------------------------------------------------- timing
def paired_times(fb, ft, quick: bool) -> dict:
    """Alternating bursts of blasnet ``fb`` and torch ``ft`` after a warm-up: the median
    time per call of each (ms) and the median over pairs of torch/blasnet (as
    bench.timing.paired_ratio, with bursts; the order flips every pair)."""
    target_s, min_pairs, warm = settings(quick)
    clock = time.perf_counter
    t0 = clock()
    for i in range(warm):  # first calls allocate work buffers and warm caches; <= ~0.5 s
        fb()
        ft()
        if clock() - t0 > 0.5:
            break
    t0 = clock(); fb(); t1 = clock(); ft(); t2 = clock()  # noqa: E702
    per = max(t1 - t0, t2 - t1, 1e-6)
    k = int(min(MAX_BURST, max(1, math.ceil(BURST_S / per))))
    lead_in = per < LEAD_IN_BELOW_S
    pairs = int(max(min_pairs, min(400, target_s / (2 * (k + lead_in) * per + 2 * SETTLE_S))))

    def burst(f):
        time.sleep(SETTLE_S)
        if lead_in:
            f()
        s = clock()
        for _ in range(k):
            f()
        return (clock() - s) / k

    tb, tt, ratios = [], [], []
    for i in range(pairs):
        if i % 2:
            b_t = burst(ft); b_b = burst(fb)  # noqa: E702
        else:
            b_b = burst(fb); b_t = burst(ft)  # noqa: E702
        tb.append(b_b)
        tt.append(b_t)
        ratios.append(b_t / b_b)
    return dict(blasnet_ms=1e3 * statistics.median(tb), torch_ms=1e3 * statistics.median(tt),
                ratio=statistics.median(ratios), burst=k, pairs=pairs)


GEMM_SHAPES = (  # (M, N, K, trans_a, trans_b): the large FFN's first Linear, fwd and bwd
    (2048, 2048, 512, False, False),   # h (2048, 2048) = x (2048, 512) @ W_in (512, 2048)
    (512, 2048, 2048, True, False),    # dW_in (512, 2048) = x^T @ dh
    (2048, 512, 2048, False, True),    # dx (2048, 512) = dh @ W_in^T
)


def gemm_rows(quick: bool) -> list:
    """Raw GEMM speed: blasnet's gemm_unchecked vs torch.mm (out=) vs np.matmul (out=)."""
    import torch

    from kernels.gemm import gemm_unchecked
    rows = []
    rng = np.random.default_rng(0)
    for m, n, k, ta, tb in GEMM_SHAPES:
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        out_b, out_t, out_n = (np.empty((m, n), np.float32) for _ in range(3))
        ta_, tb_ = torch.from_numpy(a), torch.from_numpy(b)
        opa, opb = (ta_.t() if ta else ta_), (tb_.t() if tb else tb_)
        na, nb = (a.T if ta else a), (b.T if tb else b)
        tout = torch.from_numpy(out_t)
        fb = lambda: gemm_unchecked(out_b, a, b, ta, tb, 1.0, 0.0)  # noqa: E731
        ft = lambda: torch.mm(opa, opb, out=tout)  # noqa: E731
        fn = lambda: np.matmul(na, nb, out=out_n)  # noqa: E731
        vs_t = paired_times(fb, ft, quick)
        vs_n = paired_times(fb, fn, quick)
        ref = na.astype(np.float64) @ nb.astype(np.float64)
        err = max(float(np.max(np.abs(o - ref))) for o in (out_b, out_t, out_n)) / float(np.max(np.abs(ref)))
        gf = 2 * m * n * k / 1e9
        rows.append(dict(gemm=f"{m}x{k}x{n}" + (" A^T" if ta else "") + (" B^T" if tb else ""),
                         blasnet_gfs=gf / (vs_t["blasnet_ms"] / 1e3),
                         torch_gfs=gf / (vs_t["torch_ms"] / 1e3),
                         numpy_gfs=gf / (vs_n["torch_ms"] / 1e3),
                         ratio=vs_t["ratio"], max_rel_err=err))
    return rows


# ----------------------------------------------------------------------------- child
def child(args) -> dict:
    """One thread count: every case, checks then timings; returns the JSON-able results."""
    import kernels  # first: its BLAS controller then sees scipy's OpenBLAS, not torch's pools
    import torch
    n = args.child
    torch.set_num_threads(n)
    info = dict(threads=n, blasnet_threads=kernels.get_num_threads(),
                torch_threads=torch.get_num_threads(), torch=torch.__version__,
                set_to_none=args.set_to_none, adamw=args.adamw, quick=args.quick,
                input_grad=args.input_grad)
    out = dict(info=info, checks=[], rows=[], gemms=[])
    for block, shape_name in selected_cases(args):
        c = cases.build_case(block, shape_name, input_grad=args.input_grad)
        t = torch_case(c, block, args.set_to_none, args.adamw, args.input_grad)
        out["checks"].append(dict(block=block, shape=shape_name,
                                  **check_same(c, t, args.input_grad)))
        label = f"{block} {shape_name} threads={n}"
        print(f"  [{label}] timing", file=sys.stderr, flush=True)
        row = dict(block=block, shape=shape_name, threads=n)
        for kind in ("step", "fwd_bwd"):
            row[kind] = paired_times(c[kind], t[kind], args.quick)
        g = floors.gemm_list(block, c["shape"])
        row["floor"] = paired_times(floors.floor_fn(g), torch_floor_fn(g), args.quick)
        out["rows"].append(row)
    if not args.no_gemm:
        print(f"  [gemm threads={n}] timing", file=sys.stderr, flush=True)
        out["gemms"] = gemm_rows(args.quick)
    return out


def selected_cases(args) -> list:
    want = [c for c in cases.CASES if (not args.block or c[0] in args.block)
            and (not args.shape or c[1] in args.shape)]
    if not want:
        raise SystemExit(f"no case matches --block {args.block} --shape {args.shape}; "
                         f"cases: {cases.CASES}")
    return want


# ----------------------------------------------------------------------------- parent
def child_env(threads: int) -> dict:
    """Every pool sized before import: blasnet's (BLASNET_NUM_THREADS), torch's OpenMP/MKL."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for var in ("BLASNET_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_child(threads: int, argv: list) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(threads), *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(threads), stdout=subprocess.PIPE, text=True)
    print(f"  [threads={threads}] exit {proc.returncode} after {time.perf_counter() - t0:.0f} s",
          file=sys.stderr, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"child at {threads} threads failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_argv(args) -> list:
    """The options a child needs (its thread count comes with --child)."""
    out = ["--set-to-none", str(int(args.set_to_none)), "--adamw", args.adamw,
           "--input-grad", str(int(args.input_grad))]
    out += ["--quick"] * args.quick + ["--no-gemm"] * args.no_gemm
    if args.block:
        out += ["--block", *args.block]
    if args.shape:
        out += ["--shape", *args.shape]
    return out


def report(results: list) -> str:
    """The tables: checks (from the first run; any later mismatch is flagged), the blocks,
    the raw GEMMs."""
    lines = []
    first = results[0]
    i = first["info"]
    dx = ("x.requires_grad (dx computed, as blasnet)" if i.get("input_grad", True) else
          "x is data: no dx on either side (blasnet: input_grad=False, as fit)")
    lines.append(f"blasnet vs PyTorch {i['torch']} (eager, CPU), float32; torch/blasnet > 1: "
                 f"blasnet faster. torch step: zero_grad(set_to_none={i['set_to_none']}), "
                 f"AdamW({i['adamw']}), {dx}. "
                 f"Medians of alternating bursts{' (quick)' if i['quick'] else ''}.")
    lines.append("")
    lines.append(f"Same weights, same numbers (float32): loss, max grad error (params"
                 f"{' and dx' if i.get('input_grad', True) else ''}, "
                 "relative to max|grad|), loss after one AdamW step")
    hdr = f"{'block':<22} {'shape':<8} {'loss blasnet':>13} {'loss torch':>13} {'rel':>8} " \
          f"{'grad err':>9} {'loss2 rel':>9}"
    lines += [hdr, "-" * len(hdr)]
    for ch in first["checks"]:
        lines.append(f"{ch['block']:<22} {ch['shape']:<8} {ch['loss_blasnet']:>13.7g} "
                     f"{ch['loss_torch']:>13.7g} {ch['loss_rel']:>8.1e} {ch['grad_err']:>9.1e} "
                     f"{ch['loss2_rel']:>9.1e}")
    bad = [(r["info"]["threads"], ch["block"], ch["shape"]) for r in results for ch in r["checks"]
           if not (ch["loss_rel"] < 1e-5 and ch["grad_err"] < 1e-4 and ch["loss2_rel"] < 1e-5)]
    lines.append("checks: all agree to float32 tolerance (loss 1e-5, grads 1e-4)" if not bad
                 else f"checks: MISMATCH at (threads, block, shape) {bad}")
    lines.append("")
    hdr = (f"{'block':<22} {'shape':<8} {'thr':>3} | {'step ms':>8} {'torch':>8} {'t/b':>5} | "
           f"{'fwd+bwd':>8} {'torch':>8} {'t/b':>5} | {'GEMMs':>8} {'torch':>8} {'t/b':>5}")
    lines += [hdr, "-" * len(hdr)]
    rows = [r for res in results for r in res["rows"]]
    order = {c: k for k, c in enumerate(cases.CASES)}
    rows.sort(key=lambda r: (order.get((r["block"], r["shape"]), 99), r["threads"]))
    for r in rows:
        cells = []
        for kind in ("step", "fwd_bwd", "floor"):
            m = r.get(kind)
            cells.append(f"{m['blasnet_ms']:>8.3f} {m['torch_ms']:>8.3f} {m['ratio']:>5.2f}"
                         if m else " " * 23)
        lines.append(f"{r['block']:<22} {r['shape']:<8} {r['threads']:>3} | " + " | ".join(cells))
    lines.append("GEMMs: the block's forward+backward GEMM list alone (bench/floors.py), blasnet "
                 "gemm_unchecked vs torch.mm/addmm_.")
    if any(res["gemms"] for res in results):
        lines.append("")
        hdr = (f"{'raw GEMM (MxKxN)':<24} {'thr':>3} {'blasnet GF/s':>12} {'torch GF/s':>11} "
               f"{'numpy GF/s':>11} {'t/b':>5}")
        lines += [hdr, "-" * len(hdr)]
        for res in results:
            for g in res["gemms"]:
                lines.append(f"{g['gemm']:<24} {res['info']['threads']:>3} {g['blasnet_gfs']:>12.1f} "
                             f"{g['torch_gfs']:>11.1f} {g['numpy_gfs']:>11.1f} {g['ratio']:>5.2f}")
    return "\n".join(lines)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer timed pairs (~4x shorter)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--block", nargs="+", choices=cases.BLOCKS, help="only these blocks")
    p.add_argument("--shape", nargs="+", choices=sorted(cases.SHAPES), help="only these shapes")
    p.add_argument("--set-to-none", type=int, choices=(0, 1), default=1,
                   help="torch zero_grad(set_to_none=...) (default 1, torch's default)")
    p.add_argument("--adamw", choices=("default", "foreach", "fused"), default="default",
                   help="torch AdamW implementation (default: torch's choice, for-loop on CPU)")
    p.add_argument("--input-grad", type=int, choices=(0, 1), default=1,
                   help="1: both compute the input gradient (a block inside a network); 0: x is "
                        "data, as in fit (no requires_grad; backward(dy, input_grad=False))")
    p.add_argument("--no-gemm", action="store_true", help="skip the raw GEMM table")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.set_to_none = bool(args.set_to_none)
    args.input_grad = bool(args.input_grad)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    if not have_torch():
        print(INSTALL_HINT.format(python=sys.executable, root=ROOT))
        return 0
    if args.child is not None:
        print(json.dumps(child(args)))
        return 0
    results = [run_child(n, child_argv(args)) for n in args.threads]
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
