"""`make run`'s time line: the step time as a multiple of the time of its own GEMMs
(engine.cli.step_gemm_time), measured without touching the trained model. No timing
assertions: formats, GEMM counts and unchanged state only."""
import re

import numpy as np
import pytest

from engine.models import registry
from engine.cli import app as cli
from engine.data import make_task
from engine.nn.losses import MSELoss
from engine.optim import AdamW
from engine.training.loop import fit

SMALL = ["train", "--verbose", "--samples", "64", "--d-hidden", "16", "--d-ff", "32", "--seed",
         "3", "--epochs", "4"]
TIME_LINE = re.compile(r"^time +\S+ s for \d+ epochs, (\d+) steps \(\S+ samples/s\); "
                       r"step (\d+\.\d\d) ms = (\d+\.\d\d)x its (\d+) GEMMs \((\d+\.\d\d) ms\)$",
                       re.M)


def _main(capsys, argv) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def test_time_line_shows_the_step_against_its_gemms(capsys):
    # Check that the summary's time line ends with the step time, its ratio to the GEMM time
    # and the number of GEMMs one step makes: the registry's list for a gMLP (forward 3,
    # backward 6), with the ratio and both times positive.
    out = _main(capsys, SMALL)
    m = TIME_LINE.search(out)
    assert m is not None, out
    steps, step_ms, ratio, n, gemm_ms = m.groups()
    dims = {"d_in": 16, "d_model": 16, "d_ff": 32, "d_out": 4}
    assert int(n) == len(registry.get("GMLP").gemms(64, dims)) == 9
    assert int(steps) == 4
    assert float(step_ms) > 0 and float(gemm_ms) > 0 and float(ratio) > 0


def test_gemm_count_of_a_minibatch_step_is_the_registrys(capsys):
    # Check that with mini-batches the GEMMs are those of one batch's step (the registry's
    # list at 16 rows has the same 9 GEMMs), and the line still shows the ratio.
    out = _main(capsys, SMALL + ["--batch-size", "16"])
    m = TIME_LINE.search(out)
    assert m is not None, out
    assert int(m.group(1)) == 4 * 4  # 64 samples in batches of 16, 4 epochs
    dims = {"d_in": 16, "d_model": 16, "d_ff": 32, "d_out": 4}
    assert int(m.group(4)) == len(registry.get("GMLP").gemms(16, dims))


def test_no_steps_no_gemm_ratio(capsys):
    # Check that a run without optimizer steps (0 epochs) prints the time line without a
    # step time or ratio (there is no step to compare).
    out = _main(capsys, SMALL[:-1] + ["0"])
    line = next(s for s in out.splitlines() if s.startswith("time "))
    assert "GEMMs" not in line and "0 steps" in line


def _results(out: str) -> list:
    """The lines that depend on the trained parameters only (not on timings)."""
    keep = ("final loss", "y0 ", "y1 ", "y2 ", "y3 ", "reloaded")
    return [s for s in out.splitlines() if s.startswith(keep)]


def test_measurement_leaves_the_run_unchanged(capsys, monkeypatch):
    # Check that the final loss, R^2/MAE rows and reloaded checkpoint are exactly those of the
    # same run without the GEMM measurement (it runs between training and those lines).
    with_it = _results(_main(capsys, SMALL))
    monkeypatch.setattr(cli, "step_gemm_time", lambda *a, **k: (None, 0))
    without = _main(capsys, SMALL)
    assert "GEMMs" not in without
    assert len(with_it) == 6 and with_it == _results(without)


def test_step_gemm_time_touches_no_parameter_gradient_or_optimizer_state():
    # Check that measuring a trained model leaves its parameters, gradients, AdamW moments and
    # step count bit for bit as they were, and returns the registry's GEMM count.
    args = cli.build_parser().parse_args(SMALL)
    X, Y, _ = make_task("regression", 64, dtype=np.float32, rng=3)
    model = cli.build_model(args, 16, 4, args.seed)
    loss, opt = MSELoss(), AdamW(model.parameters(), lr=1e-3)
    fit(model, loss, opt, X, Y, epochs=2, progress=False)
    loss.forward(model.forward(X), Y)
    model.backward(loss.backward())  # non-zero gradients, as a caller may leave them
    before = {n: (p.data.copy(), p.grad.copy()) for n, p in model.named_parameters()}
    moments = [{k: v.copy() for k, v in st.items()} for st in opt.state]
    seconds, n = cli.step_gemm_time(args, model, 16, 4, loss, X, Y)
    assert n == 9 and seconds > 0
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, before[name][0], err_msg=name)
        np.testing.assert_array_equal(p.grad, before[name][1], err_msg=name)
    for st, saved in zip(opt.state, moments):
        for k in saved:
            np.testing.assert_array_equal(st[k], saved[k])
    assert opt.steps == 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_step_gemm_time_runs_a_copy_with_the_trained_weights(dtype, monkeypatch):
    # Check that the measured step runs on a separate model holding the trained weights (not
    # the ones build_model draws): same values, no memory shared with the trained model.
    args = cli.build_parser().parse_args(SMALL + ["--dtype", dtype])
    X, Y, _ = make_task("regression", 64, dtype=np.dtype(dtype), rng=3)
    model = cli.build_model(args, 16, 4, args.seed)
    for p in model.parameters():
        p.data[...] *= 1.5  # not what build_model draws: must come from the model
    built = []
    real = cli.build_model
    monkeypatch.setattr(cli, "build_model", lambda *a: built.append(real(*a)) or built[-1])
    cli.step_gemm_time(args, model, 16, 4, MSELoss(), X, Y)
    (twin,) = built
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        assert not np.shares_memory(p.data, q.data), name
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
