"""Squared ReLU ("relu2", So et al. 2021, "Primer") and Mish ("mish", Misra 2019) through
every block that takes an activation, added as registry entries only: the activation module
built by name, FFN, FFNSublayer (post and pre, with dropout too) and MLP, in float64 against
central finite differences and the formulas written out here; and the CLI's --activation."""
import contextlib
import io
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from gradcheck import assert_close, numeric_grad
from scipy.special import expit

import kernels
from engine import FFN, MLP, FFNSublayer
from engine.nn.layers import Activation
from modules_zoo import randomize

F64 = np.float64
NEW = ("relu2", "mish")


def _act(z, name):
    if name == "relu2":
        return np.maximum(z, 0.0) ** 2
    return z * np.tanh(np.logaddexp(0.0, z))  # z tanh(softplus(z))


def _act_grad(z, name):
    if name == "relu2":
        return 2.0 * np.maximum(z, 0.0)
    t = np.tanh(np.logaddexp(0.0, z))
    return t + z * expit(z) * (1.0 - t * t)


def _ln(s, gamma, beta, eps=1e-5):
    mu = s.mean(-1, keepdims=True)
    var = ((s - mu) ** 2).mean(-1, keepdims=True)
    return (s - mu) / np.sqrt(var + eps) * gamma + beta


def _ffn(p, x, act, pre=""):
    z = x @ p[pre + "W_in"] + p.get(pre + "b1", 0.0)
    return _act(z, act) @ p[pre + "W_out"] + p.get(pre + "b2", 0.0)


# name -> (factory(act, rng), naive forward(params, x, act) or None for dropout blocks)
BLOCKS = {
    "activation": (lambda a, r: Activation(a, dtype=F64), lambda p, x, a: _act(x, a)),
    "ffn": (lambda a, r: FFN(6, 10, a, dtype=F64, rng=r), _ffn),
    "ffn_nobias": (lambda a, r: FFN(6, 10, a, bias=False, dtype=F64, rng=r), _ffn),
    "ffn_dropout": (lambda a, r: FFN(6, 10, a, dropout=0.3, dtype=F64, rng=r), None),
    "sublayer_post": (
        lambda a, r: FFNSublayer(6, 10, a, norm="post", dtype=F64, rng=r),
        lambda p, x, a: _ln(x + _ffn(p, x, a, "ffn."), p["norm.gamma"], p["norm.beta"])),
    "sublayer_pre": (
        lambda a, r: FFNSublayer(6, 10, a, norm="pre", dtype=F64, rng=r),
        lambda p, x, a: x + _ffn(p, _ln(x, p["norm.gamma"], p["norm.beta"]), a, "ffn.")),
    "sublayer_post_dropout": (
        lambda a, r: FFNSublayer(6, 10, a, dropout=0.25, norm="post", dtype=F64, rng=r), None),
    "sublayer_pre_dropout": (
        lambda a, r: FFNSublayer(6, 10, a, dropout=0.25, norm="pre", dtype=F64, rng=r), None),
    "mlp": (lambda a, r: MLP([6, 9, 5], [a, None], dtype=F64, rng=r),
            lambda p, x, a: _act(x @ p["0.W"] + p["0.b"], a) @ p["1.W"] + p["1.b"]),
    "mlp_act_out": (lambda a, r: MLP([6, 7, 4], [a, a], dtype=F64, rng=r),
                    lambda p, x, a: _act(_act(x @ p["0.W"] + p["0.b"], a) @ p["1.W"] + p["1.b"],
                                         a)),
}
D_IN = 6


def _build(block, act, seed):
    """The block with randomised parameters, and a forward that replays the same dropout
    draws on every call (the Generator's state is restored first), so that finite
    differences see one fixed function."""
    gen = np.random.default_rng(seed)
    m = BLOCKS[block][0](act, gen)
    randomize(m, np.random.default_rng(seed + 1))
    m.train()
    state = gen.bit_generator.state

    def forward(x):
        gen.bit_generator.state = state
        return m.forward(x)
    return m, forward


@pytest.mark.parametrize("act", NEW)
def test_registry_lists_the_new_activations(act):
    # Check that the one registry names them and the public ACTIVATIONS tuple follows it.
    assert act in kernels.activations.REGISTRY
    assert act in kernels.activations.ACTIVATIONS
    assert act in kernels.ACTIVATIONS


