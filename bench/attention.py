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
  required.

Prints a table and writes the numbers as JSON (default bench/results/attention.json).
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

# (B, T, d_model, n_heads) and the target for forward+backward / GEMM floor.
MHA_SHAPES = [((8, 256, 384, 6), 1.3), ((4, 64, 128, 4), 1.6)]
GPT_SHAPE = dict(vocab=103, n_layer=4, n_head=4, d_model=128, seq_len=128, batch=16)
# --tiny (the test suite's smoke run): every part of the bench at sizes that take no time.
TINY_MHA = [((2, 8, 12, 3), 1.6)]
TINY_GPT = dict(vocab=11, n_layer=1, n_head=2, d_model=8, seq_len=8, batch=2)


def mha_case(shape, dtype=np.float32):
    """(fn, floor, flops): forward+backward of a causal MultiHeadAttention at ``shape``."""
    from engine.nn.attention import MultiHeadAttention
    b, t, d, h = shape
    m = MultiHeadAttention(d, h, causal=True, dtype=dtype, rng=0)
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


def gpt_case(s=GPT_SHAPE, dtype=np.float32):
    """(step, floor, model, ids, targets): a GPT training step and the GEMMs of its forward
    and backward replayed."""
    from engine.models.gpt import GPT
    from engine.nn.losses import CrossEntropyLoss
    from engine.optim import AdamW
    m = GPT(s["vocab"], s["seq_len"], s["n_layer"], s["n_head"], s["d_model"], dtype=dtype,
            rng=0)
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
    """The same GPT step in PyTorch (nanoGPT's layout, float32), or None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch
    nn, F = torch.nn, torch.nn.functional
    d, h = s["d_model"], s["n_head"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (a.view(b, t, h, d // h).transpose(1, 2) for a in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(s["vocab"], d), nn.Embedding(s["seq_len"], d)
            self.h = nn.ModuleList([Block() for _ in range(s["n_layer"])])
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, s["vocab"], bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            return self.head(self.ln_f(x))

    torch.manual_seed(0)
    model = GPT()
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


def _median_ms(fn, rounds):
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer pairs")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (default: as set)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention.json"))
    a = ap.parse_args(argv)
    import kernels
    if a.threads is not None:
        kernels.set_num_threads(a.threads)
    per_pair = 0.05 if a.tiny else 0.5 if a.quick else 2.0
    mha_shapes, s = (TINY_MHA, TINY_GPT) if a.tiny else (MHA_SHAPES, GPT_SHAPE)
    if a.tiny:  # a smoke run: no replacement samples, no waiting for a quiet machine
        timing.spend_extra(timing.extra_left())
    rows = []
    print(f"blasnet attention bench | float32 | {kernels.get_num_threads()} thread(s)")
    print(f"{'case':<40} {'ms':>8} {'floor ms':>9} {'ratio':>7} {'target':>7} {'GF/s':>7}")
    for shape, target in mha_shapes:
        fn, floor, flops = mha_case(shape)
        timing.warm_up(fn)
        r = timing.paired_ratio(fn, floor, per_pair)
        ms, fl = _median_ms(fn, 5), _median_ms(floor, 5)
        name = "MHA fwd+bwd (B, T, d, h) = " + str(shape)
        rows.append(dict(case=name, ms=ms, floor_ms=fl, ratio=r.value, target=target,
                         gflops=flops / ms / 1e6, kept=[r.kept, r.total]))
        print(f"{name:<40} {ms:8.2f} {fl:9.2f} {r.value:7.3f} {target:7.1f} "
              f"{flops / ms / 1e6:7.1f}")
    step, floor, model, _, _ = gpt_case(s)
    timing.warm_up(step)
    r = timing.paired_ratio(step, floor, per_pair)
    ms, fl = _median_ms(step, 5), _median_ms(floor, 5)
    name = f"GPT step L{s['n_layer']} h{s['n_head']} d{s['d_model']} T{s['seq_len']} B{s['batch']}"
    tokens = s["batch"] * s["seq_len"]
    row = dict(case=name, ms=ms, floor_ms=fl, ratio=r.value, kept=[r.kept, r.total],
               tokens_per_s=tokens / ms * 1e3, parameters=model.num_parameters())
    print(f"{name:<40} {ms:8.2f} {fl:9.2f} {r.value:7.3f} {'':>7} {'':>7}  "
          f"{tokens / ms * 1e3:,.0f} tokens/s")
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
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(threads=kernels.get_num_threads(), rows=rows), indent=1))
    return 0 if all(math.isfinite(x["ratio"]) for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
