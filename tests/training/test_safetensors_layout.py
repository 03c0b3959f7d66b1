""".safetensors checkpoints in PyTorch's names and layouts by default: when every module of
the model has a PyTorch reference module, ``save`` writes what
``torch.nn.Module.load_state_dict(safetensors.torch.load_file(path))`` takes; ``load`` and
``load_model`` read both layouts, with blasnet's checksums kept."""
import numpy as np
import pytest

import engine
from engine import (FFN, GMLP, MLP, CheckpointError, FFNSublayer, Linear, Sequential, load,
                    save, to_torch_state_dict)

st_np = pytest.importorskip("safetensors.numpy")


def _sublayer():
    m = Sequential(Linear(4, 8, dtype=np.float64, rng=0),
                   FFNSublayer(8, 16, "gelu", dtype=np.float64, rng=1),
                   Linear(8, 3, dtype=np.float64, rng=2))
    r = np.random.default_rng(5)  # LayerNorm's ones and zeros too: every value distinct
    m.load_state_dict({n: r.standard_normal(p.shape) for n, p in m.named_parameters()})
    return m


def test_a_mappable_model_is_saved_under_pytorchs_names_and_layouts(tmp_path):
    # Check the file's tensors are exactly to_torch_state_dict's (names, (out, in) weights),
    # and that load and load_model give the parameters back exactly.
    m = _sublayer()
    save(tmp_path / "m.safetensors", m, epoch=3)
    raw = st_np.load_file(str(tmp_path / "m.safetensors"))
    want = to_torch_state_dict(m)
    assert sorted(raw) == sorted(want) and "0.weight" in raw and "1.ffn.0.weight" in raw
    for k, v in want.items():
        np.testing.assert_array_equal(raw[k], v)
    fresh = _sublayer()
    fresh.load_state_dict({n: np.zeros(p.shape) for n, p in fresh.named_parameters()})
    assert load(tmp_path / "m.safetensors", fresh) == {"epoch": 3}
    for (n, p), (_, q) in zip(m.named_parameters(), fresh.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)
    rebuilt = engine.load_model(tmp_path / "m.safetensors").model
    for p, q in zip(m.parameters(), rebuilt.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    header = engine.training.checkpoint.read_header(tmp_path / "m.safetensors")
    assert header["metadata"] == {"epoch": 3}


def test_a_model_without_a_pytorch_mapping_keeps_blasnets_names(tmp_path):
    # Check a GMLP (no PyTorch reference module) is saved under blasnet's names, as before.
    m = GMLP(4, 8, 16, 2, rng=0)
    save(tmp_path / "g.safetensors", m)
    assert sorted(st_np.load_file(str(tmp_path / "g.safetensors"))) == sorted(
        n for n, _ in m.named_parameters())


def test_a_file_pytorch_wrote_loads_and_other_names_are_refused(tmp_path):
    # Check a plain safetensors file under PyTorch's names (as torch's save_file writes one
    # for the reference module) loads transposed into place; unrelated names are refused
    # with nothing changed.
    m = MLP([3, 5, 2], dtype=np.float64, rng=0)
    st_np.save_file(dict(to_torch_state_dict(m)), str(tmp_path / "t.safetensors"))
    fresh = MLP([3, 5, 2], dtype=np.float64, rng=9)
    assert load(tmp_path / "t.safetensors", fresh) == {}
    for p, q in zip(m.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    st_np.save_file({"foo": np.zeros((5, 3))}, str(tmp_path / "x.safetensors"))
    before = [p.data.copy() for p in fresh.parameters()]
    with pytest.raises(CheckpointError, match="missing parameters"):
        load(tmp_path / "x.safetensors", fresh)
    assert all(np.array_equal(a, p.data) for a, p in zip(before, fresh.parameters()))


def test_the_file_loads_into_the_pytorch_reference_module(tmp_path):
    # Check the promise itself: torch's load_state_dict(load_file(path)) takes the file
    # strictly, and the PyTorch module computes what the blasnet model computes.
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    m = _sublayer()
    save(tmp_path / "m.safetensors", m)
    nn = torch.nn

    class Sub(nn.Module):  # FFNSublayer's reference: ffn (Sequential), norm (post-norm)
        def __init__(self):
            super().__init__()
            self.ffn = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
            self.norm = nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(x + self.ffn(x))

    ref = nn.Sequential(nn.Linear(4, 8), Sub(), nn.Linear(8, 3)).double()
    ref.load_state_dict(st_torch.load_file(str(tmp_path / "m.safetensors")), strict=True)
    x = np.random.default_rng(0).standard_normal((6, 4))
    m.eval()
    with torch.no_grad():
        np.testing.assert_allclose(m.forward(x), ref(torch.from_numpy(x)).numpy(), rtol=1e-10,
                                   atol=1e-12)


def test_every_bit_of_a_pytorch_layout_file_is_still_checked(tmp_path):
    # Check blasnet's checksums cover a file in PyTorch's layout too: any flipped bit is a
    # CheckpointError (a sampled sweep of every 3rd byte, every bit).
    m = FFN(3, 4, dtype=np.float32, rng=0)
    save(tmp_path / "f.safetensors", m, epoch=1)
    good = (tmp_path / "f.safetensors").read_bytes()
    target = FFN(3, 4, dtype=np.float32, rng=1)
    accepted = []
    for i in range(0, len(good), 3):
        for bit in range(8):
            b = bytearray(good)
            b[i] ^= 1 << bit
            (tmp_path / "bad.safetensors").write_bytes(bytes(b))
            try:
                load(tmp_path / "bad.safetensors", target)
            except CheckpointError:
                continue
            accepted.append((i, bit))
    assert accepted == []
