"""nanoGPT's CPU recipe, blasnet against PyTorch, each side in its own process.

``python bench/gpt_recipe.py [--threads 1 2] [--iters 100] [--rounds 3]`` trains the recipe of
nanoGPT's README for a CPU (``config/train_shakespeare_char.py`` with ``--block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0``: a tied head, AdamW lr 1e-3,
betas (0.9, 0.99), weight decay 0.1 on the 2-D weights only, gradient clipping at 1.0) on
random windows of one fixed id stream, and prints each side's median ms per iteration after a
burn-in. The sides alternate process by process (blasnet, torch, blasnet, ...), so machine
drift touches both; the ratio is torch / blasnet per adjacent pair (> 1: blasnet faster), its
median over the pairs. Both sides have biases unless ``--no-bias`` (where the GPT takes it).

The torch side needs ``torch`` (not a blasnet dependency): pass the interpreter that has it
with ``--torch-python`` (with blasnet's tree on PYTHONPATH is not needed: the torch child
imports numpy and torch only). Without it, only blasnet's side is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RECIPE = dict(vocab=65, block_size=64, batch=12, n_layer=4, n_head=4, n_embd=128, lr=1e-3,
              betas=(0.9, 0.99), weight_decay=0.1, grad_clip=1.0)
BURN_IN = 20
STREAM = 200_000  # ids in the fixed random stream the windows are drawn from


def windows(rng, stream, s):
    """nanoGPT's get_batch: ``batch`` random windows of ``block_size`` and their targets."""
    import numpy as np
    starts = rng.integers(0, len(stream) - s["block_size"] - 1, s["batch"])
    x = np.stack([stream[i:i + s["block_size"]] for i in starts])
    y = np.stack([stream[i + 1:i + 1 + s["block_size"]] for i in starts])
    return x, y


def blasnet_step(s, bias: bool):
    """A recipe iteration of blasnet's GPT: ``step(x, y)``, returning the loss before the update."""
    sys.path.insert(0, str(ROOT))
    from engine import GPT, AdamW, CrossEntropyLoss, clip_grad_norm
    kw = {} if bias else {"bias": False}
    m = GPT(s["vocab"], s["block_size"], s["n_layer"], s["n_head"], s["n_embd"], rng=0, **kw)
    decay = [p for p in m.parameters() if p.data.ndim == 2]
    other = [p for p in m.parameters() if p.data.ndim != 2]
    opt = AdamW([{"params": decay}, {"params": other, "weight_decay": 0.0}], lr=s["lr"],
                betas=s["betas"], weight_decay=s["weight_decay"])
    loss = CrossEntropyLoss()
    params = m.parameters()

    def step(x, y):
        value = loss.forward(m.forward(x), y)
        m.backward(loss.backward(), input_grad=False)
        clip_grad_norm(params, s["grad_clip"])
        opt.step()
        m.zero_grad()
        return value
    return step


