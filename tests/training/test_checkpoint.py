"""Checkpoints: bit-exact round trip, bit-identical resume, a clear error (and untouched model
and optimizer) for every bad file or mismatch, and atomic writes."""
import json
import os
import zipfile

import numpy as np
import pytest

import kernels
from engine import GMLP, MLP, SGD, AdamW, CheckpointError, MSELoss, data, fit, load, save
from engine.training import checkpoint


def _setup(seed=0, d_ffn=16, dtype=np.float32):
    """A gMLP (F-contiguous W_gate/W_proj views) with an AdamW over two parameter groups."""
    m = GMLP(16, 8, d_ffn, 4, dtype=dtype, rng=seed)
    opt = AdamW([{"params": [m.W_in, m.W_gate, m.W_proj]},
                 {"params": [m.W_out], "weight_decay": 0.0}], lr=1e-2)
    return m, opt


def _steps(m, opt, X, Y, k, start=0, batch=16):
    """``k`` hand-written training steps on consecutive batches (fixed order)."""
    loss = MSELoss()
    for i in range(start, start + k):
        s = (i * batch) % X.shape[0]
        loss.forward(m.forward(X[s:s + batch]), Y[s:s + batch])
        m.backward(loss.backward())
        opt.step()
        m.zero_grad()


def _snapshot(m, opt):
    return m.state_dict(), opt.state_dict()


def _assert_same(a, b):
    (pa, oa), (pb, ob) = a, b
    assert list(pa) == list(pb)
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
    assert oa["steps"] == ob["steps"] and oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        for k in oa["state"][i]:
            np.testing.assert_array_equal(oa["state"][i][k], ob["state"][i][k])


@pytest.fixture
def trained(tmp_path):
    """A model and optimizer after 3 steps, saved to ckpt.npz; returns (path, m, opt, X, Y)."""
    X, Y = data.regression(64, rng=0)
    m, opt = _setup(0)
    _steps(m, opt, X, Y, 3)
    path = tmp_path / "ckpt.npz"
    save(path, m, opt, epoch=3, note="hello", lr=1e-2)
    return path, m, opt, X, Y


def test_round_trip_is_bit_exact(trained):
    # Check that loading into a freshly initialised model (other seed) and optimizer restores
    # every parameter, moment, option and the step count bit for bit, and the metadata.
    path, m, opt, _, _ = trained
    m2, opt2 = _setup(seed=1)
    opt2.param_groups[0]["lr"] = 0.5
    meta = load(path, m2, opt2)
    assert meta == {"epoch": 3, "note": "hello", "lr": 1e-2}
    _assert_same(_snapshot(m2, opt2), _snapshot(m, opt))
    assert m2.W_gate.data.flags.f_contiguous            # layout kept: loaded by copy
    assert np.shares_memory(m2.W_gate.data, m2.Wgp_T)   # still a view of the combined weight


def test_resume_equals_uninterrupted(tmp_path):
    # Check that N steps, save, load into fresh objects, M more steps equals N + M steps
    # without interruption, bit for bit (float32, one thread).
    X, Y = data.regression(64, rng=0)
    with kernels.num_threads(1):
        ref, ref_opt = _setup(0)
        _steps(ref, ref_opt, X, Y, 7)

        m, opt = _setup(0)
        _steps(m, opt, X, Y, 3)
        save(tmp_path / "mid.npz", m, opt)
        del m, opt
        m2, opt2 = _setup(seed=5)
        load(tmp_path / "mid.npz", m2, opt2)
        _steps(m2, opt2, X, Y, 4, start=3)
    _assert_same(_snapshot(m2, opt2), _snapshot(ref, ref_opt))


def test_resume_with_fit_and_rng_state_in_metadata(tmp_path):
    # Check that fit with shuffling resumes identically when the shuffling Generator's state
    # travels in the metadata (JSON).
    X, Y = data.regression(50, rng=0)
    with kernels.num_threads(1):
        ref, ref_opt = _setup(0)
        fit(ref, MSELoss(), ref_opt, X, Y, epochs=4, batch_size=16, rng=np.random.default_rng(9),
            progress=False)

        m, opt = _setup(0)
        gen = np.random.default_rng(9)
        fit(m, MSELoss(), opt, X, Y, epochs=2, batch_size=16, rng=gen, progress=False)
        save(tmp_path / "e2.npz", m, opt, rng_state=gen.bit_generator.state)
        m2, opt2 = _setup(3)
        meta = load(tmp_path / "e2.npz", m2, opt2)
        gen2 = np.random.default_rng()
        gen2.bit_generator.state = meta["rng_state"]
        fit(m2, MSELoss(), opt2, X, Y, epochs=2, batch_size=16, rng=gen2, progress=False)
    _assert_same(_snapshot(m2, opt2), _snapshot(ref, ref_opt))


