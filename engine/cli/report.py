"""What the ``train`` command prints: the banner before training, and the fit, timing and
output lines after it."""
from __future__ import annotations

import os

import kernels
import numpy as np

from .. import __version__
from ..data import REGRESSION_OUTPUTS, make_task
from ..training.loop import evaluate, mean_absolute_error, predict, r2_score
from .safe_text import safe

__all__ = ["HELD_OUT", "describe", "banner", "results", "early_stop", "timing", "outputs"]

HELD_OUT = 4096  # fresh samples drawn (with another seed) to measure generalisation


def describe(args, model, d_in: int, d_out: int) -> str:
    if args.model == "gmlp":
        shape = f"{d_in} -> {args.d_hidden} -> {args.d_ff} -> {d_out}"
    elif args.model == "mlp":
        shape = " -> ".join(str(s) for s in [d_in, *args.hidden, d_out])
    else:
        shape = f"{d_in} -> {args.d_hidden} -> [{args.model} d_ff {args.d_ff}] -> {d_out}"
    return f"{args.model} {shape} ({type(model).__name__}, {model.num_parameters():,} parameters)"


def _report_regression(out, names, r2, mae, extra, extra_name) -> None:
    names = [safe(n) for n in names]  # column names from the user's file
    width = max(len(s) for s in names)
    head = f"{'output':<7} {'target':<{width}}  {'R^2':>8}  {'MAE':>8}"
    print(head + (f"  {extra_name:>12}" if extra is not None else ""), file=out)
    for j in range(r2.shape[0]):
        line = f"y{j:<6} {names[j]:<{width}}  {r2[j]:8.5f}  {mae[j]:8.5f}"
        if extra is not None:
            line += f"  {extra[j]:12.4f}"
        print(line, file=out)


def banner(out, args, comm, model, d, opt_text: str, sched_text: str, bs) -> None:
    """The lines before training: versions and threads, model, data or task, split, training."""
    threads = f"{kernels.get_num_threads()} BLAS thread(s)"
    if comm is not None:
        shard = ", AdamW sharded (ZeRO-1)" if args.shard_optimizer else ""
        threads = f"{comm.Get_size()} ranks x {kernels.get_num_threads()} threads{shard}"
    print(f"blasnet {__version__} | numpy {np.__version__} | {args.dtype} | {threads}", file=out)
    print(f"model     {describe(args, model, d.d_in, d.d_out)}", file=out)
    n = d.X.shape[0]
    if d.own:
        target = (f"{d.d_out} classes" if d.classify else f"{d.Y.shape[1]} output(s)")
        print(f"data      {safe(args.data)}: {d.n_all} samples, {d.d_in} inputs -> "
              f"{', '.join(map(safe, d.y_names))} ({d.kind}, {d.note}; {target})", file=out)
    else:
        task = {"regression": f"X uniform in [-3, 3]^{d.d_in} -> {d.d_out} smooth targets",
                "spiral": "two interleaved spirals, 2 classes", "xor": "the XOR truth table",
                "sine": "y = sin(x), x uniform in [-pi, pi]"}[d.task_name]
        print(f"task      {d.task_name}: {n} samples, {task}", file=out)
    if d.val is not None or d.standardizer is not None or d.target_standardizer is not None:
        parts = []
        if d.val is not None:
            parts.append(f"{n} for training, {d.val[0].shape[0]} for validation "
                         f"(val fraction {d.vf:g}, seed {args.seed})")
        if d.standardizer is not None:
            parts.append("inputs standardised with the training split's mean and std")
        if d.target_standardizer is not None:
            parts.append("targets standardised with the training split's mean and std "
                         "(the loss is in those units; R^2, MAE and predictions in the "
                         "target's own)")
        print(f"split     {'; '.join(parts)}", file=out)
    _scale_note(out, d)
    extras = [sched_text]
    if args.clip_grad_norm is not None:
        extras.append(f"grad norm clipped at {args.clip_grad_norm:g}")
    if args.early_stopping is not None:
        extras.append(f"early stopping (patience {args.early_stopping})")
    print(f"training  {opt_text}, {'full batch' if bs is None else f'batches of {bs}'}, "
          f"{args.epochs} epochs, seed {args.seed}, {', '.join(extras)}", file=out)
    out.flush()


