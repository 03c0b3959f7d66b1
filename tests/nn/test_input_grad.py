"""``backward(dy, input_grad=False)``: the parameter gradients alone, for an input that is data
(PyTorch's input without ``requires_grad``). Over every module kind of the zoo, float64: the
same gradients bit for bit, None returned, the input-gradient GEMM left out where a layer has
one of its own, bad values rejected changing nothing; Embedding and GPT accept the option;
``fit`` uses it, and still trains a model whose ``backward`` has the older signature."""
import numpy as np
import pytest

from modules_zoo import (CASES, SHAPES, SINGLE, array, assert_same_state, copy_out, lead,
                         pair)

from engine.nn.module import Module
from kernels.instrument import record

# The zoo modules whose first layer computes the input gradient with a GEMM of its own.
SKIPS_A_GEMM = ["linear", "linear_nobias", "linear_5_7", "linear_softmax", "ffn_relu",
                "ffn_gelu", "ffn_relu_drop", "ffn_gelu_drop", "ffn_nobias", "gmlp", "gmlp_5_4",
                "mlp", "mlp_acts_out", "sequential", "sublayer_post", "sublayer_post_drop",
                "gated_silu", "gated_gelu_bias_drop", "sequential_checkpoint"]


def _pending_pair(name, shape, seed=5):
    """Module and twin with the same forward pending; returns (m, twin, x, dy)."""
    case = CASES[name]
    rng = np.random.default_rng(seed)
    m, twin = pair(name)
    x = array(rng, lead(shape), case.d_in)
    dy = array(rng, lead(shape), case.d_out)
    m.forward(x)
    twin.forward(x)
    return m, twin, x, dy


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE)
def test_same_parameter_gradients_and_none_returned(name, shape):
    # Check that leaving out the input gradient changes no parameter gradient (bit for bit)
    # and that nothing is returned in its place.
    m, twin, _, dy = _pending_pair(name, shape)
    assert m.backward(dy, input_grad=False) is None
    twin.backward(dy)
    assert_same_state(m, twin)


def _gemm_outputs(m, x, dy, input_grad):
    m.forward(x)
    with record() as rec:
        m.backward(dy, input_grad=input_grad)
    return [c.args[0].shape for c in rec.of("gemm")]


@pytest.mark.parametrize("name", SINGLE)
def test_the_input_gradient_gemm_is_left_out(name):
    # Check that a layer whose input gradient is its own GEMM runs exactly that GEMM fewer
    # (the one writing an (N, d_in) array), and that no module runs more.
    case = CASES[name]
    m, _, x, dy = _pending_pair(name, "2d")
    m.backward(dy)
    full = _gemm_outputs(m, x, dy, True)
    fewer = _gemm_outputs(m, x, dy, False)
    if name in SKIPS_A_GEMM:
        assert len(fewer) == len(full) - 1, (full, fewer)
        missing = list(full)
        for shape in fewer:
            missing.remove(shape)
        assert missing == [x.shape[:-1] + (case.d_in,)]
    else:
        assert fewer == full


@pytest.mark.parametrize("bad", [0, 1, None, "False", 0.0])
@pytest.mark.parametrize("name", ["linear", "ffn_gelu_drop", "mlp", "sequential_checkpoint",
                                  "layernorm", "sublayer_pre"])
def test_bad_input_grad_raises_and_changes_nothing(name, bad):
    # Check that a value other than a bool raises a TypeError naming input_grad, leaves the
    # gradients alone and keeps the forward pending for a correct backward.
    m, twin, _, dy = _pending_pair(name, "3d")
    with pytest.raises(TypeError, match="input_grad"):
        m.backward(dy, input_grad=bad)
    assert_same_state(m, twin)
    np.testing.assert_array_equal(copy_out(m.backward(dy)), copy_out(twin.backward(dy)))
    assert_same_state(m, twin)


