"""One float64 instance of every engine module kind, shared by the protocol, arena and
activation tests: a name -> Case table with the factory (seeded: the same seed builds a twin
with the same weights and the same dropout draws), the input and output widths and the
calling convention (single-input module, AddNorm's two inputs, or a loss)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine import (FFN, GELU, GMLP, MLP, AddNorm, CrossEntropyLoss, Dropout, FFNSublayer,
                    Identity, LayerNorm, LeakyReLU, Linear, MSELoss, ReLU, Sequential, Sigmoid,
                    SiLU, Tanh)
from engine.nn.layers import Activation
from kernels.activations import ACTIVATIONS

F64 = np.float64
D = 6  # feature width of the square modules (output shape == input shape)
N = 5  # rows of a 2-D input
BT = (2, 3)  # leading shape of a 3-D input
SHAPES = ("2d", "3d")


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable  # build(seed) -> Module, float64, train mode, randomised parameters
    d_in: int
    d_out: int
    kind: str = "single"  # "single" (forward(x)), "addnorm" (forward(x, sub)), "loss"
    # False for modules that hand back their input itself (no work buffer on a plain call)
    owns_output: bool = True


def randomize(m, rng) -> None:
    """Non-zero biases and betas, non-unit gammas (written in place into the parameters), so
    that a bug in their use cannot hide behind an init of zeros or ones."""
    for name, p in m.named_parameters():
        if name.endswith("gamma"):
            p.data[...] = 1.0 + 0.3 * rng.standard_normal(p.shape)
        else:
            p.data[...] = 0.5 * rng.standard_normal(p.shape)


def _seeded(make):
    """A factory build(seed): one Generator for init and dropout, then randomised parameters
    drawn from a second stream of the same seed."""
    def build(seed):
        m = make(np.random.default_rng(seed))
        randomize(m, np.random.default_rng(seed + 1000))
        m.train()
        return m
    return build


def _sequential(rng):
    return Sequential(Linear(D, 8, dtype=F64, rng=rng), GELU(dtype=F64),
                      Dropout(0.25, dtype=F64, rng=rng), LayerNorm(8, dtype=F64),
                      FFN(8, 12, activation="gelu", dropout=0.2, dtype=F64, rng=rng),
                      Linear(8, D, bias=False, dtype=F64, rng=rng))


_CASES = [
    Case("linear", _seeded(lambda r: Linear(D, D, dtype=F64, rng=r)), D, D),
    Case("linear_nobias", _seeded(lambda r: Linear(D, D, bias=False, dtype=F64, rng=r)), D, D),
    Case("linear_5_7", _seeded(lambda r: Linear(5, 7, dtype=F64, rng=r)), 5, 7),
    Case("relu_cls", _seeded(lambda r: ReLU(dtype=F64)), D, D),
    Case("leaky_relu_cls", _seeded(lambda r: LeakyReLU(0.1, dtype=F64)), D, D),
    Case("gelu_cls", _seeded(lambda r: GELU(dtype=F64)), D, D),
    Case("gelu_tanh_cls", _seeded(lambda r: GELU(approximate="tanh", dtype=F64)), D, D),
    Case("silu_cls", _seeded(lambda r: SiLU(dtype=F64)), D, D),
    Case("sigmoid_cls", _seeded(lambda r: Sigmoid(dtype=F64)), D, D),
    Case("tanh_cls", _seeded(lambda r: Tanh(dtype=F64)), D, D),
    Case("identity_cls", _seeded(lambda r: Identity(dtype=F64)), D, D, owns_output=False),
    *[Case(f"act_{a}", _seeded(lambda r, a=a: Activation(a, dtype=F64)), D, D,
           owns_output=a != "identity") for a in ACTIVATIONS],
    Case("dropout", _seeded(lambda r: Dropout(0.3, dtype=F64, rng=r)), D, D),
    Case("layernorm", _seeded(lambda r: LayerNorm(D, dtype=F64)), D, D),
    Case("ffn_relu", _seeded(lambda r: FFN(D, 10, "relu", dtype=F64, rng=r)), D, D),
    Case("ffn_gelu", _seeded(lambda r: FFN(D, 10, "gelu", dtype=F64, rng=r)), D, D),
    Case("ffn_relu_drop", _seeded(lambda r: FFN(D, 10, "relu", dropout=0.2, dtype=F64,
                                                rng=r)), D, D),
    Case("ffn_gelu_drop", _seeded(lambda r: FFN(D, 10, "gelu", dropout=0.2, dtype=F64,
                                                rng=r)), D, D),
    Case("ffn_nobias", _seeded(lambda r: FFN(D, 10, "tanh", bias=False, dtype=F64, rng=r)),
         D, D),
    Case("gmlp", _seeded(lambda r: GMLP(D, 7, 5, D, dtype=F64, rng=r)), D, D),
    Case("gmlp_5_4", _seeded(lambda r: GMLP(5, 7, 6, 4, dtype=F64, rng=r)), 5, 4),
    Case("mlp", _seeded(lambda r: MLP([D, 9, 7, D], ["relu", "tanh", None], dtype=F64,
                                      rng=r)), D, D),
    Case("mlp_acts_out", _seeded(lambda r: MLP([D, 8, D], ["silu", "sigmoid"], dtype=F64,
                                               rng=r)), D, D),
    Case("sequential", _seeded(_sequential), D, D),
    Case("sublayer_post", _seeded(lambda r: FFNSublayer(D, 10, "gelu", norm="post", dtype=F64,
                                                        rng=r)), D, D),
    Case("sublayer_pre", _seeded(lambda r: FFNSublayer(D, 10, "relu", norm="pre", dtype=F64,
                                                       rng=r)), D, D),
    Case("sublayer_post_drop", _seeded(lambda r: FFNSublayer(D, 10, "relu", dropout=0.2,
                                                             norm="post", dtype=F64, rng=r)),
         D, D),
    Case("sublayer_pre_drop", _seeded(lambda r: FFNSublayer(D, 10, "gelu", dropout=0.2,
                                                            norm="pre", dtype=F64, rng=r)),
         D, D),
    Case("addnorm", _seeded(lambda r: AddNorm(D, dtype=F64, rng=r)), D, D, kind="addnorm"),
    Case("addnorm_drop", _seeded(lambda r: AddNorm(D, dropout=0.3, dtype=F64, rng=r)), D, D,
         kind="addnorm"),
    Case("mse", _seeded(lambda r: MSELoss()), D, 1, kind="loss"),
    Case("cross_entropy", _seeded(lambda r: CrossEntropyLoss()), D, 1, kind="loss"),
]
from engine import GatedFFN, LogSoftmax, Softmax  # noqa: E402


def _checkpointed(rng):
    return Sequential(Linear(D, 8, dtype=F64, rng=rng), Dropout(0.25, dtype=F64, rng=rng),
                      GatedFFN(8, 10, "gelu", bias=True, dropout=0.2, dtype=F64, rng=rng),
                      FFNSublayer(8, 12, "gelu", dropout=0.2, norm="pre", dtype=F64, rng=rng),
                      Linear(8, D, dtype=F64, rng=rng), checkpoint=True)


_CASES += [
    Case("gated_silu", _seeded(lambda r: GatedFFN(D, 10, dtype=F64, rng=r)), D, D),
    Case("gated_gelu_bias_drop", _seeded(lambda r: GatedFFN(D, 10, "gelu", bias=True,
                                                            dropout=0.2, dtype=F64, rng=r)),
         D, D),
    Case("softmax", _seeded(lambda r: Softmax(dtype=F64)), D, D),
    Case("log_softmax", _seeded(lambda r: LogSoftmax(dtype=F64)), D, D),
    Case("linear_softmax", _seeded(lambda r: Linear(D, D, activation="softmax", dtype=F64,
                                                    rng=r)), D, D),
    Case("sequential_checkpoint", _seeded(_checkpointed), D, D),
]
CASES = {c.name: c for c in _CASES}
SINGLE = [c.name for c in _CASES if c.kind == "single"]
# Modules with a work buffer behind their plain forward output.
SINGLE_OWNING = [c.name for c in _CASES if c.kind == "single" and c.owns_output]
# Square single-input modules: their output can be fed back as their input.
SQUARE = [c.name for c in _CASES if c.kind == "single" and c.owns_output and c.d_in == c.d_out]
ADDNORM = [c.name for c in _CASES if c.kind == "addnorm"]
LOSSES = [c.name for c in _CASES if c.kind == "loss"]
MODULES = [c.name for c in _CASES if c.kind != "loss"]


def with_params(names):
    """The cases among ``names`` whose module has parameters."""
    return [n for n in names if CASES[n].build(0).parameters()]


def lead(shape_kind: str, n: int = N) -> tuple:
    return (n,) if shape_kind == "2d" else BT


def array(rng, lead_shape, d) -> np.ndarray:
    return rng.standard_normal((*lead_shape, d))


def pair(name: str, seed: int = 0):
    """The module and its twin (same seed): the twin never sees the call under test."""
    case = CASES[name]
    return case.build(seed), case.build(seed)


def params_and_grads(m) -> dict:
    return {n: (p.data.copy(), p.grad.copy()) for n, p in m.named_parameters()}


def assert_same_state(m, twin) -> None:
    """Bit-identical parameters and gradients."""
    a, b = params_and_grads(m), params_and_grads(twin)
    assert list(a) == list(b)
    for n in a:
        np.testing.assert_array_equal(a[n][0], b[n][0], err_msg=f"{n}: data")
        np.testing.assert_array_equal(a[n][1], b[n][1], err_msg=f"{n}: grad")


def copy_out(r):
    """A copy of a module's output (an array, or AddNorm's (dx, dsub) pair)."""
    if isinstance(r, tuple):
        return tuple(np.array(a, copy=True) for a in r)
    return np.array(r, copy=True)


def assert_equal_outputs(a, b, what: str) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), what
        for i, (u, v) in enumerate(zip(a, b)):
            np.testing.assert_array_equal(u, v, err_msg=f"{what}[{i}]")
    else:
        np.testing.assert_array_equal(a, b, err_msg=what)


def fwd(m, case: Case, rng, shape_kind: str):
    """A forward call with fresh inputs; returns the inputs and the output (not copied)."""
    ld = lead(shape_kind)
    x = array(rng, ld, case.d_in)
    if case.kind == "addnorm":
        sub = array(rng, ld, case.d_in)
        return (x, sub), m.forward(x, sub)
    return (x,), m.forward(x)


def step_both(m, twin, case: Case, seed: int, shape_kind: str):
    """The same forward + backward on both modules; asserts identical outputs and state."""
    rng = np.random.default_rng(seed)
    ld = lead(shape_kind)
    x = array(rng, ld, case.d_in)
    dy = array(rng, ld, case.d_out)
    if case.kind == "addnorm":
        sub = array(rng, ld, case.d_in)
        ys = [copy_out(mod.forward(x, sub)) for mod in (m, twin)]
    else:
        ys = [copy_out(mod.forward(x)) for mod in (m, twin)]
    assert_equal_outputs(ys[0], ys[1], "forward output after the rejected call")
    dxs = [copy_out(mod.backward(dy)) for mod in (m, twin)]
    assert_equal_outputs(dxs[0], dxs[1], "backward output after the rejected call")
    assert_same_state(m, twin)
