"""nanoGPT's CPU recipe trained by blasnet and by PyTorch from the same weights on the same
batches: the held-out losses side by side.

``python bench/lm_vs_torch.py --torch-python /work/torchvenv/bin/python [--iters 2000]
[--threads 1]`` reads the recipe ``bench/nanogpt-cpu.toml`` as ``train --config`` does and
builds the run ``train --model gpt`` makes of it on the built-in corpus (its GPT, split,
``RandomWindows`` batches and held-out estimate windows, all from the seed). This process
writes the GPT's initial weights under nanoGPT's names (``engine.to_torch_state_dict``),
every training batch and the held-out windows to one ``.npz``; then, each in its own process
and at the same time:

- blasnet: ``python -m engine train --model gpt --config bench/nanogpt-cpu.toml`` itself,
  whose held-out estimates are read from its ``--out-dir`` checkpoint and its log;
- PyTorch: nanoGPT's ``GPT`` (``bench/gpt_recipe.py``'s ``torch_gpt``) loaded with those
  weights, trained on those batches with nanoGPT's loop (its ``get_lr``, AdamW with decay on
  the 2-D parameters, ``clip_grad_norm_``), the held-out mean loss at the same steps.

Both sides are float32 on ``--threads`` BLAS/torch threads each. The difference of the final
held-out losses is the figure; losses are nats per token.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "bench" / "nanogpt-cpu.toml"


# ----------------------------------------------------------------------------- blasnet side
def _config(iters: int):
    """The ``GPTConfig`` that ``train --model gpt --config RECIPE --max-iters iters`` runs."""
    sys.path.insert(0, str(ROOT))
    from engine.cli.lm import GPT, config_of
    from engine.cli.parser import build_parser, train_actions
    from engine.cli.recipe import apply_recipe
    args = build_parser().parse_args(["train", "--model", "gpt", "--config", str(RECIPE),
                                      "--max-iters", str(iters)])
    apply_recipe(args, train_actions())
    return config_of(args, GPT)


def write_inputs(path: str, iters: int) -> dict:
    """The run's initial weights (nanoGPT's names), its ``iters`` batches and held-out windows
    to ``path``; returns the recipe's numbers the torch side needs."""
    from engine import to_torch_state_dict
    from engine.training import gpt_lm
    c = _config(iters)
    s = gpt_lm.setup(c)
    X = np.empty((iters, c.batch_size, c.seq_len), np.int64)  # (iters, B, T) every batch
    Y = np.empty_like(X)
    for i in range(iters):  # the same draws as fit's: the sampler is seeded as in train
        X[i], Y[i] = s.sampler.sample()
    state = {f"w.{k}": np.ascontiguousarray(v) for k, v in to_torch_state_dict(s.model).items()}
    np.savez(path, X=X, Y=Y, Xh=s.Xh, Yh=s.Yh, **state)
    from engine.nn.losses import CrossEntropyLoss
    loss = CrossEntropyLoss()
    first = float(loss.forward(s.model.forward(X[0]), Y[0]))
    return dict(vocab=len(s.vocab), block_size=c.seq_len, n_layer=c.n_layer, n_head=c.n_head,
                n_embd=c.d_model, bias=c.bias, lr=c.lr, min_lr=c.min_lr, warmup_iters=c.warmup,
                lr_decay_iters=c.lr_decay_iters, betas=(c.beta1, c.beta2),
                weight_decay=c.weight_decay, grad_clip=c.grad_clip, iters=iters,
                eval_interval=c.eval_interval, batch=c.batch_size, first_loss=first)


def blasnet_command(iters: int, threads: int, out_dir: str) -> list:
    return [sys.executable, "-m", "engine", "train", "--model", "gpt", "--config", str(RECIPE),
            "--max-iters", str(iters), "--threads", str(threads), "--out-dir", out_dir,
            "--sample-length", "0"]


def blasnet_result(stdout: str, out_dir: str) -> dict:
    """The held-out estimates of the run's log, the last one exact from ``last.npz``."""
    sys.path.insert(0, str(ROOT))
    from engine.training import checkpoint
    steps = [int(m) for m in re.findall(r"step\s+(\d+)/\d+ .*val_loss", stdout)]
    losses = [float(v) for v in re.findall(r"val_loss (\d+\.\d+)", stdout)]
    meta = checkpoint.read_header(os.path.join(out_dir, "last.npz"))["metadata"]
    losses[-1] = meta["val_loss"]
    secs = float(re.search(r"time\s+([\d.]+) s for", stdout).group(1))
    return {"steps": steps, "val_loss": losses, "seconds": secs}


