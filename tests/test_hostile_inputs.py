"""Hostile inputs to data files, the LM, safetensors metadata, data-parallel runs and
callbacks: each test is one class of defect, tried as a hostile user would; a call
does the right thing or raises a named error before it changes anything."""
import math
import os

import numpy as np
import pytest

from engine import data as D


# ----------------------------------------------------------------------------- silently wrong
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("value", [0.1, 1e6 + 0.3, -3.7e-5])
def test_standardizer_treats_rounding_noise_as_a_constant_column(dtype, value):
    # Check that a constant column (whose float64 std comes out as ~1e-17 * |value|, not 0)
    # gets scale 1, so a new value is shifted, not blown up by ~1e17.
    X = np.empty((1000, 2), dtype)
    X[:, 0] = value
    X[:, 1] = np.linspace(-1, 1, 1000)
    s = D.Standardizer().fit(X)
    assert s.scale[0] == 1.0
    new = np.array([[2 * value, 0.0]], dtype)
    z = s.transform(new)
    assert abs(z[0, 0] - dtype(value)) <= 1e-6 * abs(value)
    assert 0.5 < s.scale[1] < 0.7  # a real spread keeps its standard deviation


def _csv(tmp_path, text, name="d.csv", mode="w"):
    p = tmp_path / name
    if mode == "wb":
        p.write_bytes(text)
    else:
        p.write_text(text)
    return str(p)


@pytest.mark.parametrize("label", [2 ** 53 + 1, 2 ** 62 + 1, -(2 ** 63)])
def test_csv_integer_labels_round_trip_exactly(tmp_path, label):
    # Check that integer labels inside int64 are read exactly (not through a float64).
    path = _csv(tmp_path, f"a,y\n1.5,{label}\n2.5,3\n")
    X, Y = D.load(path, y="y")
    assert Y.dtype == np.int64 and int(Y[0]) == label and int(Y[1]) == 3


@pytest.mark.parametrize("label", [2 ** 63, -(2 ** 63) - 1, 10 ** 30])
def test_csv_integer_labels_outside_int64_are_refused_naming_line_and_column(tmp_path, label):
    # Check that a label that int64 cannot hold is a ValueError naming the file, line and
    # column (not a wrap-around with a NumPy warning).
    path = _csv(tmp_path, f"a,y\n1.5,3\n2.5,{label}\n")
    with pytest.raises(ValueError, match=r"d\.csv: line 3, column 2 \('y'\)"):
        D.load(path, y="y")


def test_csv_big_integer_in_a_float_target_column_is_a_number(tmp_path):
    # Check that a huge integer in a column that also holds decimals is a float target
    # (regression), not a refused label.
    path = _csv(tmp_path, f"a,y\n1.5,{10 ** 30}\n2.5,0.5\n")
    X, Y = D.load(path, y="y")
    assert Y.dtype == np.float32 and Y.shape == (2, 1) and Y[0, 0] == np.float32(1e30)


@pytest.fixture
def small_safetensors(tmp_path):
    pytest.importorskip("safetensors")
    from engine.training import checkpoint
    from engine.nn.layers import Linear
    model = Linear(3, 2, rng=0)
    path = str(tmp_path / "m.safetensors")
    checkpoint.save(path, model, scale=2.0, epoch=7)
    return path, model


def test_safetensors_every_bit_of_a_blasnet_file_is_checked(small_safetensors, tmp_path):
    # Check that flipping any single bit of a blasnet-written .safetensors file (length
    # prefix, header with the metadata and the "format" key, tensor bytes) is refused
    # with a CheckpointError: nothing loads silently changed, no check is switched off.
    from engine.training import checkpoint
    from engine.nn.layers import Linear
    path, model = small_safetensors
    good = open(path, "rb").read()
    bad = str(tmp_path / "bad.safetensors")
    target = Linear(3, 2, rng=1)
    before = target.state_dict()
    accepted = []
    for i in range(len(good)):
        for bit in range(8):
            b = bytearray(good)
            b[i] ^= 1 << bit
            with open(bad, "wb") as f:
                f.write(b)
            try:
                checkpoint.load(bad, target)
            except checkpoint.CheckpointError:
                continue
            accepted.append((i, bit))
    assert accepted == []
    after = target.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert checkpoint.load(path, target) == {"scale": 2.0, "epoch": 7}


def test_safetensors_foreign_file_without_checksums_loads(tmp_path):
    # Check that a file written by another tool (no blasnet metadata) loads as before.
    st = pytest.importorskip("safetensors.numpy")
    from engine.training import checkpoint
    from engine.nn.layers import Linear
    model = Linear(3, 2, rng=0)
    path = str(tmp_path / "other.safetensors")
    st.save_file({k: v for k, v in model.state_dict().items()}, path,
                 metadata={"producer": "someone else"})
    target = Linear(3, 2, rng=1)
    assert checkpoint.load(path, target) == {}
    assert np.array_equal(target.state_dict()["W"], model.state_dict()["W"])


# ----------------------------------------------------------------------------- data parallel
def _mpi():
    pytest.importorskip("mpi4py")
    from engine import distributed
    return distributed


