"""kernels.ops: the namespace of hot-path cores the engine calls by name."""
import numpy as np
import pytest

from kernels import ops
from kernels import reference as R

F64 = np.float64


def test_names_are_unique():
    # Check that no kernel is listed twice (the recorder would wrap it twice).
    assert len(set(ops.NAMES)) == len(ops.NAMES)


@pytest.mark.parametrize("name", ops.NAMES)
def test_every_name_is_a_callable_entry(name):
    # Check that each listed name exists on the module and can be called.
    assert callable(getattr(ops, name))


def _rand(rng, *shape):
    return rng.standard_normal(shape)


def _case(name, rng):
    """(call, expected): call() runs ``ops.<name>`` on fresh float64 arrays and returns what
    to compare; expected is computed independently (kernels.reference or a formula)."""
    x, y, z = _rand(rng, 4, 3), _rand(rng, 4, 3), _rand(rng, 4, 3)
    b = _rand(rng, 3)
    if name == "gemm":
        w = _rand(rng, 3, 5)
        return (lambda: ops.gemm(np.empty((4, 5)), x, w, False, False, 1.0, 0.0)), x @ w
    if name == "colsum":
        return (lambda: ops.colsum(np.ones(3), x, 1.0)), x.sum(0) + 1.0
    if name == "bias_act":
        return (lambda: ops.bias_act(np.empty((4, 3)), x.copy(), b, "tanh")), np.tanh(x + b)
    if name == "act_backward":
        return (lambda: ops.act_backward(np.empty((4, 3)), y, x, "tanh")), \
            y * (1.0 - np.tanh(x) ** 2)
    if name == "act_backward_cached":
        return (lambda: ops.act_backward_cached(np.empty((4, 3)), y, z)), y * z
    if name == "dropout_forward":
        def run():
            out, mask = np.empty((4, 3)), np.empty((4, 3))
            ops.dropout_forward(out, mask, x, 0.5, np.random.default_rng(1))
            return out
        ref_out = R.dropout_forward(np.empty((4, 3)), np.empty((4, 3)), x, 0.5,
                                    np.random.default_rng(1))
        return run, ref_out
    if name == "dropout_backward":
        return (lambda: ops.dropout_backward(np.empty((4, 3)), y, z)), y * z
    if name == "layernorm_forward":
        g, beta = _rand(rng, 3), _rand(rng, 3)
        exp = R.layernorm_forward(np.empty((4, 3)), np.empty(4), np.empty(4), x, g, beta)
        return (lambda: ops.layernorm_forward(np.empty((4, 3)), np.empty(4), np.empty(4), x,
                                              g, beta, 1e-5)), exp
    if name == "layernorm_backward":
        g = _rand(rng, 3)
        mean, rstd = x.mean(1), 1.0 / np.sqrt(x.var(1) + 1e-5)
        exp = R.layernorm_backward(np.empty((4, 3)), np.zeros(3), np.zeros(3), y, x, mean,
                                   rstd, g)
        return (lambda: ops.layernorm_backward(np.empty((4, 3)), np.zeros(3), np.zeros(3), y,
                                               x, mean, rstd, g)), exp
    if name == "gate_forward":
        g, p = x.reshape(-1), y.reshape(-1)
        exp = R.gate_forward(np.empty(12), g.copy(), p.copy())
        return (lambda: ops.gate_forward(np.empty(12), g.copy(), p.copy())), exp
    if name == "gate_backward":
        g, p, da = 1.0 + np.tanh(x.reshape(-1)), y.reshape(-1), z.reshape(-1)
        exp = R.gate_backward(g.copy(), p.copy(), da.copy())
        return (lambda: ops.gate_backward(g.copy(), p.copy(), da.copy())), exp
    if name == "fill_rows":
        return (lambda: ops.fill_rows(np.empty((4, 3)), b, y)), y + b
    if name == "add":
        return (lambda: ops.add(np.empty((4, 3)), x, y)), x + y
    if name == "mse_forward_backward":
        def run():
            d = np.empty((4, 3))
            return np.append(d, ops.mse_forward_backward(d, x, y))
        return run, np.append(2.0 * (x - y) / 12, ((x - y) ** 2).mean())
    if name == "cross_entropy_forward":
        labels = np.array([0, 2, 1, 2])
        ref = R.softmax_cross_entropy_forward(np.empty((4, 3)), x, labels)
        return (lambda: ops.cross_entropy_forward(np.empty((4, 3)), x, labels)), ref
    if name == "cross_entropy_backward":
        labels = np.array([0, 2, 1, 2])
        probs = R.softmax(x)
        exp = R.softmax_cross_entropy_backward(np.empty((4, 3)), probs, labels)
        return (lambda: ops.cross_entropy_backward(np.empty((4, 3)), probs, labels)), exp
    if name == "adamw":
        from kernels.optim import adamw_consts

        def run():
            p, m, v = x.copy(), np.zeros(12), np.zeros(12)
            ops.adamw([((p.reshape(-1), y.reshape(-1), m, v),
                        adamw_consts(np.dtype(F64), 1, 0.1))])
            return p
        return run, R.adamw_update(x.copy(), y, np.zeros((4, 3)), np.zeros((4, 3)), 1, 0.1)
    if name == "sgd":
        return (lambda: ops.sgd(x.copy(), y, None, 0.1)), x - 0.1 * y
    if name in _ROWWISE_GLU_TOKEN_MIX_EMBEDDING:
        return _ROWWISE_GLU_TOKEN_MIX_EMBEDDING[name](rng, x, y)
    if name in _ATTENTION:
        return _ATTENTION[name](rng)
    raise AssertionError(f"no case for ops.{name}: add one here")


