"""Multi-head attention and a GPT training step against their GEMM floors (float32).

``python bench/attention.py [--quick] [--threads N] [--out FILE]`` times, in one process:

- MultiHeadAttention (causal) forward + backward at (B, T, d, h) = (8, 256, 384, 6) (nanoGPT's
  shakespeare-char width) and (4, 64, 128, 4), as a ratio to its GEMM floor: the same GEMM
  calls, replayed on the module's own buffers (bench.floors.replay_fn), alternated pair by
  pair with the module (bench.timing.paired_ratio), so machine drift cancels;
- a GPT training step (4 layers, 4 heads, d_model 128, T 128, 16 sequences, vocabulary 103:
  forward, cross-entropy, backward, AdamW, zero_grad) as a ratio to the GEMMs of its forward
  and backward;
- where torch is installed, the same GPT step in PyTorch (eager, nanoGPT's layout with
  scaled_dot_product_attention) as torch/blasnet (> 1: blasnet faster). Reported, never
  required;
- nanoGPT's CPU recipe (Karpathy's README: block_size 64, batch 12, n_layer 4, n_head 4,
  n_embd 128, dropout 0, shakespeare_char's 65 tokens; bias off, tied head) at 1 and 2
  threads: the step as a ratio to the GEMM floor of the compiled-attention step, with the
  attention heads compiled (kernels.sdpa) and as per-head BLAS GEMMs (the path before it),
  and the BLAS calls per step of each; at 2+ threads also the step without the lane
  thread for the backward's weight gradients (kernels.overlap) over the step with it.

Every row also prints a ``bound``: the ratio the step would reach if attention's own products
(S = q k^T, P v and the four of the backward), which the compiled heads run outside BLAS and
so outside the floor, ran at the floor GEMMs' rate and nothing else took time
(``attention_bound``). A target below it cannot be met by faster attention alone.

``--paths`` instead times MultiHeadAttention forward+backward with the compiled heads
against the per-head BLAS GEMMs over head sizes 32, 64 and T 64..1024 (full attention also
T 32, where the rule's crossover is) (the table behind
``engine.nn.attention.kernel_wins``). Prints a table and writes the numbers as JSON (default
bench/results/attention.json).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:  # run as a script: make "bench", "kernels", "engine" importable
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench import floors, timing  # noqa: E402

# Step / GEMM floor targets: GPT steps and MHA forward+backward alike (docs/performance.md).
TARGET = 1.15
# (B, T, d_model, n_heads) and the target for forward+backward / GEMM floor.
MHA_SHAPES = [((8, 256, 384, 6), TARGET), ((4, 64, 128, 4), TARGET)]
GPT_SHAPE = dict(vocab=103, n_layer=4, n_head=4, d_model=128, seq_len=128, batch=16)
# --tiny (the test suite's smoke run): every part of the bench at sizes that take no time.
TINY_MHA = [((2, 8, 12, 3), TARGET)]
TINY_GPT = dict(vocab=11, n_layer=1, n_head=2, d_model=8, seq_len=8, batch=2)
# nanoGPT's CPU recipe on shakespeare_char (bias=False as its config allows; tied head).
NANOGPT_CPU = dict(vocab=65, n_layer=4, n_head=4, d_model=128, seq_len=64, batch=12,
                   bias=False)
TINY_NANOGPT = dict(vocab=11, n_layer=1, n_head=2, d_model=8, seq_len=8, batch=2, bias=False)
# --paths: (d_head, T, causal) per case, 4 heads; B = 8 sequences (2 at T = 1024).
PATH_CASES = ([(dh, t, True) for dh in (32, 64) for t in (64, 128, 256, 1024)]
              + [(dh, t, False) for dh in (32, 64) for t in (32, 64, 256, 1024)])
TINY_PATH_CASES = [(4, 8, True), (4, 8, False)]


def mha_case(shape, dtype=np.float32, path="auto", causal=True):
    """(fn, floor, flops): forward+backward of a MultiHeadAttention (causal by default) at
    ``shape``, its heads run as ``path`` says (MultiHeadAttention.path)."""
    from engine.nn.attention import MultiHeadAttention
    b, t, d, h = shape
    m = MultiHeadAttention(d, h, causal=causal, dtype=dtype, rng=0)
    m.path = path
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, t, d)).astype(dtype)
    dy = (0.01 * rng.standard_normal((b, t, d))).astype(dtype)

    def fn():
        m.forward(x)
        m.backward(dy)
    fn()
    floor = floors.replay_fn(fn)
    from engine.models import registry
    gemms = registry.get("MultiHeadAttention").gemms(b * t, {"d_model": d, "seq_len": t},
                                                     n_heads=h)
    return fn, floor, floors.gemm_flops(gemms)


def set_path(model, path: str) -> None:
    """Set ``path`` on every MultiHeadAttention inside ``model``."""
    from engine.nn.attention import MultiHeadAttention
    for _, m in model.named_modules():
        if isinstance(m, MultiHeadAttention):
            m.path = path


def gpt_case(s=GPT_SHAPE, dtype=np.float32, path="auto"):
    """(step, floor, model, ids, targets): a GPT training step and the GEMMs of its forward
    and backward replayed; attention heads as ``path`` says."""
    from engine.models.gpt import GPT
    from engine.nn.losses import CrossEntropyLoss
    from engine.optim import AdamW
    m = GPT(s["vocab"], s["seq_len"], s["n_layer"], s["n_head"], s["d_model"], dtype=dtype,
            bias=s.get("bias", True), rng=0)
    set_path(m, path)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, s["vocab"], (s["batch"], s["seq_len"]))
    tgt = rng.integers(0, s["vocab"], (s["batch"], s["seq_len"]))
    loss, opt = CrossEntropyLoss(), AdamW(m.parameters(), lr=1e-4)

    def fwd_bwd():
        loss.forward(m.forward(ids), tgt)
        m.backward(loss.backward())

    def step():
        fwd_bwd()
        opt.step()
        m.zero_grad()
    step()
    floor = floors.replay_fn(fwd_bwd)
    m.zero_grad()
    return step, floor, m, ids, tgt


def torch_gpt_step(s=GPT_SHAPE):
    """The same GPT step in PyTorch (nanoGPT's layout, bench/gpt_recipe.py's ``torch_gpt``,
    with biases, AdamW lr 1e-4), or None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch
    from bench.gpt_recipe import torch_gpt
    F = torch.nn.functional
    torch.manual_seed(0)
    model = torch_gpt(dict(vocab=s["vocab"], block_size=s["seq_len"], n_layer=s["n_layer"],
                           n_head=s["n_head"], n_embd=s["d_model"]), bias=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, s["vocab"], (s["batch"], s["seq_len"])))
    tgt = torch.from_numpy(rng.integers(0, s["vocab"], (s["batch"], s["seq_len"])))

    def step():
        out = model(ids)
        F.cross_entropy(out.view(-1, out.shape[-1]), tgt.view(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return step, torch


def attention_flops(batch, seq_len, d_model, n_heads, causal=True, n_layer=1) -> int:
    """FLOPs of attention's own products in one forward + backward, which the compiled heads
    run outside BLAS and so outside the GEMM floor: per (sequence, head) S = q k^T and
    O = P v forward, dP = dO v^T, dv = P^T dO, dq = dS k and dk = dS^T q backward, each
    T x T x d_head multiply-adds, of which a causal mask leaves T (T + 1) / 2 x d_head."""
    t, dh = seq_len, d_model // n_heads
    pairs = t * (t + 1) // 2 if causal else t * t
    return n_layer * 6 * 2 * batch * n_heads * pairs * dh


def gpt_attention_flops(s) -> int:
    """``attention_flops`` of a GPT case ``s`` (causal, every layer)."""
    return attention_flops(s["batch"], s["seq_len"], s["d_model"], s["n_head"],
                           n_layer=s["n_layer"])


def floor_flops(floor) -> int:
    """2 M N K summed over the GEMM calls a ``floors.replay_fn`` floor replays."""
    return floors.gemm_flops([floors.gemm_mnk(args) for args in floor.calls])


def attention_bound(floor, attn_flops) -> float:
    """The step / floor ratio a step would reach if attention's products ran at the floor
    GEMMs' own rate (FLOPs per second) and nothing else outside the GEMMs took any time:
    1 + attention FLOPs / floor FLOPs. A target below it asks the compiled heads to beat
    BLAS at its own shapes' rate with a free softmax."""
    return 1 + attn_flops / floor_flops(floor)


def _median_ms(fn, rounds):
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))