def test_data_parallel_refuses_an_optimizer_over_other_parameters():
    # Check that DataParallel(model, AdamW(other.parameters())) is a ValueError (as
    # fit(comm=...) is), not a wrapper whose step never updates the model.
    dist = _mpi()
    from engine.nn.layers import Linear
    from engine.optim import AdamW
    model, other = Linear(3, 2, rng=0), Linear(3, 2, rng=1)
    before = model.W.data.copy()
    with pytest.raises(ValueError, match="optimizer"):
        dist.DataParallel(model, AdamW(other.parameters()))
    assert np.array_equal(model.W.data, before)


@pytest.mark.parametrize("make", ["DataParallel", "ShardedAdamW"])
def test_a_communicator_that_is_not_one_is_a_type_error(make):
    # Check that comm=42 is a TypeError naming comm, not an AttributeError.
    dist = _mpi()
    from engine.nn.layers import Linear
    from engine.optim import AdamW
    model = Linear(3, 2, rng=0)
    with pytest.raises(TypeError, match="comm: expected an MPI communicator"):
        if make == "DataParallel":
            dist.DataParallel(model, AdamW(model.parameters()), comm=42)
        else:
            dist.ShardedAdamW(model.parameters(), comm=42)


def test_sharded_adamw_checks_its_options_at_step_time():
    # Check that a learning rate made invalid between steps is refused at step() naming
    # it, before the gradients or parameters change (as AdamW.step does).
    dist = _mpi()
    from engine.nn.layers import Linear
    model = Linear(3, 2, rng=0)
    opt = dist.ShardedAdamW(model.parameters())
    model.W.grad[...] = 1.0
    opt.param_groups[0]["lr"] = float("nan")
    before, grad = model.W.data.copy(), model.W.grad.copy()
    with pytest.raises(ValueError, match="lr"):
        opt.step()
    assert np.array_equal(model.W.data, before) and np.array_equal(model.W.grad, grad)
    assert opt.steps == 0


def test_sharded_adamw_step_defers_ctrl_c_to_its_end():
    # Check that a SIGINT arriving inside ShardedAdamW.step is delivered after the whole
    # update (parameters gathered, gradients zeroed, step counted), never half way.
    import signal
    dist = _mpi()
    from engine.nn.layers import Linear

    class Interrupted(dist.ShardedAdamW):
        def update_shard(self):
            super().update_shard()
            signal.raise_signal(signal.SIGINT)

    model = Linear(3, 2, rng=0)
    opt = Interrupted(model.parameters())
    model.W.grad[...] = 1.0
    before = model.W.data.copy()
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            opt.step(zero_grad=True)
    finally:
        signal.signal(signal.SIGINT, old)
    assert opt.steps == 1 and not np.array_equal(model.W.data, before)
    assert not model.W.grad.any()


# ----------------------------------------------------------------------------- warmup
def _cli(capsys, *argv):
    from engine import cli
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear", "step"])
def test_warmup_longer_than_the_run_is_refused_for_every_schedule(capsys, schedule):
    # Check one rule for all schedules: a warmup that leaves no step at the full rate is a
    # usage error naming --warmup before training (constant used to train at ~1e-6).
    code, out, err = _cli(capsys, "train", "--task", "sine", "--samples", "8", "--model", "mlp",
                          "--hidden", "4", "--epochs", "2", "--schedule", schedule,
                          "--warmup", "1000")
    assert code == 2 and "--warmup 1000" in err and "Traceback" not in err
    assert "epoch" not in out


def test_lm_warmup_longer_than_the_run_is_refused_not_clamped():
    # Check that the language model's warmup is refused when the run is too short for it
    # (it used to be clamped while the banner printed the value given).
    from engine.training import lm
    cfg = lm.LMConfig(seq_len=16, d_model=8, d_ffn=16, blocks=1, batch_size=16, epochs=1,
                      block=512, warmup=100000, prompt="ab")
    with pytest.raises(ValueError, match="warmup 100000"):
        lm.setup(cfg, text="abcdefgh" * 2000)


# ----------------------------------------------------------------------------- checkpointing
def test_checkpointed_sequential_refuses_backward_after_a_mode_change():
    # Check that eval() between forward and backward of Sequential(checkpoint=True) is a
    # RuntimeError naming the mode change (not eval-mode gradients), that nothing changed,
    # and that restoring the mode gives the gradients of the plain Sequential.
    from engine.nn.blocks import Dropout
    from engine.nn.layers import Linear
    from engine.nn.containers import Sequential
    def make(checkpoint):
        g = np.random.default_rng(3)
        return Sequential(Linear(4, 8, dtype=np.float64, rng=0),
                          Dropout(0.5, dtype=np.float64, rng=g),
                          Linear(8, 3, dtype=np.float64, rng=1), checkpoint=checkpoint)
    ck, plain = make(True), make(False)
    x = np.random.default_rng(0).standard_normal((5, 4))
    dy = np.ones((5, 3))
    ck.forward(x)
    plain.forward(x)
    ck.eval()
    with pytest.raises(RuntimeError, match="mode changed since forward"):
        ck.backward(dy)
    assert not ck.flat_grads().any()
    ck.train()
    ck.backward(dy)
    plain.backward(dy)
    assert np.array_equal(ck.flat_grads(), plain.flat_grads())