@pytest.mark.parametrize("name", ["linear", "ffn_relu", "gmlp", "mlp", "sequential",
                                  "sequential_checkpoint", "layernorm"])
def test_dx_acc_with_input_grad_false_raises_and_changes_nothing(name):
    # Check that asking for the input gradient to be added somewhere and for no input
    # gradient at once is a ValueError naming dx_acc, changing nothing.
    m, twin, x, dy = _pending_pair(name, "2d")
    acc = np.ones_like(x)
    with pytest.raises(ValueError, match="dx_acc"):
        m.backward(dy, dx_acc=acc, input_grad=False)
    np.testing.assert_array_equal(acc, np.ones_like(x))
    assert_same_state(m, twin)
    np.testing.assert_array_equal(copy_out(m.backward(dy)), copy_out(twin.backward(dy)))


@pytest.mark.parametrize("name", ["linear", "mlp", "sequential_checkpoint"])
def test_input_grad_false_uses_up_the_forward(name):
    # Check that the rule "one backward per forward" holds with the option too.
    m, _, _, dy = _pending_pair(name, "2d")
    m.backward(dy, input_grad=False)
    with pytest.raises(RuntimeError, match="no forward"):
        m.backward(dy, input_grad=False)


def test_numpy_bools_are_accepted():
    m, twin, _, dy = _pending_pair("linear", "2d")
    assert m.backward(dy, input_grad=np.False_) is None
    twin.backward(dy)
    assert_same_state(m, twin)


def test_embedding_and_gpt_take_the_option():
    # Check that the modules of integer ids accept input_grad (their gradient w.r.t. ids is
    # None either way), give the same parameter gradients, and reject a non-bool.
    from engine.models.gpt import GPT
    from engine.nn.embedding import Embedding
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 11, (3, 5))
    for make, dy_shape in ((lambda: Embedding(11, 6, rng=1), (3, 5, 6)),
                           (lambda: GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2,
                                        d_model=8, rng=1), (3, 5, 11))):
        m, twin = make(), make()
        dy = rng.standard_normal(dy_shape).astype(np.float32)
        m.forward(ids)
        twin.forward(ids)
        with pytest.raises(TypeError, match="input_grad"):
            m.backward(dy, input_grad="no")
        assert m.backward(dy, input_grad=False) is None
        assert twin.backward(dy) is None
        assert_same_state(m, twin)


def _mlp_data():
    from engine.nn.containers import MLP
    rng = np.random.default_rng(3)
    X = rng.standard_normal((12, 6)).astype(np.float32)
    Y = rng.standard_normal((12, 2)).astype(np.float32)
    return MLP([6, 5, 4, 2], ["relu", "tanh", None], rng=0), X, Y


def test_fit_leaves_out_the_input_gradient_and_trains_the_same():
    # Check that fit's step runs one GEMM fewer than forward + backward with the input
    # gradient (the first layer's dx), and that its parameters equal a hand-written loop's
    # that computes dx, bit for bit.
    from engine.nn.losses import MSELoss
    from engine.optim import AdamW
    from engine.training import fit
    model, X, Y = _mlp_data()
    with record() as rec:
        fit(model, MSELoss(), AdamW(model.parameters(), lr=1e-2), X, Y, epochs=1,
            progress=False)
    assert len(rec.of("gemm")) == 3 * 3 - 1

    model, X, Y = _mlp_data()
    fit(model, MSELoss(), AdamW(model.parameters(), lr=1e-2), X, Y, epochs=3, progress=False)
    hand, X, Y = _mlp_data()
    loss, opt = MSELoss(), AdamW(hand.parameters(), lr=1e-2)
    for _ in range(3):
        loss.forward(hand.forward(X), Y)
        assert hand.backward(loss.backward()) is not None
        opt.step(zero_grad=True)
    for (n, p), (_, q) in zip(model.named_parameters(), hand.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)