# The engine's calls into BLAS: GEMMs, and the column sums of bias gradients (gemv).
BLAS_OPS = ("gemm", "colsum")


def blas_calls(fn) -> int:
    """How many BLAS calls one ``fn()`` makes (kernels.instrument)."""
    from kernels import instrument
    with instrument.record(BLAS_OPS) as rec:
        fn()
    return len(rec.calls)


def _without_lane(step):
    """``step`` with the backward's weight gradients run in place, not on the lane thread
    (kernels.overlap)."""
    from kernels import overlap

    def run():
        overlap.ENABLED[0] = False
        try:
            step()
        finally:
            overlap.ENABLED[0] = True
    return run


def nanogpt_rows(s, per_pair, thread_counts) -> list:
    """nanoGPT's CPU-recipe step at each thread count: its ratio to the GEMM floor of the
    compiled-attention step with the heads compiled ("kernel") and as per-head GEMMs
    ("blas", the path before the compiled heads), the two steps paired against each other,
    and the BLAS calls per step of each."""
    import kernels
    rows, before = [], kernels.get_num_threads()
    name = f"nanoGPT-cpu step L{s['n_layer']} h{s['n_head']} d{s['d_model']} " \
           f"T{s['seq_len']} B{s['batch']}"
    try:
        for threads in thread_counts:
            kernels.set_num_threads(threads)
            step, floor, _, _, _ = gpt_case(s, path="kernel")
            old, _, _, _, _ = gpt_case(s, path="blas")
            for fn in (step, old, floor):
                timing.warm_up(fn)
            r_new = timing.paired_ratio(step, floor, per_pair)
            r_old = timing.paired_ratio(old, floor, per_pair)
            r_pair = timing.paired_ratio(old, step, per_pair)
            lane = None  # 2+ threads: the step without the weight gradients' lane / with it
            if threads > 1:
                lane = timing.paired_ratio(_without_lane(step), step, per_pair).value
            bound = attention_bound(floor, gpt_attention_flops(s))
            row = dict(case=f"{name} {threads}t", threads=threads, ratio=r_new.value,
                       without_lane_over_lane=lane,
                       target=TARGET, attention_bound=bound,
                       ratio_blas_heads=r_old.value, blas_heads_over_kernel=r_pair.value,
                       ms=_median_ms(step, 5), ms_blas_heads=_median_ms(old, 5),
                       floor_ms=_median_ms(floor, 5), blas_calls=blas_calls(step),
                       blas_calls_blas_heads=blas_calls(old), kept=[r_new.kept, r_new.total])
            rows.append(row)
            print(f"{row['case']:<40} {row['ms']:8.2f} {row['floor_ms']:9.2f} "
                  f"{r_new.value:7.3f} {TARGET:7.2f} {bound:7.3f}  per-head BLAS: "
                  f"{row['ms_blas_heads']:.2f} ms, ratio "
                  f"{r_old.value:.3f}, {r_pair.value:.2f}x the compiled step; BLAS calls "
                  f"{row['blas_calls']} vs {row['blas_calls_blas_heads']}"
                  + ("" if lane is None else f"; without the lane {lane:.3f}x"))
    finally:
        kernels.set_num_threads(before)
    return rows


