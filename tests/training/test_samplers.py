"""RandomWindows, nanoGPT's get_batch: windows at random offsets and their next tokens."""
import numpy as np
import pytest

from engine.training.samplers import RandomWindows


def test_windows_are_slices_of_the_ids_and_targets_the_next_tokens():
    # Check every row of X is ids[s:s+T] for some start s, and Y's row is ids[s+1:s+T+1].
    ids = np.random.default_rng(0).permutation(1000).astype(np.uint16)  # distinct: s is unique
    r = RandomWindows(ids, 8, 16, rng=1)
    X, Y = r.sample()
    assert X.shape == Y.shape == (16, 8) and X.dtype == Y.dtype == np.int64
    for x, y in zip(X, Y):
        s = int(np.flatnonzero(ids == x[0])[0])
        np.testing.assert_array_equal(x, ids[s:s + 8])
        np.testing.assert_array_equal(y, ids[s + 1:s + 9])


def test_offsets_are_drawn_as_nanogpt_draws_them():
    # Check the starts are rng.integers(0, len(ids) - T, batch_size): the same Generator
    # stream gives the same windows, and every start leaves room for the targets.
    ids = np.arange(50, dtype=np.int64)
    r = RandomWindows(ids, 10, 4, rng=np.random.default_rng(7))
    starts = np.random.default_rng(7).integers(0, 40, 4)
    X, _ = r.sample()
    np.testing.assert_array_equal(X[:, 0], starts)
    for _ in range(200):
        X, Y = r.sample()
        assert Y[:, -1].max() <= 49


def test_same_seed_same_batches():
    ids = np.random.default_rng(0).integers(0, 30, 500)
    a, b = RandomWindows(ids, 5, 3, rng=4), RandomWindows(ids, 5, 3, rng=4)
    for _ in range(5):
        xa, ya = a.sample()
        xb, yb = b.sample()
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)


def test_example_holds_the_largest_id_without_drawing():
    # Check example() covers the largest id (so fit can check the id range) and leaves the
    # Generator where it was.
    ids = np.zeros(100, np.int64)
    ids[97] = 9
    r = RandomWindows(ids, 4, 2, rng=3)
    state = r.rng.bit_generator.state
    X, Y = r.example()
    assert max(X.max(), Y.max()) == 9
    assert r.rng.bit_generator.state == state


@pytest.mark.parametrize("args,err,msg", [
    ((np.arange(5), 5, 2), ValueError, "block_size \\+ 1 = 6"),
    ((np.arange(5.0), 2, 2), TypeError, "integer token ids"),
    ((np.arange(10), 0, 2), ValueError, "block_size"),
    ((np.arange(10), 2, 0), ValueError, "batch_size"),
    ((np.arange(10) - 1, 2, 2), ValueError, "ids >= 0"),
])
def test_bad_arguments_are_refused(args, err, msg):
    with pytest.raises(err, match=msg):
        RandomWindows(*args)
