"""``blasnet inspect`` on edited checkpoints: fields of the wrong type print (as JSON)
instead of raising, control characters a file holds reach the terminal escaped, and
``--json`` prints strict JSON (NaN and infinities as null)."""
import json

import numpy as np
import pytest

from engine import MLP, AdamW, save
from engine.optim import lr_scheduler
from engine.cli.app import main

ESC = "\x1b]0;owned\x07\x1b[2J\u202e\u2028"  # a title change, a bell, a clear, an override


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("ins") / "m.npz"
    m = MLP([3, 4, 2], rng=0)
    opt = AdamW(m.parameters(), lr=0.01)
    save(path, m, opt, scheduler=lr_scheduler.StepLR(opt, step_size=2), epoch=1)
    return path


def _edited(src, dst, edit, rename=None):
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays["__header__"][()]))
    edit(header)
    if rename:  # a parameter's name, in the member name and the header alike
        old, new = rename
        arrays["param/" + new] = arrays.pop("param/" + old)
        header["params"][new] = header["params"].pop(old)
    arrays["__header__"] = np.array(json.dumps(header))
    np.savez(dst, **arrays)
    return str(dst)


def _set(*keys, value):
    def edit(h):
        d = h
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


WRONG_TYPES = {
    "param_groups_int": _set("optimizer", "param_groups", value=3),
    "param_groups_of_ints": _set("optimizer", "param_groups", value=[3, "x"]),
    "param_groups_empty": _set("optimizer", "param_groups", value=[]),
    "config_list": _set("model_config", "config", value=[1, 2]),
    "config_string": _set("model_config", "config", value="x"),
    "type_list": _set("model_config", "type", value=["x"]),
    "model_name_dict": _set("model", value={"a": 1}),
    "scheduler_options_list": _set("scheduler", "options", value=[[1]]),
}


@pytest.mark.parametrize("edit", sorted(WRONG_TYPES))
@pytest.mark.parametrize("as_json", [False, True])
def test_inspect_prints_fields_of_the_wrong_type(saved, tmp_path, capsys, edit, as_json):
    # Check that an edited field of another type is printed, not a traceback.
    path = _edited(saved, tmp_path / "x.npz", WRONG_TYPES[edit])
    capsys.readouterr()
    assert main(["inspect", path] + (["--json"] if as_json else [])) == 0
    out = capsys.readouterr().out
    if as_json:
        json.loads(out)
    else:
        assert out.startswith("checkpoint ")


HOSTILE_TEXT = {
    "metadata_key": (_set("metadata", ESC, value=1), None),
    "metadata_value": (_set("metadata", "note", value=ESC), None),
    "model_name": (_set("model", value=ESC), None),
    "config_type": (_set("model_config", "type", value=ESC), None),
    "config_key": (_set("model_config", "config", ESC, value=ESC), None),
    "optimizer_type": (_set("optimizer", "type", value=ESC), None),
    "optimizer_option": (lambda h: h["optimizer"]["param_groups"][0].update({ESC: ESC}), None),
    "scheduler_type": (_set("scheduler", "type", value=ESC), None),
    "parameter_name": (lambda h: None, ("0.W", "0." + ESC)),
}


@pytest.mark.parametrize("edit", sorted(HOSTILE_TEXT))
@pytest.mark.parametrize("as_json", [False, True])
def test_inspect_escapes_control_characters_from_the_file(saved, tmp_path, capsys, edit,
                                                          as_json):
    # Check that nothing the file holds reaches the terminal as a control character.
    fn, rename = HOSTILE_TEXT[edit]
    path = _edited(saved, tmp_path / "x.npz", fn, rename)
    capsys.readouterr()
    code = main(["inspect", path] + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    text = out + err
    assert not any(c in text for c in "\x1b\x07\u202e\u2028"), text
    if code == 0 and not as_json:
        assert "\\x1b" in out or "\\u001b" in out  # shown, escaped
    assert code in (0, 2)


def test_inspect_json_prints_non_finite_numbers_as_null(saved, tmp_path, capsys):
    # Check that --json output is strict JSON: NaN and infinities become null.
    path = tmp_path / "n.npz"
    save(path, MLP([3, 2], rng=0), loss=float("nan"), best=[float("inf"), 1.5])
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0

    def refuse(name):
        raise AssertionError(f"non-JSON constant {name}")
    doc = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert doc["metadata"]["loss"] is None and doc["metadata"]["best"] == [None, 1.5]