# ----------------------------------------------------------------------------- torch side
def get_lr(it: int, r: dict) -> float:
    """nanoGPT's ``get_lr`` (train.py): linear warmup, cosine to ``min_lr``, then ``min_lr``."""
    w, d = r["warmup_iters"], r["lr_decay_iters"]
    if it < w:
        return r["lr"] * (it + 1) / (w + 1)
    if it > d:
        return r["min_lr"]
    coeff = 0.5 * (1.0 + math.cos(math.pi * (it - w) / (d - w)))
    return r["min_lr"] + coeff * (r["lr"] - r["min_lr"])


def torch_child(path: str, r: dict, threads: int) -> dict:
    """nanoGPT's training loop on the saved weights and batches; the held-out mean loss every
    ``eval_interval`` steps and at the end."""
    import torch
    sys.path.insert(0, str(ROOT / "bench"))
    from gpt_recipe import torch_adamw, torch_gpt
    torch.set_num_threads(threads)
    F = torch.nn.functional
    z = np.load(path)
    m = torch_gpt(r, r["bias"])
    m.load_state_dict({k[2:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("w.")})
    opt = torch_adamw(m, r, fused=False)  # the reference (foreach) implementation
    X, Y, Xh, Yh = z["X"], z["Y"], z["Xh"], z["Yh"]

    def held_out() -> float:
        m.eval()
        with torch.no_grad():
            total = 0.0
            for s in range(0, Xh.shape[0], r["batch"]):
                logits = m(torch.from_numpy(Xh[s:s + r["batch"]]))
                y = torch.from_numpy(Yh[s:s + r["batch"]])
                total += F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).item() \
                    * y.shape[0]
        m.train()
        return total / Xh.shape[0]

    steps, losses, first = [], [], None
    t0 = time.perf_counter()
    for it in range(r["iters"]):
        for g in opt.param_groups:
            g["lr"] = get_lr(it, r)
        logits = m(torch.from_numpy(X[it]))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), torch.from_numpy(Y[it]).view(-1))
        first = loss.item() if first is None else first
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), r["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (it + 1) % r["eval_interval"] == 0 or it + 1 == r["iters"]:
            steps.append(it + 1)
            losses.append(held_out())
    return {"steps": steps, "val_loss": losses, "seconds": time.perf_counter() - t0,
            "first_loss": first, "torch": torch.__version__}


# ----------------------------------------------------------------------------- both
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1, help="threads of each side")
    ap.add_argument("--torch-python", required=True, help="an interpreter that imports torch")
    ap.add_argument("--child", nargs=2, metavar=("NPZ", "JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(torch_child(a.child[0], json.loads(a.child[1]), a.threads)))
        return 0
    env = dict(os.environ, BLASNET_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads),
               PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory(prefix="lm-vs-torch-") as tmp:
        npz, out_dir = os.path.join(tmp, "inputs.npz"), os.path.join(tmp, "out")
        r = write_inputs(npz, a.iters)
        ours = subprocess.Popen(blasnet_command(a.iters, a.threads, out_dir), cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        theirs = subprocess.Popen([a.torch_python, str(Path(__file__).resolve()), "--torch-python",
                                   a.torch_python, "--threads", str(a.threads), "--child", npz,
                                   json.dumps(r)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        out_b, err_b = ours.communicate()
        out_t, err_t = theirs.communicate()
        if ours.returncode or theirs.returncode:
            raise SystemExit(f"a side failed:\nblasnet: {err_b[-2000:]}\ntorch: {err_t[-2000:]}")
        b = blasnet_result(out_b, out_dir)
        t = json.loads(out_t.strip().splitlines()[-1])
    print(f"nanoGPT CPU recipe ({RECIPE.name}), {a.iters} iterations, float32, {a.threads} "
          f"thread(s) a side, both sides at once; PyTorch {t['torch']}")
    print(f"loss of the first batch before training: blasnet {r['first_loss']:.6f}, torch "
          f"{t['first_loss']:.6f}")
    print(f"{'step':>6} {'blasnet':>9} {'torch':>9} {'diff':>8}")
    for i, s in enumerate(t["steps"]):
        bl = b["val_loss"][b["steps"].index(s)] if s in b["steps"] else float("nan")
        print(f"{s:>6} {bl:9.4f} {t['val_loss'][i]:9.4f} {bl - t['val_loss'][i]:+8.4f}")
    diff = b["val_loss"][-1] - t["val_loss"][-1]
    print(f"final held-out: blasnet {b['val_loss'][-1]:.4f}, torch {t['val_loss'][-1]:.4f}, "
          f"difference {diff:+.4f} nats (|diff| {'<=' if abs(diff) <= 0.02 else '>'} 0.02); "
          f"training time blasnet {b['seconds']:.0f} s, torch {t['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