def path_rows(cases, per_pair) -> list:
    """MultiHeadAttention forward+backward, compiled heads against per-head GEMMs, per
    (d_head, T, causal): 4 heads, 8 sequences (2 at T >= 1024)."""
    from engine.nn.attention import kernel_wins
    rows = []
    print(f"{'d_head':>6} {'T':>5} {'causal':>6} {'B':>3} {'kernel ms':>10} {'BLAS ms':>9} "
          f"{'kernel/BLAS':>11} {'rule':>7}")
    for dh, t, causal in cases:
        shape = (2 if t >= 1024 else 8, t, 4 * dh, 4)
        fn_k, _, _ = mha_case(shape, path="kernel", causal=causal)
        fn_b, _, _ = mha_case(shape, path="blas", causal=causal)
        timing.warm_up(fn_k)
        timing.warm_up(fn_b)
        r = timing.paired_ratio(fn_k, fn_b, per_pair)
        row = dict(d_head=dh, T=t, causal=causal, B=shape[0], kernel_ms=_median_ms(fn_k, 5),
                   blas_ms=_median_ms(fn_b, 5), kernel_over_blas=r.value,
                   rule="kernel" if kernel_wins(t, dh, causal) else "blas",
                   kept=[r.kept, r.total])
        rows.append(row)
        print(f"{dh:6d} {t:5d} {str(causal):>6} {shape[0]:3d} {row['kernel_ms']:10.2f} "
              f"{row['blas_ms']:9.2f} {r.value:11.3f} {row['rule']:>7}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer pairs")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (default: as set)")
    ap.add_argument("--paths", action="store_true",
                    help="only the compiled-vs-BLAS attention table")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention.json"))
    a = ap.parse_args(argv)
    import kernels
    if a.threads is not None:
        kernels.set_num_threads(a.threads)
    per_pair = 0.05 if a.tiny else 0.5 if a.quick else 2.0
    if a.tiny:  # a smoke run: no replacement samples, no waiting for a quiet machine
        timing.spend_extra(timing.extra_left())
    print(f"blasnet attention bench | float32 | {kernels.get_num_threads()} thread(s)")
    if a.paths:
        rows = path_rows(TINY_PATH_CASES if a.tiny else PATH_CASES, per_pair)
        ok = all(math.isfinite(x["kernel_over_blas"]) for x in rows)
    else:
        rows = _cases(a, per_pair)
        ok = all(math.isfinite(x["ratio"]) for x in rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(threads=kernels.get_num_threads(), rows=rows), indent=1))
    return 0 if ok else 1