# Inputs larger than this (in absolute value) without --standardize get a note: the first
# layer's pre-activations then start far outside the activations' useful range.
LARGE_INPUT = 100.0


def _scale_note(out, d) -> None:
    """A note when the file's inputs are large and not standardised (why a fit may fail)."""
    if not d.own or d.standardizer is not None or d.X.size == 0:
        return
    big = np.abs(d.X).max(axis=0)
    j = int(np.argmax(big))
    if np.isfinite(big[j]) and big[j] > LARGE_INPUT:
        name = d.x_names[j] if d.x_names and j < len(d.x_names) else f"x{j}"
        print(f"note      input {safe(name)!s} reaches {big[j]:.3g} and inputs are not "
              f"standardised: give --standardize (the fit may fail without it)", file=out)


def early_stop(out, stopper, epochs: int) -> None:
    if 0 < stopper.stopped_epoch < epochs:
        print(f"early stop after epoch {stopper.stopped_epoch}: best val_loss "
              f"{stopper.best:.6g} at epoch {stopper.best_epoch} (its weights restored)",
              file=out)
    else:
        print(f"no early stop; best val_loss {stopper.best:.6g} at epoch "
              f"{stopper.best_epoch} (its weights restored)", file=out)


def results(out, args, model, loss, d, bs) -> float:
    """The fit on the training, validation and held-out sets; returns the final loss."""
    X, Y, val = d.X, d.Y, d.val
    final, acc = evaluate(model, loss, X, Y, bs)
    print(f"final loss {final:.6g} (eval mode, all {X.shape[0]} training samples)", file=out)
    if val is not None:
        vloss, vacc = evaluate(model, loss, *val, bs)
        print(f"val loss  {vloss:.6g} ({val[0].shape[0]} validation samples)", file=out)
    held = None
    if not d.own and d.task_name != "xor":
        Xh, Yh, _ = make_task(d.task_name, HELD_OUT, dtype=X.dtype, rng=args.seed + 1)
        if d.standardizer is not None:
            Xh = d.standardizer.transform(Xh)
        held = (Xh, Yh)
    if d.classify:
        line = f"accuracy  {acc:.4f} on the training set"
        if val is not None:
            line += f", {vacc:.4f} on the validation set"
        if held is not None:
            _, hacc = evaluate(model, loss, *held, bs)
            line += f", {hacc:.4f} on {HELD_OUT} held-out samples"
        print(line, file=out)
        return final
    pred = predict(model, X, bs)
    ts = d.target_standardizer
    if ts is not None:  # the figures in the target's own units
        Y, pred = ts.inverse_transform(Y), ts.inverse_transform(pred)
    r2, mae = r2_score(Y, pred), mean_absolute_error(Y, pred)
    if d.own:
        extra = r2_score(val[1], predict(model, val[0], bs)) if val is not None else None
        _report_regression(out, d.y_names, r2, mae, extra, "val R^2")
    else:
        hr2 = r2_score(held[1], predict(model, held[0], bs))
        names = REGRESSION_OUTPUTS if d.task_name == "regression" else ("sin(x)",)
        _report_regression(out, names, r2, mae, hr2, "held-out R^2")
        print(f"(held-out: {HELD_OUT} fresh samples drawn with seed {args.seed + 1})", file=out)
    return final


def timing(out, h, t_fit: float, gemm_s, n_gemms) -> None:
    rate = h.samples / t_fit if t_fit > 0 else float("inf")
    line = f"time      {t_fit:.2f} s for {len(h)} epochs, {h.steps} steps ({rate:,.0f} samples/s)"
    if gemm_s:
        step_s = t_fit / h.steps
        line += (f"; step {1e3 * step_s:.2f} ms = {step_s / gemm_s:.2f}x its {n_gemms} GEMMs "
                 f"({1e3 * gemm_s:.2f} ms)")
    print(line, file=out)


def outputs(out, args, h, d) -> None:
    """Write --history and --plot (one writer: rank 0 calls this)."""
    if args.history:
        if args.history.lower().endswith(".json"):
            h.to_json(args.history)
        else:
            h.to_csv(args.history)
        print(f"history   {args.history} ({len(h)} epochs)", file=out)
    if args.plot:
        h.plot(args.plot, title=f"{args.model} on "
                                f"{os.path.basename(args.data) if d.own else d.task_name}")
        print(f"plot      {args.plot}", file=out)
