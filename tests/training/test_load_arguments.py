"""Arguments of the functions that read checkpoints: a wrong type is a TypeError naming the
argument (``load_model``'s ``custom_objects``, ``fit``'s ``resume_from``), raised before the
file is read or the model changed."""
import numpy as np
import pytest

import engine
from engine import MLP, MSELoss, AdamW, fit, save


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.npz"
    save(path, MLP([2, 3, 1], rng=0))
    return path


@pytest.mark.parametrize("bad, match", [
    ("MLP", r"custom_objects: expected a dict"), (3, r"custom_objects: expected a dict"),
    (["MLP"], r"custom_objects: expected a dict"),
    ({"MLP": 3}, r"custom_objects\['MLP'\]: expected a Module subclass"),
    ({"MLP": "MLP"}, r"custom_objects\['MLP'\]: expected a Module subclass"),
    ({3: MLP}, r"custom_objects: expected class names")])
def test_load_model_names_custom_objects_of_the_wrong_type(saved, bad, match):
    # Check that every wrong shape of custom_objects is a TypeError naming it.
    with pytest.raises(TypeError, match=match):
        engine.load_model(saved, custom_objects=bad)


@pytest.mark.parametrize("bad", [3, 1.5, ["m.npz"], {"path": "m.npz"}])
def test_fit_names_a_resume_from_that_is_not_a_path(bad):
    # Check that resume_from of another type is a TypeError naming it; nothing trained.
    m = MLP([2, 3, 1], rng=0)
    before = m.flat_params().copy()
    X, Y = np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32)
    with pytest.raises(TypeError, match="resume_from: expected a checkpoint's path"):
        fit(m, MSELoss(), AdamW(m.parameters()), X, Y, epochs=1, resume_from=bad,
            progress=False)
    np.testing.assert_array_equal(m.flat_params(), before)