def _cases(a, per_pair) -> list:
    """The MHA shapes, the GPT step (and PyTorch's), nanoGPT's CPU recipe: one row each."""
    import kernels
    mha_shapes, s = (TINY_MHA, TINY_GPT) if a.tiny else (MHA_SHAPES, GPT_SHAPE)
    rows = []
    print(f"{'case':<40} {'ms':>8} {'floor ms':>9} {'ratio':>7} {'target':>7} {'bound':>7} "
          f"{'GF/s':>7}")
    for shape, target in mha_shapes:
        fn, floor, flops = mha_case(shape)
        timing.warm_up(fn)
        r = timing.paired_ratio(fn, floor, per_pair)
        ms, fl = _median_ms(fn, 5), _median_ms(floor, 5)
        name = "MHA fwd+bwd (B, T, d, h) = " + str(shape)
        bound = attention_bound(floor, attention_flops(*shape))
        rows.append(dict(case=name, ms=ms, floor_ms=fl, ratio=r.value, target=target,
                         attention_bound=bound, gflops=flops / ms / 1e6,
                         kept=[r.kept, r.total]))
        print(f"{name:<40} {ms:8.2f} {fl:9.2f} {r.value:7.3f} {target:7.2f} {bound:7.3f} "
              f"{flops / ms / 1e6:7.1f}")
    step, floor, model, _, _ = gpt_case(s)
    timing.warm_up(step)
    r = timing.paired_ratio(step, floor, per_pair)
    ms, fl = _median_ms(step, 5), _median_ms(floor, 5)
    name = f"GPT step L{s['n_layer']} h{s['n_head']} d{s['d_model']} T{s['seq_len']} B{s['batch']}"
    tokens = s["batch"] * s["seq_len"]
    bound = attention_bound(floor, gpt_attention_flops(s))
    row = dict(case=name, ms=ms, floor_ms=fl, ratio=r.value, target=TARGET,
               attention_bound=bound, kept=[r.kept, r.total], tokens_per_s=tokens / ms * 1e3,
               parameters=model.num_parameters())
    print(f"{name:<40} {ms:8.2f} {fl:9.2f} {r.value:7.3f} {TARGET:7.2f} {bound:7.3f} "
          f"{'':>7}  {tokens / ms * 1e3:,.0f} tokens/s")
    t = torch_gpt_step(s)
    if t is None:
        print("torch: not installed; no PyTorch comparison (it is optional)")
    else:
        tstep, torch = t
        torch.set_num_threads(kernels.get_num_threads())
        timing.warm_up(tstep)
        tr = timing.paired_ratio(tstep, step, per_pair)
        row.update(torch_ms=_median_ms(tstep, 5), torch_over_blasnet=tr.value,
                   torch_version=torch.__version__)
        print(f"{'  PyTorch ' + torch.__version__ + ' same step':<40} {row['torch_ms']:8.2f} "
              f"{'':>9} torch/blasnet {tr.value:.2f}")
    rows.append(row)
    rows += nanogpt_rows(TINY_NANOGPT if a.tiny else NANOGPT_CPU, per_pair, (1, 2))
    return rows


if __name__ == "__main__":
    sys.exit(main())
