"""Checkpoints under damage and misuse: every damaged file (bytes flipped in the zip
structures and in the data, truncations) is a CheckpointError that changes nothing, a header
declaring more data than the file holds is refused before any allocation, edited headers
and duplicate members are refused; save writes through symbolic links, refuses read-only
files, cleans up after killed saves and fits the name limit; bad arguments are named."""
import io
import json
import os
import signal
import struct
import subprocess
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest

from engine import MLP, AdamW, CheckpointError, Linear, load, save
from engine.optim import lr_scheduler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _trained(rng=0):
    m = MLP([3, 4, 2], rng=rng)
    opt = AdamW(m.parameters(), lr=0.01)
    sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for p in m.parameters():
        p.grad[...] = 0.5
    opt.step()
    sched.step()
    return m, opt, sched


def _state(m, opt, sched):
    sd = opt.state_dict()
    return ([p.data.copy() for p in m.parameters()],
            {i: {k: v.copy() for k, v in st.items()} for i, st in sd["state"].items()},
            sd["steps"], json.dumps(sd["param_groups"]), json.dumps(sched.state_dict()))


def _equal(a, b) -> bool:
    return (all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
            and a[1].keys() == b[1].keys()
            and all(np.array_equal(a[1][i][k], b[1][i][k]) for i in a[1] for k in a[1][i])
            and a[2:] == b[2:])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The bytes of a small checkpoint and the state it holds."""
    path = tmp_path_factory.mktemp("ck") / "good.npz"
    m, opt, sched = _trained()
    save(path, m, opt, scheduler=sched, epoch=3, note="ok")
    return path.read_bytes(), _state(m, opt, sched)


def _offsets(raw: bytes, magic: bytes) -> list:
    out, i = [], raw.find(magic)
    while i >= 0:
        out.append(i)
        i = raw.find(magic, i + 1)
    return out


def _damaged_npz(raw: bytes):
    """Deterministic damage: every byte of the first two local headers (30 bytes), the first
    two central directory entries (46 bytes) and the end record (22 bytes) flipped; 80 bytes
    anywhere flipped by one bit (seeded); 50 truncations spread over the length."""
    cases = []
    spans = [(o, 30) for o in _offsets(raw, b"PK\x03\x04")[:2]]
    spans += [(o, 46) for o in _offsets(raw, b"PK\x01\x02")[:2]]
    spans += [(o, 22) for o in _offsets(raw, b"PK\x05\x06")[-1:]]
    for start, n in spans:
        for i in range(start, start + n):
            b = bytearray(raw)
            b[i] ^= 0xFF
            cases.append((f"flip {i}", bytes(b)))
    rng = np.random.default_rng(13)
    for i, bit in zip(rng.integers(0, len(raw), 80), rng.integers(0, 8, 80)):
        b = bytearray(raw)
        b[i] ^= 1 << int(bit)
        cases.append((f"bit {bit} of byte {i}", bytes(b)))
    for n in sorted(set(np.linspace(0, len(raw) - 1, 50).astype(int)) | {1, 4, 21, 22}):
        cases.append((f"first {n} bytes", raw[:n]))
    return cases


def _check_case(path, data, saved_state, what):
    """Load damaged ``data`` into a differently initialised model, optimizer and scheduler:
    either CheckpointError and nothing changed, or the saved state exactly (a byte nobody
    reads, e.g. a timestamp)."""
    path.write_bytes(data)
    m, opt, sched = _trained(rng=1)
    before = _state(m, opt, sched)
    try:
        load(path, m, opt, sched)
    except CheckpointError:
        assert _equal(_state(m, opt, sched), before), f"{what}: a failed load changed state"
        return "error"
    assert _equal(_state(m, opt, sched), saved_state), f"{what}: loaded a different state"
    return "loaded"


def test_every_damaged_npz_checkpoint_is_a_checkpoint_error_and_changes_nothing(saved, tmp_path):
    # Check ~300 deterministic damages of a small .npz checkpoint (model, AdamW, StepLR):
    # each is a CheckpointError with model, optimizer and scheduler unchanged, or loads the
    # saved state bit for bit; never another exception type, never a different state.
    raw, state = saved
    outcomes = [_check_case(tmp_path / "bad.npz", data, state, what)
                for what, data in _damaged_npz(raw)]
    assert outcomes.count("error") > len(outcomes) // 2


def test_every_damaged_safetensors_file_is_a_checkpoint_error(tmp_path):
    # Check every one-bit flip (bit 0 of each byte) and a truncation every 7 bytes of a
    # .safetensors file blasnet wrote: CheckpointError and nothing changed, or the saved
    # parameters exactly. The format has no checksum of its own; the CRC-32s blasnet stores
    # in its metadata catch flips in the tensor data.
    pytest.importorskip("safetensors")
    m, _, _ = _trained()
    path = tmp_path / "good.safetensors"
    save(path, m, epoch=3)
    raw = path.read_bytes()
    want = [p.data.copy() for p in m.parameters()]
    bad = tmp_path / "bad.safetensors"
    cases = [(f"flip {i}", raw[:i] + bytes([raw[i] ^ 1]) + raw[i + 1:]) for i in range(len(raw))]
    cases += [(f"first {n} bytes", raw[:n]) for n in range(0, len(raw), 7)]
    for what, data in cases:
        bad.write_bytes(data)
        got = MLP([3, 4, 2], rng=1)
        before = [p.data.copy() for p in got.parameters()]
        try:
            load(bad, got)
        except CheckpointError:
            for a, p in zip(before, got.parameters()):
                np.testing.assert_array_equal(a, p.data, err_msg=what)
            continue
        for a, p in zip(want, got.parameters()):
            np.testing.assert_array_equal(a, p.data, err_msg=f"{what}: a different state")


# ----------------------------------------------------------------------------- huge shapes
def _npy(shape, dtype, payload: bytes) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(
        np.dtype(dtype)), "fortran_order": False, "shape": shape})
    return buf.getvalue() + payload


def test_a_header_declaring_a_huge_array_is_refused_before_allocating(saved, tmp_path):
    # Check that a member whose .npy header declares a (4096, 4096) float32 array (64 MiB)
    # over 48 stored bytes (its CRC-32 valid) is a CheckpointError naming the member, with
    # less than 1 MiB traced during the load: sizes are checked against the bytes stored.
    raw, _ = saved
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(io.BytesIO(raw)) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "param/0.W.npy":
                data = _npy((4096, 4096), np.float32, data[-48:])
            zout.writestr(info.filename, data)
    m, _, _ = _trained(rng=1)
    before = [p.data.copy() for p in m.parameters()]
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"param/0\.W\.npy.*\(4096, 4096\)"):
            load(path, m)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes traced"
    for a, p in zip(before, m.parameters()):
        np.testing.assert_array_equal(a, p.data)


def test_a_safetensors_header_declaring_a_huge_tensor_is_refused(tmp_path):
    # Check that a safetensors header declaring an (8192, 8192) float32 tensor over 48
    # bytes of data is a CheckpointError, with less than 1 MiB traced during the load.
    pytest.importorskip("safetensors")
    header = json.dumps({"W": {"dtype": "F32", "shape": [8192, 8192],
                               "data_offsets": [0, 48]}}).encode()
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(48))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError):
            load(path, Linear(3, 4))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes traced"


# ----------------------------------------------------------------------------- edited files
def _rewrite(raw: bytes, path, edit_header=None, extra=()):
    """``raw``'s members, the JSON header passed through ``edit_header``, then ``extra``
    (name, bytes) members appended."""
    with zipfile.ZipFile(io.BytesIO(raw)) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "__header__.npy" and edit_header is not None:
                h = json.loads(str(np.load(io.BytesIO(data))[()]))
                edit_header(h)
                buf = io.BytesIO()
                np.save(buf, np.array(json.dumps(h)))
                data = buf.getvalue()
            zout.writestr(info.filename, data)
        for name, data in extra:
            with pytest.warns(UserWarning, match="Duplicate name"):
                zout.writestr(name, data)


def test_a_duplicate_member_is_refused(saved, tmp_path):
    # Check that a second param/0.W.npy member (numpy would silently read the last one) is
    # a CheckpointError naming it; the model is unchanged.
    raw, _ = saved
    path = tmp_path / "dup.npz"
    buf = io.BytesIO()
    np.save(buf, np.full((3, 4), 7.0, np.float32))
    _rewrite(raw, path, extra=[("param/0.W.npy", buf.getvalue())])
    m, _, _ = _trained(rng=1)
    w = m.parameters()[0].data.copy()
    with pytest.raises(CheckpointError, match=r"param/0\.W\.npy.*twice"):
        load(path, m)
    np.testing.assert_array_equal(w, m.parameters()[0].data)


@pytest.mark.parametrize("field, value", [("version", 1.0), ("version", True), ("version", "1"),
                                          ("metadata", [1, 2]), ("metadata", "x"),
                                          ("optimizer", "AdamW"), ("params", [])])
def test_a_header_field_of_the_wrong_type_is_refused(saved, tmp_path, field, value):
    # Check that a non-integer version (1.0, True, "1"), metadata that is not a JSON object,
    # an optimizer entry or parameter list of the wrong type is a CheckpointError naming
    # the field; nothing changes.
    raw, _ = saved
    path = tmp_path / "edited.npz"
    _rewrite(raw, path, edit_header=lambda h: h.update({field: value}))
    m, opt, sched = _trained(rng=1)
    before = _state(m, opt, sched)
    with pytest.raises(CheckpointError, match=field):
        load(path, m, opt, sched)
    assert _equal(_state(m, opt, sched), before)


@pytest.mark.parametrize("field, value", [("version", "1.0"), ("version", "١"),
                                          ("metadata", "[1, 2]"), ("metadata", "{"),
                                          ("crc32", "[]")])
def test_a_safetensors_header_field_of_the_wrong_type_is_refused(tmp_path, field, value):
    # Check the same for the metadata of a .safetensors file blasnet wrote: a version that is
    # not a decimal integer, user metadata that is not a JSON object, checksums that are not
    # one: CheckpointError naming the field, nothing changed.
    st = pytest.importorskip("safetensors.numpy")
    m, _, _ = _trained()
    path = tmp_path / "good.safetensors"
    save(path, m, epoch=1)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n))["__metadata__"]
    meta[field] = value
    # Edited on purpose: without the header checksum (which would refuse any edit), as a
    # file written before it; its fields are still checked one by one.
    meta.pop("blasnet_header_crc32")
    st.save_file(st.load_file(str(path)), str(tmp_path / "edited.safetensors"), metadata=meta)
    got = MLP([3, 4, 2], rng=1)
    before = [p.data.copy() for p in got.parameters()]
    with pytest.raises(CheckpointError, match=field.replace("crc32", "checksum|crc32")):
        load(tmp_path / "edited.safetensors", got)
    for a, p in zip(before, got.parameters()):
        np.testing.assert_array_equal(a, p.data)


# ----------------------------------------------------------------------------- saving
def test_save_writes_through_a_symbolic_link(tmp_path):
    # Check that saving to a symlink replaces the file it points to (as open(path, "w")
    # would) and leaves the link a link; loading through it gives the new weights.
    target = tmp_path / "real.npz"
    link = tmp_path / "link.npz"
    old, _, _ = _trained(rng=0)
    save(target, old)
    link.symlink_to(target)
    new, _, _ = _trained(rng=2)
    save(link, new)
    assert link.is_symlink() and os.readlink(link) == str(target)
    got = MLP([3, 4, 2], rng=5)
    load(target, got)
    for a, b in zip(got.parameters(), new.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


def test_save_refuses_to_replace_a_read_only_file(tmp_path):
    # Check that a file without write permission is not replaced (even for root, who could):
    # PermissionError naming the path, and the file's bytes are unchanged.
    path = tmp_path / "ro.npz"
    m, _, _ = _trained()
    save(path, m)
    raw = path.read_bytes()
    os.chmod(path, 0o444)
    try:
        with pytest.raises(PermissionError, match="ro.npz: the file is read-only"):
            save(path, _trained(rng=3)[0])
        assert path.read_bytes() == raw
    finally:
        os.chmod(path, 0o644)


def test_a_long_file_name_gets_a_temporary_name_within_the_limit(tmp_path):
    # Check that a target name of 250 bytes (and of 255, the usual limit) saves and loads:
    # the temporary name is cut to fit instead of failing with "File name too long".
    m, _, _ = _trained()
    for n in (250, 255):
        path = tmp_path / ("w" * (n - 4) + ".npz")
        save(path, m)
        got = MLP([3, 4, 2], rng=1)
        load(path, got)
        np.testing.assert_array_equal(got.parameters()[0].data, m.parameters()[0].data)
    assert sorted(len(p.name) for p in tmp_path.iterdir()) == [250, 255]


_KILLED_SAVE = """
import os, signal, sys
import numpy as np
from engine import Linear, save
def die(f, **arrays):
    f.write(b"x" * 4096)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
