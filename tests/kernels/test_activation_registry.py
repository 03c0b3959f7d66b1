"""kernels.activations.REGISTRY: every entry a scalar pair with generated kernels for both
dtypes agreeing with its reference, construction refusing malformed entries, and
sign_from_output meaning what the engine relies on (act' recomputed from act(z) equals
act'(z))."""
from __future__ import annotations

import numpy as np
import pytest

from kernels import activation_pairs
from kernels import activations as A
from kernels import reference as R

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
TOL = {np.dtype(np.float64): dict(rtol=1e-12, atol=1e-14),
       np.dtype(np.float32): dict(rtol=2e-5, atol=2e-6)}


def _sample(dtype, shape=(9, 13)):
    rng = np.random.default_rng(0)
    z = (3.0 * rng.standard_normal(shape)).astype(dtype)
    z.flat[:6] = [0.0, -0.0, 1e-3, -1e-3, 7.5, -7.5]
    return z


def _kernel_stub(*args):
    pass


def _fields(**over):
    """Arguments of a complete entry (the relu pair and reference), with ``over`` applied."""
    relu = A.REGISTRY["relu"]
    kw = dict(name="probe", forward=relu.forward, derivative=relu.derivative,
              reference=R.relu, reference_grad=R.relu_grad, sign_from_output=True)
    kw.update(over)
    return kw


# ----------------------------------------------------------------------------- completeness
def test_activations_are_the_registry_names():
    # Check that ACTIVATIONS lists exactly the registry's names, each once, relu2 and mish
    # among them.
    assert A.ACTIVATIONS == tuple(A.REGISTRY)
    assert len(set(A.ACTIVATIONS)) == len(A.ACTIVATIONS)
    assert {"relu2", "mish"} <= set(A.ACTIVATIONS)


@pytest.mark.parametrize("name", A.ACTIVATIONS)
def test_entry_has_every_field_and_generated_kernels(name):
    # Check that the entry is an Activation named by its key, with a callable scalar pair,
    # reference pair, a bool sign_from_output, and every generated kernel for both dtypes.
    e = A.REGISTRY[name]
    assert isinstance(e, A.Activation)
    assert e.name == name
    assert callable(e.forward) and callable(e.derivative)
    assert callable(e.reference) and callable(e.reference_grad)
    assert type(e.sign_from_output) is bool
    for dt in DTYPES:
        kern = A.kernels_for(name, dt)
        assert all(callable(k) for k in kern), kern


