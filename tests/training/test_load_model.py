"""Self-describing checkpoints: every engine module's get_config rebuilds it, save stores the
configuration, load_model rebuilds model, optimizer, scheduler and Standardizer alone."""
import inspect
import json

import numpy as np
import pytest

import engine
from engine.optim import lr_scheduler as lrs
from engine.models.config import ConfigError, from_config, module_types, to_config

F64 = np.float64

# Every public module class, built with non-default values wherever the constructor allows,
# so a get_config that returns a default or another attribute differs from what was passed.
EXAMPLES = {
    "Linear": dict(d_in=3, d_out=5, bias=False, init="xavier", dtype="float64",
                   activation="leaky_relu", negative_slope=0.2),
    "Activation": dict(activation="leaky_relu", negative_slope=0.3, dtype="float64"),
    "ReLU": dict(dtype="float64"),
    "LeakyReLU": dict(negative_slope=0.05, dtype="float64"),
    "GELU": dict(approximate="tanh", dtype="float64"),
    "SiLU": dict(dtype="float64"),
    "Sigmoid": dict(dtype="float64"),
    "Tanh": dict(dtype="float64"),
    "Identity": dict(dtype="float64"),
    "Softmax": dict(dtype="float64"),
    "LogSoftmax": dict(dtype="float64"),
    "MLP": dict(sizes=[3, 7, 2], activations=["gelu", "log_softmax"], init="xavier", bias=False,
                negative_slope=[0.1, 0.2], dtype="float64"),
    "Dropout": dict(p=0.3, dtype="float64"),
    "LayerNorm": dict(d=5, eps=1e-3, dtype="float64", bias=False),
    "FFN": dict(d_model=4, d_ff=6, activation="silu", dropout=0.1, bias=False, init="xavier",
                dtype="float64"),
    "GMLP": dict(d_in=3, d_hidden=4, d_ffn=6, d_out=2, dtype="float64"),
    "AddNorm": dict(d_model=4, dropout=0.2, eps=1e-4, dtype="float64"),
    "FFNSublayer": dict(d_model=4, d_ff=6, activation="gelu", dropout=0.1, norm="pre",
                        eps=1e-4, dtype="float64"),
    "GatedFFN": dict(d_model=4, d_ff=6, activation="gelu", bias=True, dropout=0.1,
                     init="he", dtype="float64", negative_slope=0.02),
    "SpatialGatingUnit": dict(d_ffn=6, seq_len=3, causal=True, eps=1e-4, dtype="float64"),
    "GMLPBlock": dict(d_model=4, d_ffn=6, seq_len=3, causal=True, eps=1e-4, dtype="float64"),
    "Embedding": dict(num_embeddings=9, dim=4, dtype="float64"),
    "MSELoss": dict(dtype="float64"),
    "CrossEntropyLoss": dict(dtype="float64"),
    "MultiHeadAttention": dict(d_model=6, n_heads=2, causal=False, dropout=0.1, bias=False,
                               init="he", max_scores_bytes=1 << 20, dtype="float64"),
    "TransformerBlock": dict(d_model=6, n_heads=3, d_ff=8, ffn="swiglu", norm="post",
                             dropout=0.1, causal=False, bias=False, init="normal", eps=1e-4,
                             dtype="float64", norm_bias=False),
}


