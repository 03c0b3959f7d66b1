"""bench/gpt_recipe.py: nanoGPT's CPU recipe timed in its own process (torch optional)."""
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpt_recipe  # noqa: E402


def test_recipe_iteration_trains_the_recipe_gpt():
    # Check that one blasnet iteration of the recipe lowers the loss on a repeated batch (the
    # step really runs forward, backward, clipping and AdamW on the recipe's GPT).
    import numpy as np
    s = dict(gpt_recipe.RECIPE, n_layer=1, block_size=16, batch=4)
    step = gpt_recipe.blasnet_step(s, bias=True)
    rng = np.random.default_rng(0)
    stream = rng.integers(0, s["vocab"], 1000)
    x, y = gpt_recipe.windows(rng, stream, s)
    losses = []
    for _ in range(5):
        losses.append(step(x, y))
    assert losses[-1] < losses[0]


def test_main_prints_one_row_per_thread_count(capsys):
    # Check that the parent runs the blasnet child per thread count and prints its median.
    assert gpt_recipe.main(["--threads", "1", "--iters", "2", "--burn-in", "1",
                            "--rounds", "1"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("1 ")]
    assert len(rows) == 1
    assert math.isfinite(float(rows[0][1])) and float(rows[0][1]) > 0
