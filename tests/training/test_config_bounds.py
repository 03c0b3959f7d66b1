"""The dry shape pass of engine/training/config_bounds.py: the parameter count it reads off
a configuration equals what building the module allocates, for every engine module."""
import numpy as np
import pytest

from engine.models.config import module_types, to_config
from engine.training.config_bounds import PARAMETER_COUNTS, implied_parameters

# Small constructor arguments per engine module, every size distinct (a swapped size in a
# count cannot pass for another), with the options that change the parameter set.
BUILDS = {
    "Linear": [dict(d_in=3, d_out=5), dict(d_in=3, d_out=5, bias=False)],
    "MLP": [dict(sizes=[3, 7, 5, 2]), dict(sizes=[4, 6], bias=False)],
    "LayerNorm": [dict(d=7)], "AddNorm": [dict(d_model=7)],
    "FFN": [dict(d_model=5, d_ff=9), dict(d_model=5, d_ff=9, bias=False)],
    "FFNSublayer": [dict(d_model=5, d_ff=9), dict(d_model=5, d_ff=9, norm="pre")],
    "GatedFFN": [dict(d_model=5, d_ff=9), dict(d_model=5, d_ff=9, bias=True)],
    "GMLP": [dict(d_in=3, d_hidden=5, d_ffn=7, d_out=2)],
    "ChannelGatedMLP": [dict(d_in=3, d_hidden=5, d_ffn=7, d_out=2)],
    "SpatialGatingUnit": [dict(d_ffn=6, seq_len=5)],
    "GMLPBlock": [dict(d_model=3, d_ffn=10, seq_len=4)],
    "SpatialGMLPBlock": [dict(d_model=3, d_ffn=10, seq_len=4)],
    "MultiHeadAttention": [dict(d_model=6, n_heads=2), dict(d_model=6, n_heads=3, bias=False)],
    "TransformerBlock": [dict(d_model=6, n_heads=2, d_ff=10),
                         dict(d_model=6, n_heads=2, d_ff=10, ffn="swiglu", bias=False),
                         dict(d_model=6, n_heads=2, d_ff=10, ffn="relu", bias=False)],
    "Embedding": [dict(num_embeddings=11, dim=3)],
}


def test_every_engine_module_has_a_parameter_count():
    # Check that a new engine module cannot be stored without its dry shape pass.
    missing = sorted(set(module_types()) - set(PARAMETER_COUNTS))
    assert not missing


@pytest.mark.parametrize("name", sorted(set(module_types())))
def test_implied_parameters_equal_what_building_allocates(name):
    # Check that the count read off the configuration is the module's parameter count.
    cls = module_types()[name]
    for kwargs in BUILDS.get(name, [{}]):
        if name == "Sequential":
            from engine import Linear, ReLU
            m = cls(Linear(3, 4), ReLU(), Linear(4, 2, bias=False))
        else:
            m = cls(**kwargs)
        known, unknown = implied_parameters(to_config(m))
        assert (known, unknown) == (m.num_parameters(), []), kwargs
        assert m.num_parameters() == sum(p.data.size for p in m.parameters())


def test_a_size_that_is_not_a_positive_int_is_left_to_the_constructor():
    # Check that a size the constructor refuses is not counted (and its values are listed).
    known, unknown = implied_parameters({"type": "Linear", "config": {"d_in": 3.0,
                                                                      "d_out": 4}})
    assert known == 0 and 3.0 in unknown and 4 in unknown
    assert np.isfinite(known)
