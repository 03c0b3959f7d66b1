"""engine.to_torch_state_dict / load_torch_state_dict (PyTorch's names and layouts) and
.safetensors checkpoints. The tests against PyTorch modules skip without torch (it is not a
dependency); the safetensors tests skip without the 'interop' extra."""
import os
import sys

import numpy as np
import pytest

from engine import (FFN, GMLP, MLP, AdamW, CheckpointError, FFNSublayer, GatedFFN, LayerNorm,
                    Linear, Sequential, load, load_torch_state_dict, save, to_torch_state_dict)

F64 = np.float64


def _models():
    """name -> a float64 blasnet model covering each row of the interop table."""
    return {
        "linear": Linear(5, 3, dtype=F64, rng=0),
        "ffn-gelu": FFN(6, 10, "gelu", dtype=F64, rng=1),
        "ffn-relu-nobias": FFN(6, 10, "relu", bias=False, dtype=F64, rng=2),
        "mlp": MLP([5, 7, 6, 4], ["relu", None, "silu"], dtype=F64, rng=3),
        "mlp-identity": MLP([5, 7, 4], ["tanh", "identity"], dtype=F64, rng=4),
        "layernorm": LayerNorm(6, dtype=F64),
        "sublayer-post": FFNSublayer(6, 12, "gelu_tanh", norm="post", dtype=F64, rng=5),
        "sublayer-pre": FFNSublayer(6, 12, "leaky_relu", norm="pre", dtype=F64, rng=6),
        "sequential": Sequential(Linear(5, 6, dtype=F64, rng=7), FFN(6, 8, "sigmoid", dtype=F64, rng=8),
                                 Linear(6, 2, dtype=F64, rng=9)),
        "gated-silu": GatedFFN(6, 10, "silu", dtype=F64, rng=10),
        "gated-gelu-bias": GatedFFN(6, 10, "gelu", bias=True, dtype=F64, rng=11),
    }


def _perturb(model, seed):
    """Give every parameter (LayerNorm's ones and zeros too) distinct random values."""
    rng = np.random.default_rng(seed)
    model.load_state_dict({n: rng.standard_normal(p.shape).astype(p.dtype)
                           for n, p in model.named_parameters()})


# ----------------------------------------------------------------------------- names, layouts
def test_ffn_keys_and_layouts_are_pytorchs():
    # Check FFN -> 0.weight (= W_in transposed, (d_ff, d_model)), 0.bias, 2.weight, 2.bias.
    m = FFN(4, 9, dtype=F64, rng=0)
    _perturb(m, 1)
    sd = to_torch_state_dict(m)
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    np.testing.assert_array_equal(sd["0.weight"], m.W_in.data.T)
    np.testing.assert_array_equal(sd["2.weight"], m.W_out.data.T)
    np.testing.assert_array_equal(sd["0.bias"], m.b1.data)
    assert sd["0.weight"].shape == (9, 4) and all(v.flags.c_contiguous for v in sd.values())
    assert not np.shares_memory(sd["0.bias"], m.b1.data)


def test_mlp_slots_follow_the_layers_in_order():
    # Check MLP([5, 7, 6, 4], [relu, None, silu]) -> Sequential(Linear, ReLU, Linear, Linear,
    # SiLU): the Linear layers sit at slots 0, 2 and 3.
    sd = to_torch_state_dict(_models()["mlp"])
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"]
    assert sd["3.weight"].shape == (4, 6)


def test_sublayer_and_sequential_nest_their_children():
    # Check the prefixes: FFNSublayer -> ffn.*, norm.*; Sequential -> <index>.<child's keys>.
    m = _models()
    assert list(to_torch_state_dict(m["sublayer-post"])) == [
        "ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias", "norm.weight", "norm.bias"]
    assert list(to_torch_state_dict(m["sequential"])) == [
        "0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.2.weight", "1.2.bias", "2.weight",
        "2.bias"]


@pytest.mark.parametrize("name", list(_models()))
def test_round_trip_restores_every_parameter(name):
    # Check that export then load into a model built from another seed gives it exactly the
    # exported parameters.
    a, b = _models()[name], _models()[name]
    _perturb(a, 11)
    _perturb(b, 12)
    load_torch_state_dict(b, to_torch_state_dict(a))
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(q.data, p.data, err_msg=n)


