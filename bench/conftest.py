"""Fixtures shared by the benchmarks (timing settings live in ``bench/timing.py``)."""
from __future__ import annotations

import pytest

import kernels
from bench import timing


@pytest.fixture(scope="session", autouse=True)
def settled():
    """Once per process, before the first benchmark: wake the BLAS threads and wait for a
    quiet machine (timing.settle). Returns the seconds waited."""
    return timing.settle()


@pytest.fixture
def threads(settled):
    """The BLAS thread count this process runs with (set by BLASNET_NUM_THREADS)."""
    return kernels.get_num_threads()


def pytest_benchmark_update_machine_info(config, machine_info):
    """Every benchmark JSON says which BLAS kernel produced it (kernels.blas_kernel; not
    re-measured here: bench/run.py times the pin's cost once)."""
    from kernels import blas_kernel
    machine_info["blas_kernel"] = blas_kernel.facts(measure=False)