def test_model_only_checkpoint(tmp_path):
    # Check that a checkpoint saved without an optimizer loads into a model, and that asking
    # it for optimizer state is a clear error that changes nothing.
    m, opt = _setup(0)
    save(tmp_path / "m.npz", m)
    m2, opt2 = _setup(1)
    before = _snapshot(m2, opt2)
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load(tmp_path / "m.npz", m2, opt2)
    _assert_same(_snapshot(m2, opt2), before)
    load(tmp_path / "m.npz", m2)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(m2.state_dict()[k], v)


# ----------------------------------------------------------------------------- bad files
def _truncate(path, out):
    raw = path.read_bytes()
    out.write_bytes(raw[: len(raw) // 2])
    return out


def _bad(kind, path, tmp_path):
    """A (file, model, optimizer, message pattern) for each way a load must fail."""
    m, opt = _setup(1)
    if kind == "shape":           # other d_ffn: W_gate/W_proj/W_out shapes differ
        m, opt = _setup(1, d_ffn=12)
        return path, m, opt, r"parameter W_gate: the model has shape \(8, 12\)"
    if kind == "dtype":
        m, opt = _setup(1, dtype=np.float64)
        return path, m, opt, "dtype float64, the checkpoint float32"
    if kind == "missing_key":     # another architecture: its parameter names are missing
        m = MLP([16, 8, 4], rng=0)
        return path, m, AdamW(m.parameters()), r"missing parameters \['0.W'"
    if kind == "optimizer_type":
        return path, m, SGD(m.parameters(), lr=0.1), "optimizer state does not fit SGD"
    if kind == "optimizer_groups":
        return path, m, AdamW(m.parameters()), "parameter group"
    if kind == "truncated":
        return _truncate(path, tmp_path / "half.npz"), m, opt, "truncated or corrupt"
    if kind == "text":
        bad = tmp_path / "notes.npz"
        bad.write_text("these are not the weights you are looking for\n")
        return bad, m, opt, "not a blasnet checkpoint"
    if kind == "plain_npz":
        bad = tmp_path / "plain.npz"
        np.savez(bad, W_in=np.zeros((16, 8), np.float32))
        return bad, m, opt, "not a blasnet checkpoint"
    if kind == "newer_version":
        bad = tmp_path / "v99.npz"
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        header = json.loads(str(arrays["__header__"]))
        header["version"] = 99
        arrays["__header__"] = np.array(json.dumps(header))
        np.savez(bad, **arrays)
        return bad, m, opt, "format version 99"
    if kind == "missing_buffer":
        bad = tmp_path / "nobuf.npz"
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files if k != "optim/2/exp_avg_sq"}
        np.savez(bad, **arrays)
        return bad, m, opt, "missing buffers"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["shape", "dtype", "missing_key", "optimizer_type",
                                  "optimizer_groups", "truncated", "text", "plain_npz",
                                  "newer_version", "missing_buffer"])
def test_bad_checkpoint_gives_clear_error_and_changes_nothing(trained, tmp_path, kind):
    # Check that each bad file or mismatch raises CheckpointError (a ValueError) with a clear
    # message and leaves the model's parameters and the optimizer's state untouched.
    path = trained[0]
    bad, m, opt, pattern = _bad(kind, path, tmp_path)
    before = _snapshot(m, opt)
    with pytest.raises(CheckpointError, match=pattern):
        load(bad, m, opt)
    assert issubclass(CheckpointError, ValueError)
    _assert_same(_snapshot(m, opt), before)


def test_missing_file_is_file_not_found(tmp_path):
    # Check that a path that does not exist raises FileNotFoundError.
    m, opt = _setup(0)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nope.npz", m, opt)


def test_bad_metadata_is_rejected_before_writing(tmp_path):
    # Check that metadata that JSON cannot hold is a TypeError and no file is written.
    m, _ = _setup(0)
    with pytest.raises(TypeError, match="metadata"):
        save(tmp_path / "x.npz", m, weights=np.zeros(3))
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- atomicity
def test_interrupted_save_keeps_previous_checkpoint(trained, monkeypatch):
    # Check that a failure in the middle of writing (simulated: np.savez writes part of an
    # archive, then raises) leaves the previous checkpoint intact and no temporary file.
    path, m, opt, X, Y = trained
    before = path.read_bytes()
    _steps(m, opt, X, Y, 2, start=3)  # the model moves on; the next save fails half-way

    def failing_savez(file, **arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError("No space left on device (simulated)")

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="simulated"):
        save(path, m, opt, epoch=5)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == ["ckpt.npz"]
    m2, opt2 = _setup(1)
    assert load(path, m2, opt2)["epoch"] == 3
    assert opt2.steps == 3


def test_save_replaces_atomically_via_same_directory_temp(trained, monkeypatch):
    # Check that the final file appears through os.replace from a temporary file in the same
    # directory (so the rename is atomic), and that the result is a valid zip archive.
    path, m, opt, _, _ = trained
    calls = []
    real = os.replace

    def spy(src, dst):
        calls.append((os.path.dirname(os.path.abspath(src)), os.fspath(dst)))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    save(path, m, opt)
    assert calls == [(str(path.parent), str(path))]
    assert zipfile.is_zipfile(path)
    assert checkpoint.FORMAT_VERSION == 1
