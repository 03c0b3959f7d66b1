"""engine.nn.blocks: bad input at the public boundary gives a clear error and leaves the module
unchanged (parameters and the cached forward), for every block; constructor argument checks."""
import numpy as np
import pytest

from engine import FFN, GMLP, AddNorm, Dropout, FFNSublayer, LayerNorm
from kernels.activations import ACTIVATIONS

F64 = np.float64

BLOCKS = {  # name -> (factory, d_in, d_out)
    "ffn": (lambda: FFN(6, 10, "gelu", dtype=F64, rng=0), 6, 6),
    "gmlp": (lambda: GMLP(6, 5, 7, 4, dtype=F64, rng=0), 6, 4),
    "layernorm": (lambda: LayerNorm(6, dtype=F64), 6, 6),
    "dropout": (lambda: Dropout(0.3, dtype=F64, rng=0), 6, 6),
    "sub_post": (lambda: FFNSublayer(6, 10, dtype=F64, rng=0), 6, 6),
    "sub_pre": (lambda: FFNSublayer(6, 10, norm="pre", dtype=F64, rng=0), 6, 6),
}

BAD_X = [  # (description, maker(d), exception, message fragment)
    ("last dim", lambda d: np.ones((4, d + 1)), ValueError, "last dimension"),
    ("dtype", lambda d: np.ones((4, d), np.float32), TypeError, "float64"),
    ("int dtype", lambda d: np.ones((4, d), np.int64), TypeError, "dtype"),
    ("1-D", lambda d: np.ones(d), ValueError, "(N, "),
    ("4-D", lambda d: np.ones((1, 2, 4, d)), ValueError, "(N, "),
    ("list", lambda d: [[1.0] * d] * 4, TypeError, "numpy.ndarray"),
    ("non-contiguous", lambda d: np.ones((4, 2 * d))[:, ::2], ValueError, "C-contiguous"),
]


def _snapshot(m):
    return {n: p.data.copy() for n, p in m.named_parameters()}


@pytest.mark.parametrize("name", list(BLOCKS))
@pytest.mark.parametrize("desc,make,exc,frag", BAD_X, ids=[b[0] for b in BAD_X])
def test_bad_input_clear_error_module_unchanged(name, desc, make, exc, frag):
    # Check that a bad x raises the documented error naming x and changes nothing: parameters,
    # and the cached forward (a later backward equals a clean module's).
    factory, d_in, d_out = BLOCKS[name]
    if name == "dropout" and desc == "last dim":
        pytest.skip("Dropout accepts any feature size")
    rng = np.random.default_rng(0)
    m, clean = factory(), factory()
    x, dy = rng.standard_normal((4, d_in)), rng.standard_normal((4, d_out))
    m(x)
    clean(x)
    before = _snapshot(m)
    with pytest.raises(exc, match="x") as info:
        m(make(d_in))
    assert frag in str(info.value)
    for n, v in _snapshot(m).items():
        np.testing.assert_array_equal(v, before[n], err_msg=n)
    np.testing.assert_array_equal(m.backward(dy), clean.backward(dy))


@pytest.mark.parametrize("name", list(BLOCKS))
def test_backward_before_forward_names_module(name):
    # Check that backward with no forward (and a second backward after one) is a RuntimeError
    # naming the module class.
    factory, d_in, d_out = BLOCKS[name]
    m = factory()
    cls = type(m).__name__
    with pytest.raises(RuntimeError, match=cls):
        m.backward(np.ones((4, d_out)))
    m(np.ones((4, d_in)))
    m.backward(np.ones((4, d_out)))
    with pytest.raises(RuntimeError, match=cls):
        m.backward(np.ones((4, d_out)))