# ----------------------------------------------------------------------------- save paths
@pytest.mark.parametrize("name", ["newdir/", "", "sub/.", "sub/.."])
def test_save_to_a_directory_name_or_empty_is_a_value_error(tmp_path, monkeypatch, name):
    # Check that save("newdir/") and save("") are ValueErrors naming the path, and nothing
    # is written (it used to write a file named newdir, or raise IsADirectoryError).
    from engine.training import checkpoint
    from engine.nn.layers import Linear
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match=r"path: expected a file name, got " + repr(name)):
        checkpoint.save(name, Linear(2, 2, rng=0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]
    assert list((tmp_path / "sub").iterdir()) == []


# ----------------------------------------------------------------------------- fit up front
def _lm_stack(seq_len=8, vocab=11):
    from engine.models import lm
    return lm.build_model(vocab, seq_len=seq_len, d_model=8, d_ffn=16, blocks=1,
                          dtype=np.float64, rng=0)


def _lm_data(n=12, seq_len=8, vocab=11):
    g = np.random.default_rng(0)
    return g.integers(0, vocab, (n, seq_len)), g.integers(0, vocab, (n, seq_len))


def _unchanged_fit(model, *args, match, error=ValueError, **kw):
    """fit(model, ...) raises ``error`` matching ``match`` and leaves the parameters, the
    gradients, the mode and the optimizer as they were."""
    from engine.nn.losses import CrossEntropyLoss
    from engine.optim import AdamW
    from engine.training.loop import fit
    opt = AdamW(model.parameters(), lr=0.1)
    model.eval()
    model.flat_grads()[...] = 0.5
    params, grads = model.flat_params().copy(), model.flat_grads().copy()
    kw.setdefault("loss", CrossEntropyLoss())
    loss = kw.pop("loss")
    with pytest.raises(error, match=match):
        fit(model, loss, opt, *args, **kw)
    assert np.array_equal(model.flat_params(), params)
    assert np.array_equal(model.flat_grads(), grads)
    assert not model.training and opt.steps == 0


def test_fit_checks_lm_ids_of_every_batch_before_the_first_step():
    # Check that an id out of range in the last batch is found before any step.
    X, Y = _lm_data()
    X[-1, 3] = 11
    _unchanged_fit(_lm_stack(), X, Y, epochs=1, batch_size=4, match=r"X: expected ids in \[0, 11\)")


def test_fit_checks_the_validation_ids_before_the_first_step():
    X, Y = _lm_data()
    Xv, Yv = _lm_data(4)
    Xv[2, 0] = -1
    _unchanged_fit(_lm_stack(), X, Y, epochs=1, batch_size=4, validation=(Xv, Yv),
                   match=r"validation X: expected ids in \[0, 11\)")


def test_fit_checks_the_sequence_length_through_every_child():
    # Check that T > seq_len (which only the GMLPBlock after the Embedding rejects) is
    # found up front.
    X, Y = _lm_data(seq_len=9)
    _unchanged_fit(_lm_stack(seq_len=8), X, Y, epochs=1, match=r"T <= seq_len = 8")


def test_fit_checks_the_width_of_a_first_gmlp_block():
    from engine.nn.gmlp_block import GMLPBlock
    model = GMLPBlock(8, 16, 4, dtype=np.float64, rng=0)
    X = np.zeros((3, 4, 7))
    Y = np.zeros((3, 4, 8))
    from engine.nn.losses import MSELoss
    _unchanged_fit(model, X, Y, epochs=1, loss=MSELoss(), match=r"X: expected shape \(N, 8\)")


def test_fit_checks_the_lm_target_shape():
    X, Y = _lm_data()
    _unchanged_fit(_lm_stack(), X, Y[:, :-1].copy(), epochs=1, match=r"Y: expected integer labels of "
                   r"shape \(12, 8\)")


def test_fit_asks_a_users_module_through_the_protocol():
    # Check that a user's module with its own forward and check_input is asked (its check
    # runs up front), and one without check_input is not judged by the default rules.
    from engine.nn.layers import Linear
    from engine.nn.module import Module

    class Picky(Linear):
        def check_input(self, x, name="x"):
            if x.shape[0] % 2:
                raise ValueError(f"{name}: expected an even number of rows")
            return super().check_input(x, name)

        def forward(self, x, *, residual=None):
            return super().forward(x, residual=residual)

    from engine.nn.losses import MSELoss
    X, Y = np.zeros((3, 2)), np.zeros((3, 2))
    _unchanged_fit(Picky(2, 2, dtype=np.float64, rng=0), X, Y, epochs=1, loss=MSELoss(),
                   match="even number of rows")


@pytest.mark.parametrize("name", __import__("modules_zoo").SINGLE)
@pytest.mark.parametrize("shape_kind", ["2d", "3d"])
def test_check_input_predicts_forward(name, shape_kind):
    # Check, for every single-input module kind, that check_input gives the shape forward
    # returns, and refuses a wrong width as forward does.
    import modules_zoo as Z
    case = Z.CASES[name]
    m = case.build(0)
    x = Z.array(np.random.default_rng(0), Z.lead(shape_kind), case.d_in)
    assert m.check_input(x) == m.forward(x).shape
    bad = Z.array(np.random.default_rng(0), Z.lead(shape_kind), case.d_in + 1)
    try:
        m.forward(bad)
    except (TypeError, ValueError) as e:
        with pytest.raises(type(e)):
            m.check_input(bad)


@pytest.mark.parametrize("what", ["loss", "scheduler", "optimizer", "callback"])
def test_fit_refuses_a_class_where_an_instance_is_expected(what):
    # Check that fit(loss=MSELoss) (the class), scheduler=StepLR, optimizer=AdamW or
    # callbacks=[EarlyStopping] is a TypeError naming the argument before anything changes.
    from engine.training.callbacks import EarlyStopping
    from engine.nn.layers import Linear
    from engine.nn.losses import MSELoss
    from engine.optim.lr_scheduler import StepLR
    from engine.optim import AdamW
    from engine.training.loop import fit
    model = Linear(2, 2, dtype=np.float64, rng=0)
    opt = AdamW(model.parameters())
    model.eval()
    model.flat_grads()[...] = 0.5
    params, grads = model.flat_params().copy(), model.flat_grads().copy()
    kw = dict(loss=MSELoss(), optimizer=opt)
    extra = {}
    if what == "loss":
        kw["loss"] = MSELoss
    elif what == "optimizer":
        kw["optimizer"] = AdamW
    elif what == "scheduler":
        extra["scheduler"] = StepLR
    else:
        extra["callbacks"] = [EarlyStopping]
    X = np.ones((4, 2))
    with pytest.raises(TypeError, match=r"(loss|optimizer|scheduler|callbacks\[0\]): expected "
                                        r"an instance, got the class"):
        fit(model, kw["loss"], kw["optimizer"], X, X, epochs=1, **extra)
    assert np.array_equal(model.flat_params(), params)
    assert np.array_equal(model.flat_grads(), grads) and not model.training


# ----------------------------------------------------------------------------- callbacks
@pytest.mark.parametrize("template, kind, validation", [
    ("ck-{val_loss:.3f}.npz", "regression", False),
    ("ck-{accuracy:.2f}.npz", "regression", True),
    ("ck-{epoch}-{val_accuracy}.npz", "classification", False),
])
def test_model_checkpoint_template_naming_an_unrecorded_figure_is_refused_up_front(
        tmp_path, template, kind, validation):
    # Check that a path template naming a figure this run does not record is a ValueError
    # naming it before the first step (it used to fail after epoch 1), nothing written.
    from engine.training.callbacks import ModelCheckpoint
    from engine.nn.layers import Linear
    from engine.nn.losses import CrossEntropyLoss, MSELoss
    from engine.optim import AdamW
    from engine.training.loop import fit
    model = Linear(2, 3, dtype=np.float64, rng=0)
    X = np.ones((4, 2))
    Y = np.zeros((4, 3)) if kind == "regression" else np.array([0, 1, 2, 0])
    loss = MSELoss() if kind == "regression" else CrossEntropyLoss()
    opt = AdamW(model.parameters())
    before = model.flat_params().copy()
    cb = ModelCheckpoint(str(tmp_path / template), monitor="loss")
    with pytest.raises(ValueError, match=r"callbacks\[0\]: ModelCheckpoint reads '(val_loss|"
                                         r"accuracy|val_accuracy)'"):
        fit(model, loss, opt, X, Y, epochs=2, callbacks=[cb],
            validation=(X, Y) if validation else None)
    assert np.array_equal(model.flat_params(), before) and opt.steps == 0
    assert list(tmp_path.iterdir()) == []


def test_model_checkpoint_template_with_an_unknown_field_is_refused_at_construction(tmp_path):
    from engine.training.callbacks import ModelCheckpoint
    with pytest.raises(ValueError, match=r"path: the template .* names \{lr\}"):
        ModelCheckpoint(str(tmp_path / "ck-{lr}.npz"))


# ----------------------------------------------------------------------------- output files
@pytest.fixture
def read_only_file(tmp_path):
    p = tmp_path / "ro.npz"
    p.write_bytes(b"old")
    os.chmod(p, 0o444)
    yield p
    os.chmod(p, 0o644)


def test_model_checkpoint_onto_a_read_only_file_is_refused_before_the_first_step(
        read_only_file):
    # Check that the start-of-run check predicts what save does with a read-only file (it
    # refuses it, even for root, whom os.access lets through): ValueError before any step.
    from engine.training.callbacks import ModelCheckpoint
    from engine.nn.layers import Linear
    from engine.nn.losses import MSELoss
    from engine.optim import AdamW
    from engine.training.loop import fit
    model = Linear(2, 2, dtype=np.float64, rng=0)
    opt = AdamW(model.parameters())
    before = model.flat_params().copy()
    X = np.ones((4, 2))
    with pytest.raises(ValueError, match="ModelCheckpoint path: .*read-only"):
        fit(model, MSELoss(), opt, X, X, epochs=2,
            callbacks=[ModelCheckpoint(str(read_only_file), monitor="loss")])
    assert np.array_equal(model.flat_params(), before) and opt.steps == 0
    assert read_only_file.read_bytes() == b"old"


def test_cli_save_onto_a_read_only_file_is_a_usage_error_before_training(capsys, read_only_file):
    code, out, err = _cli(capsys, "train", "--task", "sine", "--samples", "8", "--model", "mlp",
                          "--hidden", "4", "--epochs", "2", "--save", str(read_only_file))
    assert code == 2 and "--save: " in err and "read-only" in err and "Traceback" not in err
    assert "epoch" not in out and read_only_file.read_bytes() == b"old"


def test_a_254_byte_file_name_saves_through_save_and_the_cli(tmp_path, capsys):
    # Check one temporary-name scheme: a name as long as the file system allows (minus the
    # suffix) is accepted by save() and by the CLI's up-front check alike.
    from engine.training import checkpoint
    from engine.nn.layers import Linear
    name = "s" * 250 + ".npz"  # 254 bytes
    checkpoint.save(str(tmp_path / name), Linear(2, 2, rng=0))
    (tmp_path / name).unlink()
    code, out, err = _cli(capsys, "train", "--task", "sine", "--samples", "8", "--model", "mlp",
                          "--hidden", "4", "--epochs", "1", "--save", str(tmp_path / name))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_cli_save_failing_at_the_end_keeps_the_model(tmp_path, capsys, monkeypatch):
    # Check that a save that fails after training (here: the disk fills up) writes the
    # checkpoint to a temporary file, says where, exits 1 with no traceback, and that file
    # holds the trained model.
    import errno
    from engine.training import checkpoint
    target = str(tmp_path / "m.npz")
    real_write = checkpoint.write  # the writer under save and save_or_rescue

    def full_disk(path, *args, **kw):
        if os.fspath(path) == target:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, *args, **kw)
    monkeypatch.setattr(checkpoint, "write", full_disk)
    code, out, err = _cli(capsys, "train", "--task", "sine", "--samples", "8", "--model", "mlp",
                          "--hidden", "4", "--epochs", "2", "--save", target)
    assert code == 1 and "Traceback" not in err
    assert "No space left on device" in err and "saved to " in err
    rescued = err.split("saved to ")[1].split(" instead")[0]
    try:
        from engine.nn.containers import MLP
        meta = checkpoint.load(rescued, MLP([1, 4, 1], rng=5))
        assert meta["epochs"] == 2
    finally:
        os.unlink(rescued)


