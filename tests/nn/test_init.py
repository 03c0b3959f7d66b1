"""Weight initialisation (seed 004): He and Xavier variances, signal propagation through deep
ReLU stacks, and the explosion that N(0, 1) weights cause."""
import numpy as np
import pytest

from engine import MLP, Linear


def _var_ratio(W, expected_var):
    return np.var(W) / expected_var


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_he_variance(dtype):
    # Check that He init on 1000 -> 500 has variance 2/n_in within 15% and mean ~0.
    W = Linear(1000, 500, init="he", dtype=dtype, rng=0).W.data
    assert W.shape == (1000, 500) and W.dtype == dtype
    assert abs(_var_ratio(W, 2.0 / 1000) - 1.0) < 0.15
    assert abs(W.mean()) < 0.05 * np.sqrt(2.0 / 1000)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_xavier_variance(dtype):
    # Check that Xavier init on 1000 -> 500 has variance 2/(n_in + n_out) within 15%.
    W = Linear(1000, 500, init="xavier", dtype=dtype, rng=1).W.data
    assert abs(_var_ratio(W, 2.0 / 1500) - 1.0) < 0.15


def test_he_and_xavier_differ_as_expected():
    # Check that the two inits are told apart: He's variance is 1.5x Xavier's at 1000 -> 500,
    # and the 15% band would catch a swap.
    he = np.var(Linear(1000, 500, init="he", rng=2).W.data)
    xa = np.var(Linear(1000, 500, init="xavier", rng=2).W.data)
    assert abs(he / xa - 1.5) < 0.05


def test_normal_and_zeros_init():
    # Check "normal" is N(0, 0.02^2) and "zeros" is all zeros; biases start at zero.
    lin = Linear(1000, 500, init="normal", rng=3)
    assert abs(np.std(lin.W.data) / 0.02 - 1.0) < 0.05
    assert not lin.b.data.any()
    assert not Linear(30, 20, init="zeros").W.data.any()


def test_he_relu_stack_keeps_activation_variance():
    # Check that five 256-wide He-initialised ReLU layers keep the activation variance of a
    # unit-variance input in (0.01, 100): neither vanishing nor exploding.
    rng = np.random.default_rng(4)
    m = MLP([256] * 6, ["relu"] * 5, init="he", dtype=np.float64, rng=5)
    x = rng.standard_normal((1000, 256))
    var = np.var(m(x))
    assert 0.01 < var < 100, var


def test_standard_normal_weights_explode():
    # Check that the same stack with N(0, 1) weights blows the activation variance past 1e6
    # (each layer multiplies it by about n/2 = 128).
    rng = np.random.default_rng(6)
    m = MLP([256] * 6, ["relu"] * 5, dtype=np.float64, rng=7)
    m.load_state_dict({n: (rng.standard_normal(p.shape) if n.endswith("W") else np.zeros(p.shape))
                       for n, p in m.named_parameters()})
    x = rng.standard_normal((1000, 256))
    assert np.var(m(x)) > 1e6


def test_small_weights_vanish():
    # Check the other side: weights 10x smaller than He make the signal vanish (< 0.01).
    rng = np.random.default_rng(8)
    m = MLP([256] * 6, ["relu"] * 5, dtype=np.float64, rng=9)
    for p in m.parameters():
        p.data *= 0.1
    assert np.var(m(rng.standard_normal((1000, 256)))) < 0.01


def test_init_is_seeded():
    # Check that the init of every layer of an MLP is reproducible from one seed.
    a, b = MLP([10, 20, 5], init="xavier", rng=11), MLP([10, 20, 5], init="xavier", rng=11)
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    # Layers draw in turn from one generator: the two hidden weights are not copies.
    assert not np.array_equal(a[0].W.data[:5, :5], a[1].W.data[:5, :5])
