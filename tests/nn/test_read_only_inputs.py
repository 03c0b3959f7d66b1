"""Read-only inputs (``x.setflags(write=False)``: a memory-mapped file, a broadcast, a frozen
array): every module gives the same output and gradients as for a writable copy, where a
compiled kernel's in-place branch once failed to compile (AddNorm's row add, dropout)."""
import numpy as np
import pytest

from kernels import ops
from kernels import reference as ref
from support import modules_zoo as zoo


def _run(name, lock: bool):
    """Forward and backward of the zoo's module ``name``; inputs and dy read-only if lock."""
    case = zoo.CASES[name]
    m = case.build(0)
    rng = np.random.default_rng(2)
    args = [rng.standard_normal((5, case.d_in))]
    if case.kind == "addnorm":
        args.append(rng.standard_normal((5, case.d_in)))
    for a in args:
        a.setflags(write=not lock)
    y = zoo.copy_out(m.forward(*args))
    dy = rng.standard_normal(y.shape)
    dy.setflags(write=not lock)
    dx = zoo.copy_out(m.backward(dy))
    return y, dx, zoo.params_and_grads(m), args


@pytest.mark.parametrize("name", zoo.MODULES)
def test_a_read_only_input_gives_what_a_writable_one_gives(name):
    # Check bit-identical output, input gradient and parameter gradients, inputs untouched.
    y, dx, state, _ = _run(name, lock=False)
    y_ro, dx_ro, state_ro, args = _run(name, lock=True)
    np.testing.assert_array_equal(y_ro, y)
    for a, b in zip(np.atleast_1d(dx_ro) if not isinstance(dx, tuple) else dx_ro,
                    np.atleast_1d(dx) if not isinstance(dx, tuple) else dx):
        np.testing.assert_array_equal(a, b)
    for n in state:
        np.testing.assert_array_equal(state_ro[n][1], state[n][1], err_msg=n)
    assert all(not a.flags.writeable for a in args)


@pytest.mark.parametrize("which", ["a", "b", "both"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_add_takes_read_only_operands(which, dtype):
    # Check ops.add with a read-only operand against the reference, into a fresh output.
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((7, 5)).astype(dtype) for _ in range(2))
    want = ref.add(np.empty_like(a), a, b)
    if which in ("a", "both"):
        a.setflags(write=False)
    if which in ("b", "both"):
        b.setflags(write=False)
    out = np.empty_like(a)
    np.testing.assert_array_equal(ops.add(out, a, b), want)


def test_row_add_in_place_onto_a_writable_operand_with_a_read_only_other():
    # Check out = a += b with b read-only (AddNorm's dropout path) against the reference.
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    want = ref.add(np.empty_like(a), a, b)
    b.setflags(write=False)
    np.testing.assert_array_equal(ops.add(a, a, b), want)
