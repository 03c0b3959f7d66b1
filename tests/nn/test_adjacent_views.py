"""engine.nn.module.adjacent_views: the one helper behind GMLP's and GatedFFN's fused GEMMs
over two weights kept back to back in the parameter arena."""
import numpy as np
import pytest

from engine import GMLP, GatedFFN, Linear
from engine.nn.module import adjacent_views


def test_views_span_the_parameters_in_order():
    # Check the data view is the two parameters' values back to back and writes through.
    m = GatedFFN(4, 6, bias=True, dtype=np.float64, rng=0)
    data, grad = adjacent_views((m.W_gate, m.W_up), "test")
    assert data.size == m.W_gate.size + m.W_up.size
    np.testing.assert_array_equal(data[:m.W_gate.size].reshape(-1),
                                  m.W_gate.data.reshape(-1, order="A"))
    assert np.shares_memory(data, m.W_up.data) and np.shares_memory(grad, m.W_up.grad)
    assert m.Wgu_T.base is not None and np.shares_memory(m.Wgu_T, data)


def test_parameters_out_of_order_or_in_two_arenas_are_refused():
    # Check the reversed order and parameters of two separate models raise RuntimeError
    # naming the caller's description.
    m = GMLP(4, 6, 8, 2, dtype=np.float64, rng=0)
    with pytest.raises(RuntimeError, match="^swapped must be adjacent in the arena$"):
        adjacent_views((m.W_proj, m.W_gate), "swapped")
    a, b = Linear(2, 2, rng=0), Linear(2, 2, rng=1)
    with pytest.raises(RuntimeError, match="two models"):
        adjacent_views((a.W, b.W), "two models")
