"""A block declared in one place: a new block class, defined here with its ``@register_block``
declaration, ``gemm_list`` and ``torch_layout`` and nothing else, is walked by the registry
tests, benched, offered by the CLI and round-tripped by interop, with no edit elsewhere."""
from __future__ import annotations

import numpy as np
import pytest

import test_registry as walk  # tests/models/test_registry.py: the walk every entry passes
from engine import interop
from engine.cli import parser as cli_parser
from engine.cli.app import main as cli_main
from engine.models import registry
from engine.models.naive import NaiveBlock
from engine.nn.module import Module, Parameter, check_positive_int, init_weight, make_rng
from kernels import ops

NAME, CLI = "ScaledResidual", "scaled-residual"


class NaiveScaledResidual(NaiveBlock):
    """The twin: y = x + scale x W + b, whole-array NumPy."""

    def __init__(self, params, *, scale=0.5, **kw):
        super().__init__(params, **kw)
        self.scale = scale

    def forward_rows(self, x):
        p = self.params
        return x + self.scale * (x @ p["W"]) + p["b"], x

    def backward_rows(self, x, dy):
        p = self.params
        grads = {"W": self.scale * (x.T @ dy), "b": dy.sum(axis=0)}
        return dy + self.scale * (dy @ p["W"].T), grads


def _define_block():
    """The new block's file, as a contributor writes it (defining it registers it)."""
    @registry.register_block(
        doc="y = x + scale x W + b: a residual linear map",
        twin=NaiveScaledResidual, dims=("d_model",), example={"d_model": 7},
        options={"scale": 0.5}, variants=({"scale": 0.5}, {"scale": 2.0}),
        cli=(CLI, "Linear(d_in, d_hidden) -> ScaledResidual(d_hidden) -> Linear(d_hidden, d_out)"))
    class ScaledResidual(Module):
        torch_layout = (("proj.weight", "W", True), ("proj.bias", "b", False))

        def __init__(self, d_model: int, scale: float = 0.5, dtype=np.float32, rng=None):
            super().__init__(dtype)
            self.d_model = self.in_features = check_positive_int("d_model", d_model)
            self.scale = float(scale)
            self.W = Parameter(init_weight(d_model, d_model, "xavier", self.dtype, make_rng(rng)))
            self.b = Parameter(np.zeros(d_model, self.dtype))
            self._saved.x = None

        def get_config(self) -> dict:
            return {"d_model": self.d_model, "scale": self.scale, "dtype": self.dtype.name}

        def _forward(self, x2, res2):
            y = self._ws.get("y", x2.shape[0], self.d_model)
            ops.fill_rows(y, self.b.data, x2)                              # y = x + b, then
            ops.gemm(y, x2, self.W.data, False, False, self.scale, 1.0)   # += scale x W
            self._saved.x = x2
            return y

        def gemm_list(self, lead) -> list:
            fwd, bwd = registry.linear_gemms(int(np.prod(lead)), self.d_model, self.d_model)
            return fwd + bwd

        def _backward(self, dy2, acc2):
            dx = self._ws.get("dx", *dy2.shape)
            ops.colsum(self.b.grad, dy2, 1.0)
            ops.gemm(self.W.grad, self._saved.x, dy2, True, False, self.scale, 1.0)
            np.copyto(dx, dy2)                                             # dx = dy, then
            ops.gemm(dx, dy2, self.W.data, False, True, self.scale, 1.0)  # += scale dy W^T
            self._saved.x = None
            return dx

    return ScaledResidual


@pytest.fixture(scope="module")
def block():
    # Registered for this module's tests only: no other test sees it.
    assert NAME not in registry.BLOCKS
    cls = _define_block()
    try:
        yield cls
    finally:
        registry.unregister(NAME)
    assert NAME not in registry.BLOCKS and CLI not in cli_parser.MODELS


def test_registry_walk_passes_on_the_new_block(block):
    # Check that the walk every registered block passes (entry complete, twin equal to the
    # module in float64 forward and backward, GEMM list = the GEMMs it runs, its beta=1
    # GEMMs = those into gradients) passes on the new block, for each of its variants.
    entry = registry.get(NAME)
    assert entry.cls is block and entry.naive is NaiveScaledResidual
    walk.test_entry_is_complete(NAME)
    for variant in entry.variants:
        walk.test_twin_forward_matches_module(NAME, variant)
        walk.test_twin_gradients_match_module(NAME, variant)
        walk.test_gemm_list_is_what_the_module_runs(NAME, variant)
        walk.test_gemm_list_accumulates_exactly_the_weight_gradients(NAME, variant)


