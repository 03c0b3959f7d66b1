"""Checkpoints edited to make blasnet allocate, recurse or misread: sizes in the stored model
configuration larger than the arrays the file holds (in .npz, in .safetensors with its
checksums recomputed, in a ``train`` run's saved options), configurations of many modules,
JSON nested past any stack, and stored values of the wrong type. Each is a CheckpointError
(or one ``error:`` line and exit 2 from the CLI) raised before anything is built."""
import json
import os

import numpy as np
import pytest

import engine
from engine import MLP, CheckpointError, Embedding, LayerNorm, Linear, Sequential, load, save
from engine.cli.app import main
from engine.models import config as config_module
from engine.training import checkpoint, load_model as load_model_module


def _arrays(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _edited_npz(src, dst, edit):
    """``src`` with its JSON header changed by ``edit(header)`` (the zip's CRCs are written
    afresh, so only blasnet's own checks stand in the way)."""
    arrays = _arrays(src)
    header = json.loads(str(arrays["__header__"][()]))
    edit(header)
    arrays["__header__"] = np.array(json.dumps(header))
    np.savez(dst, **arrays)
    return dst


def _deep_npz(src, dst, depth=100_000):
    """``src`` with metadata nested ``depth`` lists deep (text edit: json.dumps would recurse)."""
    arrays = _arrays(src)
    text = str(arrays["__header__"][()])
    arrays["__header__"] = np.array(text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}")
    np.savez(dst, **arrays)
    return dst


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "m.npz"
    save(path, MLP([8, 16, 3], rng=0))
    return path


@pytest.fixture
def never_built(monkeypatch):
    """Fails the test if load_model gets as far as building a module from the config."""
    def refuse(*a, **k):
        raise AssertionError("the model was built from an unchecked configuration")
    monkeypatch.setattr(config_module, "from_config", refuse)


# Each edit makes the stored configuration imply more than the file holds.
OVERSIZED = {
    "mlp_hidden_width": lambda h: h["model_config"]["config"].update(sizes=[8, 10**12, 3]),
    "mlp_one_more_unit": lambda h: h["model_config"]["config"].update(sizes=[8, 17, 3]),
    "layernorm_width": lambda h: h.update(model_config={"type": "LayerNorm",
                                                        "config": {"d": 10**9}}),
    "embedding_rows": lambda h: h.update(model_config={
        "type": "Embedding", "config": {"num_embeddings": 10**10, "dim": 1}}),
    "nested_linear": lambda h: h.update(model_config={"type": "Sequential", "config": {
        "modules": [{"type": "Linear", "config": {"d_in": 10**5, "d_out": 10**5}}]}}),
    "many_identities": lambda h: h.update(model_config={"type": "Sequential", "config": {
        "modules": [{"type": "Identity", "config": {}}] * 300_000}}),
}


@pytest.mark.parametrize("edit", sorted(OVERSIZED))
def test_a_configuration_larger_than_the_stored_arrays_is_refused_before_building(
        small, tmp_path, never_built, edit):
    # Check that load_model refuses, naming the file, before constructing any module.
    path = _edited_npz(small, tmp_path / "x.npz", OVERSIZED[edit])
    with pytest.raises(CheckpointError, match="x.npz: the model configuration"):
        engine.load_model(path)


def test_a_users_module_setting_larger_than_the_file_is_refused(small, tmp_path,
                                                                  never_built):
    # Check that a class without a dry shape pass has its integer settings bounded.
    def edit(h):
        h["model_config"] = {"type": "my.Wide", "config": {"width": 10**12}}
    path = _edited_npz(small, tmp_path / "x.npz", edit)
    with pytest.raises(CheckpointError, match="integer 1000000000000, larger"):
        engine.load_model(path, custom_objects={"Wide": Linear})


def test_a_consistent_configuration_still_loads(small):
    # Check that the bound does not refuse the file save wrote.
    r = engine.load_model(small)
    assert r.model.num_parameters() == 8 * 16 + 16 + 16 * 3 + 3


@pytest.mark.parametrize("node", [
    {"type": "LayerNorm", "config": {"d": 10**9}},
    {"type": "MLP", "config": {"sizes": [8, 10**12, 3]}}])
def test_a_safetensors_file_with_its_checksums_recomputed_is_bounded_too(
        tmp_path, never_built, node):
    # Check that a .safetensors file whose header is edited and checksummed afresh (by
    # blasnet's own writer) is refused before building.
    pytest.importorskip("safetensors")
    from engine.training.safetensors_file import write_safetensors
    path = str(tmp_path / "x.safetensors")
    write_safetensors(path, MLP([8, 16, 3], rng=0), "{}", {"model_config": node})
    with pytest.raises(CheckpointError, match="implies"):
        engine.load_model(path)


@pytest.mark.parametrize("depth", [150, 100_000])
def test_deeply_nested_json_is_a_checkpoint_error_for_every_reader(small, tmp_path, capsys,
                                                                   depth):
    # Check that nesting past the bound (and past the parser's own stack) is refused by
    # load, load_model and inspect, naming the file.
    path = _deep_npz(small, tmp_path / "deep.npz", depth)
    for call in (lambda: load(path, MLP([8, 16, 3])), lambda: engine.load_model(path)):
        with pytest.raises(CheckpointError, match="deep.npz.*nested deeper"):
            call()
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "nested deeper" in err


def test_deeply_nested_safetensors_metadata_is_a_checkpoint_error(tmp_path):
    # Check the same for the metadata string of a .safetensors file.
    pytest.importorskip("safetensors")
    from engine.training.safetensors_file import write_safetensors
    path = str(tmp_path / "deep.safetensors")
    write_safetensors(path, MLP([3, 2], rng=0), '{"a": ' + "[" * 5000 + "]" * 5000 + "}", {})
    with pytest.raises(CheckpointError, match="nested deeper"):
        engine.load_model(path)


def test_save_refuses_metadata_nested_deeper_than_load_reads(tmp_path):
    # Check that save cannot write a file that load would refuse.
    deep = []
    for _ in range(checkpoint.MAX_JSON_DEPTH):
        deep = [deep]
    with pytest.raises(ValueError, match="metadata: nested deeper"):
        save(tmp_path / "m.npz", MLP([3, 2]), note=deep)
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("state", [{"mean": ["x"], "scale": [1.0]},
                                   {"mean": [0.0], "scale": "y"}])
def test_a_stored_standardizer_of_strings_is_a_checkpoint_error(tmp_path, state):
    # Check that a wrongly typed standardizer is the file's fault, named as such.
    path = tmp_path / "s.npz"
    save(path, MLP([1, 2], rng=0), standardizer=state)
    with pytest.raises(CheckpointError, match="s.npz: metadata 'standardizer'"):
        engine.load_model(path)


# ----------------------------------------------------------------------------- train --resume
RUN = ["train", "--task", "sine", "--model", "mlp", "--hidden", "16", "--samples", "64",
       "--batch-size", "32", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def run_checkpoint(tmp_path_factory):
    """A finished two-epoch ``train`` run's checkpoint (resumable)."""
    path = tmp_path_factory.mktemp("run") / "r.npz"
    assert main(RUN + ["--epochs", "2", "--save", str(path)]) == 0
    return path


def _saved_cli(key, value):
    return lambda h: h["metadata"]["cli"].update({key: value})


def _history(key, value):
    return lambda h: h["training"]["history"].update({key: value})


RESUME_EDITS = {
    "hidden_width": (_saved_cli("hidden", [10**9]), "sizes imply at least"),
    "hidden_pair": (_saved_cli("hidden", [5000, 5000]), "sizes imply at least"),
    "unknown_model": (_saved_cli("model", "nope"), "--model is 'nope'"),
    "hidden_text": (_saved_cli("hidden", "x"), "--hidden is 'x'"),
    "lr_text": (_saved_cli("lr", "x"), "--lr is 'x'"),
    "epochs_bool": (_saved_cli("epochs", True), "--epochs is True"),
    "history_strings": (_history("loss", ["x", "y"]), "History's loss holds 'x'"),
    "history_lists": (_history("lr", [[1], [2]]), "History's lr holds [1]"),
}


@pytest.mark.parametrize("edit", sorted(RESUME_EDITS))
def test_resume_of_an_edited_run_is_one_usage_error_line(run_checkpoint, tmp_path, capsys,
                                                        monkeypatch, edit):
    # Check that a run's saved options and history are held to what train writes: exit 2,
    # one line naming --resume, and no model built from the saved sizes.
    fn, match = RESUME_EDITS[edit]
    path = _edited_npz(run_checkpoint, tmp_path / "e.npz", fn)
    if "sizes" in match:
        from engine.cli import app
        monkeypatch.setattr(app, "build_model", lambda *a, **k: pytest.fail("built"))
    capsys.readouterr()
    assert main(["train", "--resume", str(path), "--epochs", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume: ") and err.count("\n") == 1, err
    assert match in err


def test_resume_of_the_unedited_run_still_continues(run_checkpoint, capsys):
    # Check that the checks pass the file train wrote.
    assert main(["train", "--resume", str(run_checkpoint), "--epochs", "3", "--quiet"]) == 0


_UNDER_A_MEMORY_LIMIT = r"""
import resource, sys
import engine
from engine import CheckpointError
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
limit = used + (1 << 30)  # 1 GiB above what the interpreter holds: far below 4 GB
resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
try:
    engine.load_model(sys.argv[1])
except CheckpointError as e:
    print("refused:", e)
"""


def test_an_oversized_configuration_is_refused_under_a_memory_limit(small, tmp_path):
    # Check end to end, in a process whose address space cannot hold the 4 GB a LayerNorm
    # of 10**9 features would take, that load_model refuses the file rather than allocate.
    import subprocess
    import sys
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc here")
    path = _edited_npz(small, tmp_path / "x.npz", OVERSIZED["layernorm_width"])
    env = dict(os.environ, BLASNET_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", _UNDER_A_MEMORY_LIMIT, str(path)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("refused:") and "implies" in p.stdout
