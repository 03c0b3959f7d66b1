"""kernels.activations.REGISTRY: every entry complete for both dtypes and agreeing with its
reference, construction refusing incomplete entries, and sign_from_output meaning what the
engine relies on (act' recomputed from act(z) equals act'(z))."""
from __future__ import annotations

import numpy as np
import pytest

from kernels import activations as A
from kernels import reference as R

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
KERNEL_FIELDS = ("forward", "forward_grad", "backward")
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
    """Arguments of a complete entry (the relu kernels and reference), with ``over`` applied."""
    relu = A.REGISTRY["relu"]
    kw = dict(name="probe", forward=dict(relu.forward), forward_grad=dict(relu.forward_grad),
              backward=dict(relu.backward), reference=R.relu, reference_grad=R.relu_grad,
              sign_from_output=True)
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
def test_entry_has_every_field_for_both_dtypes(name):
    # Check that the entry is an Activation named by its key, with a callable kernel for
    # float32 and float64 in forward, forward_grad and backward (and nothing else), callable
    # reference functions and a bool sign_from_output.
    e = A.REGISTRY[name]
    assert isinstance(e, A.Activation)
    assert e.name == name
    for field in KERNEL_FIELDS:
        kernels = getattr(e, field)
        assert set(kernels) == set(DTYPES), (field, set(kernels))
        assert all(callable(kernels[dt]) for dt in DTYPES), field
    assert callable(e.reference) and callable(e.reference_grad)
    assert type(e.sign_from_output) is bool


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


def test_reference_rejects_unknown_names():
    # Check that the reference dispatch raises ValueError naming act for an unknown name.
    with pytest.raises(ValueError, match=r"^act\b.*'swish'"):
        R.activation(np.zeros((2, 2)), "swish")
    with pytest.raises(ValueError, match=r"^act\b"):
        R.activation_grad(np.zeros((2, 2)), None)


def test_registry_is_read_only():
    # Check that the registry cannot be changed after import (ACTIVATIONS would go stale).
    with pytest.raises(TypeError):
        A.REGISTRY["probe"] = A.REGISTRY["relu"]
    with pytest.raises(TypeError):
        A.REGISTRY["relu"].forward[np.dtype(np.float32)] = _kernel_stub


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("field", KERNEL_FIELDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_missing_kernel_is_an_error(field, dtype):
    # Check that an entry lacking one dtype's kernel in one field raises ValueError naming
    # the entry, the field and the dtype, instead of falling back to anything.
    kernels = dict(getattr(A.REGISTRY["relu"], field))
    del kernels[dtype]
    with pytest.raises(ValueError, match=rf"'probe'.*{field}.*{dtype}"):
        A.Activation(**_fields(**{field: kernels}))


@pytest.mark.parametrize("over, exc, words", [
    (dict(forward={np.float32: _kernel_stub, np.float64: None}), TypeError, "forward"),
    (dict(backward=_kernel_stub), TypeError, "backward"),
    (dict(forward_grad={np.float16: _kernel_stub, np.float32: _kernel_stub,
                        np.float64: _kernel_stub}), ValueError, "forward_grad.*float16"),
    (dict(forward_grad={"no such dtype": _kernel_stub}), ValueError, "forward_grad"),
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


def test_complete_entry_accepts_dtype_types_as_keys():
    # Check that kernels keyed by np.float32 / np.float64 (types, not dtypes) are accepted and
    # looked up by the arrays' dtype.
    e = A.Activation(**_fields(forward={np.float32: _kernel_stub, np.float64: _kernel_stub}))
    z = np.zeros((1, 1), np.float64)
    assert e.forward[z.dtype] is _kernel_stub


def test_duplicate_names_are_an_error():
    # Check that building a registry with one name twice raises ValueError naming it.
    e = A.Activation(**_fields())
    with pytest.raises(ValueError, match="'probe'"):
        A._registry(e, e)


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