def _softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _swap(a):
    return np.swapaxes(a, 0, 1)


def _add_at(ids, rows):
    out = np.zeros((5, 3))
    np.add.at(out, ids, rows)
    return out


# Row-wise softmax, GLU, token mixing and embedding entries: name -> (rng, x, y) -> (call,
# expected), expected from formulas written here.
_ROWWISE_GLU_TOKEN_MIX_EMBEDDING = {
    "softmax_forward": lambda rng, x, y: (
        lambda: ops.softmax_forward(np.empty((4, 3)), x), _softmax(x)),
    "softmax_backward": lambda rng, x, y: (
        lambda: ops.softmax_backward(np.empty((4, 3)), y, _softmax(x)),
        _softmax(x) * (y - (y * _softmax(x)).sum(1, keepdims=True))),
    "log_softmax_forward": lambda rng, x, y: (
        lambda: ops.log_softmax_forward(np.empty((4, 3)), x), np.log(_softmax(x))),
    "log_softmax_backward": lambda rng, x, y: (
        lambda: ops.log_softmax_backward(np.empty((4, 3)), y, np.log(_softmax(x))),
        y - _softmax(x) * y.sum(1, keepdims=True)),
    "glu_forward": lambda rng, x, y: (
        lambda: ops.glu_forward(np.empty((4, 3)), x.copy(), y.copy(), "tanh", 0.01),
        np.tanh(x) * y),
    "glu_backward": lambda rng, x, y: (
        lambda: ops.glu_backward(x.copy(), np.ones((4, 3)), y), x * y),
    "fill_by_row": lambda rng, x, y: (
        lambda: ops.fill_by_row(np.empty((4, 3)), x[:, 0].copy()), np.repeat(x[:, :1], 3, 1)),
    "rowsum": lambda rng, x, y: (lambda: ops.rowsum(np.ones(4), x, 1.0), x.sum(1) + 1.0),
    "swap01": lambda rng, x, y: (
        lambda: ops.swap01(np.empty((2, 2, 3)), x.reshape(2, 2, 3)), _swap(x.reshape(2, 2, 3))),
    "sgu_gate_forward": lambda rng, x, y: (
        lambda: ops.sgu_gate_forward(np.empty((2, 2, 3)), y.reshape(2, 2, 3), np.full(2, 0.5),
                                     x.reshape(2, 2, 3)),
        x.reshape(2, 2, 3) * (_swap(y.reshape(2, 2, 3)) + 0.5)),
    "sgu_gate_backward": lambda rng, x, y: (
        lambda: ops.sgu_gate_backward(np.empty((2, 2, 3)), np.ones((2, 2, 3)), np.zeros(2),
                                      np.empty((2, 2, 3)), y.reshape(2, 2, 3), np.ones(2),
                                      x.reshape(2, 2, 3)),
        _swap(x.reshape(2, 2, 3) * y.reshape(2, 2, 3))),
    "causal_weight": lambda rng, x, y: (
        lambda: ops.causal_weight(np.empty((3, 3)), x[:3], np.tri(3)), np.tril(x[:3])),
    "causal_grad_add": lambda rng, x, y: (
        lambda: ops.causal_grad_add(np.ones((3, 3)), x[:3].copy(), np.tri(3)),
        1.0 + np.tril(x[:3])),
    "embedding_forward": lambda rng, x, y: (
        lambda: ops.embedding_forward(np.empty((4, 3)), np.array([2, 0, 2, 1]), x),
        x[[2, 0, 2, 1]]),
    "embedding_backward": lambda rng, x, y: (
        lambda: ops.embedding_backward(np.zeros((5, 3)), np.array([4, 0, 4, 1]), y),
        _add_at([4, 0, 4, 1], y)),
}