@pytest.mark.parametrize("name", A.ACTIVATIONS)
def test_scalar_pair_agrees_with_reference(name):
    # Check that the pair itself, run as Python on float64 numbers, is the reference's act and
    # act' (it is what the kernels are generated from).
    e = A.REGISTRY[name]
    z = _sample(np.float64)
    np.testing.assert_allclose([e.forward(float(v), 0.01) for v in z.flat],
                               e.reference(z, 0.01).ravel(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose([e.derivative(float(v), 0.01) for v in z.flat],
                               e.reference_grad(z, 0.01).ravel(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", A.ACTIVATIONS)
def test_entry_kernels_agree_with_its_reference(name, dtype):
    # Check that, through the public kernels, every entry's forward, forward with cached
    # derivative, recomputed backward (with and without h) and cached backward agree with
    # its own reference pair on a sample.
    e = A.REGISTRY[name]
    z = _sample(dtype)
    dh = np.random.default_rng(1).standard_normal(z.shape).astype(dtype)
    want_h, want_g = e.reference(z, 0.01), e.reference_grad(z, 0.01)
    assert want_h.dtype == dtype and want_g.dtype == dtype
    h, g, h2 = np.empty_like(z), np.empty_like(z), np.empty_like(z)
    A.bias_act_forward(h, z.copy(), None, name)
    A.bias_act_forward(h2, z.copy(), None, name, grad=g)
    np.testing.assert_allclose(h, want_h, **TOL[dtype], err_msg="forward")
    np.testing.assert_allclose(h2, want_h, **TOL[dtype], err_msg="forward with grad")
    np.testing.assert_allclose(g, want_g, **TOL[dtype], err_msg="cached derivative")
    for hh in (None, h):
        dz = A.act_backward(np.empty_like(z), dh, z, name, h=hh)
        np.testing.assert_allclose(dz, dh * want_g, **TOL[dtype], err_msg=f"backward h={hh is not None}")
    dz = A.act_backward_cached(np.empty_like(z), dh, g)
    np.testing.assert_allclose(dz, dh * want_g, **TOL[dtype], err_msg="cached backward")


@pytest.mark.parametrize("name", A.ACTIVATIONS)
def test_reference_dispatch_uses_the_entry(name):
    # Check that kernels.reference.activation / activation_grad evaluate the entry's own
    # reference pair (one source of truth for the naive twins).
    z = _sample(np.float64)
    e = A.REGISTRY[name]
    np.testing.assert_array_equal(R.activation(z, name), e.reference(z, 0.01))
    np.testing.assert_array_equal(R.activation_grad(z, name), e.reference_grad(z, 0.01))


def test_reference_imports_no_fast_kernel():
    # Check that kernels.reference is pure NumPy: it imports nothing from the kernels package
    # but its own attention part (kernels/reference_attention.py), which imports nothing either.
    import ast
    import os
    attention = os.path.join(os.path.dirname(R.__file__), "reference_attention.py")
    for path in (R.__file__, attention):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                own = node.level == 1 and node.module == "reference_attention"
                assert own or (node.level == 0 and not (node.module or "").startswith(
                    "kernels")), node.module
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("kernels") for a in node.names)


def test_reference_rejects_unknown_names():
    # Check that the reference dispatch raises ValueError naming act for an unknown name.
    with pytest.raises(ValueError, match=r"^act\b.*'swish'"):
        R.activation(np.zeros((2, 2)), "swish")
    with pytest.raises(ValueError, match=r"^act\b"):
        R.activation_grad(np.zeros((2, 2)), None)
    with pytest.raises(ValueError, match=r"^act\b"):
        R.activation(np.zeros((2, 2)), "softmax")  # a reference function, not an activation


def test_registry_is_read_only():
    # Check that the registry cannot be changed after import (ACTIVATIONS would go stale).
    with pytest.raises(TypeError):
        A.REGISTRY["probe"] = A.REGISTRY["relu"]
    with pytest.raises(AttributeError):
        A.REGISTRY["relu"].forward = _kernel_stub


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("over, exc, words", [
    (dict(forward=None), TypeError, "forward"),
    (dict(derivative=1.0), TypeError, "derivative"),
    (dict(reference=None), TypeError, "reference"),
    (dict(reference_grad="relu"), TypeError, "reference_grad"),
    (dict(sign_from_output=1), TypeError, "sign_from_output"),
    (dict(sign_from_output=None), TypeError, "sign_from_output"),
    (dict(name=""), ValueError, "name"),
    (dict(name=3), ValueError, "name"),
])
def test_malformed_entry_is_an_error(over, exc, words):
    # Check that a wrong type or value in any field raises at construction, naming the field.
    with pytest.raises(exc, match=words):
        A.Activation(**_fields(**over))


def test_unknown_kernels_are_an_error():
    # Check that asking for the kernels of an unregistered name or dtype raises ValueError.
    with pytest.raises(ValueError, match="'probe'"):
        A.kernels_for("probe", np.dtype(np.float32))
    with pytest.raises(ValueError, match="float16"):
        A.kernels_for("relu", np.dtype(np.float16))


def test_duplicate_names_are_an_error():
    # Check that building a registry with one name twice raises ValueError naming it.
    e = A.Activation(**_fields())
    with pytest.raises(ValueError, match="'probe'"):
        activation_pairs._registry(e, e)


# ----------------------------------------------------------------------------- sign_from_output
def _sign_sample():
    z = np.concatenate([np.linspace(-6.0, 6.0, 241), [0.0, -0.0, 1e-300, -1e-300, 1e3, -1e3]])
    return z.reshape(1, -1)


@pytest.mark.parametrize("name", A.ACTIVATIONS)
def test_sign_from_output_flag_matches_its_definition(name):
    # Check that sign_from_output is set exactly for the activations whose derivative,
    # recomputed from act(z) in place of z, is act'(z) (float64 references): what a module
    # relies on when it overwrites z with act(z) and runs the backward on that buffer.
    # (act(z) > 0 exactly where z > 0 is not enough: relu2, gelu, silu, tanh and mish have
    # that, but their act' needs |z|.)
    e = A.REGISTRY[name]
    z = _sign_sample()
    recomputable = np.array_equal(e.reference_grad(e.reference(z, 0.01), 0.01),
                                  e.reference_grad(z, 0.01))
    assert e.sign_from_output == recomputable
    if e.sign_from_output:  # and the sign itself survives
        h = e.reference(z, 0.01)
        np.testing.assert_array_equal(h > 0, z > 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [n for n in A.ACTIVATIONS if A.REGISTRY[n].sign_from_output])
def test_sign_from_output_backward_on_the_overwritten_buffer(name, dtype):
    # Check that for flagged activations the kernels' forward run in place (h is z) followed
    # by act_backward on that buffer gives exactly the backward on the original z.
    z0 = _sign_sample().astype(dtype)
    dh = np.random.default_rng(2).standard_normal(z0.shape).astype(dtype)
    want = A.act_backward(np.empty_like(z0), dh, z0, name)
    z = z0.copy()
    A.bias_act_forward(z, z, None, name)
    np.testing.assert_array_equal(A.act_backward(np.empty_like(z), dh, z, name), want)