@pytest.mark.parametrize("name", list(BLOCKS))
def test_bad_dy_clear_error_cache_kept(name):
    # Check that dy of the wrong shape / dtype / type is rejected naming dy, with no gradient
    # touched, and that the forward cache survives for a correct backward.
    factory, d_in, d_out = BLOCKS[name]
    rng = np.random.default_rng(1)
    m, clean = factory(), factory()
    x, dy = rng.standard_normal((2, 3, d_in)), rng.standard_normal((2, 3, d_out))
    m(x)
    clean(x)
    bad = [(np.ones((6, d_out)), ValueError, r"dy: expected shape \(2, 3, %d\)" % d_out),
           (np.ones((2, 3, d_out + 1)), ValueError, "dy: expected shape"),
           (dy.astype(np.float32), TypeError, "dy: expected dtype float64"),
           (dy.tolist(), TypeError, "dy: expected a numpy.ndarray"),
           (np.ones((2, 3, 2 * d_out))[..., ::2], ValueError, "C-contiguous")]
    for arr, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            m.backward(arr)
    assert all(not p.grad.any() for p in m.parameters())
    np.testing.assert_array_equal(m.backward(dy), clean.backward(dy))


def test_addnorm_mismatched_shapes_name_both():
    # Check that AddNorm rejects x and sub of different shapes with both shapes in the message,
    # and keeps its previous cache.
    m, clean = AddNorm(6, dtype=F64), AddNorm(6, dtype=F64)
    x = np.random.default_rng(2).standard_normal((4, 6))
    m(x, x)
    clean(x, x)
    for sub in (np.ones((5, 6)), np.ones((4, 7)), np.ones((1, 4, 6))):
        with pytest.raises(ValueError, match=r"x, sub") as info:
            m(x, sub)
        assert str((4, 6)) in str(info.value) and str(sub.shape) in str(info.value)
    with pytest.raises(TypeError, match="sub"):
        m(x, x.astype(np.float32))
    with pytest.raises(TypeError, match="sub"):
        m(x, "nope")
    for a, b in zip(m.backward(np.ones((4, 6))), clean.backward(np.ones((4, 6)))):
        np.testing.assert_array_equal(a, b)


def test_ffn_bad_activation_lists_names():
    # Check that an unknown activation name is a ValueError listing every valid name.
    with pytest.raises(ValueError, match="activation") as info:
        FFN(4, 8, "swish")
    for act in ACTIVATIONS:
        assert act in str(info.value)
    with pytest.raises(ValueError, match="activation"):
        FFNSublayer(4, 8, "swish")


@pytest.mark.parametrize("call,exc,frag", [
    (lambda: FFNSublayer(4, 8, norm="middle"), ValueError, "norm"),
    (lambda: FFN(4, 8, dropout=1.0), ValueError, "dropout"),
    (lambda: FFN(4, 8, dropout=-0.1), ValueError, "dropout"),
    (lambda: AddNorm(4, dropout="0.1"), TypeError, "dropout"),
    (lambda: Dropout(1.5), ValueError, "p"),
    (lambda: FFN(0, 8), ValueError, "d_model"),
    (lambda: FFN(4, 2.5), TypeError, "d_ff"),
    (lambda: GMLP(4, 4, 0, 4), ValueError, "d_ffn"),
    (lambda: LayerNorm(True), TypeError, "d"),
    (lambda: FFN(4, 8, init="uniform"), ValueError, "init"),
    (lambda: FFN(4, 8, dtype=np.int32), TypeError, "dtype"),
    (lambda: AddNorm(4, eps=-1.0), ValueError, "eps"),
    (lambda: GMLP(4, 4, 4, 4, rng="seed"), TypeError, "rng"),
])
def test_constructor_argument_errors(call, exc, frag):
    # Check that bad constructor arguments raise the right error naming the argument.
    with pytest.raises(exc, match=frag):
        call()


def test_load_state_dict_wrong_shape_leaves_gmlp_unchanged():
    # Check that a state dict with one wrong shape is rejected and no parameter is written
    # (including the combined gate/proj weight behind the views).
    m = GMLP(6, 5, 7, 4, dtype=F64, rng=0)
    before = m.Wgp_T.copy()
    sd = {k: v + 1.0 for k, v in m.state_dict().items()}
    sd["W_out"] = np.ones((7, 5))
    with pytest.raises(ValueError, match="W_out"):
        m.load_state_dict(sd)
    np.testing.assert_array_equal(m.Wgp_T, before)