np.savez = die
save(sys.argv[1], Linear(3, 4, rng=0))
"""


def test_temporary_files_of_killed_saves_are_removed_by_the_next_save(tmp_path):
    # Check that a save SIGKILLed mid-write leaves the previous file intact and a temporary
    # file, that the next save of the same target removes it (and only such files: a live
    # process's temporary file of that target, another target's and an unrelated file
    # stay), and that the target then holds the new weights.
    path = tmp_path / "ck.npz"
    m, _, _ = _trained()
    save(path, m)
    raw = path.read_bytes()
    env = dict(os.environ, BLASNET_NUM_THREADS="1")
    seen = set()
    for _ in range(3):  # each killed save first removes the one killed before it
        r = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(path)], cwd=ROOT, env=env,
                           capture_output=True, timeout=120)
        assert r.returncode == -signal.SIGKILL, r.stderr
        assert path.read_bytes() == raw
        stale = sorted(set(os.listdir(tmp_path)) - {"ck.npz"})
        assert len(stale) == 1 and stale[0].startswith(".blasnet-") and stale[0] not in seen
        seen.add(stale[0])
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        keep = [f"{stale[0].rsplit('-', 2)[0]}-{live.pid}-abcdefgh.tmp",  # a live save
                ".blasnet-00000000-999999999-abcdefgh.tmp", "notes.txt"]  # another target
        for name in keep:
            (tmp_path / name).write_bytes(b"keep")
        new, _, _ = _trained(rng=4)
        save(path, new)
        assert sorted(os.listdir(tmp_path)) == sorted(["ck.npz", *keep])
    finally:
        live.kill()
        live.wait()
    got = MLP([3, 4, 2], rng=1)
    load(path, got)
    np.testing.assert_array_equal(got.parameters()[0].data, new.parameters()[0].data)


# ----------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("call, kind, names", [
    (lambda p, m, o: save(p, None), TypeError, "model:"),
    (lambda p, m, o: save(p, m, "x"), TypeError, "optimizer:"),
    (lambda p, m, o: save(None, m), TypeError, "path:"),
    (lambda p, m, o: load(p, None), TypeError, "model:"),
    (lambda p, m, o: load(p, m, "x"), TypeError, "optimizer:"),
    (lambda p, m, o: load(p, m, o, "x"), TypeError, "scheduler:"),
], ids=["save model", "save optimizer", "save path", "load model", "load optimizer",
        "load scheduler"])
def test_wrong_argument_types_are_named(tmp_path, call, kind, names):
    # Check that save and load name a wrong-type argument (before touching any file).
    path = tmp_path / "ck.npz"
    m, opt, _ = _trained()
    save(path, m, opt)
    mtime = os.stat(path).st_mtime_ns
    with pytest.raises(kind, match=names):
        call(path, m, opt)
    assert os.stat(path).st_mtime_ns == mtime