# ----------------------------------------------------------------------------- the LM
_TINY_LM = dict(seq_len=16, d_model=8, d_ffn=16, blocks=1, batch_size=16, epochs=1, block=512,
                warmup=0, prompt="ab")
_TEXT = "abcdefgh " * 1000


@pytest.mark.parametrize("field, value, kind", [
    ("prompt", "", ValueError), ("temperature", 0, ValueError),
    ("sample_length", -2, ValueError), ("temperature", "hot", TypeError),
    ("batch_size", 0, ValueError), ("seq_len", 0, ValueError), ("block", 0, ValueError),
    ("epochs", 1.5, TypeError),
])
def test_lm_train_checks_its_config_before_training(field, value, kind):
    # Check that a config sampling would reject (or one that divides by zero) is refused,
    # naming the field, before any step: by setup, and by train on a prepared setup whose
    # config was edited afterwards.
    from engine.training import lm
    with pytest.raises(kind, match=f"{field}"):
        lm.setup(lm.LMConfig(**{**_TINY_LM, field: value}), text=_TEXT)
    s = lm.setup(lm.LMConfig(**_TINY_LM), text=_TEXT)
    before = s.model.flat_params().copy()
    setattr(s.config, field, value)
    with pytest.raises(kind, match=f"{field}"):
        lm.train(prepared=s, progress=False)
    assert np.array_equal(s.model.flat_params(), before) and s.optimizer.steps == 0


