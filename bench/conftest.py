"""Fixtures shared by the benchmarks (timing settings live in ``bench/timing.py``)."""
from __future__ import annotations

import pytest

import kernels


@pytest.fixture
def threads():
    """The BLAS thread count this process runs with (set by BLASNET_NUM_THREADS)."""
    return kernels.get_num_threads()