@pytest.mark.parametrize("case, exc, match", [
    ("missing", KeyError, r"missing keys \['2.bias'\]"),
    ("extra", KeyError, r"unexpected keys \['3.weight'\]"),
    ("not_transposed", ValueError, "expected shape .10, 6.*PyTorch's layout"),
    ("float32", TypeError, "expected dtype float64, got float32"),
    ("list", TypeError, "numpy.ndarray or a torch.Tensor"),
])
def test_load_rejects_a_bad_state_and_changes_nothing(case, exc, match):
    # Check each mismatch raises naming the key, and the model keeps its parameters.
    m = FFN(6, 10, dtype=F64, rng=0)
    sd = to_torch_state_dict(FFN(6, 10, dtype=F64, rng=1))
    if case == "missing":
        del sd["2.bias"]
    elif case == "extra":
        sd["3.weight"] = np.zeros((2, 2))
    elif case == "not_transposed":
        sd["0.weight"] = np.ascontiguousarray(sd["0.weight"].T)
    elif case == "float32":
        sd["2.weight"] = sd["2.weight"].astype(np.float32)
    else:
        sd["0.bias"] = sd["0.bias"].tolist()
    before = m.state_dict()
    with pytest.raises(exc, match=match):
        load_torch_state_dict(m, sd)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_gated_ffn_keys_and_layouts_are_llamas():
    # Check that GatedFFN exports LLaMA's MLP names, each weight (out, in): W.T.
    m = GatedFFN(6, 10, "silu", bias=True, dtype=F64, rng=0)
    _perturb(m, 3)
    sd = to_torch_state_dict(m)
    assert list(sd) == ["gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias",
                        "down_proj.weight", "down_proj.bias"]
    np.testing.assert_array_equal(sd["gate_proj.weight"], m.W_gate.data.T)
    np.testing.assert_array_equal(sd["up_proj.weight"], m.W_up.data.T)
    np.testing.assert_array_equal(sd["down_proj.weight"], m.W_down.data.T)
    np.testing.assert_array_equal(sd["up_proj.bias"], m.b_up.data)
    assert sd["gate_proj.weight"].shape == (10, 6) and sd["down_proj.weight"].shape == (6, 10)


def test_a_block_without_a_reference_module_is_a_type_error():
    # Check that GMLP (not in the interop table) is a TypeError listing the supported blocks.
    with pytest.raises(TypeError, match="no PyTorch reference module for GMLP.*FFN"):
        to_torch_state_dict(GMLP(4, 8, 16, 2, rng=0))


# ----------------------------------------------------------------------------- with torch
def _torch_act(nn, name):
    return {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"),
            "silu": nn.SiLU(), "sigmoid": nn.Sigmoid(), "tanh": nn.Tanh(),
            "leaky_relu": nn.LeakyReLU(0.01), "identity": nn.Identity()}[name]


