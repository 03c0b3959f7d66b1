"""engine.training.parallel: fit's processes come from the factory the distributed layer
registers (training does not import engine.distributed)."""
import pytest

from engine.training import parallel


def test_processes_without_comm_is_this_process_alone():
    # Check comm=None gives the one-process interface of rank 0 of 1.
    p = parallel.processes(None)
    assert isinstance(p, parallel.SingleProcess) and (p.rank, p.size) == (0, 1)


def test_processes_of_a_comm_come_from_the_registered_factory():
    # Check a comm goes to the factory registered last, and that engine.distributed's
    # FitRanks is the one import engine registers (a comm that is none is its TypeError).
    import engine.distributed as D
    sentinel = object()
    try:
        parallel.register_ranks(lambda comm: (sentinel, comm))
        assert parallel.processes("c") == (sentinel, "c")
    finally:
        parallel.register_ranks(D.FitRanks)
    pytest.importorskip("mpi4py")
    with pytest.raises(TypeError, match=r"comm: expected an MPI communicator \(mpi4py"):
        parallel.processes("c")


def test_a_factory_that_is_not_callable_is_refused():
    # Check register_ranks refuses a non-callable with a TypeError naming factory, and the
    # registered factory stays in use.
    with pytest.raises(TypeError, match="factory: expected a callable, got int"):
        parallel.register_ranks(3)
    sentinel = object()
    import engine.distributed as D
    try:
        parallel.register_ranks(lambda comm: sentinel)
        with pytest.raises(TypeError):
            parallel.register_ranks(None)
        assert parallel.processes(1) is sentinel
    finally:
        parallel.register_ranks(D.FitRanks)
