"""Test ordering for ``make test``."""

# The directories and files whose tests mostly start other Python processes (bench runs, the
# CLI, the wheel, mpiexec) run after the rest: on a fresh clone (an empty kernel cache) a
# process started early compiles the kernels it needs again, while one started late loads
# what the in-process tests and kernels.precompile compiled meanwhile.
LATE = ("tests/benchmarks/", "tests/cli/", "tests/test_wheel.py", "tests/test_distributed.py",
        "tests/test_packaging.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.startswith(LATE))  # stable: order kept within