def test_cli_lm_with_an_empty_prompt_is_a_usage_error_before_training(capsys):
    code, out, err = _cli(capsys, "train", "--model", "gmlp-lm", "--task", "text", "--d-hidden",
                          "4", "--d-ff", "4", "--epochs", "1", "--prompt", "")
    assert code == 2 and "prompt" in err and "Traceback" not in err
    assert "epoch" not in out and "time " not in out


@pytest.mark.parametrize("call, kind, match", [
    (lambda lm, v, ids: lm.windows(ids, 0), ValueError, "seq_len"),
    (lambda lm, v, ids: lm.windows(ids, 4, 0), ValueError, "stride"),
    (lambda lm, v, ids: lm.windows(ids, "4"), TypeError, "seq_len"),
    (lambda lm, v, ids: lm.windows(ids.astype(float), 4), TypeError, "ids"),
    (lambda lm, v, ids: lm.split(ids, 0.1, 0), ValueError, "block"),
    (lambda lm, v, ids: lm.split(ids, 0.1, -5), ValueError, "block"),
    (lambda lm, v, ids: lm.split(ids, "0.1"), TypeError, "held_out"),
    (lambda lm, v, ids: lm.split(ids, 0.1, 10 ** 9), ValueError, "block: 120 ids make 1 "),
    (lambda lm, v, ids: v.decode([len(v)]), ValueError, r"ids\[0\]: expected an id in"),
    (lambda lm, v, ids: v.decode([-1]), ValueError, r"ids\[0\]: expected an id in"),
    (lambda lm, v, ids: v.decode([1.7]), TypeError, r"ids\[0\]: expected an integer"),
    (lambda lm, v, ids: v.decode(5), TypeError, "ids: expected a sequence"),
    (lambda lm, v, ids: lm.unigram_bits(ids, ids, 2), ValueError, r"train_ids: expected ids "
                                                                  r"in \[0, 2\)"),
    (lambda lm, v, ids: lm.unigram_bits(ids, ids[:0], len(v)), ValueError, "eval_ids"),
    (lambda lm, v, ids: lm.unigram_bits(ids, ids, 0), ValueError, "vocab_size"),
])
def test_lm_functions_validate_their_arguments(call, kind, match):
    # Check that each public function of engine.models.lm names a bad argument (no
    # ZeroDivisionError, IndexError, wrap-around, truncation or silent no-op).
    from engine.models import lm
    v = lm.Vocabulary("abcdef")
    ids = v.encode("abcdefabcdef" * 10)
    with pytest.raises(kind, match=match):
        call(lm, v, ids)


