"""The bench's training step is the one engine.fit runs, and its "run" shape is the model
`make run` trains (engine.cli's defaults). No timings."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.cli import app as cli
from engine.data import make_task
from engine.training.loop import fit
from kernels.instrument import record

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases  # noqa: E402

TINY = cases.Shape("tiny2d", (6,), d_model=12, d_ff=20)
TINY_MLP = cases.Shape("tinymlp", (7,), sizes=(11, 9, 6, 4))
BLOCKS = [("FFN-gelu", TINY), ("GMLP", TINY), ("FFNSublayer-post-gelu", TINY),
          ("MLP", TINY_MLP)]


def _fit_calls(block, shape, epochs):
    c = cases.build_case(block, shape, np.float64)
    with record() as rec:
        fit(c["module"], c["loss"], c["opt"], c["x"], c["target"], epochs=epochs, shuffle=False,
            progress=False)
    return rec.calls


@pytest.mark.parametrize("block,shape", BLOCKS, ids=[b for b, _ in BLOCKS])
def test_bench_step_makes_the_kernel_calls_of_a_fit_step(block, shape):
    # Check that one bench step makes the kernels.ops calls of one full-batch step of fit
    # (a fit of 2 epochs minus a fit of 1: the same kernels, as many times each) plus the
    # input-gradient GEMM that fit leaves out (the bench times a block inside a network),
    # and that its optimizer pass zeroes the gradients (adamw's zero_grad flag), as fit's.
    per_fit_step = Counter(c.name for c in _fit_calls(block, shape, 2))
    per_fit_step.subtract(Counter(c.name for c in _fit_calls(block, shape, 1)))
    per_fit_step["gemm"] += 1
    c = cases.build_case(block, shape, np.float64)
    with record() as rec:
        c["step"]()
    assert Counter(call.name for call in rec.calls) == +per_fit_step
    (adamw,) = rec.of("adamw")
    assert adamw.args[1] is True


@pytest.mark.parametrize("block,shape", BLOCKS, ids=[b for b, _ in BLOCKS])
def test_bench_step_without_the_input_gradient_is_fits_step(block, shape):
    # Check that build_case(input_grad=False) gives exactly fit's kernel calls, and a
    # forward+backward one GEMM short of the one with the input gradient.
    per_fit_step = Counter(c.name for c in _fit_calls(block, shape, 2))
    per_fit_step.subtract(Counter(c.name for c in _fit_calls(block, shape, 1)))
    c = cases.build_case(block, shape, np.float64, input_grad=False)
    with record() as rec:
        c["step"]()
    assert Counter(call.name for call in rec.calls) == +per_fit_step
    full = cases.build_case(block, shape, np.float64)
    with record() as with_dx:
        full["fwd_bwd"]()
    with record() as without:
        c["fwd_bwd"]()
    assert len(without.of("gemm")) == len(with_dx.of("gemm")) - 1


def test_bench_step_leaves_zero_gradients_and_updated_parameters():
    # Check that after a bench step every gradient is zero and every parameter moved (the
    # AdamW update was applied before the gradients were cleared).
    c = cases.build_case("GMLP", TINY, np.float64)
    before = {n: p.data.copy() for n, p in c["module"].named_parameters()}
    c["step"]()
    for name, p in c["module"].named_parameters():
        assert not np.array_equal(p.data, before[name]), name
        assert not p.grad.any(), name


def test_run_shape_is_make_runs_model():
    # Check that the "run" case is what `make run` trains: the CLI's default task gives the
    # rows and widths, and the CLI's default model has the bench module's parameter shapes;
    # and that the case is benched (blocks table, spread).
    args = cli.build_parser().parse_args(["train"])
    assert args.model == "gmlp" and args.batch_size == 0  # full batch
    X, Y, kind = make_task(args.task or "regression", args.samples, dtype=np.float32, rng=0)
    shape = cases.SHAPES["run"]
    assert kind == "regression" and cases.make_loss("GMLP").__class__.__name__ == "MSELoss"
    assert shape.rows == X.shape[0]
    assert cases.in_features("GMLP", shape) == X.shape[1]
    assert cases.out_features("GMLP", shape) == Y.shape[1]
    ours = cases.build_module("GMLP", shape)
    theirs = cli.build_model(args, X.shape[1], Y.shape[1], 0)
    assert [(n, p.data.shape) for n, p in ours.named_parameters()] == \
        [(n, p.data.shape) for n, p in theirs.named_parameters()]
    assert ("GMLP", "run") in cases.CASES and ("GMLP", "run") in cases.SMALL_CASES
    assert "make run" in shape.legend()
