"""``python -m engine`` (or ``blasnet``): ``train`` a model on a synthetic task or on your own
data (``--data FILE``), or print ``info`` on the versions, BLAS libraries and thread counts.

The default ``train`` (what ``make run`` runs) is a gated-MLP regression experiment: gMLP 16 -> 128 ->
512 -> 4 on 1024 samples of the regression task, full batch, AdamW lr 1e-3, 1000 epochs.
Every output path (``--save``, ``--history``, ``--plot``) and the data are checked before
the first step.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

import kernels
from kernels.threads import check_environment, usable_cores

from .. import __version__
from .. import distributed
from ..nn.containers import Sequential
from ..nn.layers import Linear
from ..nn.losses import CrossEntropyLoss, MSELoss
from ..optim import lr_scheduler as _lrs
from ..optim.optimizers import SGD, AdamW
from ..training import checkpoint
from ..training.callbacks import EarlyStopping
from ..training.loop import History, NonFiniteLossError, TrainingInterrupted, evaluate, fit
from . import report, resume_cmd
from .inputs import UsageError, check_args, load_data
from .parser import LM_MODELS, block_models, build_parser

__all__ = ["main", "build_parser", "build_model", "step_gemm_time", "train", "info"]


def _version() -> str:
    return __version__


# ----------------------------------------------------------------------------- train
# The CLI's block options: the flags that set a registry option of the same name.
_BLOCK_FLAGS = ("activation", "norm")


def build_model(args, d_in: int, d_out: int, seed: int):
    """The model named by ``args.model`` for a task with ``d_in`` inputs and ``d_out`` outputs:
    the registry's block (engine/cli/parser.py's ``block_models``) at the sizes the CLI sets
    (d_in/d_out the task's, d_model = --d-hidden, d_ff = --d-ff, sizes = d_in, --hidden...,
    d_out) with the options --activation and --norm where it has them; a block that keeps its
    width (FFN, FFNSublayer) sits between Linear maps from and to the task's widths."""
    dt, rng = np.dtype(args.dtype), np.random.default_rng(seed)
    block = block_models()[args.model]
    sizes = {"d_in": d_in, "d_out": d_out, "d_model": args.d_hidden, "d_ff": args.d_ff,
             "sizes": (d_in, *args.hidden, d_out)}
    options = {k: getattr(args, k) for k in _BLOCK_FLAGS if k in block.options}
    if not block.keeps_width:
        return block.build(sizes, dtype=dt, rng=rng, **options)
    d = args.d_hidden
    first = Linear(d_in, d, dtype=dt, rng=rng)
    middle = block.build(sizes, dtype=dt, rng=rng, **options)
    return Sequential(first, middle, Linear(d, d_out, init="xavier", dtype=dt, rng=rng))


# The CLI's size flags and the registry size each sets (build_model reads them so).
_SIZE_FLAGS = {"hidden": "sizes", "d_hidden": "d_model", "d_ff": "d_ff"}


def check_model_flags(args) -> None:
    """UsageError for a size or block flag given on the command line that ``--model`` does
    not read (``--hidden`` with gmlp, ``--norm`` with mlp, ...): the README's rule that an
    option a run would ignore is an error, not a silent no-op."""
    block = block_models()[args.model]
    reads = {dest for dest, dim in _SIZE_FLAGS.items() if dim in block.dims}
    reads |= {k for k in _BLOCK_FLAGS if k in block.options}
    for dest in (*_SIZE_FLAGS, *_BLOCK_FLAGS):
        if dest in args.given and dest not in reads:
            flags = ", ".join(sorted("--" + r.replace("_", "-") for r in reads))
            raise UsageError(f"{args.given[dest]}: --model {args.model} does not read it "
                             f"(it reads {flags})")


def _optimizer(args, model, comm=None):
    if args.optimizer == "adamw":
        wd = 1e-2 if args.weight_decay is None else args.weight_decay
        if args.shard_optimizer and comm is not None:
            from ..distributed import ShardedAdamW
            return ShardedAdamW(model.parameters(), comm, lr=args.lr, weight_decay=wd)
        return AdamW(model.parameters(), lr=args.lr, weight_decay=wd)
    wd = 0.0 if args.weight_decay is None else args.weight_decay
    return SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=wd)