@pytest.mark.parametrize("kw, kind, match", [
    (dict(temperature="hot"), TypeError, "temperature"),
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(length="5"), TypeError, "length"),
    (dict(length=-2), ValueError, "length"),
    (dict(prompt=""), ValueError, "prompt"),
    (dict(seq_len=0), ValueError, "seq_len"),
    (dict(vocab="other"), ValueError, "vocab: 5 characters, the model predicts 6"),
    (dict(vocab="abcdefgh"), ValueError, "vocab: 8 characters do not fit"),
    (dict(seq_len=20), ValueError, "seq_len: the model does not take windows of 20"),
    (dict(prompt="xyz"), ValueError, "prompt: characters not in the vocabulary"),
])
def test_lm_sample_validates_its_arguments(kw, kind, match):
    # Check that sample names each bad argument before generating anything, the vocabulary
    # and window length checked against the model through its check_input.
    from engine.models import lm
    model = lm.build_model(6, seq_len=8, d_model=8, d_ffn=16, blocks=1, rng=0)
    args = dict(vocab=lm.Vocabulary("abcdef"), prompt="ab", length=3, seq_len=8,
                temperature=0.8)
    if "vocab" in kw:  # another text's vocabulary: 5 or 8 characters for a 6-id model
        kw = dict(kw, vocab=lm.Vocabulary(kw["vocab"]))
    args.update(kw)
    with pytest.raises(kind, match=match):
        lm.sample(model, args.pop("vocab"), args.pop("prompt"), args.pop("length"),
                  args.pop("seq_len"), **args)


# ----------------------------------------------------------------------------- broken data files
def _npz_bytes(**arrays):
    import io
    b = io.BytesIO()
    np.savez(b, **arrays)
    return b.getvalue()


def _broken_files():
    """name -> (file bytes, what the message must say besides the file name)."""
    good = _npz_bytes(x=np.ones((4, 2)), y=np.arange(4))
    crc = bytearray(good)
    at = crc.find(b"\x00\x00\xf0?")  # inside x's data (1.0 in float64)
    crc[at + 3] ^= 0x01
    encrypted = bytearray(good)
    encrypted[6] |= 0x01  # the first local header's flag bits: "encrypted"
    cd = encrypted.find(b"PK\x01\x02")
    encrypted[cd + 8] |= 0x01  # and the central directory's
    import zipfile, io
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("x.npy", b"this is not an npy file at all")
        z.writestr("y.npy", b"neither")
    not_npy = b.getvalue()
    return {
        "truncated.npz": (good[:len(good) // 2], ""),
        "empty.npz": (b"", ""),
        "crc.npz": (bytes(crc), ""),
        "encrypted.npz": (bytes(encrypted), "encrypted"),
        "notnpy.npz": (not_npy, "not .npy data"),
        "nosamples.npz": (_npz_bytes(x=np.ones((0, 2)), y=np.arange(0)), "no samples"),
        "nofeatures.npz": (_npz_bytes(x=np.ones((4, 0)), y=np.arange(4)), "no features"),
        "notargets.npz": (_npz_bytes(x=np.ones((4, 2)), y=np.ones((4, 0))), "no target"),
        "field.csv": (b"a,y\n" + b"1" * (200 * 1024) + b",0\n", "line 2"),
        "latin1.csv": ("a,y\n1,0\n2,caf\u00e9\n".encode("latin-1"), "line 3"),
        "binary.csv": (bytes(range(256)) * 4, "line 2, byte 118"),  # 0x80 after the 0x0a
        "nul.csv": (b"a,y\n1,\x000\n", "line 2"),
        "header.csv": (b"a,y\n", "no data rows"),
    }


def _huge_shape_npz():
    # An .npz whose x header declares 2**40 elements (8 TiB of float64) over 64 stored bytes.
    import io, zipfile
    x = np.ones((4, 2))
    h = io.BytesIO()
    np.lib.format.write_array_header_1_0(h, {"descr": "<f8", "fortran_order": False,
                                             "shape": (2 ** 40,)})
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("x.npy", h.getvalue() + x.tobytes())
        z.writestr("y.npy", _npy(np.arange(4)))
    return b.getvalue()


def _npy(a):
    import io
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


@pytest.mark.parametrize("name", sorted(_broken_files()) + ["huge.npz"])
def test_broken_data_files_are_value_errors_naming_the_file(tmp_path, name):
    # Check that engine.data.load names the file (and line or array) for each broken file,
    # as a ValueError (no MemoryError, UnicodeDecodeError, csv.Error, zipfile error).
    raw, says = (_huge_shape_npz(), "declares shape") if name == "huge.npz" \
        else _broken_files()[name]
    p = tmp_path / name
    p.write_bytes(raw)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")) as e:
        D.load(str(p), y="y")
    assert says in str(e.value)


@pytest.mark.parametrize("name", ["truncated.npz", "latin1.csv", "field.csv", "huge.npz"])
def test_cli_turns_a_broken_data_file_into_a_usage_error(tmp_path, capsys, name):
    raw = _huge_shape_npz() if name == "huge.npz" else _broken_files()[name][0]
    p = tmp_path / name
    p.write_bytes(raw)
    code, out, err = _cli(capsys, "train", "--data", str(p), "--y-cols", "y", "--epochs", "1")
    assert code == 2 and err.startswith("error: --data: ") and name in err
    assert "Traceback" not in err and "epoch" not in out


def test_a_csv_with_a_utf8_byte_order_mark_is_read(tmp_path, capsys):
    # Check that Excel's "CSV UTF-8" (a BOM before the header) loads, first column named
    # without the BOM, through load and the CLI.
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffa,b,y\n".encode("utf-8") + b"".join(
        f"{i % 3},{i % 5 - 2},{i % 2}\n".encode() for i in range(20)))
    X, Y = D.load(str(p), x=["a", "b"], y="y")
    assert X.shape == (20, 2) and X[4, 0] == 1.0 and Y[3] == 1
    code, out, err = _cli(capsys, "train", "--data", str(p), "--y-cols", "y", "--epochs", "1",
                          "--model", "mlp", "--hidden", "4")
    assert code == 0, err