def test_every_public_module_has_an_example():
    # Check that a module added to engine.nn without a rebuild test fails here
    classes = {cls.__name__ for cls in module_types().values()}  # aliases count once
    assert classes - {"Sequential"} == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_get_config_returns_the_constructor_arguments(name):
    # Check that get_config gives back every argument passed (not defaults, not others)
    cls = module_types()[name]
    kwargs = EXAMPLES[name]
    m = cls(**kwargs)
    cfg = m.get_config()
    assert cfg == kwargs
    takes = set(inspect.signature(cls.__init__).parameters) - {"self", "rng"}
    assert set(cfg) == takes  # every argument but the generator is described


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_from_config_rebuilds_through_json(name):
    # Check that the node survives JSON and rebuilds a module with the same config and shapes
    m = module_types()[name](**EXAMPLES[name], **({"rng": 1} if "rng" in inspect.signature(
        module_types()[name].__init__).parameters else {}))
    node = json.loads(json.dumps(to_config(m)))
    twin = from_config(node)
    assert type(twin) is type(m)
    assert twin.get_config() == m.get_config()
    assert [(n, p.shape, p.dtype) for n, p in twin.named_parameters()] == \
        [(n, p.shape, p.dtype) for n, p in m.named_parameters()]


def test_sequential_config_nests_its_children():
    # Check that a stack's config holds its children's nodes, recursively
    m = engine.Sequential(engine.Linear(3, 4, rng=0),
                          engine.Sequential(engine.ReLU(), engine.LayerNorm(4)))
    node = to_config(m)
    assert node["type"] == "Sequential"
    inner = node["config"]["modules"][1]
    assert inner["type"] == "Sequential"
    assert inner["config"]["modules"][1] == {"type": "LayerNorm",
                                             "config": {"d": 4, "eps": 1e-5, "dtype": "float32",
                                                        "bias": True}}
    twin = from_config(node)
    assert len(twin) == 2 and len(twin[1]) == 2 and isinstance(twin[1][1], engine.LayerNorm)