def _opt_text(opt) -> str:
    g = opt.param_groups[0]
    return f"{type(opt).__name__}(" + ", ".join(f"{k}={g[k]}" for k in opt.defaults) + ")"


def _scheduler(args, opt, total: int):
    """``(scheduler or None, description)`` for --schedule and --warmup over ``total`` steps."""
    try:
        w = _lrs.check_warmup(args.warmup, total, "--warmup")
    except ValueError as e:
        raise UsageError(str(e)) from None
    rest = total - w
    if args.schedule == "constant":
        main, text = None, "constant lr"
    elif args.schedule == "cosine":
        main, text = _lrs.CosineAnnealingLR(opt, T_max=rest), f"cosine to 0 over {rest} steps"
    elif args.schedule == "linear":
        main = _lrs.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=rest)
        text = f"linear to 0 over {rest} steps"
    else:
        size = args.step_size or max(1, rest // 3)
        main = _lrs.StepLR(opt, step_size=size, gamma=args.gamma)
        text = f"x{args.gamma:g} every {size} steps"
    if w == 0:
        return main, text
    # Warmup rates base*(k+1)/(w+1) for k = 0..w-1: never 0, reaching base at step w.
    warm = _lrs.LinearLR(opt, start_factor=1.0 / (w + 1), end_factor=1.0, total_iters=w)
    text = f"warmup {w} steps, then {text}"
    if main is None:
        return warm, text
    return _lrs.SequentialLR(opt, [warm, main], milestones=[w]), text


# The GEMM time of one step (the "time" line): replays of its recorded GEMM calls, at least
# GEMM_REPS[0], then until GEMM_BUDGET_S seconds of replays or GEMM_REPS[1] of them.
GEMM_REPS = (3, 30)
GEMM_BUDGET_S = 0.15


def step_gemm_time(args, model, d_in: int, d_out: int, loss, xb, yb) -> tuple:
    """``(median seconds, number)`` of the GEMMs of one training step of ``model`` on the batch
    ``xb``, ``yb``: a copy of the model (built again from ``args``, the trained parameters
    loaded) runs one forward, loss and backward inside ``kernels.instrument.record("gemm")``;
    its recorded GEMM calls are replayed on the copy's own buffers, each replay after putting
    back what the recorded calls left in their outputs (so replays cannot compound into
    overflow or denormals). The trained model, its loss and optimizer are not touched."""
    from kernels.instrument import replay
    twin = build_model(args, d_in, d_out, args.seed)
    twin.load_state_dict(model.state_dict())
    twin_loss = type(loss)()

    def step():
        twin_loss.forward(twin.forward(xb), yb)
        twin.backward(twin_loss.backward())
    try:
        run = replay(step, "gemm")
    except RuntimeError:  # no GEMM in the model
        return None, 0
    clock = time.perf_counter
    times: list = []
    while len(times) < GEMM_REPS[1] and (len(times) < GEMM_REPS[0]
                                         or sum(times) < GEMM_BUDGET_S):
        run.restore()
        t0 = clock()
        run()
        times.append(clock() - t0)
    return statistics.median(times), len(run.calls)


def train(args) -> int:
    try:
        return _train(args)
    except UsageError as e:
        if _rank() == 0:  # every rank finds the same usage error: one line, not one per rank
            print(f"error: {e}", file=sys.stderr)
        return 2
    except checkpoint.SaveError as e:  # the run is done; where its model went is the message
        print(f"error: {e}", file=sys.stderr)
        return 1


def _rank() -> int:
    """This process's rank under an MPI launcher (0 when alone), without loading MPI."""
    if distributed.launched_size() == 1:
        return 0
    comm = distributed.world(warn=None)
    return 0 if comm is None else comm.Get_rank()


def _warn_threads(args, comm) -> None:
    """One process asked for more threads than it may run on: say so (under mpiexec,
    distributed.set_threads warns about the host's ranks together)."""
    if comm is None and args.threads is not None and args.threads > usable_cores():
        print(f"warning: --threads {args.threads} is more than the {usable_cores()} core(s) this "
              f"process may run on; the extra threads only take turns with the others",
              file=sys.stderr)


def _is_language_model(args) -> bool:
    return args.model in LM_MODELS or args.task == "text"


def _language_model(args):
    """The exit status of a character language model's run (engine/cli/lm.py: each takes its
    own defaults and the options given), or None for the other models, after refusing the
    language models' options given to them."""
    if _is_language_model(args):
        from . import lm
        return lm.run_cli(args)
    from .lm import LM_ONLY
    given = [flag for dest, flag in args.given.items() if dest in LM_ONLY]
    if given:
        raise UsageError(f"{', '.join(given)}: only with the language models (--model gpt or "
                         f"--model gmlp-lm)")
    return None


def _resume_header(args):
    """The header of the checkpoint ``--resume`` names, once the run's options are taken
    from it (None without --resume; a language model resumes its own run)."""
    if args.resume is None or _is_language_model(args):
        return None
    header = resume_cmd.apply_resume(args)
    done = header["training"].get("history") or {}
    args.resumed_at = (len(done.get("loss") or []), done.get("steps", 0),
                       done.get("samples", 0))
    return header


def _checked_data(args, header):
    """The run's data; resuming, it must be the run's own and the saved sizes must fit the
    checkpoint's parameters (checked before the model is built from them)."""
    d = load_data(args, np.dtype(args.dtype))
    if header is not None:
        resume_cmd.check_resumed_data(args, header, d)
        resume_cmd.check_resumed_sizes(args, header, d.d_in, d.d_out)
    return d


def _train(args) -> int:
    t_all = time.perf_counter()
    header = _resume_header(args)  # the run's options, from its checkpoint
    check_args(args)
    code = _language_model(args)
    if code is not None:
        return code
    check_model_flags(args)
    comm = distributed.world()  # K > 1 ranks under mpiexec: data parallel, else None
    rank = 0 if comm is None else comm.Get_rank()
    _warn_threads(args, comm)
    threads = distributed.set_threads(comm, args.threads)  # under MPI: each rank's share
    d = _checked_data(args, header)
    model = build_model(args, d.d_in, d.d_out, args.seed)
    loss = CrossEntropyLoss() if d.classify else MSELoss()
    try:
        opt = _optimizer(args, model, comm)
    except (ValueError, TypeError) as e:  # bad hyperparameters: the optimizer's message says which
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    n = d.X.shape[0]
    bs = None if args.batch_size == 0 or args.batch_size >= n else args.batch_size
    opt_text = _opt_text(opt)  # before the schedule sets its first rate
    sched, sched_text = _scheduler(args, opt, max(args.epochs * -(-n // (bs or n)), 1))
    stopper = None if args.early_stopping is None else EarlyStopping(
        "val_loss", patience=args.early_stopping, restore_best_weights=True)
    # rank 0 prints, unless --quiet
    out = sys.stdout if rank == 0 and not args.quiet else open(os.devnull, "w")
    report.banner(out, args, comm, model, d, opt_text, sched_text, bs)
    if comm is not None:
        print(f"threads   {threads}", file=out)
    if args.resume is not None:
        print(f"resume    {args.resume}", file=out)
    trained = (model, opt, sched, loss, bs)
    t0 = time.perf_counter()
    h, code = _fit(args, comm, trained, d, stopper)
    if code is not None:
        return code
    t_fit = time.perf_counter() - t0
    gemm_s = n_gemms = None
    if comm is None and h.steps > 0 and args.verbose:  # the step's own GEMMs, one process
        rows = bs or n
        gemm_s, n_gemms = step_gemm_time(args, model, d.d_in, d.d_out, loss, d.X[:rows],
                                         d.Y[:rows])
    if stopper is not None:
        report.early_stop(out, stopper, args.epochs)
    final = report.results(out, args, model, loss, d, bs)
    report.timing(out, _this_session(h, args), t_fit, gemm_s, n_gemms)
    if rank == 0:  # one writer per file
        report.outputs(out, args, h, d)
    if not _checkpoint_round_trip(out, args, comm, trained, d, h, final):
        return 0  # ranks other than 0: rank 0 checks the reload
    print(f"wall time {time.perf_counter() - t_all:.2f} s", file=out)
    return 0


def _this_session(h, args):
    """The part of a resumed run's History trained by this command (for its timing line)."""
    start = getattr(args, "resumed_at", None)
    if start is None:
        return h
    epochs, steps, samples = start
    return History(loss=h.loss[epochs:], steps=h.steps - steps, samples=h.samples - samples)


class _RunKeeper:
    """A callback that keeps the run's state, for the final checkpoint's training state."""
    run = None

    def set_run(self, run) -> None:
        self.run = run

    def on_epoch_end(self, epoch, history) -> bool:
        return False


def _fit(args, comm, trained, d, stopper) -> tuple:
    """``(History, None)``, or ``(None, exit status)`` when the run stopped early: a
    non-finite loss or a failed rank (1), a checkpoint that does not fit (2), Ctrl-C or
    SIGTERM (130, 143: a resumable checkpoint is written)."""
    model, opt, sched, loss, bs = trained
    rank = 0 if comm is None else comm.Get_rank()
    keeper = _RunKeeper()
    options = dict(batch_size=bs, rng=args.seed, validation=d.val, scheduler=sched,
                   progress=False if args.quiet else args.log_every or max(1, args.epochs // 10),
                   scheduler_interval="step", clip_grad_norm=args.clip_grad_norm,
                   callbacks=[stopper] if stopper else [])
    if comm is not None:
        options["comm"] = comm
    options["callbacks"].append(keeper)  # resumable, on one process or K ranks
    options["resume_from"] = args.resume
    try:
        with resume_cmd.preemption() as got:
            h = fit(model, loss, opt, d.X, d.Y, epochs=args.epochs, **options)
    except (NonFiniteLossError, distributed.RankError) as e:  # raised on every rank
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return None, 1
    except checkpoint.CheckpointError as e:  # fit read args.resume's training state
        if args.resume is None:
            raise
        if rank == 0:
            print(f"error: --resume: {e}", file=sys.stderr)
        return None, 2
    except ValueError as e:
        if not str(e).startswith("resume_from"):
            raise
        if rank == 0:
            print(f"error: --resume: {str(e).removeprefix('resume_from: ')}", file=sys.stderr)
        return None, 2
    except TrainingInterrupted as e:  # Ctrl-C or SIGTERM: save, say how to resume
        # (under mpiexec every rank stopped after the same step: rank 0 writes, as at the end)
        meta = _metadata(args, d, len(e.history), None)
        sig = resume_cmd.agreed_signal(comm, got["signal"])
        return None, resume_cmd.save_interrupted(sys.stderr, args, (e, sig), meta, comm=comm)
    args.run_state = keeper.run  # for the final checkpoint's training state
    return h, None


def _metadata(args, d, epochs: int, final) -> dict:
    """What a checkpoint of the run records about it (the run's options under "cli")."""
    meta = dict(task=d.task_name, model=args.model, epochs=epochs, seed=args.seed, loss=final,
                cli=resume_cmd.saved_options(args))
    if d.own:
        meta.update(data=args.data, x_cols=d.x_names, y_cols=d.y_names, kind=d.kind,
                    data_crc32=d.data_crc32)
        if d.classify:
            meta["classes"] = d.d_out
    if d.standardizer is not None:
        meta["standardizer"] = d.standardizer.state_dict()
    if d.target_standardizer is not None:  # predict and LoadedModel.predict undo it
        meta["target_standardizer"] = d.target_standardizer.state_dict()
    return meta


def _checkpoint_round_trip(out, args, comm, trained, d, h, final) -> bool:
    """Save the checkpoint, reload it into a freshly initialised model (another seed) and
    compare the losses. Returns False on the ranks other than 0 (rank 0 alone checks)."""
    model, opt, sched, loss, bs = trained
    tmpdir = None
    if args.save:
        path = args.save
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="blasnet-")
        path = os.path.join(tmpdir.name, f"{args.model}-{d.task_name}.npz")
    meta = _metadata(args, d, len(h), final)
    run = getattr(args, "run_state", None)
    try:
        tensors = path.lower().endswith(".safetensors")
        if comm is not None:  # rank 0 writes; it alone checks the reload (others may see no file)
            if run is not None:  # with the run's state (the same on every rank): resumable
                run.save(path, ranks=comm.Get_size(), **meta)
            else:
                distributed.save(path, model, None if tensors else opt, comm=comm,
                                 scheduler=None if tensors else sched, ranks=comm.Get_size(),
                                 **meta)
            if comm.Get_rank():
                return False
        elif tensors:
            checkpoint.save_or_rescue(path, model, **meta)
        else:  # with the run's state: --resume continues it
            checkpoint.save_or_rescue(path, model, opt, scheduler=sched,
                                      training_state=None if run is None else run.state(),
                                      **meta)
        fresh = build_model(args, d.d_in, d.d_out, args.seed + 1)
        checkpoint.load(path, fresh)
        reloaded, _ = evaluate(fresh, loss, d.X, d.Y, bs)
        same = "identical to" if reloaded == final else f"differs by {reloaded - final:.3g} from"
        size = os.path.getsize(path)
        where = path if args.save else f"{path} (temporary)"
        print(f"checkpoint {where}, {size / 1024:,.0f} KiB", file=out)
        print(f"reloaded into a fresh model: loss {reloaded:.6g} ({same} the trained model)",
              file=out)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()
    return True


# ----------------------------------------------------------------------------- info
def info(args) -> int:
    import scipy
    import threadpoolctl
    out = sys.stdout
    print(f"blasnet        {_version()}", file=out)
    print(f"python         {platform.python_version()} ({sys.executable})", file=out)
    print(f"numpy          {np.__version__}", file=out)
    print(f"scipy          {scipy.__version__}", file=out)
    print(f"threadpoolctl  {threadpoolctl.__version__}", file=out)
    print(f"platform       {platform.platform()}, {os.cpu_count()} CPUs", file=out)
    print(f"engine GEMMs   scipy.linalg.blas, {kernels.get_num_threads()} thread(s)", file=out)
    from kernels import blas_kernel
    facts = blas_kernel.facts()  # times the pin's cost when there is one
    print("libraries (threadpoolctl):", file=out)
    for lib in kernels.blas_info():
        level = blas_kernel.kernel_level(lib.get("architecture"))
        kernel = f"{lib.get('architecture') or '?'}" + (f" ({level})" if level else "")
        print(f"  {lib.get('user_api', '?'):<7} {lib.get('internal_api', '?'):<9} "
              f"{lib.get('version') or '?':<14} kernel {kernel:<16} "
              f"threads {lib.get('num_threads', '?'):<3} "
              f"shipped with {lib.get('owner', '?'):<6} {lib.get('filepath', '')}", file=out)
    cpu = f"{facts['cpu']} ({facts['cpu_class']}-class kernels)" if facts["cpu"] else "unknown"
    print(f"CPU SIMD       {cpu}; BLAS kernel verdict: {facts['verdict']}", file=out)
    for line in blas_kernel.header_lines(facts)[1:]:  # the pin line, a failed measurement
        print(line, file=out)
    print(f"numba          {facts['numba']}, compiled kernels "
          f"{'DISABLED (run as Python)' if facts['jit_disabled'] else 'enabled'}", file=out)
    print("environment:", file=out)
    for var in (kernels.ENV_VAR, "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                *blas_kernel.PIN_VARS, *blas_kernel.NOTED_VARS, "NUMBA_DISABLE_JIT"):
        print(f"  {var}={os.environ.get(var, '(unset)')}", file=out)
    return 0


def main(argv=None) -> int:
    try:
        # A bad BLASNET_NUM_THREADS (read when kernels is imported) is a usage error, first.
        check_environment()
    except ValueError as e:
        print(f"blasnet: error: {e}", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed: the resume hint
        if hasattr(args, "run"):
            code = args.run(args)
        else:
            code = info(args) if args.command == "info" else train(args)
        sys.stdout.flush()  # here, so a closed pipe surfaces inside the try
        return code
    except BrokenPipeError:
        # The reader went away (`... | head -1`): stop quietly, with the status of a process
        # killed by SIGPIPE. Point stdout at /dev/null so the exit-time flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
