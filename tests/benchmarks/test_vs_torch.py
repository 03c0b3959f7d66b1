"""bench/vs_torch.py: without torch it explains and exits 0; with torch, its PyTorch modules and
timed steps compute what blasnet's do (same weights -> same loss, gradients and AdamW steps).
The torch tests skip where torch is not installed (it is not a project dependency)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from bench import cases

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("bench_vs_torch", ROOT / "bench" / "vs_torch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vs = _load()

TINY = cases.Shape("tiny", (2, 3), d_model=8, d_ff=16)
TINY_MLP = cases.Shape("tiny_mlp", (6,), sizes=(5, 7, 4, 3))


def _case(block):
    """cases.build_case at a tiny shape."""
    return cases.build_case(block, TINY_MLP if block == "MLP" else TINY)


def _max_rel(got, ref):
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _params_agree(c, t, tol):
    bparams = dict(c["module"].named_parameters())
    for name, p in t["module"].named_parameters():
        bname, transposed = t["pmap"][name]
        w = p.detach().numpy()
        assert _max_rel(w.T if transposed else w, bparams[bname].data) < tol, name


def test_without_torch_prints_install_hint_and_exits_0(monkeypatch, capsys):
    # Check that the script explains how to get torch and exits 0 when torch is missing.
    monkeypatch.setattr(vs, "have_torch", lambda: False)
    assert vs.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "not importable" in out and "pip install torch" in out


def test_report_flags_a_check_mismatch():
    # Check that a loss disagreement in any run is reported as a mismatch, not as agreement.
    check = dict(block="FFN-relu", shape="seed000", loss_blasnet=1.0, loss_torch=1.0,
                 loss_rel=0.0, grad_err=0.0, loss2_blasnet=1.0, loss2_torch=1.0, loss2_rel=0.0)
    timing = dict(blasnet_ms=1.0, torch_ms=2.0, ratio=2.0)
    row = dict(block="FFN-relu", shape="seed000", threads=1, step=timing, fwd_bwd=timing,
               floor=timing)
    info = dict(threads=1, torch="x", set_to_none=True, adamw="default", quick=True)
    good = dict(info=info, checks=[check], rows=[row], gemms=[])
    bad = dict(info=dict(info, threads=2), checks=[dict(check, loss2_rel=1e-3)],
               rows=[dict(row, threads=2)], gemms=[])
    assert "all agree" in vs.report([good, good])
    text = vs.report([good, bad])
    assert "MISMATCH" in text and "(2, 'FFN-relu', 'seed000')" in text


def test_the_report_and_the_children_say_whether_x_is_data():
    # Check that --input-grad 0 reaches the child processes and the report's header (which
    # then claims no dx on either side and compares parameter gradients only).
    args = vs.argparse.Namespace(set_to_none=True, adamw="default", input_grad=False,
                                 quick=True, no_gemm=True, block=None, shape=None)
    argv = vs.child_argv(args)
    assert argv[argv.index("--input-grad") + 1] == "0"
    check = dict(block="MLP", shape="batch64", loss_blasnet=1.0, loss_torch=1.0, loss_rel=0.0,
                 grad_err=0.0, loss2_blasnet=1.0, loss2_torch=1.0, loss2_rel=0.0)
    timing = dict(blasnet_ms=1.0, torch_ms=2.0, ratio=2.0)
    row = dict(block="MLP", shape="batch64", threads=1, step=timing, fwd_bwd=timing,
               floor=timing)
    info = dict(threads=1, torch="x", set_to_none=True, adamw="default", quick=True)
    data = vs.report([dict(info=dict(info, input_grad=False), checks=[check], rows=[row],
                           gemms=[])])
    assert "x is data: no dx on either side" in data and "(params," in data
    with_dx = vs.report([dict(info=dict(info, input_grad=True), checks=[check], rows=[row],
                              gemms=[])])
    assert "x.requires_grad (dx computed" in with_dx and "(params and dx," in with_dx


@pytest.mark.parametrize("input_grad", [True, False])
@pytest.mark.parametrize("block", cases.BLOCKS)
def test_same_loss_gradients_and_step_whether_or_not_x_is_data(block, input_grad):
    # The same with x as data (no input gradient on either side).
    pytest.importorskip("torch")
    c = cases.build_case(block, TINY_MLP if block == "MLP" else TINY, input_grad=input_grad)
    t = vs.torch_case(c, block, input_grad=input_grad)
    r = vs.check_same(c, t, input_grad)
    assert r["loss_rel"] < 1e-5 and r["grad_err"] < 1e-4 and r["loss2_rel"] < 1e-5, r


@pytest.mark.parametrize("block", cases.BLOCKS)
def test_same_loss_gradients_and_step(block):
    # Check that from blasnet's weights the torch module gives the same loss, parameter and
    # input gradients, and loss after one AdamW step (float32 tolerance).
    pytest.importorskip("torch")
    c = _case(block)
    t = vs.torch_case(c, block)
    r = vs.check_same(c, t)
    assert r["loss_rel"] < 1e-5 and r["grad_err"] < 1e-4 and r["loss2_rel"] < 1e-5, r


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("block", cases.BLOCKS)
def test_timed_steps_reach_the_same_weights(block, set_to_none):
    # Check that the timed training steps (blasnet's cases.step_fn, the script's torch step)
    # are the same computation: after three steps each, every parameter agrees.
    pytest.importorskip("torch")
    c = _case(block)
    t = vs.torch_case(c, block, set_to_none=set_to_none)
    for g in c["opt"].param_groups + t["opt"].param_groups:
        g["lr"] = 1e-2  # bench.cases.LR moves weights too little to tell weight decay apart
    start = {n: p.data.copy() for n, p in c["module"].named_parameters()}
    for _ in range(3):
        c["step"]()
        t["step"]()
    _params_agree(c, t, 1e-5)
    moved = [n for n, p in c["module"].named_parameters() if not np.array_equal(p.data, start[n])]
    assert len(moved) == len(start)  # the steps really updated every parameter


@pytest.mark.parametrize("block", cases.BLOCKS)
def test_timed_fwd_bwd_gives_the_same_gradients(block):
    # Check that the timed forward+backward callables accumulate the same parameter
    # gradients over two calls, and torch's input gradient is one call's (not accumulated).
    pytest.importorskip("torch")
    c = _case(block)
    t = vs.torch_case(c, block)
    c["module"].zero_grad()
    dx = c["module"].backward(c["dy"]) if c["module"].forward(c["x"]) is not None else None
    c["module"].zero_grad()
    for _ in range(2):
        c["fwd_bwd"]()
        t["fwd_bwd"]()
    bparams = dict(c["module"].named_parameters())
    for name, p in t["module"].named_parameters():
        bname, transposed = t["pmap"][name]
        g = p.grad.numpy()
        assert _max_rel(g.T if transposed else g, bparams[bname].grad) < 1e-4, name
    assert _max_rel(t["x"].grad.numpy(), dx) < 1e-4


def test_torch_floor_runs_the_floor_gemms():
    # Check that the torch GEMM floor computes the listed products (beta=0 overwrites,
    # beta=1 accumulates), against NumPy on the same operands.
    pytest.importorskip("torch")
    from bench import floors
    gemms = floors.gemm_list("FFN-relu", TINY)
    run = vs.torch_floor_fn(gemms, seed=3)
    run()
    run()
    assert len(run.calls) == len(gemms)
    for (m, n, k, ta, tb, beta), (out, a, b, beta2) in zip(gemms, run.calls):
        assert out.shape == (m, n) and tuple(a.shape) == (m, k) and tuple(b.shape) == (k, n)
        want = a.numpy() @ b.numpy()
        np.testing.assert_allclose(out.numpy(), want * (2 if beta else 1), rtol=1e-5, atol=1e-7)
