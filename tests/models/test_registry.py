"""engine.models.registry: every block entry is complete, its engine module and its naive twin
(engine.models.naive, whole-array NumPy on kernels.reference) compute the same forward and
gradients in float64, and its GEMM list is what the module really runs
(kernels.instrument.record)."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Module
from engine.models import registry
from engine.models.naive import NaiveBlock
from kernels.instrument import record

F64 = np.float64
LEAD = (3, 5)  # 15 rows: distinct from every example width

CASES = [pytest.param(name, variant, id="-".join([name, *map(str, variant.values())]))
         for name, entry in registry.BLOCKS.items() for variant in entry.variants]


def _build(name, variant, seed=0):
    entry = registry.get(name)
    module = entry.build(entry.example, dtype=F64, rng=seed, **variant)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((*LEAD, entry.d_in(entry.example)))
    dy = rng.standard_normal((*LEAD, entry.d_out(entry.example)))
    return entry, module, x, dy


def _full(args):
    """A recorded gemm call's arguments as passed, with gemm's defaults after (out, a, b):
    (out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0)."""
    return (*args, *(False, False, 1.0, 0.0)[len(args) - 3:])


def _mnk(args):
    """(M, N, K) of a recorded gemm call."""
    out, a, _, trans_a = _full(args)[:4]
    return out.shape[0], out.shape[1], a.shape[0] if trans_a else a.shape[1]


def _canon(mnks):
    """Sorted (min(M, N), max(M, N), K): a product computed as its transpose
    (C^T = B^T A^T) counts as the same GEMM."""
    return sorted((min(m, n), max(m, n), k) for m, n, k in mnks)


@pytest.mark.parametrize("name", list(registry.BLOCKS))
def test_entry_is_complete(name):
    # Check that the entry has every piece (factory, twin class, GEMM list, widths, sizes,
    # an example with every size it needs, variants using only declared options) and that
    # its example builds an engine Module.
    entry = registry.BLOCKS[name]
    assert entry.name == name and entry.doc
    for fn in (entry.build_fn, entry.gemm_fn, entry.d_in, entry.d_out):
        assert callable(fn)
    assert issubclass(entry.naive, NaiveBlock)
    assert entry.naive.forward_rows is not NaiveBlock.forward_rows
    assert entry.naive.backward_rows is not NaiveBlock.backward_rows
    assert entry.dims and all(k in entry.example for k in entry.dims)
    assert entry.variants and all(set(v) <= set(entry.options) for v in entry.variants)
    module = entry.build(entry.example, dtype=F64, rng=0, **entry.variants[0])
    assert isinstance(module, Module) and module.num_parameters() > 0
    assert entry.gemms(4, entry.example, **entry.variants[0])


@pytest.mark.parametrize("name,variant", CASES)
def test_twin_forward_matches_module(name, variant):
    # Check that the engine module and its naive twin, from the same parameters, give the
    # same output (float64).
    entry, module, x, _ = _build(name, variant)
    twin = entry.twin(module, **variant)
    y = module.forward(x).copy()
    np.testing.assert_allclose(y, twin.forward(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,variant", CASES)
def test_twin_gradients_match_module(name, variant):
    # Check that backward gives the twin's input gradient and that every parameter gradient
    # equals the twin's (same names, float64).
    entry, module, x, dy = _build(name, variant)
    twin = entry.twin(module, **variant)
    module.forward(x)
    dx = module.backward(dy).copy()
    twin.forward(x)
    np.testing.assert_allclose(dx, twin.backward(dy), rtol=1e-10, atol=1e-12)
    named = dict(module.named_parameters())
    assert set(named) == set(twin.grads)
    for pname, p in named.items():
        np.testing.assert_allclose(p.grad, twin.grads[pname], rtol=1e-10, atol=1e-12,
                                   err_msg=f"{name} {pname}")


@pytest.mark.parametrize("name,variant", CASES)
def test_gemm_list_is_what_the_module_runs(name, variant):
    # Check that the GEMMs one forward + backward calls through kernels.ops.gemm are, as
    # (M, N, K) up to a transposed output, exactly the entry's list, and that the list
    # would notice one GEMM missing.
    entry, module, x, dy = _build(name, variant)
    with record(["gemm"]) as rec:
        module.forward(x)
        module.backward(dy)
    seen = [_mnk(c.args) for c in rec.of("gemm")]
    listed = [g[:3] for g in entry.gemms(int(np.prod(LEAD)), entry.example, **variant)]
    assert _canon(seen) == _canon(listed), (sorted(seen), sorted(listed))
    assert _canon(seen[1:]) != _canon(listed)


@pytest.mark.parametrize("name,variant", CASES)
def test_gemm_list_accumulates_exactly_the_weight_gradients(name, variant):
    # Check that the list's beta=1 GEMMs are the module's GEMMs that write into parameter
    # gradients, and that those calls accumulate (beta=1) rather than overwrite.
    entry, module, x, dy = _build(name, variant)
    grads = [p.grad for p in module.parameters()]
    with record(["gemm"]) as rec:
        module.forward(x)
        module.backward(dy)
    into_grads = [c.args for c in rec.of("gemm")
                  if any(np.shares_memory(c.args[0], g) for g in grads)]
    assert all(_full(args)[6] == 1.0 for args in into_grads)
    listed = [g for g in entry.gemms(int(np.prod(LEAD)), entry.example, **variant)
              if g[5] == 1.0]
    assert _canon(_mnk(a) for a in into_grads) == _canon(g[:3] for g in listed)


def test_twin_step_is_adamw_on_its_own_gradients():
    # Check that the twin's step is forward, MSE loss, backward, one AdamW update
    # (Loshchilov & Hutter 2019; first step: p -= lr * g / (|g| + eps) after decay) and a
    # zeroed gradient, written out here for the FFN twin's W_out.
    entry, module, x, _ = _build("FFN", {"activation": "relu"})
    twin = entry.twin(module, lr=1e-2, weight_decay=0.1, activation="relu")
    probe = entry.twin(module, activation="relu")
    y = probe.forward(x)
    target = np.zeros_like(y)
    probe.backward(2.0 * (y - target) / y.size)
    g = probe.grads["W_out"]
    w0 = twin.params["W_out"].copy()
    loss = twin.step(x, target)
    assert loss == pytest.approx(float(np.mean(y ** 2)), rel=1e-12)
    want = w0 * (1 - 1e-2 * 0.1) - 1e-2 * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(twin.params["W_out"], want, rtol=1e-9, atol=1e-12)
    assert not twin.grads["W_out"].any()


def test_twin_refuses_dropout():
    # Check that a twin asked for dropout raises ValueError naming it (it cannot draw the
    # engine's mask) instead of silently computing without it.
    entry, module, _, _ = _build("FFN", {"activation": "relu"})
    with pytest.raises(ValueError, match="dropout"):
        entry.twin(module, activation="relu", dropout=0.1)


def test_unknown_block_option_and_missing_size_are_errors():
    # Check that an unknown block name, an unknown option and a missing size raise, naming
    # what was wrong.
    with pytest.raises(ValueError, match="nope"):
        registry.get("nope")
    ffn = registry.get("FFN")
    with pytest.raises(TypeError, match="colour"):
        ffn.build(ffn.example, colour="red")
    with pytest.raises(ValueError, match="d_ff"):
        ffn.build({"d_model": 4})
    with pytest.raises(ValueError, match="already registered"):
        registry.register(ffn)