def test_cli_refuses_labels_that_would_build_a_trillion_classes(tmp_path, capsys):
    p = tmp_path / "big.csv"
    p.write_text("a,y\n1,0\n2,1000000000000\n3,1\n4,0\n5,1\n")
    code, out, err = _cli(capsys, "train", "--data", str(p), "--y-cols", "y", "--epochs", "1")
    assert code == 2 and "1000000000000" in err and "classes" in err
    assert "Traceback" not in err


# ----------------------------------------------------------------------------- smaller ones
@pytest.mark.parametrize("kind", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [(2, 3, 0), (2, 0)])
def test_rowwise_activations_take_an_empty_feature_axis(kind, shape):
    # Check that Softmax/LogSoftmax on rows of zero features return empty arrays of the
    # input's shape, forward and backward (NumPy cannot reshape (2, 3, 0) to (-1, 0)).
    from engine.nn import layers
    m = getattr(layers, kind)()
    x = np.zeros(shape, np.float32)
    assert m.forward(x).shape == shape
    assert m.backward(np.zeros(shape, np.float32)).shape == shape


@pytest.mark.parametrize("state, name", [
    ({"mean": ["a"], "scale": ["b"]}, "mean"), ({"mean": "12", "scale": "34"}, "mean"),
    ({"mean": [1.0], "scale": "2"}, "scale"), ({"mean": [True], "scale": [1.0]}, "mean"),
])
def test_standardizer_from_state_dict_names_a_field_of_strings(state, name):
    with pytest.raises(TypeError, match=rf"state\['{name}'\]: expected a list of numbers"):
        D.Standardizer.from_state_dict(state)


def test_history_plot_honours_the_suffix(tmp_path):
    # Check that plot("loss.pdf") writes a PDF (not PNG bytes), ".svg" an SVG, and an
    # unknown suffix is a ValueError naming the path before anything is written.
    pytest.importorskip("matplotlib")
    from engine.training.history import History
    h = History(loss=[1.0, 0.5], steps=2)
    h.plot(tmp_path / "loss.pdf")
    h.plot(tmp_path / "loss.svg")
    h.plot(tmp_path / "loss.png")
    assert (tmp_path / "loss.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (tmp_path / "loss.svg").read_bytes()[:1000]
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match=r"path: expected a file name ending in .*loss\.xyz"):
        h.plot(tmp_path / "loss.xyz")
    assert not (tmp_path / "loss.xyz").exists()


@pytest.mark.parametrize("identity", ["identity", "module"])
def test_to_torch_state_dict_keeps_the_identity_slot(identity):
    # Check the documented layout: an MLP layer with an "identity" activation maps to
    # nn.Sequential(nn.Linear, nn.Identity(), nn.Linear), so the second Linear is slot 2.
    from engine.interop import load_torch_state_dict, to_torch_state_dict
    from engine.nn.containers import MLP
    from engine.nn.layers import Identity
    act = "identity" if identity == "identity" else Identity()
    m = MLP([2, 3, 2], activations=[act, None], rng=0)
    sd = to_torch_state_dict(m)
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    twin = MLP([2, 3, 2], activations=[act, None], rng=1)
    load_torch_state_dict(twin, sd)
    assert np.array_equal(twin.flat_params(), m.flat_params())


def test_checkpointed_sequential_accepts_a_mode_restored_or_changed_elsewhere():
    # Check that only an actual difference from the forward's modes is refused: eval() then
    # train() on the model, or eval() of another model, between forward and backward pass.
    from engine.nn.layers import Linear
    from engine.nn.containers import Sequential
    m = Sequential(Linear(3, 4, dtype=np.float64, rng=0), Linear(4, 2, dtype=np.float64, rng=1),
                   checkpoint=True)
    other = Linear(2, 2, rng=0)
    x, dy = np.ones((2, 3)), np.ones((2, 2))
    m.forward(x)
    m.eval()
    m.train()
    other.eval()
    m.backward(dy)
    m.eval()
    m.forward(x)  # an eval-mode forward, then its backward in eval mode
    m.backward(dy)


