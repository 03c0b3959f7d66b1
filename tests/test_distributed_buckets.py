"""Gradient buckets (``engine.distributed.set_gradient_buckets``): the containers' backward
hooks they start from (one process), and under ``mpiexec`` (tests/mpi/buckets.py) the same
results as one reduction after the backward."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from engine import GPT, MLP, Sequential
from engine.nn.layers import Linear, ReLU

from test_distributed import HERE, ROOT, TIMEOUT, json_line, launch, needs_mpi


def _recorder():
    seen = []
    return seen, lambda child: seen.append(child)


# ----------------------------------------------------------------------------- hooks
@pytest.mark.parametrize("checkpoint", [False, True])
def test_sequential_calls_its_hooks_after_each_child_in_backward_order(checkpoint):
    # Check that a Sequential's hook gets each child once, last child first, plain and
    # checkpointed, and that a child's gradients are already complete when it does.
    g = np.random.default_rng(0)
    seq = Sequential(Linear(3, 4, rng=g), ReLU(), Linear(4, 2, rng=g), checkpoint=checkpoint)
    seen, hook = _recorder()
    grads = []
    seq.add_backward_hook(hook)
    seq.add_backward_hook(lambda child: grads.append([p.grad.copy() for p in child.parameters()]))
    seq.forward(g.standard_normal((5, 3)).astype(np.float32))
    seq.backward(np.ones((5, 2), np.float32))
    assert seen == [seq[2], seq[1], seq[0]]
    final = [[p.grad for p in seq[i].parameters()] for i in (2, 1, 0)]
    assert all(np.array_equal(a, b) for got, want in zip(grads, final) for a, b in zip(got, want))


def test_sequential_without_input_grad_hooks_the_children_it_runs():
    # Check that backward(input_grad=False) of an MLP stops at its first layer and calls the
    # hook for every layer it ran, the first included.
    m = MLP([3, 4, 2], dtype=np.float64, rng=0)
    seen, hook = _recorder()
    m.add_backward_hook(hook)
    m.forward(np.ones((2, 3)))
    m.backward(np.ones((2, 2)), input_grad=False)
    assert seen == [m[1], m[0]]


def test_removed_hook_is_not_called_and_a_bad_hook_is_refused():
    # Check remove_backward_hook stops the calls (removing it again is a ValueError naming
    # hook), and a hook that is not callable is a TypeError that leaves the hooks as they were.
    m = MLP([3, 2], dtype=np.float64, rng=0)
    seen, hook = _recorder()
    m.add_backward_hook(hook)
    with pytest.raises(TypeError, match="hook: expected a callable"):
        m.add_backward_hook(3)
    assert m.backward_hooks == (hook,)
    m.remove_backward_hook(hook)
    with pytest.raises(ValueError, match="hook: .* is not a backward hook of this MLP"):
        m.remove_backward_hook(hook)
    m.forward(np.ones((2, 3)))
    m.backward(np.ones((2, 2)))
    assert seen == [] and m.backward_hooks == ()


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_hooks_ln_f_and_an_untied_head_but_not_a_tied_one(tie):
    # Check a GPT's hook gets the untied head, then ln_f, with their gradients complete, and
    # never the tied head's embedding (its gradient grows until the end of the backward).
    model = GPT(7, 4, 2, 2, 8, tie_weights=tie, dtype=np.float64, rng=0)
    seen, hook = _recorder()
    snap = {}
    model.add_backward_hook(hook)
    model.add_backward_hook(lambda c: snap.setdefault(id(c), [p.grad.copy()
                                                              for p in c.parameters()]))
    model.forward(np.array([[1, 2, 3], [4, 5, 6]]))
    model.backward(np.ones((2, 3, 7)))
    want = [model.ln_f] if tie else [model.lm_head, model.ln_f]
    assert seen == want
    for c in want:
        assert all(np.array_equal(a, p.grad) for a, p in zip(snap[id(c)], c.parameters()))


# ----------------------------------------------------------------------------- over MPI
@pytest.fixture(scope="module", params=[2, 3], ids=["K2", "K3"])
def buckets(request):
    return json_line(launch(request.param, os.path.join(HERE, "mpi", "buckets.py")))


CASES = ["mlp", "mlp tiny", "tied siblings", "gpt tied", "gpt untied", "gpt checkpointed"]


@needs_mpi
@pytest.mark.parametrize("mode", ["plain", "zero1"])
def test_buckets_equal_one_process_and_are_the_same_on_every_rank(buckets, mode):
    # Check that fit(comm=...) with gradient buckets (an MLP, batches that do not divide by
    # K or are smaller than K; a weight tied across siblings; a GPT tied, untied and
    # checkpointed) gives one process's parameters to 1e-12 and the same bits on every
    # rank, plain and ZeRO-1.
    for case in CASES:
        r = buckets[case][mode]
        assert r["rel_err"] <= 1e-12, case
        assert r["identical"], case


@needs_mpi
@pytest.mark.parametrize("mode", ["plain", "zero1"])
def test_buckets_give_the_bits_of_one_reduction_at_two_ranks(buckets, mode):
    # Check that at 2 ranks (a sum of two is the same in any order) the bucketed fit gives the
    # parameters and the History of the unbucketed one bit for bit, plain and ZeRO-1. (At 3
    # ranks ZeRO-1's per-slice reductions may add in another order than Reduce_scatter.)
    if buckets["K"] != 2:
        pytest.skip("bit equality is claimed at 2 ranks")
    for case in CASES:
        assert buckets[case][mode]["same_bits"], case
        assert buckets[case][mode]["same_history"], case


@needs_mpi
def test_the_backward_launches_all_buckets_but_the_embeddings(buckets):
    # Check that in a loop of one's own (begin_backward, backward, step) the GPT's backward
    # launches every bucket but the last (the embeddings, complete only at its end), with
    # the bits of unbucketed steps.
    d = buckets["direct"]
    assert all(early == total - 1 and total > 2 for early, total in d["launched"])
    if buckets["K"] == 2:
        assert d["same_bits"]


@needs_mpi
def test_fit_removes_the_hooks_at_its_end(buckets):
    # Check that after a bucketed fit no container of the model holds a hook.
    assert buckets["hooks removed"]


@needs_mpi
def test_a_rank_failing_mid_backward_stops_every_rank_and_leaves_mpi_working(buckets):
    # Check that when the last rank raises in its backward after (then before) the others
    # launched a bucket, it raises its error and the others RankError, no rank hangs, the
    # world still works, and a bucketed fit afterwards still equals one process.
    f = buckets["failure"]
    k = buckets["K"]
    assert f["raised"] == [["RankError", "RankError"]] * (k - 1) + [["RuntimeError"] * 2]
    assert f["world_works"] and f["after"]


@needs_mpi
def test_ranks_with_different_buckets_or_a_bad_count_are_refused_on_every_rank(buckets):
    # Check that DataParallel refuses, on every rank, ranks whose bucket sizes differ (naming
    # both) and a negative count (naming buckets).
    for first, second in buckets["disagree"]:
        assert "ranks disagree" in first and "gradient buckets" in first
        assert second.startswith("buckets: expected an int >= 0") and second.endswith("got -1")


@pytest.mark.parametrize("bad", [-1, 2.5, True, "8"])
def test_set_gradient_buckets_refuses_a_bad_count_and_keeps_the_setting(bad):
    # Check a count that is not an int >= 0 is a ValueError naming elements, and the
    # process's setting is unchanged.
    from engine import distributed as D
    before = D.gradient_buckets()
    with pytest.raises(ValueError, match="elements: expected an int >= 0"):
        D.set_gradient_buckets(bad)
    assert D.gradient_buckets() == before


@needs_mpi
def test_bench_buckets_case_runs(tmp_path):
    # Check that bench/distributed.py --only buckets runs both models in every mode and
    # writes one time per round and mode and their medians (no timing asserted).
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "distributed.py"),
                           "--only", "buckets", "--quick", "--steps", "1", "--out", str(out)],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    b = json.loads(out.read_text())["buckets"]
    assert set(b) == {"gpt", "tabular"}
    for r in b.values():
        assert set(r["median_s"]) == {"off", "on", "no test"}
        assert all(len(v) == 3 and min(v) > 0 for v in r["runs_s"].values())
    assert "GRADIENT BUCKETS" in proc.stdout