class NoConfig(engine.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = engine.Linear(d, d, rng=0)

    def _forward(self, x2, res2):
        return self.lin(x2)

    def _backward(self, dy2, acc2):
        return self.lin.backward(dy2)


class WithConfig(NoConfig):
    def get_config(self):
        return {"d": self.lin.d_in}


class WiderFFN(engine.FFN):  # overrides __init__ with an argument it does not store
    def __init__(self, d):
        super().__init__(d, 2 * d)


class WiderWithConfig(WithConfig):  # overrides __init__ below a hand-written get_config
    def __init__(self, d, k):
        super().__init__(d * k)


def _data(n=24, d=4, k=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    return X, rng.standard_normal((n, k)).astype(np.float32)


def test_user_module_without_config_is_saved_and_refused_by_load_model(tmp_path):
    # Check that saving works, and load_model names the class and the argument it cannot
    # read back (NoConfig keeps d only inside its child)
    p = tmp_path / "u.npz"
    engine.save(p, NoConfig(3))
    with pytest.raises(engine.CheckpointError,
                       match=r"NoConfig.get_config\(\): __init__ takes 'd' but the module has no "
                             r"attribute 'd'"):
        engine.load_model(p)


def test_user_subclass_overriding_init_is_described_by_its_own_arguments():
    # Check that the generic get_config reads the subclass's __init__, not FFN's: WiderFFN's d
    # is not stored, so it is refused rather than described as an FFN
    with pytest.raises(ConfigError, match=r"WiderFFN.get_config\(\): __init__ takes 'd'"):
        to_config(WiderFFN(4))


def test_inherited_hand_written_get_config_does_not_describe_another_init():
    # Check that a hand-written get_config inherited below an overriding __init__ is refused
    with pytest.raises(ConfigError, match=r"WiderWithConfig defines __init__ but not get_config"):
        to_config(WiderWithConfig(2, 2))


def test_user_module_with_config_needs_custom_objects(tmp_path):
    # Check that a user class is rebuilt only when passed, and then with its weights
    m = WithConfig(3)
    m.lin.W.data[...] = np.arange(9, dtype=np.float32).reshape(3, 3)
    p = tmp_path / "u.npz"
    engine.save(p, m)
    with pytest.raises(engine.CheckpointError, match=r"custom_objects=\{'WithConfig'"):
        engine.load_model(p)
    r = engine.load_model(p, custom_objects={"WithConfig": WithConfig})
    assert isinstance(r.model, WithConfig)
    np.testing.assert_array_equal(r.model.lin.W.data, m.lin.W.data)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_load_model_rebuilds_weights_without_naming_the_architecture(tmp_path, suffix):
    # Check that predictions of the rebuilt model equal the saved model's, in both formats
    if suffix == ".safetensors":
        pytest.importorskip("safetensors")
    m = engine.Sequential(engine.Linear(4, 8, activation="gelu", rng=0),
                          engine.FFNSublayer(8, 16, norm="pre", rng=1),
                          engine.MLP([8, 5, 3], activations=["silu", None], rng=2))
    X, _ = _data()
    p = tmp_path / f"m{suffix}"
    engine.save(p, m, note="x")
    r = engine.load_model(p)
    assert r.metadata == {"note": "x"} and r.optimizer is None and r.scheduler is None
    np.testing.assert_array_equal(engine.predict(r.model, X), engine.predict(m, X))


def test_load_model_resumes_optimizer_and_schedule_exactly(tmp_path):
    # Check that training on from the rebuilt optimizer and schedule equals training on
    # from the originals (moments, step count, warmup position all restored)
    def build():
        m = engine.MLP([4, 16, 3], rng=0)
        opt = engine.AdamW(m.parameters(), lr=0.01)
        s = lrs.SequentialLR(opt, [lrs.LinearLR(opt, 0.1, 1.0, 5),
                                   lrs.CosineAnnealingLR(opt, T_max=20)], [5])
        return m, opt, s
    X, Y = _data()
    kw = dict(batch_size=8, shuffle=False, scheduler_interval="step", progress=False)
    m, opt, s = build()
    engine.fit(m, engine.MSELoss(), opt, X, Y, epochs=2, scheduler=s, **kw)
    p = tmp_path / "c.npz"
    engine.save(p, m, opt, s)
    r = engine.load_model(p)
    assert type(r.optimizer) is engine.AdamW and r.optimizer.steps == opt.steps == 6
    assert r.scheduler.get_last_lr() == s.get_last_lr()
    engine.fit(m, engine.MSELoss(), opt, X, Y, epochs=3, scheduler=s, **kw)
    engine.fit(r.model, engine.MSELoss(), r.optimizer, X, Y, epochs=3, scheduler=r.scheduler, **kw)
    np.testing.assert_array_equal(r.model.flat_params(), m.flat_params())


def test_load_model_keeps_parameter_groups_in_their_order(tmp_path):
    # Check that groups listing parameters in another order than the model come back right
    m = engine.MLP([4, 6, 3], rng=0)
    params = dict(m.named_parameters())
    opt = engine.SGD([{"params": [params["1.W"], params["0.W"]], "weight_decay": 0.1},
                      {"params": [params["0.b"], params["1.b"]], "weight_decay": 0.0}],
                     lr=0.05, momentum=0.9)
    X, Y = _data()
    engine.fit(m, engine.MSELoss(), opt, X, Y, epochs=1, batch_size=8, progress=False)
    p = tmp_path / "g.npz"
    engine.save(p, m, opt)
    r = engine.load_model(p)
    got = r.optimizer.param_groups
    named = {id(q): n for n, q in r.model.named_parameters()}
    assert [named[id(q)] for q in got[0]["params"]] == ["1.W", "0.W"]
    assert got[0]["weight_decay"] == 0.1 and got[1]["weight_decay"] == 0.0
    sd0, sd1 = opt.state_dict(), r.optimizer.state_dict()
    for i in sd0["state"]:
        for k in sd0["state"][i]:
            np.testing.assert_array_equal(sd0["state"][i][k], sd1["state"][i][k])


def test_load_model_rebuilds_the_standardizer(tmp_path):
    # Check that the Standardizer saved in the metadata comes back fitted
    X, _ = _data()
    st = engine.data.Standardizer().fit(X)
    m = engine.Linear(4, 2, rng=0)
    p = tmp_path / "s.npz"
    engine.save(p, m, standardizer=st.state_dict())
    r = engine.load_model(p)
    np.testing.assert_array_equal(r.standardizer.transform(X), st.transform(X))


def test_lambda_scheduler_is_named_and_can_be_skipped(tmp_path):
    # Check that a LambdaLR (its function is not saved) is a clear error, and skippable
    m = engine.Linear(2, 2, rng=0)
    opt = engine.SGD(m.parameters(), lr=0.1)
    s = lrs.LambdaLR(opt, lambda e: 0.5 ** e)
    p = tmp_path / "l.npz"
    engine.save(p, m, opt, s)
    with pytest.raises(engine.CheckpointError, match="LambdaLR"):
        engine.load_model(p)
    r = engine.load_model(p, scheduler=False)
    assert r.scheduler is None and isinstance(r.optimizer, engine.SGD)


def test_save_takes_the_scheduler_positionally_as_load_does(tmp_path):
    # Check that save(path, m, o, s) works and mirrors load(path, m, o, s)
    m = engine.Linear(2, 2, rng=0)
    opt = engine.SGD(m.parameters(), lr=0.1)
    s = lrs.StepLR(opt, 2, 0.5)
    s.step(); s.step(); s.step()
    p = tmp_path / "p.npz"
    engine.save(p, m, opt, s, epoch=3)
    m2 = engine.Linear(2, 2, rng=1)
    opt2 = engine.SGD(m2.parameters(), lr=0.1)
    s2 = lrs.StepLR(opt2, 2, 0.5)
    assert engine.load(p, m2, opt2, s2) == {"epoch": 3}
    assert s2.last_epoch == 3 and s2.get_last_lr() == s.get_last_lr()


def test_checkpoint_without_config_names_why(tmp_path):
    # Check that a file whose model could not describe itself says so in read_header too
    p = tmp_path / "n.npz"
    engine.save(p, NoConfig(2))
    h = engine.training.checkpoint.read_header(p)
    assert h["model_config"] is None and "NoConfig.get_config()" in h["model_config_error"]


def test_history_dict_is_the_per_epoch_lists():
    # Check that History.history maps each logged figure to one value per epoch (Keras)
    X, Y = _data()
    m = engine.Linear(4, 3, rng=0)
    h = engine.fit(m, engine.MSELoss(), engine.SGD(m.parameters(), lr=0.01), X, Y, epochs=3,
                   batch_size=8, validation=(X[:8], Y[:8]), progress=False)
    assert set(h.history) == {"loss", "val_loss", "lr"}
    assert h.history["loss"] == [float(v) for v in h.loss] and len(h.history["val_loss"]) == 3
    assert h.history["lr"] == [0.01] * 3


def _registry_cases():
    from engine.models import registry
    return [(name, i, v) for name in registry.names()
            for i, v in enumerate(registry.get(name).variants)]


@pytest.mark.parametrize("name, i, options", _registry_cases())
def test_every_registry_block_and_variant_round_trips_through_load_model(tmp_path, name, i,
                                                                         options):
    # Check that each registry block, in each variant the tests cover, is rebuilt from its
    # checkpoint alone and computes the same outputs (eval mode: dropout off)
    from engine.models import registry
    block = registry.get(name)
    m = block.build(block.example, dtype=np.float64, rng=0, **options)
    for _, p in m.named_parameters():  # away from init, so loading is what makes them equal
        p.data[...] = np.random.default_rng(1).standard_normal(p.shape)
    shape = (2, block.example["seq_len"], block.d_in(block.example)) \
        if "seq_len" in block.example else (5, block.d_in(block.example))
    x = np.random.default_rng(2).standard_normal(shape)
    path = tmp_path / f"{name}.npz"
    engine.save(path, m)
    r = engine.load_model(path)
    assert type(r.model) is type(m) and r.model.get_config() == m.get_config()
    np.testing.assert_array_equal(engine.predict(r.model, x), engine.predict(m, x))