def _reference(torch, name, model):
    """The PyTorch reference module of the interop table for ``model`` (float64)."""
    nn = torch.nn

    def ffn(m):
        return nn.Sequential(nn.Linear(m.d_model, m.d_ff, bias=m.b1 is not None),
                             _torch_act(nn, m.activation),
                             nn.Linear(m.d_ff, m.d_model, bias=m.b2 is not None))

    class Sublayer(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.mode = m.norm_mode
            self.ffn, self.norm = ffn(m.ffn), nn.LayerNorm(m.d_model)

        def forward(self, x):
            if self.mode == "post":
                return self.norm(x + self.ffn(x))
            return x + self.ffn(self.norm(x))

    class LlamaMLP(nn.Module):  # LLaMA's MLP: down(act(gate(x)) * up(x))
        def __init__(self, m):
            super().__init__()
            bias = m.b_gate is not None
            self.gate_proj = nn.Linear(m.d_model, m.d_ff, bias=bias)
            self.up_proj = nn.Linear(m.d_model, m.d_ff, bias=bias)
            self.down_proj = nn.Linear(m.d_ff, m.d_model, bias=bias)
            self.act = _torch_act(nn, m.activation)

        def forward(self, x):
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    if isinstance(model, GatedFFN):
        ref = LlamaMLP(model)
    elif isinstance(model, Linear):
        ref = nn.Linear(model.d_in, model.d_out)
    elif isinstance(model, FFN):
        ref = ffn(model)
    elif isinstance(model, MLP):
        layers = []
        for i, act in enumerate(model.activations):
            layers.append(nn.Linear(model.sizes[i], model.sizes[i + 1]))
            if act is not None:
                layers.append(_torch_act(nn, act))
        ref = nn.Sequential(*layers)
    elif isinstance(model, LayerNorm):
        ref = nn.LayerNorm(model.d)
    elif isinstance(model, FFNSublayer):
        ref = Sublayer(model)
    else:  # the Sequential of _models()
        ref = nn.Sequential(nn.Linear(5, 6), ffn(model[1]), nn.Linear(6, 2))
    return ref.double().eval()


def _input(model, seed=0):
    d = next(iter(model.named_parameters()))[1].shape[0]  # W is (d_in, ...); gamma is (d,)
    return np.random.default_rng(seed).standard_normal((7, d))


@pytest.mark.parametrize("name", list(_models()))
def test_exported_state_loads_strictly_into_the_pytorch_module(name):
    # Check blasnet -> PyTorch: the exported dict loads with strict=True and the PyTorch
    # module computes the blasnet model's outputs (float64, eval mode).
    torch = pytest.importorskip("torch")
    m = _models()[name]
    _perturb(m, 21)
    m.eval()
    ref = _reference(torch, name, m)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in to_torch_state_dict(m).items()},
                        strict=True)
    x = _input(m)
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(m.forward(x), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(_models()))
def test_pytorch_state_loads_into_blasnet(name):
    # Check PyTorch -> blasnet: the torch module's own state_dict (tensors, its own init)
    # loads and the blasnet model then computes the torch module's outputs.
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = _models()[name]
    ref = _reference(torch, name, m)
    with torch.no_grad():
        for p in ref.parameters():  # LayerNorm's init (ones, zeros) would hide a swap
            p.normal_()
    load_torch_state_dict(m, ref.state_dict())
    m.eval()
    x = _input(m, 1)
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(m.forward(x), want, rtol=1e-10, atol=1e-12)


def test_safetensors_file_of_the_export_loads_into_pytorch(tmp_path):
    # Check the documented two-liner: safetensors.numpy.save_file(to_torch_state_dict(m)) is
    # read by safetensors.torch.load_file and loads strictly into the reference module.
    torch = pytest.importorskip("torch")
    st_np = pytest.importorskip("safetensors.numpy")
    st_torch = pytest.importorskip("safetensors.torch")
    m = _models()["sublayer-post"]
    _perturb(m, 31)
    st_np.save_file(to_torch_state_dict(m), str(tmp_path / "m.safetensors"))
    ref = _reference(torch, "sublayer-post", m)
    ref.load_state_dict(st_torch.load_file(str(tmp_path / "m.safetensors")), strict=True)
    x = _input(m)
    m.eval()
    with torch.no_grad():
        np.testing.assert_allclose(m.forward(x), ref(torch.from_numpy(x)).numpy(), rtol=1e-10,
                                   atol=1e-12)


# ----------------------------------------------------------------------------- safetensors
def test_safetensors_checkpoint_round_trip(tmp_path):
    # Check save/load through .safetensors: parameters (an F-ordered GMLP weight too) and
    # metadata come back exactly, and the file holds blasnet's names for safetensors itself.
    st_np = pytest.importorskip("safetensors.numpy")
    m = GMLP(4, 8, 16, 2, rng=0)
    save(tmp_path / "m.safetensors", m, epoch=7, note="hello", loss=0.25)
    other = GMLP(4, 8, 16, 2, rng=1)
    assert load(tmp_path / "m.safetensors", other) == {"epoch": 7, "note": "hello", "loss": 0.25}
    for (n, p), (_, q) in zip(m.named_parameters(), other.named_parameters()):
        np.testing.assert_array_equal(q.data, p.data, err_msg=n)
    raw = st_np.load_file(str(tmp_path / "m.safetensors"))
    assert sorted(raw) == sorted(n for n, _ in m.named_parameters())
    np.testing.assert_array_equal(raw["W_gate"], m.W_gate.data)