@pytest.mark.parametrize("shape", [(5,), (2, 3)])
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("act", NEW)
def test_gradients_match_finite_differences(act, block, shape):
    # Check dx and every parameter gradient against central differences of
    # L = sum(forward(x) * R), float64.
    m, forward = _build(block, act, 3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((*shape, D_IN))
    R = rng.standard_normal(np.shape(forward(x)))

    def loss():
        return float(np.sum(forward(x) * R))

    m.zero_grad()
    forward(x)
    dx = np.array(m.backward(R.copy()), copy=True)
    grads = {n: p.grad.copy() for n, p in m.named_parameters()}
    assert_close(dx, numeric_grad(loss, x), "dx", rtol=1e-5, atol=1e-7)
    for n, p in m.named_parameters():
        assert_close(grads[n], numeric_grad(loss, p.data), n, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("block", [b for b in BLOCKS if "dropout" in b])
@pytest.mark.parametrize("act", NEW)
def test_dropout_blocks_do_drop(act, block):
    # Check that the dropout variants above differ from eval mode (the gradient check
    # through them is not a check of the dropout-free path).
    m, forward = _build(block, act, 3)
    x = np.random.default_rng(5).standard_normal((5, D_IN))
    y_train = np.array(forward(x), copy=True)
    m.eval()
    assert not np.allclose(y_train, m.forward(x))


@pytest.mark.parametrize("block", [b for b in BLOCKS if BLOCKS[b][1] is not None])
@pytest.mark.parametrize("act", NEW)
def test_forward_matches_the_formula(act, block):
    # Check the forward pass against the block's formula with relu2(z) = max(z, 0)^2 and
    # mish(z) = z tanh(softplus(z)) written out here, (B, T, d) input.
    m, forward = _build(block, act, 6)
    x = np.random.default_rng(7).standard_normal((2, 3, D_IN))
    params = {n: p.data.copy() for n, p in m.named_parameters()}
    want = BLOCKS[block][1](params, x, act)
    np.testing.assert_allclose(forward(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", NEW)
def test_activation_module_at_extreme_inputs(act, dtype):
    # Check that act(z) and its gradient stay finite and right far into both tails, where
    # exp(z) overflows float32 (Mish) or z^2 is large (relu2).
    z = np.array([[-100.0, -30.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 30.0, 100.0]])
    m = Activation(act, dtype=dtype)
    y = np.array(m.forward(z.astype(dtype)), copy=True)
    dz = np.array(m.backward(np.ones_like(z, dtype)), copy=True)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dz))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, _act(z, act), rtol=tol, atol=tol)
    np.testing.assert_allclose(dz, _act_grad(z, act), rtol=tol, atol=tol)


@pytest.mark.parametrize("act", NEW)
def test_activation_module_computes_the_named_function(act):
    # Check that the module built by name computes that activation (not a fallback):
    # relu2 and mish differ from relu and from each other at z = -1 and z = 2.
    z = np.array([[-1.0, 2.0]])
    y = Activation(act, dtype=F64).forward(z)
    want = {"relu2": [0.0, 4.0], "mish": [-1.0 * math.tanh(math.log1p(math.exp(-1.0))),
                                          2.0 * math.tanh(math.log1p(math.exp(2.0)))]}[act]
    np.testing.assert_allclose(y[0], want, rtol=1e-14)


# ----------------------------------------------------------------------------- CLI
def _cli(*args):
    # The CLI's own main in this process, on one thread (the same code `python -m engine`
    # runs; tests/cli and tests/test_packaging start it as a process).
    from engine.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            kernels.num_threads(1):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's --help and usage errors
            code = e.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_cli_help_lists_the_new_activations():
    # Check that `train --help` offers relu2 and mish for --activation.
    out = _cli("train", "--help")
    assert out.returncode == 0, out.stderr
    text = re.sub(r"\s+", " ", out.stdout)
    m = re.search(r"--activation \{([^}]*)\}", text)
    assert m is not None, text
    choices = [c.strip() for c in m.group(1).split(",")]
    assert "relu2" in choices and "mish" in choices


@pytest.mark.parametrize("model", ["ffn", "sublayer", "mlp"])
@pytest.mark.parametrize("act", NEW)
def test_cli_trains_with_the_new_activation(act, model):
    # Check that `train --activation relu2|mish` runs for every model that takes one and
    # ends on a finite loss.
    sizes = ("--hidden", "8") if model == "mlp" else ("--d-hidden", "8", "--d-ff", "16")
    out = _cli("train", "--model", model, "--activation", act, "--task", "sine", "--samples",
               "32", "--epochs", "2", *sizes, "--dtype", "float64")
    assert out.returncode == 0, out.stderr
    final = re.search(r"final loss (\S+)", out.stdout)
    assert final is not None, out.stdout
    assert math.isfinite(float(final.group(1).rstrip(",")))
