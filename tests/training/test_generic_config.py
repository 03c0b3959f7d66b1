"""Module.get_config read off the constructor: stored configurations still rebuild and describe
their modules alike, a user's module needs no get_config of its own when it stores its
arguments, and every block takes its options keyword-only in one order.

stored_configs.json holds the model configurations that checkpoints held when every engine
module wrote its own get_config (each public module with non-default arguments and with its
defaults, two GPTs and a nested checkpointed Sequential), as ``engine.save`` wrote them."""
import inspect
import json
import pathlib

import numpy as np
import pytest

import engine
from engine.models.config import ConfigError, from_config, module_types, to_config
from engine.models.gpt import GPT

STORED = json.loads((pathlib.Path(__file__).parent / "stored_configs.json").read_text())
CUSTOM = {"GPT": GPT}  # load_model builds a GPT through its own checked path


def test_stored_configs_cover_every_public_module():
    # Check that a module added to engine.nn without a stored configuration fails here
    stored = {node["type"] for node in STORED.values()}
    classes = {cls.__name__ for cls in module_types().values()}  # aliases count once
    assert classes <= stored and "engine.models.gpt.GPT" in stored


@pytest.mark.parametrize("key", sorted(STORED))
def test_stored_config_rebuilds_and_describes_itself_alike(key):
    # Check that the module a stored node builds gives back exactly that node (same keys and
    # values): a resumed run compares them, and a new save writes it again
    node = STORED[key]
    assert to_config(from_config(node, CUSTOM)) == node


@pytest.mark.parametrize("key", sorted(k for k in STORED if not k.startswith("GPT/")))
def test_stored_config_saves_and_loads_through_load_model(tmp_path, key):
    # Check that a checkpoint of each stored configuration is rebuilt by load_model alone
    # (its size check included: LayerNorm(bias=False) holds d values, not 2 d)
    m = from_config(STORED[key])
    p = tmp_path / "m.npz"
    engine.save(p, m)
    r = engine.load_model(p)
    assert to_config(r.model) == STORED[key]
    assert [n for n, _ in r.model.named_parameters()] == [n for n, _ in m.named_parameters()]


class Scaled(engine.Module):
    """A user's module that stores its constructor arguments under their names."""

    def __init__(self, d, scale=2.0, *, dtype=np.float32, rng=None):
        super().__init__(dtype)
        self.d, self.scale = d, scale
        self.lin = engine.Linear(d, d, dtype=dtype, rng=rng)

    def _forward(self, x2, res2):
        return self.lin(x2)

    def _backward(self, dy2, acc2):
        return self.lin.backward(dy2)


def test_user_module_storing_its_arguments_needs_no_get_config(tmp_path):
    # Check that get_config reads d, scale and dtype (not rng) and load_model rebuilds it
    m = Scaled(3, 0.5, dtype=np.float64, rng=0)
    assert m.get_config() == {"d": 3, "scale": 0.5, "dtype": "float64"}
    p = tmp_path / "s.npz"
    engine.save(p, m)
    r = engine.load_model(p, custom_objects={"Scaled": Scaled})
    assert isinstance(r.model, Scaled) and r.model.scale == 0.5
    np.testing.assert_array_equal(r.model.lin.W.data, m.lin.W.data)


class ReadsChild(Scaled):
    config_attrs = {"d": "lin.d_in"}

    def __init__(self, d, *, dtype=np.float32):
        super().__init__(d, dtype=dtype)
        del self.d  # held by the child alone


def test_config_attrs_names_an_attribute_of_a_child():
    # Check that a dotted config_attrs entry reads the value from the child
    assert ReadsChild(5).get_config() == {"d": 5, "dtype": "float32"}


class NamedLikeAClassAttribute(engine.Module):
    def __init__(self, in_features, *, dtype=np.float32):
        super().__init__(dtype)  # in_features is not stored: Module's class default is None


class TakesKeywords(engine.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options


def test_a_class_attribute_does_not_stand_for_an_unstored_argument():
    # Check that Module.in_features = None is not taken for the argument in_features
    with pytest.raises(NotImplementedError, match=r"takes 'in_features' but the module has no "
                                                  r"attribute 'in_features'"):
        NamedLikeAClassAttribute(4).get_config()


def test_a_constructor_with_var_keywords_needs_its_own_get_config():
    # Check that **options is refused by name (no attribute describes it), as a ConfigError
    with pytest.raises(ConfigError, match=r"TakesKeywords.get_config\(\): __init__ takes "
                                          r"\*\*options"):
        to_config(TakesKeywords(a=1))


def test_get_config_returns_new_lists():
    # Check that changing the returned sizes does not change the module's own
    m = engine.MLP([3, 4, 2], rng=0)
    m.get_config()["sizes"].append(9)
    assert m.sizes == [3, 4, 2] and m.get_config()["sizes"] == [3, 4, 2]


# ----------------------------------------------------------------------------- signatures
# Options that stay positional: the one choice that names what the module computes.
POSITIONAL_OPTIONS = {("FFN", "activation"), ("GatedFFN", "activation"),
                      ("FFNSublayer", "activation"), ("TransformerBlock", "ffn"),
                      ("MLP", "activations"), ("Activation", "activation"),
                      ("LeakyReLU", "negative_slope"), ("GELU", "approximate"), ("Dropout", "p")}
SHARED_ORDER = ("dropout", "bias", "init", "dtype", "rng")


def _classes():
    return sorted({**module_types(), "GPT": GPT}.items())


@pytest.mark.parametrize("name, cls", _classes())
def test_every_option_is_keyword_only(name, cls):
    # Check that a positional parameter with a default is one of the listed choices
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD
                  and p.default is not p.empty]
    assert {(cls.__name__, n) for n in positional} <= POSITIONAL_OPTIONS, positional


@pytest.mark.parametrize("name, cls", _classes())
def test_keyword_options_come_in_the_shared_order(name, cls):
    # Check that dropout, bias, init, dtype, rng (those taken) lead the keyword-only options,
    # in that order, before the module's own
    kw = [p.name for p in inspect.signature(cls.__init__).parameters.values()
          if p.kind is p.KEYWORD_ONLY]
    shared = [n for n in SHARED_ORDER if n in kw]
    assert kw[:len(shared)] == shared, kw


def test_an_option_passed_positionally_is_a_type_error():
    # Check that the old positional call LayerNorm(d, eps) is refused, not misread
    with pytest.raises(TypeError, match="positional"):
        engine.LayerNorm(4, 1e-3)