def test_safetensors_holds_parameters_only(tmp_path):
    # Check that saving an optimizer or scheduler to .safetensors is a ValueError that writes
    # nothing, and that loading an optimizer from one is a CheckpointError that changes nothing.
    pytest.importorskip("safetensors")
    m = Linear(3, 2, rng=0)
    opt = AdamW(m.parameters())
    with pytest.raises(ValueError, match="parameters only"):
        save(tmp_path / "m.safetensors", m, opt)
    assert os.listdir(tmp_path) == []
    save(tmp_path / "m.safetensors", m)
    fresh = Linear(3, 2, rng=1)
    before = fresh.state_dict()
    with pytest.raises(CheckpointError, match="no optimizer state.*safetensors"):
        load(tmp_path / "m.safetensors", fresh, AdamW(fresh.parameters()))
    np.testing.assert_array_equal(fresh.W.data, before["W"])


def test_plain_safetensors_file_with_matching_names_loads(tmp_path):
    # Check that a safetensors file written by someone else (no blasnet header) loads if its
    # names, shapes and dtypes fit the model (blasnet's names, or PyTorch's: load reads
    # both layouts); one with other names is a CheckpointError.
    st_np = pytest.importorskip("safetensors.numpy")
    W = np.arange(6, dtype=np.float32).reshape(3, 2)
    st_np.save_file({"W": W, "b": np.ones(2, np.float32)}, str(tmp_path / "a.safetensors"))
    m = Linear(3, 2, rng=0)
    assert load(tmp_path / "a.safetensors", m) == {}
    np.testing.assert_array_equal(m.W.data, W)
    st_np.save_file({"weight": W.T.copy() + 1, "bias": np.ones(2, np.float32)},
                    str(tmp_path / "t.safetensors"))
    assert load(tmp_path / "t.safetensors", m) == {}  # PyTorch's (out, in) weight
    np.testing.assert_array_equal(m.W.data, W + 1)
    st_np.save_file({"kernel": W, "b": np.ones(2, np.float32)}, str(tmp_path / "k.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing parameters \['W'\]"):
        load(tmp_path / "k.safetensors", m)


def test_truncated_safetensors_is_a_checkpoint_error(tmp_path):
    # Check that a safetensors file cut short is a CheckpointError, not a crash.
    pytest.importorskip("safetensors")
    m = Linear(30, 20, rng=0)
    save(tmp_path / "m.safetensors", m)
    data = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load(tmp_path / "cut.safetensors", m)


def test_without_safetensors_the_error_names_the_extra(tmp_path, monkeypatch):
    # Check that without the package, saving to .safetensors raises ImportError naming the
    # 'interop' extra and writes nothing.
    for name in [k for k in sys.modules if k == "safetensors" or k.startswith("safetensors.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match=r"blasnet\[interop\]"):
        save(tmp_path / "m.safetensors", Linear(2, 2, rng=0))
    assert os.listdir(tmp_path) == []


def _registry_variants():
    from engine.models import registry
    return [pytest.param(name, v, id=f"{name}-{i}") for name, e in registry.BLOCKS.items()
            if getattr(e.cls, "torch_layout", None) is not None
            for i, v in enumerate(e.variants)]


@pytest.mark.parametrize("name,variant", _registry_variants())
def test_every_registry_block_with_a_torch_layout_round_trips(name, variant):
    # Check that each registered block that declares a PyTorch layout maps every parameter to
    # one key and that its state dict loads into another instance (other initial values)
    # exactly, so a block's torch_layout is checked as soon as it is registered.
    from engine.models import registry
    e = registry.get(name)
    m = e.build(e.example, dtype=F64, rng=0, **variant)
    _perturb(m, 1)
    sd = to_torch_state_dict(m)
    assert len({v.ctypes.data for v in sd.values()}) == len(sd)  # copies, one per key
    fresh = e.build(e.example, dtype=F64, rng=5, **variant)
    load_torch_state_dict(fresh, sd)
    for (n, p), (n2, q) in zip(m.named_parameters(), fresh.named_parameters()):
        assert n == n2
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)