@pytest.mark.parametrize("name", ops.NAMES)
def test_every_entry_computes_its_kernel(name):
    # Check that each entry is wired to the kernel its name says (float64, tiny shapes).
    run, expected = _case(name, np.random.default_rng(7))
    np.testing.assert_allclose(np.asarray(run()), expected, rtol=1e-12, atol=1e-12)


# Multi-head attention layouts: expected values by NumPy indexing written here.
_ATTENTION = {
    "heads_split": lambda rng: (lambda a: (
        lambda: ops.heads_split(np.empty((3, 2, 2, 3, 2)), a, 2),
        a.reshape(2, 3, 3, 2, 2).transpose(2, 0, 3, 1, 4)))(rng.standard_normal((2, 3, 12))),
    "heads_merge": lambda rng: (lambda a: (
        lambda: ops.heads_merge(np.empty((2, 3, 4)), a),
        a.transpose(1, 3, 0, 2, 4).reshape(2, 3, 4)))(rng.standard_normal((1, 2, 2, 3, 2))),
    "causal_fill": lambda rng: (lambda a: (
        lambda: ops.causal_fill(a.copy(), -5.0),
        np.where(np.tri(3, dtype=bool), a, -5.0)))(rng.standard_normal((2, 3, 3))),
    "sdpa_forward": lambda rng: (lambda a: (
        lambda: ops.sdpa_forward(np.empty((1, 3, 4)), np.zeros((2, 3, 3)), a, 2, 0.5, True),
        R.sdpa_forward(np.empty((1, 3, 4)), np.zeros((2, 3, 3)), a, 2, 0.5, True)))(
            rng.standard_normal((1, 3, 12))),
    "sdpa_backward": lambda rng: (lambda a, g: (
        lambda: ops.sdpa_backward(np.empty((1, 3, 12)), g, _sdpa_p(a), a, 2, 0.5, True),
        R.sdpa_backward(np.empty((1, 3, 12)), g, _sdpa_p(a), a, 2, 0.5, True)))(
            rng.standard_normal((1, 3, 12)), rng.standard_normal((1, 3, 4))),
}


def _sdpa_p(qkv):
    """The reference forward's probabilities for qkv (1, 3, 12) with 2 heads."""
    p = np.zeros((2, 3, 3))
    R.sdpa_forward(np.empty((1, 3, 4)), p, qkv, 2, 0.5, True)
    return p