def test_bench_picks_the_new_block_up_and_runs_it(block):
    # Check that bench's block and case lists include the new block at its shapes, and that
    # a case at a tiny shape builds, runs fwd+bwd and a training step (finite loss, the
    # weights move), with the GEMMs the registry lists.
    from bench import cases, floors
    assert NAME in cases.BLOCKS and NAME in cases.TRANSFORMER_BLOCKS
    assert [s for b, s in cases.CASES if b == NAME] == ["seed000", "seed001", "large"]
    tiny = cases.Shape("tiny", (6,), d_model=5, d_ff=9)
    c = cases.build_case(NAME, tiny)
    assert isinstance(c["module"], block) and c["x"].shape == (6, 5)
    with floors.record_gemms() as seen:
        c["fwd_bwd"]()
    assert floors.same_gemms(seen, floors.gemm_list(NAME, tiny))
    w0 = c["module"].W.data.copy()
    c["step"]()
    assert np.isfinite(c["loss"].forward(c["module"].forward(c["x"]), c["target"]))
    assert not np.array_equal(w0, c["module"].W.data)
    twin = cases.naive_twin(NAME, c["module"])
    assert np.isfinite(twin.step(c["x"].astype(np.float64), c["target"]))


def test_cli_offers_the_new_block_and_trains_it(block, capsys, tmp_path):
    # Check that `train --model scaled-residual` is offered (choices and help) and that one
    # epoch trains a Linear -> ScaledResidual -> Linear model and reloads its checkpoint.
    assert CLI in cli_parser.MODELS
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # help wraps its lines
    assert f"{{{','.join(cli_parser.MODELS)}}}" in text and CLI in cli_parser.MODELS
    assert f"{CLI}: Linear(d_in, d_hidden) -> ScaledResidual(d_hidden)" in text
    path = tmp_path / "m.npz"
    code = cli_main(["train", "--model", CLI, "--epochs", "1", "--samples", "64",
                     "--d-hidden", "8", "--seed", "3", "--save", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "(Sequential," in out and "identical to the trained model" in out
    from engine import load
    from engine.nn.containers import Sequential
    from engine.nn.layers import Linear
    model = Sequential(Linear(16, 8), block(8), Linear(8, 4))
    load(str(path), model)
    assert model[1].W.data.any()


def test_interop_round_trips_the_new_block(block):
    # Check that interop maps the new block by its torch_layout: PyTorch's (out, in) weight
    # and bias, inside a container too, and back into a fresh block exactly.
    m = block(6, rng=1)
    m.b.data = np.arange(6, dtype=np.float32)
    sd = interop.to_torch_state_dict(m)
    assert list(sd) == ["proj.weight", "proj.bias"]
    np.testing.assert_array_equal(sd["proj.weight"], m.W.data.T)
    fresh = block(6, rng=2)
    interop.load_torch_state_dict(fresh, sd)
    np.testing.assert_array_equal(fresh.W.data, m.W.data)
    np.testing.assert_array_equal(fresh.b.data, m.b.data)
    from engine.nn.containers import Sequential
    assert list(interop.to_torch_state_dict(Sequential(block(6), m))) == [
        "0.proj.weight", "0.proj.bias", "1.proj.weight", "1.proj.bias"]
    assert NAME in interop.supported()


def test_interop_state_dict_loads_into_torch_and_computes_the_same(block):
    # Check that PyTorch's reference module (proj = nn.Linear) loads the state dict strictly
    # and computes the block's output from it.
    torch = pytest.importorskip("torch")
    m = block(6, scale=2.0, dtype=np.float64, rng=3)
    m.b.data = np.linspace(-1, 1, 6)
    ref = torch.nn.Module()
    ref.proj = torch.nn.Linear(6, 6, dtype=torch.float64)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in
                         interop.to_torch_state_dict(m).items()}, strict=True)
    x = np.random.default_rng(0).standard_normal((4, 6))
    tx = torch.from_numpy(x)
    want = (tx + 2.0 * (tx @ ref.proj.weight.T) + ref.proj.bias).detach().numpy()
    np.testing.assert_allclose(m.forward(x), want, rtol=1e-12, atol=1e-12)


def test_an_incomplete_declaration_is_an_error_when_the_class_is_defined():
    # Check that a block without a GEMM list, an example without one of its sizes, a variant
    # with an undeclared option or a CLI name already taken raises when the class is
    # defined, naming what is missing, and registers nothing.
    before = registry.names()
    cases = [(TypeError, "gemm_list", {}, False),
             (ValueError, "d_ff", {"dims": ("d_model", "d_ff")}, True),
             (ValueError, "colour", {"variants": ({"colour": 1},)}, True),
             (ValueError, "'ffn' is taken", {"cli": ("ffn", "again")}, True)]
    for error, match, change, has_gemms in cases:
        decl = {"doc": "d", "twin": NaiveScaledResidual, "dims": ("d_model",),
                "example": {"d_model": 3}, "name": "Incomplete", **change}
        body = {"gemm_list": lambda self, lead: []} if has_gemms else {}
        with pytest.raises(error, match=match):
            registry.register_block(**decl)(type("Incomplete", (Module,), body))
        assert registry.names() == before
    with pytest.raises(ValueError, match="Incomplete"):
        registry.unregister("Incomplete")