def test_npz_unsigned_labels_beyond_int64_are_refused(tmp_path):
    # Check that uint64 labels int64 cannot hold are refused naming the array and index
    # (they used to wrap to negative labels).
    p = tmp_path / "u.npz"
    np.savez(p, x=np.ones((3, 2)), y=np.array([1, 2 ** 63, 3], np.uint64))
    with pytest.raises(ValueError, match=r"u\.npz: array 'y': the label 9223372036854775808 at "
                                         r"index 1 does not fit int64"):
        D.load(str(p))
    np.savez(p, x=np.ones((3, 2)), y=np.array([1, 2, 3], np.uint64))
    assert D.load(str(p))[1].tolist() == [1, 2, 3]


def test_values_that_overflow_the_dtype_are_refused_not_made_infinite(tmp_path):
    # Check that a finite value float32 cannot hold (1e300) is a ValueError naming where
    # (array and index, or line and column), not an inf; float64 reads it.
    p = tmp_path / "big.npz"
    np.savez(p, x=np.array([[1.0, 2.0], [3.0, -1e300]]), y=np.array([0, 1]))
    with pytest.raises(ValueError, match=r"big\.npz: array 'x': the value -1e\+300 at index "
                                         r"\(1, 1\) overflows float32"):
        D.load(str(p))
    assert D.load(str(p), dtype=np.float64)[0][1, 1] == -1e300
    c = _csv(tmp_path, "a,b,y\n1,2,0.5\n3,4,1e300\n")
    with pytest.raises(ValueError, match=r"d\.csv: line 3, column 3 \('y'\): the value 1e\+300 "
                                         r"overflows float32"):
        D.load(c, y="y")


def test_a_column_named_twice_is_refused(tmp_path):
    c = _csv(tmp_path, "a,b,y\n1,2,0\n3,4,1\n")
    with pytest.raises(ValueError, match=r"y: the column\(s\) \['y'\] are named more than once"):
        D.load(c, y=["y", "y"])
    with pytest.raises(ValueError, match=r"x: the column\(s\) \['a'\]"):
        D.load(c, x=["a", "a"], y="y")


@pytest.mark.parametrize("call", ["load", "to_csv", "to_json", "plot"])
def test_a_path_that_is_not_one_is_named(call):
    from engine.training.history import History
    h = History(loss=[1.0], steps=1)
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike, got NoneType"):
        if call == "load":
            D.load(None)
        else:
            getattr(h, call)(None)


def test_model_checkpoint_template_that_cannot_be_filled_is_refused_up_front(tmp_path):
    # Check that {loss[0]} (a float is not subscriptable) is refused at the start of fit,
    # as a ValueError naming the path, not a TypeError after epoch 1.
    from engine.training.callbacks import ModelCheckpoint
    from engine.nn.layers import Linear
    from engine.nn.losses import MSELoss
    from engine.optim import AdamW
    from engine.training.loop import fit
    m = Linear(2, 2, dtype=np.float64, rng=0)
    opt = AdamW(m.parameters())
    X = np.ones((4, 2))
    with pytest.raises(ValueError, match="path: cannot fill in"):
        fit(m, MSELoss(), opt, X, X, epochs=1,
            callbacks=[ModelCheckpoint(str(tmp_path / "{loss[0]}.npz"), monitor="loss")])
    assert opt.steps == 0


def test_fit_with_a_communicator_that_is_not_one_is_a_type_error():
    _mpi()
    from engine.nn.layers import Linear
    from engine.nn.losses import MSELoss
    from engine.optim import AdamW
    from engine.training.loop import fit
    m = Linear(2, 2, rng=0)
    X = np.ones((4, 2), np.float32)
    with pytest.raises(TypeError, match="comm: expected an MPI communicator"):
        fit(m, MSELoss(), AdamW(m.parameters()), X, X, epochs=1, comm=42)


def test_save_into_a_missing_directory_names_the_target(tmp_path):
    from engine.training import checkpoint
    from engine.nn.layers import Linear
    target = str(tmp_path / "nodir" / "m.npz")
    with pytest.raises(FileNotFoundError, match=r"nodir/m\.npz: cannot create a file in"):
        checkpoint.save(target, Linear(2, 2, rng=0))


def test_lm_sample_refuses_a_model_that_is_not_one():
    from engine.models import lm
    with pytest.raises(TypeError, match="model: expected an engine Module"):
        lm.sample(None, lm.Vocabulary("ab"), "a", 3, 8)


def test_data_parallel_step_names_a_bad_weight():
    dist = _mpi()
    from engine.nn.layers import Linear
    from engine.optim import AdamW
    m = Linear(2, 2, rng=0)
    dp = dist.DataParallel(m, AdamW(m.parameters()))
    before = m.flat_params().copy()
    with pytest.raises(TypeError, match="weight: expected a number"):
        dp.step("x")
    with pytest.raises(ValueError, match="weight"):
        dp.step(-1.0)
    assert np.array_equal(m.flat_params(), before)