def torch_gpt(s, bias: bool):
    """nanoGPT's ``GPT`` (model.py) in PyTorch with its module names (``transformer.wte``,
    ``.wpe``, ``.h.<i>.ln_1``, ``.attn.c_attn``, ``.attn.c_proj``, ``.ln_2``, ``.mlp.c_fc``,
    ``.mlp.c_proj``, ``.ln_f``, ``lm_head`` tied to ``wte``), so that
    ``engine.to_torch_state_dict`` of blasnet's GPT loads into it with ``load_state_dict``;
    attention by ``scaled_dot_product_attention``, exact GELU, no dropout."""
    import torch
    nn = torch.nn
    d = s["n_embd"]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(s["vocab"], d), wpe=nn.Embedding(s["block_size"], d),
                h=nn.ModuleList([_torch_block(d, s["n_head"], bias)
                                 for _ in range(s["n_layer"])]),
                ln_f=nn.LayerNorm(d, bias=bias)))
            self.lm_head = nn.Linear(d, s["vocab"], bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # nanoGPT's weight tying

        def forward(self, idx):
            tr = self.transformer
            x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
            for blk in tr.h:
                x = blk(x)
            return self.lm_head(tr.ln_f(x))

    return Model()


def _torch_block(d: int, h: int, bias: bool):
    """nanoGPT's ``Block``: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""
    import torch
    nn, F = torch.nn, torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d, bias=bias)
            self.c_proj = nn.Linear(d, d, bias=bias)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (a.view(b, t, h, d // h).transpose(1, 2) for a in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(d, 4 * d, bias=bias)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * d, d, bias=bias)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d, bias=bias)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(d, bias=bias)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    return Block()


def torch_adamw(m, s, fused: bool = True):
    """nanoGPT's ``configure_optimizers``: weight decay on the parameters of 2 or more
    dimensions (the tied ``wte`` once), none on the LayerNorm gains and biases."""
    import torch
    decay = [p for p in m.parameters() if p.dim() >= 2]
    other = [p for p in m.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": s["weight_decay"]},
              {"params": other, "weight_decay": 0.0}]
    if fused:
        try:
            return torch.optim.AdamW(groups, lr=s["lr"], betas=s["betas"], fused=True)
        except (RuntimeError, TypeError):  # a torch without the fused CPU AdamW
            pass
    return torch.optim.AdamW(groups, lr=s["lr"], betas=s["betas"])


def torch_step(s, bias: bool):
    """The same iteration in PyTorch: nanoGPT's GPT (``torch_gpt``), fused AdamW where this
    torch has it."""
    import torch
    F = torch.nn.functional
    torch.manual_seed(0)
    m = torch_gpt(s, bias)
    opt = torch_adamw(m, s)

    def step(x, y):
        logits = m(torch.from_numpy(x))
        F.cross_entropy(logits.view(-1, logits.size(-1)), torch.from_numpy(y).view(-1)).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), s["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def child(side: str, iters: int, bias: bool, burn_in: int = BURN_IN) -> dict:
    """Time ``iters`` iterations of one side after ``burn_in``; ms per iteration."""
    import numpy as np
    s = RECIPE
    if side == "torch":
        import torch
        torch.set_num_threads(int(os.environ.get("BLASNET_NUM_THREADS", "1")))
        step = torch_step(s, bias)
    else:
        step = blasnet_step(s, bias)
    rng = np.random.default_rng(1)
    stream = np.random.default_rng(0).integers(0, s["vocab"], STREAM)
    times = []
    for i in range(burn_in + iters):
        x, y = windows(rng, stream, s)
        t0 = time.perf_counter()
        step(x, y)
        if i >= burn_in:
            times.append(time.perf_counter() - t0)
    return {"side": side, "median_ms": 1e3 * statistics.median(times)}


def _run(python: str, side: str, threads: int, a) -> float:
    env = dict(os.environ, BLASNET_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    cmd = [python, str(Path(__file__).resolve()), "--child", side, "--iters", str(a.iters),
           "--burn-in", str(a.burn_in)]
    if not a.bias:
        cmd.append("--no-bias")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])["median_ms"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--iters", type=int, default=100, help="timed iterations per process")
    ap.add_argument("--rounds", type=int, default=3, help="process pairs per thread count")
    ap.add_argument("--burn-in", type=int, default=BURN_IN, help="untimed iterations first")
    ap.add_argument("--no-bias", dest="bias", action="store_false")
    ap.add_argument("--torch-python", default=None, help="an interpreter that imports torch")
    ap.add_argument("--child", choices=("blasnet", "torch"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.iters, a.bias, a.burn_in)))
        return 0
    print(f"nanoGPT CPU recipe {RECIPE}, bias={a.bias}; ms per iteration, median of {a.iters} "
          f"after {a.burn_in}; each side in its own process, alternated")
    print(f"{'threads':>7} {'blasnet ms':>11} {'torch ms':>9} {'torch/blasnet (pairs)':>24}")
    for t in a.threads:
        ours, theirs = [], []
        for _ in range(a.rounds):
            ours.append(_run(sys.executable, "blasnet", t, a))
            if a.torch_python:
                theirs.append(_run(a.torch_python, "torch", t, a))
        ratios = [b / o for o, b in zip(ours, theirs)]
        cell = (f"{statistics.median(ratios):.3f} ({', '.join(f'{r:.2f}' for r in ratios)})"
                if ratios else "-")
        tm = f"{statistics.median(theirs):9.2f}" if theirs else f"{'-':>9}"
        print(f"{t:>7} {statistics.median(ours):11.2f} {tm} {cell:>24}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