def test_fit_trains_a_model_whose_backward_has_the_older_signature():
    # Check that a user's module overriding backward(dy) without input_grad still trains.
    from engine.nn.layers import Linear
    from engine.nn.losses import MSELoss
    from engine.optim import SGD
    from engine.training import fit

    class Wrapped(Module):
        def __init__(self):
            super().__init__()
            self.inner = Linear(6, 2, rng=0)

        def forward(self, x):
            return self.inner.forward(x)

        def backward(self, dy):
            return self.inner.backward(dy)

    m = Wrapped()
    _, X, Y = _mlp_data()
    before = m.inner.W.data.copy()
    fit(m, MSELoss(), SGD(m.parameters(), lr=1e-2), X, Y, epochs=1, progress=False)
    assert not np.array_equal(m.inner.W.data, before)


class _OldSignature(Module):
    """A user's module written before input_grad: backward(dy, *, dx_acc=None)."""

    def __init__(self, seed):
        super().__init__()
        from engine.nn.layers import Linear
        self.inner = Linear(6, 5, rng=seed)

    def forward(self, x, *, residual=None):
        return self.inner.forward(x, residual=residual)

    def backward(self, dy, *, dx_acc=None):
        return self.inner.backward(dy, dx_acc=dx_acc)


def test_sequential_whose_first_child_has_the_older_signature():
    # Check that a Sequential calls such a child as before (no input_grad passed when the
    # input gradient is wanted), and with input_grad=False computes its gradient and drops
    # it: the same parameter gradients, None returned, no TypeError.
    from engine.nn.containers import Sequential
    from engine.nn.layers import Linear
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    dy = rng.standard_normal((4, 3)).astype(np.float32)
    m, twin = (Sequential(_OldSignature(0), Linear(5, 3, rng=1)) for _ in range(2))
    m.forward(x)
    twin.forward(x)
    assert m.backward(dy, input_grad=False) is None
    assert twin.backward(dy).shape == x.shape
    assert_same_state(m, twin)


def _leading_dropout(checkpoint):
    from engine.nn.blocks import Dropout
    from engine.nn.containers import Sequential
    from engine.nn.layers import Linear, ReLU
    return Sequential(Dropout(0.3, dtype=np.float64, rng=4), ReLU(dtype=np.float64),
                      Linear(6, 5, dtype=np.float64, rng=1), ReLU(dtype=np.float64),
                      Linear(5, 3, dtype=np.float64, rng=2), checkpoint=checkpoint)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_sequential_stops_at_its_first_child_with_parameters(checkpoint):
    # Check that children before the first one with parameters (dropout and an activation
    # on the data) run no backward, that one gets input_grad=False (its dx GEMM left out),
    # and every parameter gradient is the full backward's, bit for bit.
    rng = np.random.default_rng(6)
    x = rng.standard_normal((7, 6))
    dy = rng.standard_normal((7, 3))
    m, twin = _leading_dropout(checkpoint), _leading_dropout(checkpoint)
    m.forward(x)
    twin.forward(x)
    with record() as rec:
        assert m.backward(dy, input_grad=False) is None
    with record() as full:
        twin.backward(dy)
    assert_same_state(m, twin)
    names, full_names = rec.names(), full.names()
    assert "dropout_backward" in full_names and "dropout_backward" not in names
    assert len(rec.of("gemm")) == len(full.of("gemm")) - 1


def test_sequential_without_parameters_runs_no_backward():
    from engine.nn.blocks import Dropout
    from engine.nn.containers import Sequential
    from engine.nn.layers import ReLU
    m = Sequential(Dropout(0.5, rng=0), ReLU())
    x = np.ones((4, 3), np.float32)
    m.forward(x)
    with record() as rec:
        assert m.backward(np.ones((4, 3), np.float32), input_grad=False) is None
    assert rec.calls == []
    with pytest.raises(RuntimeError, match="no forward"):
        m.backward(np.ones((4, 3), np.float32))
